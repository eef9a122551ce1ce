"""Which run each rank file of a profile directory belongs to (offline, torch-free).

A header's ``run_id`` is the same on every rank of one run (:mod:`mimo_accel.runtime.measuring.run_id`).
Files written before it was recorded carry none; for them the only evidence is their clocks: the
ranks of one run end each step within about a step of each other (every step exchanges activations
and gradients between them), so a file whose steps ended far from the others' same steps cannot
be of the same run.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from typing import Any, Optional

#: Step ends further apart than this many of the run's longest steps (and than ``_CLOCK_SLACK_S``)
#: cannot be one run's (a rank runs at most a step ahead; clocks of one cluster agree to far less).
_STEPS_APART = 4
_CLOCK_SLACK_S = 30.0

NO_RUN = "no run id"  # the group of files without one, where others have one


def run_of(header: Optional[dict[str, Any]]) -> Optional[str]:
    """The run a file's header names (None: an older file, or no header)."""
    run = (header or {}).get("run_id")
    return str(run) if run not in (None, "") else None


def files(ranks: Iterable[int]) -> str:
    """``rank0.jsonl to rank4.jsonl, rank6.jsonl``: rank files by name, consecutive ones as a span."""
    ranks = sorted(ranks)
    spans: list[list[int]] = []
    for r in ranks:
        if spans and r == spans[-1][1] + 1:
            spans[-1][1] = r
        else:
            spans.append([r, r])
    parts = []
    for lo, hi in spans:
        if hi - lo >= 2:
            parts.append(f"rank{lo}.jsonl to rank{hi}.jsonl")
        else:
            parts += [f"rank{r}.jsonl" for r in range(lo, hi + 1)]
    return ", ".join(parts)


def by_run(headers: dict[int, Optional[dict[str, Any]]]) -> dict[str, list[int]]:
    """Each run's ranks, the run with the most files first (ties: by id); files without a run id
    where others have one as the group :data:`NO_RUN`; {} where no file has one."""
    groups: dict[str, list[int]] = {}
    for rank in sorted(headers):
        groups.setdefault(run_of(headers[rank]) or NO_RUN, []).append(rank)
    if set(groups) == {NO_RUN}:
        return {}
    return dict(sorted(groups.items(), key=lambda kv: (-len(kv[1]), kv[0] == NO_RUN, kv[0])))


def by_clock(steps: dict[int, list[dict[str, Any]]]) -> list[tuple[list[int], float]]:
    """The ranks whose step ends can be one run's, as groups with their offset in seconds (one
    group: no evidence of two runs), from the step lines' wall-clock ``t``: each rank's median
    offset from the median end of the same step over the ranks, split where two offsets are further
    apart than the run's longest steps allow. Ranks without clocked steps shared with another are
    left out."""
    ends: dict[int, dict[int, float]] = {}
    longest = 0.0
    for rank, recs in steps.items():
        for rec in recs:
            t, st = rec.get("t"), rec.get("step_time_s")
            if isinstance(t, (int, float)) and isinstance(rec.get("step"), int):
                ends.setdefault(rank, {})[rec["step"]] = float(t)
            if isinstance(st, (int, float)):
                longest = max(longest, float(st))
    shared: dict[int, list[float]] = {}
    for rank, own in ends.items():
        for step in own:
            shared.setdefault(step, [])
    for step in shared:
        shared[step] = [own[step] for own in ends.values() if step in own]
    offsets = {}
    for rank, own in ends.items():
        diffs = [t - statistics.median(shared[s]) for s, t in own.items() if len(shared[s]) > 1]
        if diffs:
            offsets[rank] = statistics.median(diffs)
    apart = max(_CLOCK_SLACK_S, _STEPS_APART * longest)
    groups: list[list[int]] = []
    last = None
    for rank, offset in sorted(offsets.items(), key=lambda kv: kv[1]):
        if last is None or offset - last > apart:
            groups.append([])
        groups[-1].append(rank)
        last = offset
    return [(sorted(g), statistics.median(offsets[r] for r in g)) for g in groups]
