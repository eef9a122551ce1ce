"""``mimo_accel.load_config``: an :class:`~mimo_accel.config.AccelConfig` from the ``mimo_accel:``
section of a YAML file and ``key=value`` overrides, the way Megatron Bridge reads its own config.

The section is merged into an OmegaConf structured config of ``AccelConfig`` (interpolations
resolve against the whole file), then the overrides in order, in the grammar of Bridge's
``process_config_with_overrides`` (``key=value``, ``+key=value``, ``++key=value``: set; ``~key``
resets, ``~key=value`` only where it is that value), values parsed as OmegaConf parses a dotlist.
Defaults < file < overrides; the ``MIMO_ACCEL*`` environment is not read. Every error is a
:class:`~mimo_accel.config.ConfigError` naming the option, where its value came from and what to
write instead. Examples: docs/usage.md, "A YAML config, Bridge's way".
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass
from typing import Iterable, Optional, Union

from mimo_accel.config import FLAGS, AccelConfig, ConfigError, parse_window, positive_int

__all__ = ["SECTION", "Override", "is_override", "load_config", "parse_overrides"]

SECTION = "mimo_accel"
FIELDS = tuple(f.name for f in dataclasses.fields(AccelConfig))
INTS = ("reorder_window", "pad_multiple")  # reorder_window: or "step" (parse_window)
_OVERRIDE = re.compile(r"^(?P<op>\+\+|\+|~)?(?P<key>[A-Za-z_][A-Za-z0-9_.]*)(?:=(?P<value>.*))?$", re.S)


@dataclass(frozen=True)
class Override:
    """One parsed override: ``set`` (``key=value``, ``+key=value``, ``++key=value``) or ``reset``
    (``~key``; with ``value``: only where the option has that value)."""

    token: str
    op: str  # "set" | "reset"
    key: str
    value: object = None
    has_value: bool = True


def is_override(token: str) -> bool:
    """Whether a command-line word is an override (``mimo-accel run`` / ``env``): ``key=value``,
    ``+key=value``, ``++key=value``, ``~key`` or ``~key=value``."""
    m = _OVERRIDE.match(token)
    return m is not None and (m["value"] is not None or m["op"] == "~")


def _key(raw: str, where: str) -> str:
    key = raw[len(SECTION) + 1:] if raw.startswith(SECTION + ".") else raw
    if key not in FIELDS:
        import difflib

        known = list(FIELDS) + [f"{SECTION}.{f}" for f in FIELDS]
        close = difflib.get_close_matches(raw, known, n=1, cutoff=0.6)
        hint = f"did you mean {close[0]!r}? " if close else ""
        raise ConfigError(f"{where}: {raw!r} is not a mimo_accel option; {hint}options: {', '.join(FIELDS)}")
    return key


def _check_value(key: str, value, where: str) -> None:
    """Stricter than OmegaConf's conversions: a switch is a boolean, a count an integer."""
    if key in FLAGS and not isinstance(value, bool):
        raise ConfigError(f"{where}: {SECTION}.{key} must be true or false, got {value!r}; "
                          f"write {key}=true or {key}=false")
    if key == "reorder_window":
        try:
            parse_window(value)
        except ConfigError as exc:
            raise ConfigError(f"{where}: {exc}") from None
    elif key in INTS and not positive_int(value):
        raise ConfigError(f"{where}: {SECTION}.{key} must be a positive integer, got {value!r}; e.g. {key}=2")
    if key not in FLAGS + INTS and value is not None and not isinstance(value, str):
        what = "plan or exchange" if key == "reorder_mode" else "a path, or null"
        raise ConfigError(f"{where}: {SECTION}.{key} must be {what}, got {value!r}")


def _value(text: str):
    from omegaconf import OmegaConf

    return OmegaConf.to_container(OmegaConf.from_dotlist([f"v={text}"]))["v"]


