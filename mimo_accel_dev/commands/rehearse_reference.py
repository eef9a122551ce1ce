"""``mimo-accel rehearse --loop bridge --layout reference``: upstream's validated layout on CPU ranks.

Megatron-Bridge's Qwen3.5-VL 27B tutorial trains images dp1 -> language tp4 pp2 dp2 with 2-sample
micro-batches, 16-32 a step, 1F1B with the encoder as the stage before the language model. Here:
images dp1 -> language **tp2** pp2 dp2 on 9 CPU ranks (TP4 does not fit this machine: said in the
output), micro-batches of 2, 32 samples a step (16 micro-batches), Bridge's
``pretrain_megatron_mimo`` with Bridge's Qwen3-VL vision model and packing. Two workloads, each
before (upstream as shipped) and after (sharded reads, reorder over the step,
``reorder_window="step"``, and packing) on the same samples, losses compared as ``make demo``
compares them: receipt-like images of varied size (``--image-mix receipts``), and a fixed-size
set (``--image-mix fixed``: every image 256x112 px; only the texts differ), where a plan has
nothing to move in the encoder and must not make the step worse.

On one CPU the wall time shows no pipeline wait; the report's step replayed from each rank's
measured forward and backward times (each rank as if on a device of its own) is the figure to
read, beside the step the plan predicted.
"""

from __future__ import annotations

import time
from typing import Optional, Sequence

from mimo_accel_dev.commands import layout_switch as switch
from mimo_accel_dev.rehearse import rehearsal

#: The tutorial's shape, with TP 2 for its TP 4. As there, each language stage outweighs the encoder
#: (its 27B language model against a ViT of about 0.5B): the language model takes 8 layers (4 a
#: stage), the encoder 2; with the demo's sizes the one encoder replica alone set the step.
SHAPE = dict(vision_dp=1, language_tp=2, language_pp=2, language_dp=2, micro_batch=2, global_batch=32,
             vision_layers=2, language_layers=8)
TUTORIAL = "images dp1 -> language tp4 pp2 dp2"
# The first is warm-up. A refit takes effect a few iterations after the steps it learnt from (the
# plans made ahead), so with 12 every plan of the measured last half used the first refit's models,
# and a pace that drifted after iteration 4 misled all of them; with 20 most of them use models that
# followed the pace since, as nearly every step of a real job does.
STEPS = 20
WORKLOADS = {"receipts": "receipt-like images of varied size", "fixed": "every image the same size (256x112 px)"}
AFTER = dict(rehearsal.ALL_FEATURES, reorder_window="step")


def layout_argv(mix: str) -> list[str]:
    """The example's flags for the reference shape over ``mix``, after the rehearsal's own."""
    s = SHAPE
    return ["--gbs", str(s["global_batch"]), "--language-tp", str(s["language_tp"]), "--language-pp",
            str(s["language_pp"]), "--language-layers", str(s["language_layers"]), "--vision-layers",
            str(s["vision_layers"]), "--image-mix", mix]


