"""AccelConfig: which features are on, and their options. Every feature is off by default.

Precedence: explicit ``enable()`` arguments > environment (``MIMO_ACCEL*``) > defaults.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from typing import Mapping, Optional

ENV_FEATURES = "MIMO_ACCEL"
ENV_PROFILE = "MIMO_ACCEL_PROFILE"  # output directory; also turns the profiler on
ENV_COST = "MIMO_ACCEL_COST"  # cost-model file (from `mimo-accel calibrate`)
ENV_COST_INDEX = "MIMO_ACCEL_COST_INDEX"  # per-sample cost index (from `mimo-accel index`)
ENV_REORDER_MODE = "MIMO_ACCEL_REORDER_MODE"
ENV_PAD_MULTIPLE = "MIMO_ACCEL_PAD_MULTIPLE"
ENV_REORDER_WINDOW = "MIMO_ACCEL_REORDER_WINDOW"
ENV_STRICT_GRADIENTS = "MIMO_ACCEL_STRICT_GRADIENTS"  # 1: refuse what would change the gradient

# MIMO_ACCEL=<comma list>: the words users write, and the fields they turn on.
FEATURE_WORDS = {
    "shard": ("sharded_reads",),
    "sharded_reads": ("sharded_reads",),
    "reorder": ("sharded_reads", "reorder"),
    "pack": ("packing",),
    "packing": ("packing",),
    "profile": ("profile",),
}
ALL_WORDS = ("all",)
OFF_WORDS = ("", "0", "off", "none", "false")
REORDER_MODES = ("plan", "exchange")


class ConfigError(ValueError):
    """A bad configuration value; the message names the fix."""


@dataclass(frozen=True)
class AccelConfig:
    """What ``mimo_accel.enable()`` turns on.

    sharded_reads: each data rank reads only its module replica's share of the global micro-batch
        (canonical grid G = lcm of module DPs); the forward step no longer slices.
    reorder: balance vision cost across the module DP replicas inside each global micro-batch
        (implies sharded_reads).
    reorder_mode: "plan" (default: costs known before reading, from a cost index; zero bytes move)
        or "exchange" (costs known after decoding; samples move with one all_to_all).
    reorder_window: how many consecutive global micro-batches are planned together (set it to the
        micro-batches per step to balance across the whole global batch; samples then move between
        the micro-batches of a step, never between steps).
    cost_model: path of a cost-model file (``mimo-accel calibrate``), or None for the default
        coefficients.
    cost_index: path of a per-sample cost index (``mimo-accel index``); None means the dataset must
        provide one (``dataset.mimo_accel_cost_index``).
    packing: THD-pack the language shard (no compute on padding).
    pad_multiple: pad every packed segment to a multiple of this (context parallelism needs 2·cp).
    profile: None (off) or the directory the per-rank profiler writes ``rank<N>.jsonl`` to.
    strict_gradients: refuse (an error naming the fix) a reorder that would change the gradient,
        not only who computes it: with the language model's ``calculate_per_token_loss=False``
        each language replica's loss is a mean over its own tokens. Off: said once.
    """

    sharded_reads: bool = False
    reorder: bool = False
    reorder_mode: str = "plan"
    reorder_window: int = 1
    cost_model: Optional[str] = None
    cost_index: Optional[str] = None
    packing: bool = False
    pad_multiple: int = 1
    profile: Optional[str] = None
    strict_gradients: bool = False

    def __post_init__(self) -> None:
        if self.reorder and not self.sharded_reads:
            object.__setattr__(self, "sharded_reads", True)  # reorder implies sharded reads
        if self.reorder_mode not in REORDER_MODES:
            raise ConfigError(f"reorder_mode={self.reorder_mode!r} is not one of {REORDER_MODES}")
        if not isinstance(self.reorder_window, int) or isinstance(self.reorder_window, bool) or self.reorder_window < 1:
            raise ConfigError(f"reorder_window must be a positive integer, got {self.reorder_window!r}")
        if not isinstance(self.pad_multiple, int) or isinstance(self.pad_multiple, bool) or self.pad_multiple < 1:
            raise ConfigError(f"pad_multiple must be a positive integer, got {self.pad_multiple!r}")
        if not isinstance(self.strict_gradients, bool):
            raise ConfigError(f"strict_gradients must be True or False, got {self.strict_gradients!r}")
        if self.profile is not None and not str(self.profile):
            raise ConfigError("profile must be None or a directory path")

    @property
    def any_feature(self) -> bool:
        return self.sharded_reads or self.reorder or self.packing or self.profile is not None

    def features(self) -> list[str]:
        names = [n for n in ("sharded_reads", "reorder", "packing") if getattr(self, n)]
        return names + (["profile"] if self.profile is not None else [])

    def replace(self, **changes) -> "AccelConfig":
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise ConfigError(f"unknown option(s) {sorted(unknown)}; valid options: "
                              f"{[f.name for f in dataclasses.fields(self)]}")
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_env(cls, environ: Optional[Mapping[str, str]] = None) -> "AccelConfig":
        """The configuration the ``MIMO_ACCEL*`` variables describe (defaults where unset)."""
        env = os.environ if environ is None else environ
        changes: dict = {}
        raw = env.get(ENV_FEATURES, "").strip().lower()
        words = [w.strip() for w in raw.split(",") if w.strip()] if raw not in OFF_WORDS else []
        for word in words:
            if word in ALL_WORDS:
                changes.update(sharded_reads=True, reorder=True, packing=True)
            elif word in FEATURE_WORDS:
                for name in FEATURE_WORDS[word]:
                    changes[name] = True
            else:
                valid = sorted(set(FEATURE_WORDS) | set(ALL_WORDS)) + ["0 (off)"]
                raise ConfigError(f"{ENV_FEATURES}={env.get(ENV_FEATURES)!r}: unknown value {word!r}. "
                                  f"Valid values (comma-separated): {', '.join(valid)}")
        profile_dir = env.get(ENV_PROFILE)
        if changes.pop("profile", False) or profile_dir:
            changes["profile"] = profile_dir or "mimo-accel-profile"
        if env.get(ENV_COST):
            changes["cost_model"] = env[ENV_COST]
        if env.get(ENV_COST_INDEX):
            changes["cost_index"] = env[ENV_COST_INDEX]
        if env.get(ENV_REORDER_MODE):
            changes["reorder_mode"] = env[ENV_REORDER_MODE].strip().lower()
        if env.get(ENV_STRICT_GRADIENTS):
            raw_strict = env[ENV_STRICT_GRADIENTS].strip().lower()
            if raw_strict not in ("0", "1", "true", "false", "on", "off", "yes", "no"):
                raise ConfigError(f"{ENV_STRICT_GRADIENTS}={env[ENV_STRICT_GRADIENTS]!r}: expected 1 or 0")
            changes["strict_gradients"] = raw_strict in ("1", "true", "on", "yes")
        for var, name in ((ENV_PAD_MULTIPLE, "pad_multiple"), (ENV_REORDER_WINDOW, "reorder_window")):
            if env.get(var):
                try:
                    changes[name] = int(env[var])
                except ValueError:
                    raise ConfigError(f"{var}={env[var]!r} is not an integer") from None
        return cls(**changes)


def resolve(config: Optional[AccelConfig], overrides: Mapping[str, object],
            environ: Optional[Mapping[str, str]] = None) -> AccelConfig:
    """Explicit config/overrides over the environment over defaults."""
    base = config if config is not None else AccelConfig.from_env(environ)
    return base.replace(**overrides) if overrides else base
