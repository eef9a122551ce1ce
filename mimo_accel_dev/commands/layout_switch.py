"""``make demo-reference``'s switch: the reference run continued on the layout the advisor checked.

The reference layout trains its steps and saves at the half (``--save-interval``). The layout the
layout check rehearses (:mod:`~mimo_accel_dev.commands.layout_check`: the advisor's recommendation,
its uneven split included, or what stands for it) resumes from that checkpoint (as a job that died
after it leaves it) and trains to the end, as ``mimo-accel layout --from`` says to continue a run
(:mod:`mimo_accel.tools.layout.continuation`). Per iteration after the switch each module trains the
uninterrupted run's samples, each once, and the global per-step loss stays within
:data:`~mimo_accel_dev.commands.layout_check.LOSS_TOLERANCE` of it; the replayed step after the switch
is held against the advisor's prediction, beside the reference's own before and after it.

The resume takes the flags ``layout --from`` says continue the run: the checkpoint holds each rank's
RNG state by its TP/PP rank (Bridge's ``save_rng`` default), which Bridge's MegatronMIMO load does not
reshard, so where the layout changes a module's TP or PP it names ``load_rng=False``, which the resume
sets (``--no-load-rng``; the rehearsal's models have no dropout).
"""

from __future__ import annotations

import shutil
import statistics
from pathlib import Path
from typing import Any, Optional

from mimo_accel_dev.rehearse.rehearsal import InvariantViolation


def interrupted_after(ckpt: Path, iteration: int) -> Path:
    """A copy of the checkpoint directory ``ckpt`` holding only the checkpoint of ``iteration`` (and
    mimo_accel's learnt cost models beside it), as a job that died in the next iteration leaves it."""
    kept = ckpt.parent / f"{ckpt.name}-after-{iteration}"
    shutil.rmtree(kept, ignore_errors=True)
    name = f"iter_{iteration:07d}"
    shutil.copytree(ckpt / name, kept / name)
    if (ckpt / "mimo_accel").is_dir():
        shutil.copytree(ckpt / "mimo_accel", kept / "mimo_accel")
    (kept / "latest_checkpointed_iteration.txt").write_text(str(iteration))
    return kept


