"""Like with like: what each run had on (its header's features), why two runs are not comparable
(other step counts, other samples, an equal-work run given as a run), what each run adds to the one
before it and what that gained, and the report's one-line verdict.

Runs are compared in the order given: each with the one before it (a feature added a run: the
gain of that feature alone) and with the first.
"""

from __future__ import annotations

from typing import Any, Optional

from mimo_accel.tools.report.comparison import compare, lookup, timed_modules
from mimo_accel.tools.report.work import same_work

Side = tuple[str, dict[str, Any]]  # (what the report calls the run, its summary)

#: Within this share of 1 a ratio is no change (the console's colours use the same band).
NO_CHANGE = 0.02


def names(count: int) -> list[str]:
    """What the report calls ``count`` runs: run, before and after, else A, B, C, ..."""
    if count == 1:
        return ["run"]
    if count == 2:
        return ["before", "after"]
    return [chr(ord("A") + i) if i < 26 else f"R{i + 1}" for i in range(count)]


def features_text(s: dict[str, Any]) -> str:
    """A run's features as its header has them: ``sharded_reads, packing``, ``none``, or ``unknown``
    (a header that does not say)."""
    feats = s.get("features")
    if feats is None:
        return "unknown"
    return ", ".join(feats) if feats else "none"


def delta(before: dict[str, Any], after: dict[str, Any]) -> Optional[tuple[list[str], list[str]]]:
    """``(added, removed)`` features from ``before`` to ``after``; None where either run's are unknown."""
    a, b = before.get("features"), after.get("features")
    if a is None or b is None:
        return None
    return [f for f in b if f not in a], [f for f in a if f not in b]


def delta_text(before: dict[str, Any], after: dict[str, Any]) -> str:
    """``+reorder``, ``+reorder +packing -sharded_reads``, ``same features`` or ``features unknown``."""
    d = delta(before, after)
    if d is None:
        return "features unknown"
    words = [f"+{f}" for f in d[0]] + [f"-{f}" for f in d[1]]
    return " ".join(words) if words else "same features"


def reasons(first: Side, other: Side) -> list[str]:
    """Why ``other`` cannot be compared with ``first`` as a run: each reason one sentence naming the
    fix; [] where nothing is known against it. A run whose replicas all computed the same work each
    step is a perfect balance where it trained the samples of the run it is compared with, and the
    machine's floor (an equal-work run) where it did not, or where that cannot be told."""
    (fn, f), (on, o) = first, other
    out = []
    same, where = same_work(f, o)
    for name, s in ((fn, f), (on, o)):
        if s.get("equal_work") is True and same is not True and not (f.get("equal_work") and o.get("equal_work")):
            out.append(f"{name} is an equal-work run (every replica computed the same work each step): the "
                       f"machine's floor, not a run to compare; give it as --floor {s.get('directory') or 'DIR'}")
    if f.get("steps_counted") != o.get("steps_counted"):
        out.append(f"{fn} counted {f.get('steps_counted')} steps and {on} {o.get('steps_counted')}: their figures "
                   "cover different spans of training; run both for the same number of iterations")
    if same is False and not any("equal-work" in r for r in out):
        out.append(f"{fn} and {on} did not train the same samples ({where}): another dataset, seed or order; "
                   "compare runs over the same data")
    return out


def _short(reason: str) -> str:
    if "equal-work" in reason:
        return "a floor given as a run"
    if "counted" in reason:
        return "different step counts"
    return "different samples"


def gain_keys(sides: list[Side]) -> list[tuple[str, str, bool]]:
    """The figures a gain is told by: ``(key, label, lower_is_better)``: the step, the throughput,
    and every module's straggler and slowest replica."""
    keys = [("step_time_p50", "step time p50", True), ("samples_per_s", "throughput", False)]
    for m in timed_modules(*(s for _, s in sides)):
        keys += [(f"{m}_max_over_mean_p50", f"{m} straggler p50", True),
                 (f"{m}_max_mean", f"{m} slowest replica", True)]
    return keys


def ratio(a: Any, b: Any) -> Optional[float]:
    """``b / a`` where both are numbers and ``a`` is not 0, else None."""
    return b / a if isinstance(a, (int, float)) and isinstance(b, (int, float)) and a else None


