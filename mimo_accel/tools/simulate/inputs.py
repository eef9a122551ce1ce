"""What a simulation is given: the DP sizes swept, each module's DP rule, every sample's cost per module."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from mimo_accel.costs import CostIndex, CostModel
from mimo_accel.modules import LANGUAGE, Modules
from mimo_accel.planner import CostIndexPlanner
from mimo_accel.workloads import AUDIO, Profile


# ------------------------------------------------------------------------------------- inputs


def parse_dp_list(text: str) -> list[int]:
    """``"2,4,8"`` or ``"2,4,8,...,512"`` (the step of the last two values, geometric or
    arithmetic, continued up to the value after ``...``) -> sorted unique DP sizes. The step is
    geometric when the second value is a multiple (> 1) of the first: ``1,3,...,9`` is 1, 3, 9."""
    parts = [p.strip() for p in str(text).split(",") if p.strip()]
    out: list[int] = []
    i = 0
    while i < len(parts):
        p = parts[i]
        if p in ("...", "…"):
            if len(out) < 2 or i + 1 >= len(parts):
                raise ValueError(f"--dp {text!r}: '...' needs two values before it and one after, e.g. 2,4,...,512")
            a, b = out[-2], out[-1]
            end = _dp_int(parts[i + 1], text)
            geometric = b > a and b % a == 0 and b // a > 1
            step = b // a if geometric else b - a
            if step < (2 if geometric else 1):
                raise ValueError(f"--dp {text!r}: the values before '...' must increase")
            x = b
            while True:
                x = x * step if geometric else x + step
                if x > end:
                    break
                out.append(x)
            if out[-1] != end:
                raise ValueError(
                    f"--dp {text!r}: {end} is not reached from {a}, {b} ({'x' if geometric else '+'}{step}); "
                    "give values that lead to the last one"
                )
            i += 2
            continue
        out.append(_dp_int(p, text))
        i += 1
    if not out:
        raise ValueError("--dp: give at least one DP size, e.g. 2,4,...,512")
    return sorted(set(out))


def _dp_int(p: str, text: str) -> int:
    try:
        v = int(p)
    except ValueError:
        raise ValueError(f"--dp {text!r}: {p!r} is not a whole number") from None
    if v < 1:
        raise ValueError(f"--dp {text!r}: DP sizes must be >= 1, got {v}")
    return v


def dp_rule_value(rule: Any, what: str) -> str | float:
    if rule in ("ratio", "equal"):
        return rule
    try:
        factor = float(rule)
    except (TypeError, ValueError):
        factor = -1.0
    if not (math.isfinite(factor) and factor > 0):
        raise ValueError(f"{what} DP rule must be 'ratio' or 'equal', got {rule!r}"
                         " (or a positive number: that many replicas per replica of the lead encoder)")
    return factor


def lead_encoder_of(profile: Profile) -> str:
    """The encoder whose DP the simulation sweeps: the profile's first encoder."""
    return profile.modules.encoders[0].name


def dp_for(profile: Profile, module: str, dp: int, rule: str | float = "ratio") -> int:
    """Module ``module``'s DP simulated next to the lead encoder's DP ``dp`` (see the module
    docstring): the profile layout's ratio, ``equal``, or ``rule`` replicas per lead replica."""
    rule = dp_rule_value(rule, module)
    if rule == "equal":
        return dp
    factor = profile.modules[module].dp / profile.modules[lead_encoder_of(profile)].dp if rule == "ratio" else rule
    return max(1, round(dp * factor))


def language_dp_for(profile: Profile, dp: int, rule: str | float = "ratio") -> int:
    """The language DP simulated next to the lead encoder's DP ``dp``."""
    return dp_for(profile, LANGUAGE, dp, rule)


def audio_dp_for(profile: Profile, dp: int, rule: str | float = "ratio") -> int | None:
    """The audio encoder's DP next to the lead encoder's DP ``dp`` (None: the profile has no audio encoder)."""
    return dp_for(profile, AUDIO, dp, rule) if AUDIO in profile.modules else None


def sample_costs(index: CostIndex, model: CostModel, modules: Modules) -> dict[str, np.ndarray]:
    """Every module's cost of every sample of ``index``: the planner's own pricing
    (:meth:`mimo_accel.planner.CostIndexPlanner.costs`), so the simulation plans what the job plans."""
    return CostIndexPlanner(index, model, modules).costs(np.arange(len(index)))