def save_argv(ckpt: Path, steps: int) -> list[str]:
    """The reference run's flags to save at the half of its ``steps`` (and at its end, as Bridge does)."""
    return ["--save", str(ckpt), "--save-interval", str(steps // 2)]


def resume_argv(kept: Path, way) -> list[str]:
    """The example's flags that resume from ``kept`` as ``mimo-accel layout --from`` says to continue the
    run (``way``, its :class:`~mimo_accel.tools.layout.continuation.Continuation`): with ``--no-load-rng``
    where it says the RNG states cannot carry over (the fix it names); InvariantViolation where it says
    anything else cannot."""
    stops = [b for b in way.barriers if b.what != "rng"]
    if stops:
        raise InvariantViolation(f"mimo-accel layout says the run cannot continue on {way.layout}: {stops[0].line()}")
    return ["--load", str(kept), *(["--no-load-rng"] if way.barriers else [])]


def trained_ids(records: list[dict]) -> dict[int, dict[str, list[int]]]:
    """iteration -> module -> the sorted sample ids it trained (each replica's first stage)."""
    out: dict[int, dict[str, list[int]]] = {}
    seen = set()
    for r in records:
        place = (r["iteration"], r["module"], r["dp_rank"])
        if r.get("pp_rank", 0) or place in seen:  # a replica's stages and TP ranks train the same samples
            continue
        seen.add(place)
        out.setdefault(r["iteration"], {}).setdefault(r["module"], []).extend(i for m in r["ids"] for i in m)
    return {it: {m: sorted(v) for m, v in mods.items()} for it, mods in sorted(out.items())}


def _replayed(run_dir: Path, first: int, last: int) -> Optional[float]:
    """The median replayed step of a profile over its steps ``first``..``last``, counted from the run's
    start (a resumed run's too: step 0 is its first iteration, its warm-up, left out); None where it
    has none there."""
    from mimo_accel.profiler.run import read_run
    from mimo_accel.tools.report.summary import summarize

    series = summarize(read_run(run_dir))["series"]["replayed"]
    steps = [t for s, t in zip(series["step"], series["step_time_replayed_s"]) if first <= s <= last]
    return statistics.median(steps) if steps else None


def switch_check(advice, checked, at: int, steps: int, reference_dir: Path, reference_records: list[dict],
                 reference_steps: list[dict], switch_dir: Path, switch_records: list[dict],
                 switch_steps: list[dict], way=None) -> dict[str, Any]:
    """The JSON's ``layout_check.switch``: the reference run saved at ``at`` and continued to ``steps`` on
    the checked layout (``switch_*``: its profile, trace and :func:`bridge_steps` from ``at + 1``).
    Raises where it trained other samples than the uninterrupted run, or another loss."""
    from mimo_accel_dev.commands.layout_check import LOSS_TOLERANCE, compare_losses

    want, got = trained_ids(reference_records), trained_ids(switch_records)
    after = list(range(at + 1, steps + 1))
    if list(got) != after:
        raise InvariantViolation(f"the switch to {checked.spec} trained iterations {list(got)}, not {after}")
    for it in after:
        if got[it] != want[it]:
            raise InvariantViolation(f"the switch to {checked.spec}, iteration {it}: other samples than the "
                                     f"uninterrupted run ({ {m: len(v) for m, v in got[it].items()} } against "
                                     f"{ {m: len(v) for m, v in want[it].items()} })")
    diff = compare_losses(reference_steps[at:], {checked.spec: switch_steps})[checked.spec]
    predicted = checked.row.accelerated.step_time_s
    # the reference's steps 0..at-1 are iterations 1..at, the resumed run's 0.. iterations at+1..; the
    # first step after a start pays for its allocations: the profiles leave it out
    replayed = {"before": _replayed(reference_dir, 0, at - 1), "after": _replayed(switch_dir, 0, steps - at - 1),
                "reference_after": _replayed(reference_dir, at, steps - 1)}
    return {"at_iteration": at, "iterations": [at + 1, steps], "from": advice.current.spec, "to": checked.spec,
            "role": checked.role, "sample_ids_equal": True, "loss_max_rel_diff": diff, "loss_tolerance": LOSS_TOLERANCE,
            "replayed_step_s": replayed, "predicted_step_s": predicted,
            "reference_predicted_step_s": advice.current.accelerated.step_time_s,
            "predicted_error": abs(predicted / replayed["after"] - 1.0) if replayed["after"] else None,
            "profile": str(switch_dir), "continue": way.to_doc() if way is not None else None}


def table(switch: dict):
    """The switch as a rich Table: the step before and after it, replayed, beside the predictions."""
    from rich.table import Table

    r = switch["replayed_step_s"]
    t = Table(title=f"The switch at iteration {switch['at_iteration']}: the reference run continued on the "
                    f"{switch['role']} layout from its checkpoint", title_justify="left")
    for col in ("iterations", "layout", "predicted step", "replayed step"):
        t.add_column(col, justify="left" if col == "layout" else "right", overflow="fold")
    a, (b, c) = switch["at_iteration"], switch["iterations"]
    fmt = lambda v: f"{v:.3f} s" if v else "—"  # noqa: E731
    t.add_row(f"1-{a}", f"{switch['from']} (reference)", fmt(switch["reference_predicted_step_s"]) + "*",
              fmt(r["before"]))
    t.add_row(f"{b}-{c}", f"{switch['to']} ({switch['role']}, resumed)", fmt(switch["predicted_step_s"]),
              fmt(r["after"]))
    t.add_row(f"{b}-{c}", f"{switch['from']} (reference, uninterrupted)", fmt(switch["reference_predicted_step_s"]) + "*",
              fmt(r["reference_after"]))
    t.caption = "* fitted: the advisor scales its costs so the reference prices at its replay; replayed steps: medians"
    t.caption_justify = "left"
    return t


def verdict(switch: dict) -> str:
    r, err = switch["replayed_step_s"], switch["predicted_error"]
    head = (f"switched at iteration {switch['at_iteration']} to {switch['to']}: iterations {switch['iterations'][0]}-"
            f"{switch['iterations'][1]} trained the uninterrupted run's samples, each once, the per-step losses "
            f"within {switch['loss_max_rel_diff']:.0e} of its (held to {switch['loss_tolerance']:.0e})")
    if err is None or not r["before"]:
        return head + "; no replayed step to compare (no per-micro-batch times)"
    return (f"{head}; replayed step {r['before']:.3f} s before, {r['after']:.3f} s after "
            f"(x{r['before'] / r['after']:.2f}), predicted {switch['predicted_step_s']:.3f} s ({err:.0%} off)")