def gains(sides: list[Side]) -> list[dict[str, Any]]:
    """For each run after the first: what it adds to the one before (``adds``; ``feature`` where it
    adds exactly one and drops none: the gain is that feature's), and the ratio of each gain figure
    over the run before (``over_previous``) and over the first (``over_first``); ``comparable``:
    False where :func:`reasons` has one against it or the run before."""
    keys = gain_keys(sides)
    out = []
    first = sides[0]
    for i in range(1, len(sides)):
        (pn, p), (n, s) = sides[i - 1], sides[i]
        d = delta(p, s)
        out.append({
            "run": n, "label": s.get("label"), "adds": delta_text(p, s),
            "feature": d[0][0] if d is not None and len(d[0]) == 1 and not d[1] else None,
            "comparable": not reasons(sides[i - 1], sides[i]) and not reasons(first, sides[i]),
            "over_previous": {k: ratio(lookup(p, k), lookup(s, k)) for k, _, _ in keys},
            "over_first": {k: ratio(lookup(first[1], k), lookup(s, k)) for k, _, _ in keys},
        })
    return out


def change_text(ratio: Optional[float]) -> str:
    return "—" if ratio is None else f"×{ratio:.2f} ({round((ratio - 1) * 100):+d}%)"


def attributions(sides: list[Side], found: list[dict[str, Any]]) -> list[str]:
    """One line for each run that adds one feature alone to a comparable run before it: the
    feature, and the figure it changed most beside the step's."""
    labels = {k: (label, lower) for k, label, lower in gain_keys(sides)}
    lines = []
    for g in found:
        if not g["feature"] or not g["comparable"]:
            continue
        moved = {k: r for k, r in g["over_previous"].items() if r is not None and k not in ("step_time_p50",
                                                                                           "samples_per_s")}
        # the figure it improved most (a lower-is-better ratio below 1, else its inverse)
        best = min(moved, key=lambda k: moved[k] if labels[k][1] else 1 / moved[k], default=None)
        parts = [f"step time {change_text(g['over_previous']['step_time_p50'])}"]
        if best is not None and abs(moved[best] - 1) > NO_CHANGE:
            parts.append(f"{labels[best][0]} {change_text(moved[best])}")
        elif moved:
            parts.append(f"no module's figure moved more than {NO_CHANGE:.0%}")
        lines.append(f"{g['feature']} ({g['run']} over the run before): {', '.join(parts)}")
    return lines


def verdict(sides: list[Side]) -> Optional[str]:
    """The report's one line: where runs are not like with like, why; else the last run against the
    first (step time and throughput), and how many features it adds at once. None for one run."""
    if len(sides) < 2:
        return None
    (fn, f), (ln, last) = sides[0], sides[-1]
    why = list(dict.fromkeys(_short(r) for i in range(1, len(sides)) for r in reasons(sides[0], sides[i])))
    if why:
        return f"not like with like ({', '.join(why)}): the changes below are no gain; see the warnings"
    step = ratio(lookup(f, "step_time_p50"), lookup(last, "step_time_p50"))
    speed = ratio(lookup(f, "samples_per_s"), lookup(last, "samples_per_s"))
    how = ("no faster" if step is None or abs(step - 1) <= NO_CHANGE else "faster" if step < 1 else "slower")
    text = (f"{ln} ({features_text(last)}) is {how} than {fn} ({features_text(f)}): step time p50 "
            f"{change_text(step)}, throughput {change_text(speed)}")
    d = delta(f, last)
    if len(sides) == 2 and d is not None and len(d[0]) + len(d[1]) > 1:
        text += f"; {len(d[0]) + len(d[1])} features changed at once (report A B C ...: one a run splits the gain)"
    return text


def warnings(sides: list[Side]) -> list[str]:
    """Every warning of a report: each run's own (named where there are several), then why each run
    is not comparable with the first (:func:`reasons`, and what :func:`compare` finds)."""
    several = len(sides) > 1
    out = [f"{n}: {w}" if several else w for n, s in sides for w in s.get("warnings", [])]
    for other in sides[1:]:
        out += compare(sides[0][1], other[1], (sides[0][0], other[0]))["warnings"]
        out += reasons(sides[0], other)
    return list(dict.fromkeys(out))