def rehearse_reference(*, steps: Optional[int] = None, out_dir: Optional[str] = None,
                       json_path: Optional[str] = None, seed: int = 0, console=None, log_path: Optional[str] = None,
                       pin_one_cpu: bool = True, peak_tflops: Optional[float] = None,
                       workloads: Sequence[str] = tuple(WORKLOADS), check_layout: bool = True) -> dict:
    """Each of ``workloads`` (default both) before and after on the reference shape; the first's
    report at the JSON's top level (the receipt-like one's), the fixed-size one's under
    ``fixed_size``; with ``check_layout``, the layout the advisor recommends from the receipt-like run
    rehearsed (:mod:`~mimo_accel_dev.commands.layout_check`), under ``layout_check``."""
    from rich.console import Console

    from mimo_accel.modules import LANGUAGE, Modules, module
    from mimo_accel.tools import report
    from mimo_accel_dev.commands.rehearsal_output import compare_and_report, cpus_for_ranks, progress_bar, start_output

    s = SHAPE
    steps = STEPS if steps is None else steps
    if steps < 2:
        raise ValueError(f"--layout reference needs at least 2 steps (the first is warm-up), got {steps}")
    console = console or Console()
    layout = Modules((module("vision", s["vision_dp"]),
                      module(LANGUAGE, s["language_dp"], tp=s["language_tp"], pp=s["language_pp"])))
    title = f"mimo-accel rehearse --loop bridge --layout reference: {layout}"
    out, log = start_output(out_dir, log_path, title, console, lambda out: (
        f"[bold]mimo-accel rehearse --loop bridge --layout reference[/bold]: upstream's validated layout "
        f"({TUTORIAL}) as {layout} on {layout.world_size} CPU ranks: language TP 2 stands in for the "
        f"tutorial's TP 4, which does not fit this machine. {steps} iterations x {s['global_batch']} samples "
        f"in micro-batches of {s['micro_batch']}, 1F1B; after: reorder_window=\"step\"; profiles in {out}"))
    cpus = cpus_for_ranks(pin_one_cpu, console)
    ranks = s["language_tp"] * s["language_pp"]
    docs, losses, checks = {}, {}, {}
    t0 = time.perf_counter()
    unknown = [w for w in workloads if w not in WORKLOADS]
    if unknown or not workloads:
        raise ValueError(f"--layout reference rehearses the workloads {list(WORKLOADS)}, not {unknown or 'none'}")
    for mix in workloads:
        what = WORKLOADS[mix]
        runs, traces = {}, {}
        cache = {"MIMO_ACCEL_CACHE_DIR": str(out / f"cache-{mix}")}  # each workload's cost index on its own
        # the run the layout check continues on another layout saves at its half (layout_switch)
        saves = check_layout and mix == "receipts" and steps >= 4
        with progress_bar(console) as progress:
            for side, features in (("baseline", {}), ("accelerated", AFTER)):
                task = progress.add_task(f"{mix}: {'upstream as shipped' if side == 'baseline' else side}", total=steps)
                argv = layout_argv(mix) + (switch.save_argv(out / "ckpt-receipts", steps)
                                           if saves and side == "accelerated" else [])
                traces[side] = rehearsal.run_bridge(f"{mix}-{side}", features, s["vision_dp"], s["language_dp"], steps,
                                                    s["micro_batch"], out, out / "images", None, seed, progress, task,
                                                    log, cpus, extra_argv=argv, language_ranks=ranks, env=cache)
                runs[side] = rehearsal.bridge_steps(traces[side], steps, s["global_batch"], f"{mix} {side}")
        console.print(f"[bold]{mix}[/bold]: {what}")
        docs[mix] = compare_and_report(
            console, f"{mix}: per-iteration global loss (per token): the same samples, the same math", "iteration",
            [(str(it), b["loss_sum"], b["tokens"], a["loss_sum"], a["tokens"])
             for it, (b, a) in enumerate(zip(runs["baseline"], runs["accelerated"]), start=1)],
            out, f"{mix}-baseline", "upstream as shipped", "planned from each module's FLOPs, learnt while training",
            time.perf_counter() - t0, peak_tflops, after_label=f"{mix}-accelerated")
        losses[mix] = {side: [[r["loss_sum"], r["tokens"]] for r in runs[side]] for side in runs}
        if mix == "receipts" and check_layout:
            checks[mix] = _check_layout(console, out, layout, steps, seed, log, cpus, cache, runs["accelerated"],
                                        traces["accelerated"] if saves else None)
    own = {"profile": "bridge-loop:reference", "loop": "bridge", "layout": str(layout), "tutorial_layout": TUTORIAL,
           "stand_in": "language TP 2 for the tutorial's TP 4 (it does not fit this machine)", "steps": steps,
           "micro_batch": s["micro_batch"], "global_batch": s["global_batch"], "reorder_window": "step",
           "pinned_cpus": list(cpus or []), "workloads": list(workloads), "losses": losses[workloads[0]],
           "profile_dir": str(out), "log": str(log), "wall_s": time.perf_counter() - t0}
    if "receipts" in checks:
        own["layout_check"] = checks["receipts"]
    if "fixed" in docs and workloads[0] != "fixed":
        own["fixed_size"] = {k: docs["fixed"][k] for k in ("before", "after", "change")} | {"losses": losses["fixed"]}
    if json_path:
        report.write_json(json_path, docs[workloads[0]], **own)
    return {**docs[workloads[0]], **own}


