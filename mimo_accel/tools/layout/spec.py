"""A layout as a line of text, checked: ``images=tp1,pp1,dp1 language=tp4,pp2,dp2 mbs=2 gbs=32``.

One ``NAME=tpT,ppP,dpD`` per module (the language model is ``language``; an encoder is one
pipeline stage), ``mbs=`` the global micro-batch (Bridge's MIMO ``micro_batch_size``: all the
language replicas' samples together), ``gbs=`` the global batch, and optionally ``seq=`` the
sequence length and ``frozen=NAME[,NAME]`` (encoders that do not train). A step is W = gbs / mbs
micro-batches; the micro-batch must be a multiple of G = lcm(DPs) (the canonical grid). The
grammar of ``mimo-accel simulate --layout`` and ``mimo-accel layout --current``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from mimo_accel.modules import LANGUAGE, Modules, module

__all__ = ["PRESETS", "LayoutSpec", "parse_layout", "spec_text"]

#: Upstream's one validated MegatronMIMO workflow (Megatron-Bridge,
#: ``tutorials/megatron_mimo/qwen35-vl-non-colocated-sft.md``), with the model it was chosen for.
PRESETS = {"reference-27b": "images=tp1,pp1,dp1 language=tp4,pp2,dp2 mbs=2 gbs=32"}
PRESET_MODELS = {"reference-27b": "qwen35-vl-27b"}

_MODULE = re.compile(r"^tp(\d+),pp(\d+),dp(\d+)$")
_EXAMPLE = "e.g. images=tp1,pp1,dp1 language=tp4,pp2,dp2 mbs=2 gbs=32 [seq=4096] [frozen=images]"


@dataclass(frozen=True)
class LayoutSpec:
    """A checked layout: its modules (tp, pp, dp), the global micro-batch and batch, the sequence
    length if given, the frozen encoders, and the preset it came from."""

    spec: str
    modules: Modules
    mbs: int
    gbs: int
    frozen: tuple[str, ...] = ()
    seq_length: Optional[int] = None
    preset: Optional[str] = None

    @property
    def micro_batches(self) -> int:
        return self.gbs // self.mbs

    @property
    def stages(self) -> dict[str, int]:
        return {LANGUAGE: self.modules[LANGUAGE].pp}

    @property
    def gpus(self) -> int:
        return self.modules.world_size


def spec_text(modules: Modules, mbs: int, gbs: int, frozen=(), seq_length: Optional[int] = None) -> str:
    """The spec of a layout, encoders first: what :func:`parse_layout` reads back."""
    parts = [f"{m.name}=tp{m.tp},pp{m.pp},dp{m.dp}" for m in (*modules.encoders, modules.language)]
    parts += [f"mbs={mbs}", f"gbs={gbs}"]
    if seq_length is not None:
        parts.append(f"seq={seq_length}")
    if frozen:
        parts.append("frozen=" + ",".join(frozen))
    return " ".join(parts)


def _count(bad, part: str, key: str, value: str) -> int:
    if not value.isdigit() or int(value) < 1:
        raise bad(part, f"{key} must be a positive whole number{' of samples' if key != 'seq' else ' of tokens'}")
    return int(value)


def parse_layout(text: str, flag: str = "--layout") -> LayoutSpec:
    """A preset name (:data:`PRESETS`) or a spec; ValueError ``<flag>: '<part>': <fix>``."""

    def bad(part: str, fix: str) -> ValueError:
        return ValueError(f"{flag}: {part!r}: {fix}")

    name = str(text).strip()
    preset = None
    if "=" not in name:
        if name not in PRESETS:
            raise bad(name, f"no such preset; give one of {', '.join(PRESETS)}, or a spec ({_EXAMPLE})")
        preset, name = name, PRESETS[name]
    mods, sizes, frozen = [], {}, ()
    for part in name.split():
        key, _, value = part.partition("=")
        if not key or not value:
            raise bad(part, f"give NAME=tpT,ppP,dpD, mbs=N, gbs=N, seq=N or frozen=NAME ({_EXAMPLE})")
        if key in ("mbs", "gbs", "seq"):
            if key in sizes:
                raise bad(part, f"{key} is given twice; give it once")
            sizes[key] = _count(bad, part, key, value)
        elif key == "frozen":
            frozen = tuple(v for v in value.split(",") if v)
        else:
            m = _MODULE.match(value)
            if not m or min(int(g) for g in m.groups()) < 1:
                raise bad(part, "give the module's sizes as tpT,ppP,dpD with positive T, P, D, "
                                f"e.g. {key}=tp1,pp1,dp1")
            tp, pp, dp = (int(g) for g in m.groups())
            if key != LANGUAGE and pp > 1:
                raise bad(part, "the step model takes an encoder as one pipeline stage; give it pp1")
            try:
                mods.append(module(key, dp, tp=tp, pp=pp))
            except ValueError as e:
                raise bad(part, str(e)) from None
    names = [m.name for m in mods]
    if LANGUAGE not in names:
        raise bad(name, f"no {LANGUAGE}=tpT,ppP,dpD: the layout needs the language model")
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise bad(f"{twice[0]}=", "a module is given twice; give each module once")
    for key in ("mbs", "gbs"):
        if key not in sizes:
            raise bad(name, f"no {key}=N; give the global micro-batch (mbs) and the global batch (gbs)")
    for f in frozen:
        if f not in names or f == LANGUAGE:
            raise bad(f"frozen={','.join(frozen)}", f"{f!r} is not an encoder of the layout; name encoders only")
    modules = Modules(tuple(mods))
    mbs, gbs, grid = sizes["mbs"], sizes["gbs"], modules.grid
    if mbs % grid:
        raise bad(f"mbs={mbs}", f"the global micro-batch must be a multiple of G = lcm(DPs) = {grid}")
    if gbs % mbs:
        raise bad(f"gbs={gbs}", f"the global batch must be a whole number of micro-batches of mbs={mbs}")
    return LayoutSpec(" ".join(name.split()), modules, mbs, gbs, frozen, sizes.get("seq"), preset)
