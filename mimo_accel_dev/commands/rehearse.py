"""`mimo-accel rehearse`: a real non-colocated MegatronMIMO layout on CPU ranks, baseline vs accelerated.

Both runs train the same global samples with the real upstream stack (Bridge's loaders, provider,
forward step; megatron-core's BridgeCommunicator and pipeline schedule; forward, backward,
optimizer step), profiler on, on gloo ranks of this machine (``mimo_accel_dev.rehearse.cpu``):

- **baseline**: upstream as shipped (every data rank reads the whole micro-batch, contiguous
  slices, no packing). Where upstream cannot run the workload's data at all (megatron-bridge 0.6.2
  slices patch-packed images by image count, so multi-image samples break at vision DP > 1, and
  fan-in with uneven rows breaks in the backward), the rehearsal says so and uses
  "sharded reads only" (contiguous order) as the before, labelled as such;
- **accelerated**: sharded reads + plan-before-read reordering + THD packing.

While running it checks the invariants: every sample of every global micro-batch processed once
per module, the same samples and the same image work in both runs, per-step losses equal (the
reorder changes which replica computes a sample, not what is computed). Then the report.

``--loop bridge`` rehearses Bridge's whole training loop instead of the stack's train step: each
rank runs ``examples/train_mimo.py`` (``pretrain_megatron_mimo``) with Bridge's own Qwen3-VL
vision model (``--encoder qwen3vl``) on real image files (``--dataset images --image-mix
receipts``: one narrow image per sample, a tall tail), baseline then accelerated, profiler on; the invariants come from the example's ``--trace``, the report is the
same.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Optional, Sequence

from mimo_accel.grid import canonical_grid
from mimo_accel.modules import LANGUAGE, Modules
from mimo_accel_dev.rehearse import peers, rehearsal
from mimo_accel_dev.commands.rehearsal_output import (compare_and_report, cpus_for_ranks, headline, headline_lines,
                                                       progress_bar, start_output)
from mimo_accel.tools.arguments import (UsageError, add_peak_option, fail, nonnegative_int, output_dir, output_file,
                                        parse, positive_int)

PROG = "mimo-accel rehearse"


def _positive(name: str, value: Optional[int], default: int) -> int:
    """``value`` (a positive integer), or ``default`` where it is None: never a silent fallback."""
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


def _check_split(micro_batch: int, vision_dp: int, language_dp: int, given: str, whose: str) -> None:
    """One DP divides the other (upstream's BridgeCommunicator fans in or out by a whole ratio) and
    the micro-batch splits evenly over both modules' replicas (every module cuts it into the same
    lcm(vision dp, language dp) canonical groups), else a ValueError naming ``given`` and the fix."""
    if max(vision_dp, language_dp) % min(vision_dp, language_dp):
        raise ValueError(f"{given}: vision DP {vision_dp} and language DP {language_dp}: one must divide the other "
                         "(the bridge between the modules fans in or out by a whole ratio); give e.g. "
                         f"--vision-dp {vision_dp} --language-dp {vision_dp}")
    grid = canonical_grid((vision_dp, language_dp))
    if micro_batch % grid:
        fits = ", ".join(str(d) for d in range(1, micro_batch + 1) if micro_batch % d == 0)
        raise ValueError(f"{given}: {whose} micro-batch of {micro_batch} samples does not split evenly over "
                         f"vision DP {vision_dp} and language DP {language_dp} (lcm {grid}); give DP sizes that "
                         f"divide {micro_batch} ({fits})")


def _given(vision_dp: Optional[int], language_dp: Optional[int]) -> str:
    flags = [f"{flag} {v}" for flag, v in (("--vision-dp", vision_dp), ("--language-dp", language_dp)) if v is not None]
    return " ".join(flags) or "the default layout"


def stack_plan(profile_name: str, steps: Optional[int] = None, vision_dp: Optional[int] = None,
               language_dp: Optional[int] = None):
    """``--loop stack``'s inputs, checked before anything runs: (profile, layout, steps). Raises
    ProfileError / ValueError naming the flag and the fix."""
    from mimo_accel.workloads import VISION, load_profile

    profile = load_profile(profile_name)
    r = profile.rehearsal
    steps = _positive("steps", steps, r.steps)
    vdp = _positive("vision_dp", vision_dp, r.modules[VISION].dp)
    ldp = _positive("language_dp", language_dp, r.modules[LANGUAGE].dp)
    _check_split(r.micro_batch_size, vdp, ldp, _given(vision_dp, language_dp),
                 f"workload {profile.name}: the rehearsal")
    return profile, r.modules.replace(VISION, dp=vdp).replace(LANGUAGE, dp=ldp), steps


def bridge_plan(example: Optional[str] = None, steps: Optional[int] = None, vision_dp: Optional[int] = None,
                language_dp: Optional[int] = None, micro_batch: Optional[int] = None):
    """``--loop bridge``'s inputs, checked before anything runs: (script, steps, vision dp, language
    dp, micro-batch). Raises FileNotFoundError / ValueError naming the flag and the fix."""
    script = rehearsal.example_script(example)
    d = rehearsal.BRIDGE_DEFAULTS
    steps = _positive("steps", steps, d["steps"])
    vdp = _positive("vision_dp", vision_dp, d["vision_dp"])
    ldp = _positive("language_dp", language_dp, d["language_dp"])
    mbs = _positive("micro_batch", micro_batch, d["micro_batch"])
    _check_split(mbs, vdp, ldp, _given(vision_dp, language_dp), "--loop bridge: the")
    return script, steps, vdp, ldp, mbs


def rehearse(profile_name: str, *, steps: Optional[int] = None, out_dir: Optional[str] = None,
             json_path: Optional[str] = None, seed: int = 0, console=None, vision_dp: Optional[int] = None,
             language_dp: Optional[int] = None, log_path: Optional[str] = None, pin_one_cpu: bool = True,
             peak_tflops: Optional[float] = None) -> dict:
    """Run the rehearsal; print progress, the loss comparison and the report on ``console``.

    Everything else — the third-party warnings megatron's imports print, every rank's output —
    goes to ``log_path`` (default ``<out_dir>/rehearsal.log``), named once on the console.
    """
    from rich.console import Console

    from mimo_accel_dev.rehearse.ranks import RankFailure
    from mimo_accel.tools import report

    profile, layout, steps = stack_plan(profile_name, steps, vision_dp, language_dp)
    console = console or Console()
    r = profile.rehearsal
    micro_batch, seq_length = r.micro_batch_size, r.seq_length
    samples = profile.rehearsal_shapes(steps * micro_batch, seed)
    spec = rehearsal.TableSpec(tuple((s.images, s.text_tokens) for s in samples))
    model_kw = dict(vision_hidden=128, vision_layers=3, merge=r.merge_size)
    out, log = start_output(out_dir, log_path, f"mimo-accel rehearse {profile.name}: {layout}", console,
                      lambda out: f"[bold]mimo-accel rehearse[/bold] {profile.name}: {layout} on "
                                  f"{layout.world_size} CPU ranks, {steps} steps x micro-batch {micro_batch}, "
                                  f"profiles in {out}")

    runs: dict[str, Any] = {}
    before_label, before_note = "baseline", "upstream as shipped"
    cpus = cpus_for_ranks(pin_one_cpu, console)
    t0 = time.perf_counter()
    with progress_bar(console) as progress:
        task = progress.add_task("baseline (upstream)", total=steps)
        try:
            runs["before"] = rehearsal.run_stack("baseline", {}, layout, spec, steps, micro_batch, seq_length,
                                                 out / "baseline", model_kw, progress, task, log, cpus)
        except RankFailure as exc:
            reason = rehearsal.upstream_limit(exc)
            before_label, before_note = "sharded", f"upstream cannot run this data here ({reason}); before = sharded reads only"
            progress.update(task, description="[yellow]baseline failed upstream[/yellow]")
            task = progress.add_task("before: sharded reads, contiguous", total=steps)
            runs["before"] = rehearsal.run_stack("sharded", rehearsal.SHARDED_ONLY, layout, spec, steps, micro_batch,
                                                 seq_length, out / "sharded", model_kw, progress, task, log, cpus)
        cost_model, cost_note = _calibrated(out / before_label, out / "cost-model.json")
        task = progress.add_task("accelerated (shard+reorder+pack)", total=steps)
        runs["after"] = rehearsal.run_stack("accelerated", dict(rehearsal.ALL_FEATURES, cost_model=cost_model), layout,
                                            spec, steps, micro_batch, seq_length, out / "accelerated", model_kw,
                                            progress, task, log, cpus)
    elapsed = time.perf_counter() - t0

    before = rehearsal.check_invariants(runs["before"], steps, micro_batch, before_label)
    after = rehearsal.check_invariants(runs["after"], steps, micro_batch, "accelerated")
    if before["vision_patches"] != after["vision_patches"]:
        raise rehearsal.InvariantViolation(f"the runs did different image work per step: {before['vision_patches']} "
                                           f"vs {after['vision_patches']} patches")
    doc = compare_and_report(
        console, "Per-step language loss (sum over replicas): the same samples, the same math", "step",
        [(str(s), lb, tb, la, ta) for s, ((lb, tb), (la, ta)) in enumerate(zip(before["losses"], after["losses"]))],
        out, before_label, before_note, cost_note, elapsed, peak_tflops)
    # The report's keys (format, before, after, change, warnings) at the top level, as
    # `mimo-accel report --json` writes them; the rehearsal's own fields beside them.
    own = {"profile": profile.name, "layout": str(layout), "steps": steps, "micro_batch": micro_batch,
           "pinned_cpus": list(cpus or []),
           "rank_cpus": sorted({c for r in runs["after"] for c in (r["cpus"] or [])}),
           "before_label": before_label, "before_note": before_note,
           "losses": {"before": before["losses"], "after": after["losses"]}, "profile_dir": str(out),
           "log": str(log), "wall_s": elapsed, "cost_model": _model_doc(cost_model, cost_note)}
    if json_path:
        report.write_json(json_path, doc, **own)
    return {**doc, **own}


def _model_doc(path: Optional[str], note: str) -> dict:
    """The cost model the accelerated run planned with (its coefficients and fit), for the JSON."""
    import json

    if not path:
        return {"calibrated": False, "note": note}
    doc = json.loads(Path(path).read_text(encoding="utf-8"))
    return {"calibrated": True, "a": doc["a"], "b": doc["b"], "fit": doc.get("fit", {}), "note": note}


def _calibrated(run_dir: Path, out_file: Path) -> tuple[Optional[str], str]:
    """Fit every module's cost on the before-run's profile (what `mimo-accel calibrate` does), so
    the accelerated run plans with this machine's measured costs. One overhead across steps, not
    one per step: with four replicas per step the per-step fit leaves the attention term to a few
    within-step differences (over six demo runs: b/a 1.8e-4 to 2.1e-3, the after-run's replica
    times predicted within 2.2-5.4%), where the one-overhead fit gave b/a 6e-4 to 2.4e-3 and
    2.1-2.7% (the noise floor of those times is about 2%). A module the before-run cannot fit
    keeps the default cost of its kind (upstream's padded language batches compute as many tokens
    on every replica, so they tell nothing of the cost of real tokens), said in the note."""
    from mimo_accel.costs import CostModel
    from mimo_accel.profiler.run import read_run
    from mimo_accel.profiler.fitting import fit_modules
    from mimo_accel.profiler.observations import CalibrationError, modules_in

    run = read_run(run_dir)
    table, notes = {}, []
    for module in modules_in(run):
        try:
            fitted, stats = fit_modules(run, modules=[module])
        except CalibrationError as exc:
            notes.append(f"{module}: default ({exc})")
            continue
        cost = fitted.modules[module]
        table[module] = cost
        r2 = stats[module]
        fit = (f"R²={r2['r2']:.2f} within steps" if r2.get("per_step") else f"R²={r2['r2']:.2f}")
        notes.append(f"{module}: a={cost.a:.3g}, b={cost.b:.3g}" + (f", k={cost.k:.3g}" if cost.k else "") +
                     f" ({fit})")
    if not table:
        return None, "default cost model (calibration failed: " + "; ".join(notes) + ")"
    # the default encoder's coefficients: the layout's first encoder's
    lead = next((c for m, c in table.items() if m != LANGUAGE), next(iter(table.values())))
    CostModel(a=lead.a, b=lead.b, modules=table).to_file(out_file)
    return str(out_file), "calibrated on the before-run, s per row / row² / item / token: " + "; ".join(notes)


PEERS = (*peers.LABELS, *peers.ALIASES)  # "4608", "reorder-buffer", and its old name "upstream"


def rehearse_bridge(*, steps: Optional[int] = None, vision_dp: Optional[int] = None,
                    language_dp: Optional[int] = None, out_dir: Optional[str] = None,
                    json_path: Optional[str] = None, seed: int = 0, example: Optional[str] = None,
                    console=None, log_path: Optional[str] = None, pin_one_cpu: bool = True,
                    micro_batch: Optional[int] = None, cost_model: Optional[str] = None,
                    calibrate_online: bool = True, peer: Optional[str] = None,
                    peak_tflops: Optional[float] = None) -> dict:
    """``mimo-accel rehearse --loop bridge``: Bridge's ``pretrain_megatron_mimo`` through
    ``examples/train_mimo.py --encoder qwen3vl --dataset images --image-mix receipts``, baseline
    then accelerated (sharded reads + reorder + packing, planned from ``cost_model`` or the default
    coefficients, learnt while training unless ``calibrate_online`` is False), profiler on; with
    ``peer`` (``"reorder-buffer"``, old name ``"upstream"``: #4608's reorder_buffer; ``"4608"``: #4608 at
    984a8a53, neither merged) a run between them plans as that peer does
    (:mod:`mimo_accel_dev.rehearse.peers`). Checks the
    invariants on the traces and prints the report. One micro-batch of ``micro_batch`` samples per
    iteration."""
    from rich.console import Console

    from mimo_accel.profiler.run import read_run
    from mimo_accel_dev.rehearse.ranks import RankFailure
    from mimo_accel.tools import report
    from mimo_accel.tools.report import sides

    script, steps, vdp, ldp, mbs = bridge_plan(example, steps, vision_dp, language_dp, micro_batch)
    console = console or Console()
    if peer is not None:
        said, peer = peers.alias_note(peer), peers.resolve(peer)
        if said:
            console.print(f"[yellow]{said}[/yellow]", highlight=False)
    layout = Modules.from_dp_sizes({"vision": vdp, LANGUAGE: ldp})
    out, log = start_output(out_dir, log_path, f"mimo-accel rehearse --loop bridge: {layout}", console,
                      lambda out: f"[bold]mimo-accel rehearse --loop bridge[/bold]: "
                                  f"{script.name if script else rehearsal.BRIDGE_SCRIPT} "
                                  f"(pretrain_megatron_mimo, Bridge's Qwen3-VL vision model, receipt-like image "
                                  f"files) on {layout.world_size} CPU ranks, {layout}, {steps} iterations x 1 "
                                  f"micro-batch of {mbs}, profiles in {out}")
    image_dir = out / "images"
    features = dict(rehearsal.ALL_FEATURES, calibrate_online=calibrate_online,
                    **({"cost_model": cost_model} if cost_model else {}))
    cost_note = (f"planned from {cost_model}" if cost_model else "planned from each module's FLOPs") + (
        ", learnt while training (online calibration)" if calibrate_online else ", pinned")

    before_label, before_note = "baseline", "upstream as shipped"
    cpus = cpus_for_ranks(pin_one_cpu, console)
    t0 = time.perf_counter()
    peer_records = None
    with progress_bar(console) as progress:
        task = progress.add_task("baseline (upstream)", total=steps)
        try:
            before_records = rehearsal.run_bridge("baseline", {}, vdp, ldp, steps, mbs, out, image_dir, script, seed,
                                                  progress, task, log, cpus)
        except RankFailure as exc:
            reason = rehearsal.upstream_limit(exc)
            before_label, before_note = "sharded", f"upstream cannot run this data here ({reason}); before = sharded reads only"
            progress.update(task, description="[yellow]baseline failed upstream[/yellow]")
            task = progress.add_task("before: sharded reads, contiguous", total=steps)
            before_records = rehearsal.run_bridge("sharded", rehearsal.SHARDED_ONLY, vdp, ldp, steps, mbs, out,
                                                  image_dir, script, seed, progress, task, log, cpus)
        if peer is not None:
            task = progress.add_task(f"peer: {peers.LABELS[peer]} (shard+reorder+pack)", total=steps)
            peer_records = rehearsal.run_bridge(f"peer-{peer}", dict(rehearsal.ALL_FEATURES, calibrate_online=False),
                                                vdp, ldp, steps, mbs, out, image_dir, script, seed, progress, task,
                                                log, cpus, env={peers.ENV: peer})
        task = progress.add_task("accelerated (shard+reorder+pack)", total=steps)
        after_records = rehearsal.run_bridge("accelerated", features, vdp, ldp, steps, mbs, out, image_dir, script,
                                             seed, progress, task, log, cpus)
        floor = rehearsal.run_floor(console, progress, vdp, ldp, mbs, out, image_dir, script, seed, log, cpus)
    elapsed = time.perf_counter() - t0

    before = rehearsal.bridge_steps(before_records, steps, mbs, before_label)
    after = rehearsal.bridge_steps(after_records, steps, mbs, "accelerated")
    if peer_records is not None:
        rehearsal.bridge_steps(peer_records, steps, mbs, f"peer {peer}")  # the same invariants
    doc = compare_and_report(
        console, "Per-iteration global loss (per token): the same samples, the same math", "iteration",
        [(str(it), b["loss_sum"], b["tokens"], a["loss_sum"], a["tokens"])
         for it, (b, a) in enumerate(zip(before, after), start=1)],
        out, before_label, before_note, cost_note, elapsed, peak_tflops, floor)
    peer_side = None
    if peer is not None:
        peer_side = dict(name=peers.LABELS[peer],
                         **report.summarize(read_run(out / f"peer-{peer}"), peak_tflops=peak_tflops))
        console.print(sides.table(doc["before"], peer_side, doc["after"]))
        peer_side["language_worse"], verdict = sides.language_verdict(peer_side, doc["after"])
        console.print(verdict, highlight=False)
    head = headline(doc, peer_side)
    for line in headline_lines(head, peer_side["name"] if peer_side else None):
        console.print(line, highlight=False)
    own = {"profile": "bridge-loop:qwen3vl-receipts", "loop": "bridge", "layout": str(layout), "steps": steps,
           "pinned_cpus": list(cpus or []),
           "micro_batch": mbs, "before_label": before_label, "before_note": before_note,
           "losses": {"before": [[b["loss_sum"], b["tokens"]] for b in before],
                      "after": [[a["loss_sum"], a["tokens"]] for a in after]},
           "profile_dir": str(out), "log": str(log), "wall_s": elapsed,
           "cost_model": {"start": cost_model or "flops", "calibrate_online": calibrate_online, "note": cost_note},
           "online_calibration": doc["after"].get("online_calibration") or {"refits": []}, "headline": head,
           **({"peer": peer_side} if peer_side is not None else {})}
    if json_path:
        report.write_json(json_path, doc, **own)
    return {**doc, **own}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("--loop", choices=("stack", "bridge"), default="stack",
                   help="stack (default): the tiny stack's train step over a workload's samples; bridge: "
                        "examples/train_mimo.py (Bridge's pretrain_megatron_mimo) with Bridge's Qwen3-VL "
                        "vision model on image files")
    p.add_argument("--example", help="--loop bridge: path of a training script to run instead of "
                   f"{rehearsal.BRIDGE_SCRIPT} (the body of examples/train_mimo.py)")
    p.add_argument("--workload", default=None,
                   help="--loop stack: workload profile name or TOML path (default: receipts)")
    p.add_argument("--steps", type=positive_int, help="training steps per run (default: the workload's rehearsal "
                   f"steps; --loop bridge: {rehearsal.BRIDGE_DEFAULTS['steps']})")
    p.add_argument("--vision-dp", type=positive_int, help="override the workload's rehearsal vision DP "
                   f"(--loop bridge: default {rehearsal.BRIDGE_DEFAULTS['vision_dp']})")
    p.add_argument("--language-dp", type=positive_int, help="override the workload's rehearsal language DP "
                   f"(--loop bridge: default {rehearsal.BRIDGE_DEFAULTS['language_dp']})")
    p.add_argument("--out", help="directory for the profiler runs, made if missing (default: a temp dir)")
    p.add_argument("--json", help="write the report's JSON here (its keys at the top level, as `mimo-accel "
                   "report --json` writes them) with the rehearsal's own fields (losses, layout, log, ...)")
    p.add_argument("--seed", type=nonnegative_int, default=0,
                   help="the workload's sample draw (--loop bridge: the model's initialisation, added to 1234)")
    p.add_argument("--cost-model", metavar="FILE",
                   help="--loop bridge: start the accelerated run from this cost model (a `mimo-accel calibrate` "
                        "file) instead of the default coefficients")
    p.add_argument("--no-calibrate-online", action="store_true",
                   help="--loop bridge: pin the cost model (no online calibration) in the accelerated run")
    p.add_argument("--peer", choices=PEERS,
                   help="--loop bridge: a third run, between the two, where a peer's planner stands in for the "
                        "joint plan, shown beside both: reorder-buffer (Megatron-Bridge PR #4608's reorder_buffer, "
                        "its defaults; 'upstream' is its old name) or 4608 (#4608 at 984a8a53); neither is merged; "
                        "both equal-size LPT per micro-batch on the vision cost")
    p.add_argument("--layout", choices=("reference",),
                   help="--loop bridge: reference = upstream's validated layout (images dp1 -> language pp2 dp2, "
                        "TP 2 for its 4; 2-sample micro-batches, 32 a step), reorder_window=step, over receipt-like "
                        "and fixed-size images (mimo_accel_dev.commands.rehearse_reference)")
    p.add_argument("--all-cpus", action="store_true",
                   help="spread the ranks over every CPU (faster, but thread-CPU times then differ by which "
                        "CPU a rank ran on: noisier straggler figures); default: all ranks on one CPU")
    add_peak_option(p)
    return p


def _check(args) -> None:
    """Everything the command line names, checked before a temp directory is made or a rank started."""
    from mimo_accel.workloads import ProfileError

    output_dir("--out", args.out)
    output_file("--json", args.json)
    if args.cost_model is not None:
        from mimo_accel.costs import CostModel

        try:
            CostModel.from_file(args.cost_model)
        except (OSError, ValueError) as exc:
            raise UsageError(f"--cost-model {args.cost_model}: {exc}") from None
    try:
        if args.loop == "bridge":
            bridge_plan(args.example, args.steps, args.vision_dp, args.language_dp)
        else:
            stack_plan(args.workload or "receipts", args.steps, args.vision_dp, args.language_dp)
    except (ProfileError, ValueError, FileNotFoundError) as exc:
        raise UsageError(str(exc)) from None


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = _parser()
    args = parse(p, argv)
    if isinstance(args, int):
        return args
    bridge_only = [flag for flag, given in (("--example", args.example is not None),
                                            ("--cost-model", args.cost_model is not None),
                                            ("--no-calibrate-online", args.no_calibrate_online),
                                            ("--peer", args.peer is not None)) if given]
    fixed = [flag for flag, given in (("--vision-dp", args.vision_dp), ("--language-dp", args.language_dp),
                                      ("--example", args.example), ("--peer", args.peer),
                                      ("--cost-model", args.cost_model)) if given is not None]
    wrong = ("--layout applies to --loop bridge: add --loop bridge" if args.layout and args.loop != "bridge" else
             f"--layout reference fixes the layout and the example: drop {', '.join(fixed)}" if args.layout and fixed
             else
             "--workload applies to --loop stack; --loop bridge trains on the example's image files: drop --workload"
             if args.loop == "bridge" and args.workload is not None else
             f"{', '.join(bridge_only)} {'applies' if len(bridge_only) == 1 else 'apply'} to --loop bridge: add "
             f"--loop bridge, or drop {'it' if len(bridge_only) == 1 else 'them'}"
             if args.loop == "stack" and bridge_only else None)
    if wrong:
        return fail(PROG, wrong)
    try:
        _check(args)
    except UsageError as exc:
        return fail(PROG, exc)
    from mimo_accel_dev.rehearse.ranks import RankFailure

    out = args.out or tempfile.mkdtemp(prefix="mimo-accel-rehearsal-")
    log = Path(out) / "rehearsal.log"
    try:
        if args.layout == "reference":
            from mimo_accel_dev.commands.rehearse_reference import rehearse_reference

            rehearse_reference(steps=args.steps, out_dir=out, json_path=args.json, seed=args.seed, log_path=str(log),
                               pin_one_cpu=not args.all_cpus, peak_tflops=args.peak_tflops)
        elif args.loop == "bridge":
            rehearse_bridge(steps=args.steps, vision_dp=args.vision_dp, language_dp=args.language_dp, out_dir=out,
                            json_path=args.json, seed=args.seed, example=args.example, log_path=str(log),
                            pin_one_cpu=not args.all_cpus, cost_model=args.cost_model,
                            calibrate_online=not args.no_calibrate_online, peer=args.peer,
                            peak_tflops=args.peak_tflops)
        else:
            rehearse(args.workload or "receipts", steps=args.steps, out_dir=out, json_path=args.json,
                     seed=args.seed, vision_dp=args.vision_dp, language_dp=args.language_dp, log_path=str(log),
                     pin_one_cpu=not args.all_cpus, peak_tflops=args.peak_tflops)
    except rehearsal.InvariantViolation as exc:
        print(f"{PROG}: INVARIANT VIOLATED: {exc}", file=sys.stderr)
        _print_log_path(log)
        return 3
    except RankFailure as exc:
        print(f"{PROG}: a rank failed: {exc}", file=sys.stderr)
        _print_log_path(log)
        return 1
    except Exception:
        traceback.print_exc()
        _print_log_path(log)
        return 1
    return 0


def _print_log_path(log: Path) -> None:
    if log.exists():
        print(f"mimo-accel rehearse: full log (third-party warnings, every rank's output): {log}", file=sys.stderr)