def parse_overrides(overrides: Iterable[str]) -> list[Override]:
    """``["packing=true", "+mimo_accel.pad_multiple=2", "~reorder_window"]`` -> their :class:`Override`
    (values parsed as OmegaConf parses a dotlist: YAML scalars), each checked."""
    parsed = []
    for token in overrides:
        token = str(token)
        m = _OVERRIDE.match(token)
        if m is None or (m["value"] is None and m["op"] != "~"):
            raise ConfigError(f"override {token!r}: write key=value (or Bridge's +key=value, ++key=value, ~key), "
                              "e.g. packing=true or pad_multiple=2")
        where = f"override {token!r}"
        key = _key(m["key"], where)
        if m["op"] == "~":
            has_value = m["value"] is not None
            value = _value(m["value"]) if has_value else None
            parsed.append(Override(token, "reset", key, value, has_value))
            continue
        value = _value(m["value"])
        _check_value(key, value, where)
        parsed.append(Override(token, "set", key, value))
    return parsed


def _apply(section: dict, overrides: list[Override], base: AccelConfig) -> dict:
    """The section's values with the overrides applied in order (a reset writes the default)."""
    out = dict(section)
    for o in overrides:
        if o.op == "set":
            out[o.key] = o.value
            continue
        current = out.get(o.key, getattr(base, o.key))
        if o.has_value and current != o.value:
            raise ConfigError(f"override {o.token!r}: {SECTION}.{o.key} is {current!r}, not {o.value!r}; write "
                              f"~{o.key} to reset it whatever it is")
        out[o.key] = getattr(AccelConfig, o.key)
    return out


def _read_section(path: Union[str, os.PathLike]) -> dict:
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    if not os.path.isfile(path):
        raise ConfigError(f"config file {os.fspath(path)!r} does not exist; pass the YAML file that holds "
                          f"the {SECTION}: section")
    try:
        root = OmegaConf.load(path)
    except Exception as exc:  # yaml's own errors: name the file, keep the parser's first line
        text = " ".join(str(exc).split())[:240] or type(exc).__name__
        raise ConfigError(f"config file {os.fspath(path)!r} is not valid YAML: {text}") from None
    example = f"{SECTION}: {{packing: true}}"
    if not OmegaConf.is_dict(root) or SECTION not in root:
        raise ConfigError(f"config file {os.fspath(path)!r} has no {SECTION}: section; add one, e.g. `{example}`")
    if root[SECTION] is None:
        return {}
    if not OmegaConf.is_dict(root[SECTION]):
        raise ConfigError(f"config file {os.fspath(path)!r}: {SECTION}: must be a mapping of options, "
                          f"e.g. `{example}`")
    try:
        section = OmegaConf.to_container(root[SECTION], resolve=True)
    except OmegaConfBaseException as exc:
        first = str(exc).strip().splitlines()[0]
        raise ConfigError(f"config file {os.fspath(path)!r}: {SECTION}: an interpolation does not resolve: "
                          f"{first}") from None
    for raw, value in section.items():
        where = f"{os.fspath(path)}"
        _check_value(_key(str(raw), where), value, where)
    return section


def load_config(path: Union[str, os.PathLike, None] = None, overrides: Iterable[str] = (),
                *, base: Optional[AccelConfig] = None) -> AccelConfig:
    """The AccelConfig of ``path``'s ``mimo_accel:`` section with ``key=value`` ``overrides`` on top.

    ``path=None``: the overrides over ``base`` (default: :class:`AccelConfig`'s defaults). Raises
    :class:`~mimo_accel.config.ConfigError` on a missing file, a missing section, an unknown option or
    a value of the wrong type. The files the options name are checked by ``enable()``.
    """
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    base = base if base is not None else AccelConfig()
    section = _apply(_read_section(path) if path is not None else {}, parse_overrides(overrides), base)
    schema = OmegaConf.structured(base)
    OmegaConf.set_readonly(schema, False)  # AccelConfig is frozen; the merged result is rebuilt from it
    try:
        merged = OmegaConf.merge(schema, section)
        return OmegaConf.to_object(merged)
    except OmegaConfBaseException as exc:  # a value OmegaConf cannot convert (_check_value catches most)
        key = getattr(exc, "full_key", None) or "?"
        first = str(exc).strip().splitlines()[0]
        raise ConfigError(f"{SECTION}.{key}: {first}") from None
