"""AccelConfig: which features are on, and their options. Every feature is off by default.

Precedence: explicit ``enable()`` arguments > environment (``MIMO_ACCEL*``) > defaults. One name per
setting: the field name is the ``enable()`` keyword, the ``key=value`` override and the YAML key
(``mimo_accel.<field>``, :func:`mimo_accel.load_config`); its variable is ``MIMO_ACCEL_<FIELD>``,
except the three switches, which are the words of ``MIMO_ACCEL`` (``mimo-accel run --features``).
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Optional, Union

ENV_FEATURES = "MIMO_ACCEL"
ENV_PROFILE = "MIMO_ACCEL_PROFILE"  # output directory; also turns the profiler on
ENV_COST_MODEL = "MIMO_ACCEL_COST_MODEL"  # cost-model file (from `mimo-accel calibrate`)
ENV_COST_INDEX = "MIMO_ACCEL_COST_INDEX"  # per-sample cost index (from `mimo-accel index`)
ENV_REORDER_MODE = "MIMO_ACCEL_REORDER_MODE"
ENV_PAD_MULTIPLE = "MIMO_ACCEL_PAD_MULTIPLE"
ENV_REORDER_WINDOW = "MIMO_ACCEL_REORDER_WINDOW"
ENV_STRICT_GRADIENTS = "MIMO_ACCEL_STRICT_GRADIENTS"  # 1: refuse what would change the gradient
ENV_CALIBRATE_ONLINE = "MIMO_ACCEL_CALIBRATE_ONLINE"  # 0: the cost model stays as configured
ENV_ALLOW_UNTESTED = "MIMO_ACCEL_ALLOW_UNTESTED"  # 1: patch an untested upstream as the nearest shape
ENV_TRACEBACK = "MIMO_ACCEL_TRACEBACK"  # 1: a command's error with its traceback (tools/arguments.py)
ENV_CACHE_DIR = "MIMO_ACCEL_CACHE_DIR"  # where derived cost indexes are cached (datasets/shared_index.py)

#: The option each MIMO_ACCEL_<FIELD> variable sets (the switches come from MIMO_ACCEL's words).
ENV_OPTIONS = {
    "profile": ENV_PROFILE,
    "cost_model": ENV_COST_MODEL,
    "cost_index": ENV_COST_INDEX,
    "reorder_mode": ENV_REORDER_MODE,
    "reorder_window": ENV_REORDER_WINDOW,
    "pad_multiple": ENV_PAD_MULTIPLE,
    "strict_gradients": ENV_STRICT_GRADIENTS,
    "calibrate_online": ENV_CALIBRATE_ONLINE,
}
#: Every variable an AccelConfig is read from (what `mimo-accel run --config` replaces).
CONFIG_ENV = (ENV_FEATURES,) + tuple(ENV_OPTIONS.values())
#: The other variables mimo_accel reads, and what each is for: with CONFIG_ENV, every name it knows.
OTHER_ENV = {
    ENV_ALLOW_UNTESTED: "1: patch an untested megatron-bridge/megatron-core pair as the nearest shape",
    ENV_CACHE_DIR: "where derived cost indexes are cached",
    ENV_TRACEBACK: "1: a mimo-accel command's error with its traceback",
    "MIMO_ACCEL_PROFILE_LABEL": "the label a profiler run records (set by mimo-accel rehearse)",
    "MIMO_ACCEL_IMPORT_LOG": "where a rehearsal's forkserver writes its import output (set by mimo-accel rehearse)",
}
KNOWN_ENV = CONFIG_ENV + tuple(OTHER_ENV)

# MIMO_ACCEL=<comma list>: the words users write (the fields' names), and the fields they turn on.
FEATURE_WORDS = {
    "sharded_reads": ("sharded_reads",),
    "reorder": ("sharded_reads", "reorder"),
    "packing": ("packing",),
    "profile": ("profile",),
}
# shorter spellings accepted for the same fields, listed nowhere else
WORD_ALIASES = {"shard": "sharded_reads", "pack": "packing"}
ALL_WORDS = ("all",)
OFF_WORDS = ("", "0", "off", "none", "false")
REORDER_MODES = ("plan", "exchange")
STEP_WINDOW = "step"  # reorder_window: the micro-batches of one training step, read from Bridge's config
SWITCHES = ("sharded_reads", "reorder", "packing")
FLAGS = SWITCHES + ("strict_gradients", "calibrate_online")  # every True/False option
TRUE_WORDS, FALSE_WORDS = ("1", "true", "on", "yes"), ("0", "false", "off", "no")
# An option -> the feature it acts in (an option set away from its default while its feature is
# off is warned, never silently ignored).
ACTS_IN = {
    "reorder_mode": "reorder",
    "reorder_window": "reorder",
    "cost_model": "reorder",
    "cost_index": "reorder",
    "strict_gradients": "reorder",
    "calibrate_online": "reorder",
    "pad_multiple": "packing",
}
DEFAULT_PROFILE_DIR = "mimo-accel-profile"  # MIMO_ACCEL=profile without MIMO_ACCEL_PROFILE
#: The options that name a path, and what each names (checked, and made absolute, where they are set).
PATH_OPTIONS = {"profile": "directory", "cost_model": "file", "cost_index": "file"}


class ConfigError(ValueError):
    """A bad configuration value; the message names the fix."""


@dataclass(frozen=True)
class AccelConfig:
    """What ``mimo_accel.enable()`` turns on (each option in full: docs/usage.md's table).

    sharded_reads: each data rank reads only its replica's canonical-grid share; no slice in the step.
    reorder: balance every module's DP replicas, planned before reading (implies sharded_reads).
    reorder_mode: "plan" (costs from a cost index; nothing moves) or "exchange" (after decoding).
    reorder_window: micro-batches planned together (tiling a step), or "step": one training step's.
    cost_model: a ``mimo-accel calibrate`` file, or None (each module's FLOPs, else the defaults).
    cost_index: a ``mimo-accel index`` file (``{split}``: one per split), or None (the dataset's own,
        else derived when the loaders are built).
    packing: THD-pack the language shard (no compute on padding).
    pad_multiple: pad every packed segment to a multiple of this (context parallelism needs 2·cp).
    profile: None (off) or the directory of the per-rank ``rank<N>.jsonl`` profiler logs.
    strict_gradients: refuse, rather than say once, a reorder that changes the gradient (the
        language model's ``calculate_per_token_loss=False``).
    calibrate_online: with reorder (plan mode), the cost model refits itself from the job's step
        times (:mod:`mimo_accel.runtime.measuring.calibration`); False pins it.
    """

    sharded_reads: bool = False
    reorder: bool = False
    reorder_mode: str = "plan"
    reorder_window: Union[int, str] = 1
    cost_model: Optional[str] = None
    cost_index: Optional[str] = None
    packing: bool = False
    pad_multiple: int = 1
    profile: Optional[str] = None
    strict_gradients: bool = False
    calibrate_online: bool = True

    def __post_init__(self) -> None:
        for name in FLAGS:
            value = getattr(self, name)
            if not isinstance(value, bool):
                raise ConfigError(f"{name} must be True or False, got {value!r} ({type(value).__name__}); "
                                  f"write {name}=True (Python) or {name}=true (YAML / key=value)")
        if self.reorder and not self.sharded_reads:
            object.__setattr__(self, "sharded_reads", True)  # reorder implies sharded reads
        if self.reorder_mode not in REORDER_MODES:
            raise ConfigError(f"reorder_mode={self.reorder_mode!r} is not one of {REORDER_MODES}; "
                              "write reorder_mode=plan or reorder_mode=exchange")
        object.__setattr__(self, "reorder_window", parse_window(self.reorder_window))
        if not positive_int(self.pad_multiple):
            raise ConfigError(f"pad_multiple must be a positive integer, got {self.pad_multiple!r}; e.g. pad_multiple=2")
        for name, what in (("cost_model", "file"), ("cost_index", "file"), ("profile", "directory")):
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, os.PathLike):
                value = os.fspath(value)
                object.__setattr__(self, name, value)
            if not isinstance(value, str) or not value:
                raise ConfigError(f"{name} must be None or a {what} path, got {value!r}")

    @property
    def calibrates_online(self) -> bool:
        """Whether the cost model is learnt while training: reorder in plan mode, not pinned."""
        return self.reorder and self.reorder_mode == "plan" and self.calibrate_online

    @property
    def any_feature(self) -> bool:
        return self.sharded_reads or self.reorder or self.packing or self.profile is not None

    def switch_words(self) -> list[str]:
        """The ``MIMO_ACCEL`` words of this config (``reorder`` implies ``sharded_reads``)."""
        return ((["reorder"] if self.reorder else ["sharded_reads"] if self.sharded_reads else []) +
                (["packing"] if self.packing else []) + (["profile"] if self.profile is not None else []))

    def features(self) -> list[str]:
        names = [n for n in ("sharded_reads", "reorder", "packing") if getattr(self, n)]
        return names + (["profile"] if self.profile is not None else [])

    def replace(self, **changes) -> "AccelConfig":
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise ConfigError(f"unknown option(s) {sorted(unknown)}; valid options: "
                              f"{[f.name for f in dataclasses.fields(self)]}")
        return dataclasses.replace(self, **changes)

    def without_effect(self) -> list[str]:
        """One line for each option set away from its default that its feature is off for
        (``enable()`` warns them, ``mimo-accel run`` / ``env`` print them)."""
        lines = []
        for name, feature in ACTS_IN.items():
            value = getattr(self, name)
            if value == getattr(AccelConfig, name):
                continue
            if not getattr(self, feature):
                lines.append(f"{name}={value!r} has no effect without {feature}: turn {feature} on, or drop {name}")
            elif name == "cost_index" and self.reorder_mode != "plan":
                lines.append(f"cost_index={value!r} has no effect with reorder_mode={self.reorder_mode!r} (it prices "
                             "samples after decoding them): drop cost_index, or set reorder_mode=plan")
        return lines

    def check_paths(self, environ: Optional[Mapping[str, str]] = None) -> None:
        """Every path the options name, before anything starts (``enable()``, ``mimo-accel run`` / ``env``):
        the files exist, and the profile directory, and ``MIMO_ACCEL_CACHE_DIR`` of ``environ`` (default:
        this process's), can be made and written. ConfigError naming the setting and the fix."""
        if self.cost_model is not None and not Path(self.cost_model).is_file():
            raise ConfigError(f"cost_model={self.cost_model!r}: no such file. Pass the file `mimo-accel calibrate "
                              "RUN_DIR --out FILE` wrote, or leave cost_model unset for the built-in coefficients")
        if self.cost_index is not None:
            from mimo_accel.datasets.split_index import SPLIT_FIELD

            train = self.cost_index.replace(SPLIT_FIELD, "train")
            if not Path(train).is_file():
                which = f" (the train split of {self.cost_index!r})" if train != self.cost_index else ""
                raise ConfigError(f"cost_index={train!r}{which}: no such file. Build it with `mimo-accel index "
                                  "... --out FILE`, or leave cost_index unset to take the dataset's own index "
                                  "or derive one from its examples")
        if self.profile is not None and (problem := directory_problem(self.profile)):
            raise ConfigError(f"profile={self.profile!r}: {problem}; give the profiler a directory it can make "
                              f"and write its rank<N>.jsonl files in (profile=DIR, {ENV_PROFILE}=DIR)")
        cache = (os.environ if environ is None else environ).get(ENV_CACHE_DIR)
        if cache and (problem := directory_problem(os.path.expanduser(cache))):
            raise ConfigError(f"{ENV_CACHE_DIR}={cache!r}: {problem}; give a directory mimo_accel can make and write "
                              "its derived cost indexes in, or unset it for ~/.cache/mimo_accel")

    def absolute(self) -> "AccelConfig":
        """This config with every path option made absolute against the current directory: the
        processes of a job may start elsewhere (a launcher's own directory, each node's)."""
        changes = {name: os.path.abspath(value) for name in PATH_OPTIONS
                   if (value := getattr(self, name)) is not None and not os.path.isabs(value)}
        return self.replace(**changes) if changes else self

    @classmethod
    def from_env(cls, environ: Optional[Mapping[str, str]] = None) -> "AccelConfig":
        """The configuration the ``MIMO_ACCEL*`` variables describe (defaults where unset)."""
        env = os.environ if environ is None else environ
        changes = switches_from_words(env.get(ENV_FEATURES, ""), f"{ENV_FEATURES}={env.get(ENV_FEATURES)!r}")
        profile_dir = env.get(ENV_PROFILE)
        if changes.pop("profile", False) or profile_dir:
            changes["profile"] = profile_dir or DEFAULT_PROFILE_DIR
        if env.get(ENV_COST_MODEL):
            changes["cost_model"] = env[ENV_COST_MODEL]
        if env.get(ENV_COST_INDEX):
            changes["cost_index"] = env[ENV_COST_INDEX]
        if env.get(ENV_REORDER_MODE):
            changes["reorder_mode"] = env[ENV_REORDER_MODE].strip().lower()
        for name in ("strict_gradients", "calibrate_online"):
            var = ENV_OPTIONS[name]
            if env.get(var):
                raw = env[var].strip().lower()
                if raw not in TRUE_WORDS + FALSE_WORDS:
                    raise ConfigError(f"{var}={env[var]!r}: expected 1 or 0")
                changes[name] = raw in TRUE_WORDS
        if env.get(ENV_PAD_MULTIPLE):
            try:
                changes["pad_multiple"] = int(env[ENV_PAD_MULTIPLE])
            except ValueError:
                raise ConfigError(f"{ENV_PAD_MULTIPLE}={env[ENV_PAD_MULTIPLE]!r} is not an integer; "
                                  f"e.g. {ENV_PAD_MULTIPLE}=2") from None
        if env.get(ENV_REORDER_WINDOW):  # text: a number is one, anything else is parse_window's to judge
            raw = env[ENV_REORDER_WINDOW]
            changes["reorder_window"] = int(raw) if raw.strip().isdecimal() else raw
        try:
            return cls(**changes)
        except ConfigError as exc:  # name the variable the value came from
            bad = next((var for name, var in ENV_OPTIONS.items() if str(exc).startswith(name)), None)
            raise ConfigError(f"{bad}: {exc}" if bad else str(exc)) from None

    def to_env(self) -> dict:
        """The ``MIMO_ACCEL*`` variables that describe this config (``from_env`` gives it back)."""
        words = self.switch_words()
        env = {ENV_FEATURES: ",".join(words) or "0"}
        for name, var in ENV_OPTIONS.items():
            value = getattr(self, name)
            if value is not None and value != getattr(AccelConfig, name):
                env[var] = ("1" if value else "0") if isinstance(value, bool) else str(value)
        return env


def directory_problem(path: Union[str, os.PathLike]) -> Optional[str]:
    """Why ``path`` cannot be a directory mimo_accel makes (with its parents) and writes in; None
    where it can. Nothing is made here."""
    p = Path(path)
    if p.exists():
        if not p.is_dir():
            return f"{p} is a file, not a directory"
        return None if os.access(p, os.W_OK | os.X_OK) else f"the directory {p} is not writable"
    above = p.parent
    while not above.exists() and above != above.parent:
        above = above.parent
    if not above.is_dir():
        return f"{above} is a file, so the directory {p} cannot be made"
    if not os.access(above, os.W_OK | os.X_OK):
        return f"the directory {above} is not writable, so {p} cannot be made in it"
    return None


def positive_int(value) -> bool:
    """An int >= 1 (True is no count)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def parse_window(value) -> Union[int, str]:
    """``reorder_window`` as every spelling gives it (``enable()``, ``MIMO_ACCEL_REORDER_WINDOW``, the
    YAML key, a ``key=value`` override): a positive integer, or ``"step"`` in any letter case; any
    other value is a ConfigError with the one line each path says (after where it came from)."""
    if isinstance(value, str) and value.strip().lower() == STEP_WINDOW:
        return STEP_WINDOW
    if not positive_int(value):
        raise ConfigError(f"reorder_window must be a positive integer or step, got {value!r}; "
                          "e.g. reorder_window=4 or reorder_window=step")
    return value


def resolve_window(window: Union[int, str], step_micro_batches: Optional[int]) -> int:
    """The micro-batches planned together for a parsed ``reorder_window``: the number, or for "step"
    the ``step_micro_batches`` of megatron-core's calculator. A window must tile a training step, so
    that samples move between the micro-batches of one step and never into another (a resume
    restarts at a step): ConfigError naming the valid values otherwise, or the fix where the step's
    micro-batches are not known."""
    if window == 1:
        return 1
    if step_micro_batches is None:
        raise ConfigError(f"mimo_accel reorder_window={window} needs the number of micro-batches per training "
                          "step, which megatron-core's num-microbatches calculator did not have when the loader "
                          "was built (Bridge's setup_megatron_mimo initialises it); build the loaders inside "
                          "pretrain_megatron_mimo's build_data_iterators, or set reorder_window=1")
    if window == STEP_WINDOW:
        return step_micro_batches
    if step_micro_batches % window:
        valid = [w for w in range(1, step_micro_batches + 1) if step_micro_batches % w == 0]
        raise ConfigError(f"mimo_accel reorder_window={window} does not divide the {step_micro_batches} "
                          "micro-batches of a training step, so a window would take samples from the next step. "
                          f"Valid values: {valid} ({step_micro_batches} balances the whole global batch).")
    return window


def switches_from_words(raw: str, where: str) -> dict:
    """The fields a ``MIMO_ACCEL`` value turns on (``profile``: True for the word ``profile``)."""
    raw = (raw or "").strip().lower()
    changes: dict = {}
    words = [w.strip() for w in raw.split(",") if w.strip()] if raw not in OFF_WORDS else []
    for word in words:
        word = WORD_ALIASES.get(word, word)
        if word in ALL_WORDS:
            changes.update(sharded_reads=True, reorder=True, packing=True)
        elif word in FEATURE_WORDS:
            for name in FEATURE_WORDS[word]:
                changes[name] = True
        else:
            valid = [*ALL_WORDS, *FEATURE_WORDS, "0 (off)"]
            raise ConfigError(f"{where}: unknown value {word!r}. Valid values (comma-separated): {', '.join(valid)}")
    return changes


def allow_untested(environ: Optional[Mapping[str, str]] = None) -> bool:
    """``MIMO_ACCEL_ALLOW_UNTESTED``: "1" allows an untested upstream; unset, "" or "0" do not."""
    raw = (os.environ if environ is None else environ).get(ENV_ALLOW_UNTESTED, "").strip()
    if raw not in ("", "0", "1"):
        raise ConfigError(f"{ENV_ALLOW_UNTESTED}={raw!r}: use 1 (allow an untested megatron-bridge/"
                          "megatron-core with the nearest shape) or 0 / unset (refuse it)")
    return raw == "1"


def unknown_variables(environ: Optional[Mapping[str, str]] = None) -> list[str]:
    """One line for each ``MIMO_ACCEL*`` variable mimo_accel does not read (in any letter case),
    naming the closest known one."""
    import difflib

    env = os.environ if environ is None else environ
    lines = []
    for name in sorted(env):
        upper = name.upper()
        if name in KNOWN_ENV or not (upper == ENV_FEATURES or upper.startswith(ENV_FEATURES + "_")):
            continue
        if upper in KNOWN_ENV:  # only the letter case differs
            close = [upper]
        else:  # the part after MIMO_ACCEL_ decides (every name shares the prefix)
            prefix = ENV_FEATURES + "_"
            suffixes = {var[len(prefix):]: var for var in KNOWN_ENV if var.startswith(prefix)}
            typed = upper[len(prefix):]
            close = [suffixes[m] for m in difflib.get_close_matches(typed, suffixes, n=1, cutoff=0.6)]
            if not close and typed:  # a part of one name (PAD of PAD_MULTIPLE), or the CLI's word for the switches
                close = [var for suffix, var in suffixes.items() if suffix.startswith(typed)
                         or typed in suffix.split("_")]
                close = close if len(close) == 1 else [ENV_FEATURES] if typed in ("FEATURES", "FEATURE") else []
        hint = f"did you mean {close[0]}?" if close else f"the variables are {', '.join(KNOWN_ENV)}"
        lines.append(f"{name} is not a mimo_accel variable ({hint})")
    return lines


def check_environment(environ: Mapping[str, str]) -> "AccelConfig":
    """Every ``MIMO_ACCEL*`` variable of a job's environment, before the job starts: the config
    they describe, or ConfigError for an unknown name or a bad value (``mimo-accel run`` / ``env``)."""
    unknown = unknown_variables(environ)
    if unknown:
        raise ConfigError("; ".join(unknown) + ": rename or unset it")
    allow_untested(environ)
    raw = environ.get(ENV_TRACEBACK, "").strip()
    if raw not in ("", "0", "1"):
        raise ConfigError(f"{ENV_TRACEBACK}={raw!r}: use 1 (a mimo-accel command's error with its traceback) or "
                          "0 / unset")
    return AccelConfig.from_env(environ)


def resolve(config: Optional[AccelConfig], overrides: Mapping[str, object],
            environ: Optional[Mapping[str, str]] = None) -> AccelConfig:
    """Explicit config/overrides over the environment over defaults."""
    base = config if config is not None else AccelConfig.from_env(environ)
    return base.replace(**overrides) if overrides else base
