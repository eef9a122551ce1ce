"""What a profile's step lines give each module's cost fit (``mimo-accel calibrate``).

A :class:`ProfileSpec` names a module's time fields and features in the profiler's step lines
(:func:`encoder_spec`, :func:`language_spec`); :func:`observe` reads a run's usable rank-steps for
it, and :func:`modules_in` says which modules a run records.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from mimo_accel.modules import LANGUAGE, replica_seconds
from mimo_accel.profiler.run import Run
from mimo_accel.profiler import record_number as _num

__all__ = ["CalibrationError", "ProfileSpec", "encoder_spec", "language_spec", "modules_in", "observe"]


class CalibrationError(ValueError):
    """A run that cannot be calibrated from; the message says why and what to record instead."""


@dataclass(frozen=True)
class ProfileSpec:
    """What one module's fit reads from the step lines and says in its messages."""

    module: str  # the module's name (the model's key)
    regions: tuple[str, str]  # the forward and backward time fields
    features: tuple[tuple[str, str], ...]  # (step field, coefficient); the first is required, the others too
    optional: str  # the attention field that older logs may lack (fitted only where every step has it)
    what: str  # "vision" / "audio" / "language": how messages name the module's steps
    labels: dict  # coefficient -> feature label in messages
    units: dict  # coefficient -> units
    nothing: str  # why the first feature must be observed

    @property
    def coefficients(self) -> tuple[str, ...]:
        return tuple(c for _, c in self.features)


def encoder_spec(module: str) -> ProfileSpec:
    """An encoder ``module``'s fit: ``<m>_fwd_s + <m>_bwd_s`` against ``<m>_rows``, ``<m>_sq_rows``
    (Σ rows² over its items: the attention term) and ``<m>_items``."""
    return ProfileSpec(module, (f"{module}_fwd_s", f"{module}_bwd_s"),
                 ((f"{module}_rows", "a"), (f"{module}_sq_rows", "b"), (f"{module}_items", "k")),
                 f"{module}_sq_rows", module,
                 {"a": f"{module}_rows", "b": f"{module}_sq_rows", "k": f"{module}_items",
                  "overhead": "the per-step overhead"},
                 {"a": "s / row", "b": "s / row²", "k": "s / item", "overhead": "s / step"},
                 f"no usable {module} step has any rows (the encoder saw no input), so no cost can be fitted; "
                 f"profile steps where the {module} encoder has work")


def language_spec(module: str = LANGUAGE) -> ProfileSpec:
    """The language model's fit: ``language_fwd_s + language_bwd_s`` against ``tokens`` (the
    replica's real tokens) and ``sq_tokens`` (Σ over its samples of L²)."""
    return ProfileSpec(module, (f"{module}_fwd_s", f"{module}_bwd_s"), (("tokens", "a"), ("sq_tokens", "b")),
                 "sq_tokens", module, {"a": "tokens", "b": "sq_tokens", "overhead": "the per-step overhead"},
                 {"a": "s / token", "b": "s / token²", "overhead": "s / step"},
                 f"no usable {module} step has any tokens, so no cost can be fitted")


def _stages_summed(run: Run, spec: ProfileSpec, timed: list) -> list:
    """Where the module runs PP stages (the header's ``layout["pp"]``), one observation per replica
    and step (:func:`~mimo_accel.modules.replica_seconds`), its features the largest any of its
    ranks counted. Without PP stages, one observation per rank-step."""
    stages = int((run.layout.get("pp") or {}).get(spec.module) or 1)
    if stages <= 1:
        return timed
    fwd_key, bwd_key = spec.regions
    members: dict = {}
    for rank, rec in timed:
        members.setdefault((run.ranks[rank].dp_rank, int(rec["step"])), []).append((rank, rec))
    out = []
    for (_, step), group in sorted(members.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        times = {rank: (_num(rec, fwd_key) or 0.0) + (_num(rec, bwd_key) or 0.0) for rank, rec in group}
        rec = {"step": step, fwd_key: replica_seconds(times, stages)}
        for f, _ in spec.features:
            values = [v for _, r in group if (v := _num(r, f)) is not None]
            rec[f] = max(values) if len(values) == len(group) else None
        out.append((min(times), rec))
    return out


def observe(run: Run, spec: ProfileSpec, *, warmup: int = 1) -> dict[str, Any]:
    """The usable steps of ``spec``'s module in ``run`` (one entry per rank-step)."""
    fwd_key, bwd_key = spec.regions
    timed = [(log.rank, rec) for log in run.ranks.values() for rec in log.steps
             if _num(rec, fwd_key) is not None or _num(rec, bwd_key) is not None]
    if not timed:
        modules = sorted({log.module for log in run.ranks.values()})
        raise CalibrationError(
            f"{run.directory}: no {spec.what} steps in the run (no step line has {fwd_key}/{bwd_key};"
            f" modules seen: {', '.join(modules)}); profile a run with the {spec.what}"
            f"{' encoder' if spec.what != LANGUAGE else ' model'} timed"
            f" (mimo_accel profiler on the {spec.what} ranks)"
        )
    timed = _stages_summed(run, spec, timed)
    numbers = sorted({int(rec["step"]) for _, rec in timed})
    skipped = numbers[:warmup] if warmup > 0 and len(numbers) > warmup else []
    skip = set(skipped)
    required = [f for f, _ in spec.features if f != spec.optional]
    y, steps, ranks, columns = [], [], set(), {f: [] for f, _ in spec.features}
    dropped = 0
    for rank, rec in timed:
        if int(rec["step"]) in skip:
            continue
        seconds = (_num(rec, fwd_key) or 0.0) + (_num(rec, bwd_key) or 0.0)
        values = {f: _num(rec, f) for f in required}
        if seconds < 0 or any(v is None or v < 0 for v in values.values()):
            dropped += 1
            continue
        y.append(seconds)
        for f in required:
            columns[f].append(values[f])
        sq = _num(rec, spec.optional)
        first = values[spec.features[0][0]]
        # Σx² >= Σx > 0 whenever there is work: a 0 there is a log that did not record it.
        columns[spec.optional].append(sq if sq is not None and sq >= 0 and not (sq == 0 and first > 0) else None)
        steps.append(int(rec["step"]))
        ranks.add(rank)
    out = {f: (np.asarray(v, dtype=np.float64) if f != spec.optional else v) for f, v in columns.items()}
    out.update({"y": np.asarray(y, dtype=np.float64), "steps": np.asarray(steps, dtype=np.int64),
                "ranks": sorted(ranks), "skipped_warmup": skipped, "dropped": dropped})
    return out



def modules_in(run: Run) -> list[str]:
    """The modules whose own counters the run records (``<m>_rows`` for an encoder, ``tokens`` with
    ``language_fwd_s``/``language_bwd_s`` for the language model), in rank order; empty for a run
    that times no module."""
    found: dict[str, None] = {}
    for r in sorted(run.ranks):
        log = run.ranks[r]
        for rec in log.steps:
            for key in rec:
                if key.endswith("_rows") and not key.endswith("_sq_rows"):
                    m = key[:-len("_rows")]
                    if _num(rec, f"{m}_fwd_s") is not None or _num(rec, f"{m}_bwd_s") is not None:
                        found.setdefault(m, None)
            if _num(rec, f"{LANGUAGE}_fwd_s") is not None or _num(rec, f"{LANGUAGE}_bwd_s") is not None:
                found.setdefault(LANGUAGE, None)
    if found and LANGUAGE in found and len(found) == 1:
        return [LANGUAGE]
    return list(found)