def _check_layout(console, out, layout, steps: int, seed: int, log, cpus, cache: dict, reference_steps: list,
                  reference_records: Optional[list] = None) -> dict:
    """The advisor's answer from the receipt-like run with mimo_accel on; the layout it recommends (or,
    where it keeps the current one, the best it found, labelled so) and a third layout of its list, each
    rehearsed with mimo_accel on over the same samples and replayed, its per-step losses and loss tokens
    held against the reference run's (``reference_steps``) (the JSON's ``layout_check``); with the
    reference's trace (``reference_records``: it saved at its half), the switch: the checked layout
    resumed from that checkpoint to the end (:mod:`~mimo_accel_dev.commands.layout_switch`)."""
    from pathlib import Path

    from mimo_accel_dev.commands import layout_check as lc
    from mimo_accel_dev.commands.rehearsal_output import progress_bar

    reference_dir = out / "receipts-accelerated"
    budget = layout.world_size + lc.EXTRA_RANKS
    try:
        indexes = sorted(Path(cache["MIMO_ACCEL_CACHE_DIR"]).glob("*.npz"))
        if len(indexes) != 1:
            raise ValueError(f"{cache['MIMO_ACCEL_CACHE_DIR']} holds {len(indexes)} cost indexes where the run derived "
                             "one: rehearse into a new --out directory")
        advice = lc.advise_from(reference_dir, indexes[0], budget, rehearsal.BRIDGE_SEQ)
    except ValueError as exc:  # a run too short to learn from: said, and the JSON says why
        console.print(f"[yellow]no layout check: {exc}[/yellow]", highlight=False)
        return {"skipped": str(exc)}
    checked = lc.to_check(advice)
    if not isinstance(checked, lc.Checked):  # nothing the rehearsal can build: said, not guessed
        check = lc.nothing_to_check(advice, budget, checked)
        console.print(lc.verdict(check), highlight=False)
        return check
    rehearsed = {advice.current.spec: reference_dir}
    trained, roles = {advice.current.spec: reference_steps}, {advice.current.spec: "reference"}
    with progress_bar(console) as progress:
        for label, row in ((checked.role, checked.row), ("third", lc.third_layout(advice, checked))):
            if row is None or row.spec in rehearsed:
                continue
            if row.layout.gbs != SHAPE["global_batch"]:  # other samples a step: no loss to hold against
                raise rehearsal.InvariantViolation(f"the advisor's {label} layout {row.spec} trains {row.layout.gbs} "
                                                   f"samples a step, the reference {SHAPE['global_batch']}")
            vdp, ldp, mbs, argv, ranks = lc.run_argv(row.layout, SHAPE)
            name = f"receipts-{label.replace(' ', '-')}"
            task = progress.add_task(f"receipts: {label} layout {row.spec}", total=steps)
            records = rehearsal.run_bridge(name, AFTER, vdp, ldp, steps, mbs, out, out / "images", None,
                                           seed, progress, task, log, cpus, extra_argv=argv, language_ranks=ranks,
                                           env=cache)
            trained[row.spec] = rehearsal.bridge_steps(records, steps, row.layout.gbs, f"receipts {label}")
            rehearsed[row.spec], roles[row.spec] = out / name, label
    console.print(lc.loss_table(advice.current.spec, trained, roles))
    diffs = lc.compare_losses(reference_steps, {s: v for s, v in trained.items() if s != advice.current.spec})
    check = lc.layout_check(advice, checked, reference_dir, rehearsed, budget, diffs)
    console.print(lc.table(check))
    console.print(lc.verdict(check), highlight=False)
    if reference_records is not None:
        check["switch"] = _switch(console, out, advice, checked, steps, seed, log, cpus, cache, reference_dir,
                                  reference_records, reference_steps)
    return check


def _switch(console, out, advice, checked, steps: int, seed: int, log, cpus, cache: dict, reference_dir,
            reference_records: list, reference_steps: list) -> dict:
    """The reference run, saved at its half, continued on the checked layout to the end."""
    from mimo_accel.tools.layout.continuation import continuation, render_continuation
    from mimo_accel_dev.commands import layout_check as lc
    from mimo_accel_dev.commands.rehearsal_output import progress_bar

    at = steps // 2
    kept = switch.interrupted_after(out / "ckpt-receipts", at)
    way = continuation(str(reference_dir), checked.row, advice.current)  # what `layout --from` says of it
    render_continuation(way, console)
    vdp, ldp, mbs, argv, ranks = lc.run_argv(checked.row.layout, SHAPE)
    name = "receipts-switch"
    with progress_bar(console) as progress:
        task = progress.add_task(f"receipts: from iteration {at} on the {checked.role} layout {checked.spec}",
                                 total=steps)
        records = rehearsal.run_bridge(name, AFTER, vdp, ldp, steps, mbs, out, out / "images", None, seed, progress,
                                       task, log, cpus, extra_argv=argv + switch.resume_argv(kept, way),
                                       language_ranks=ranks, env=cache)
    resumed = rehearsal.bridge_steps(records, steps, checked.row.layout.gbs, "receipts switch", first=at + 1)
    check = switch.switch_check(advice, checked, at, steps, reference_dir, reference_records, reference_steps,
                                out / name, records, resumed, way)
    console.print(switch.table(check))
    console.print(switch.verdict(check), highlight=False)
    return check
