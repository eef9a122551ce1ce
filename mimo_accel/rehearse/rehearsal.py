"""`mimo-accel rehearse`: a real non-colocated MegatronMIMO layout on CPU ranks, baseline vs accelerated.

Both runs train the same global samples with the real upstream stack (Bridge's loaders, provider,
forward step; megatron-core's BridgeCommunicator and pipeline schedule; forward, backward,
optimizer step), profiler on, on gloo ranks of this machine (``mimo_accel.rehearse.cpu``):

- **baseline**: upstream as shipped (every data rank reads the whole micro-batch, contiguous
  slices, no packing). Where upstream cannot run the profile's data at all (megatron-bridge 0.6.2
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
import os
import shutil
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Optional, Sequence

ALL_FEATURES = dict(sharded_reads=True, reorder=True, packing=True)
SHARDED_ONLY = dict(sharded_reads=True)


class InvariantViolation(AssertionError):
    """Samples lost, duplicated or mis-paired, or the runs disagree on what was computed."""


@dataclass(frozen=True)
class TableSpec:
    """Sample i's shape from a precomputed table (picklable, so ranks can rebuild the dataset)."""

    samples: tuple  # of (images ((h, w), ...), text_tokens)

    def __call__(self, idx: int):
        from mimo_accel.rehearse.stack import SampleSpec

        images, text = self.samples[idx]
        return SampleSpec(tuple(tuple(i) for i in images), int(text))


def one_cpu() -> Optional[tuple[int, ...]]:
    """The CPU every rank of a rehearsal is pinned to (the lowest this process may use), or None
    where the OS cannot pin. Thread-CPU times are comparable across ranks only on the same CPU:
    measured on the 2-core VM with identical work per vision replica, max/mean was 1.07-1.14 with
    the ranks spread over both CPUs and 1.03 with all of them on one."""
    if not hasattr(os, "sched_setaffinity"):
        return None
    return (min(os.sched_getaffinity(0)),)


def _cpus_for_ranks(pin_one_cpu: bool, console) -> Optional[tuple[int, ...]]:
    """The CPUs the ranks are pinned to (None: not pinned), said on the console."""
    cpus = one_cpu() if pin_one_cpu else None
    if cpus:
        console.print(f"all ranks on CPU {cpus[0]} (thread-CPU times comparable across ranks; "
                      "--all-cpus spreads them)", highlight=False)
    return cpus


def _start(out_dir, log_path, title: str, console, banner) -> tuple[Path, Path]:
    """The rehearsal's output directory and log file (started with ``title``); says both on the
    console (``banner(out)`` first)."""
    out = Path(out_dir or tempfile.mkdtemp(prefix="mimo-accel-rehearsal-"))
    out.mkdir(parents=True, exist_ok=True)
    log = Path(log_path) if log_path else out / "rehearsal.log"
    log.write_text(f"{title}, {time.strftime('%Y-%m-%d %H:%M:%S')}\n"
                   "(third-party import output, then each run's rank logs)\n", encoding="utf-8")
    console.print(banner(out))
    console.print(f"third-party warnings and rank logs: {log}", highlight=False, soft_wrap=True)
    return out, log


def _progress(console):
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total} steps"),
                    TimeElapsedColumn(), console=console, transient=False)


def _pin(cpus: Optional[Sequence[int]]) -> None:
    if cpus:
        os.sched_setaffinity(0, set(cpus))


def _keep_freed_memory() -> None:
    """Let this rank's malloc keep the memory it frees (glibc: no trimming, a fixed 32 MiB mmap
    threshold). By default glibc hands freed blocks of the encoder's attention buffers back to the
    OS and faults them in again on the next step; those page faults land in the thread-CPU time
    the profiler reads, unevenly: measured on the 2-core VM, the same forward+backward took
    112-209 ms that way and 136-150 ms with freed memory kept. No-op where glibc is absent."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return
    m_trim_threshold, m_mmap_threshold = -1, -3  # <malloc.h>
    mallopt(m_trim_threshold, 1 << 30)
    mallopt(m_mmap_threshold, 32 << 20)


def _rank(rank, world, layout, features, spec, steps, micro_batch, seq_length, profile_dir, label, model_kw,
          cpus=None):
    """One rank of a rehearsal run (module-level: the ranks unpickle it)."""
    _pin(cpus)
    _keep_freed_memory()
    os.environ["MIMO_ACCEL_PROFILE_LABEL"] = label
    import mimo_accel
    from megatron.bridge.data.megatron_mimo.loaders import build_megatron_mimo_data_loaders
    from megatron.bridge.training.megatron_mimo_step import forward_step
    from functools import partial
    from types import SimpleNamespace

    from mimo_accel.rehearse import stack as st
    from mimo_accel.rehearse.ranks import loader_config, module_of_rank, report_progress, step_state

    mimo_accel.enable(profile=profile_dir, **features)
    cfg = st.StackConfig(layout=layout, seq_length=seq_length, **model_kw)
    stack = st.build_stack(cfg)
    stack.provider._grids = stack.infra.module_to_grid_map
    data = st.make_data_provider(lambda n: st.SyntheticVLMDataset(
        n, spec, seq_length=seq_length, patch_dim=cfg.patch_dim, vocab_size=cfg.vocab_size))
    train, _, _ = build_megatron_mimo_data_loaders(
        loader_config(stack.provider, micro_batch),
        SimpleNamespace(consumed_train_samples=0), data, len(spec.samples), 0, 0)
    module = module_of_rank(layout, rank)
    dp = stack.infra.module_to_grid_map[module].get_pg(["dp"])
    seen: list = []
    patches: list = []
    # What this replica processes: a sharded batch as loaded (the step checks its tag against the
    # replica), a global batch cut by upstream's own slicing, as the baseline step cuts it.
    view = partial(_as_replica, dp.rank(), dp.size())
    batches = st.model_batches(iter(train), keep_attention_mask=bool(features.get("packing")), seen_ids=seen,
                               local_view=view, seen_patches=patches)
    losses = []
    for step in range(steps):
        out, _ = stack.train_step(batches, 1, micro_batch, partial(forward_step, step_state()))
        losses.append([[float(x) for x in o["lm loss"]] for o in out])
        report_progress(step + 1, steps)
    mimo_accel.disable()
    return dict(module=module, seen=seen, patches=patches, losses=losses, cpus=sorted(os.sched_getaffinity(0))
                if hasattr(os, "sched_getaffinity") else None)


def _as_replica(dp_rank, dp_size, view):
    from megatron.bridge.data.megatron_mimo import dp_utils

    from mimo_accel.sampler import SHARD_TAG_KEY

    if SHARD_TAG_KEY in view:
        return view
    upstream = getattr(dp_utils.slice_batch_for_megatron_mimo, "__wrapped__", dp_utils.slice_batch_for_megatron_mimo)
    return upstream(view, dp_rank, dp_size)


def _check_invariants(results: list[dict], steps: int, micro_batch: int, what: str) -> dict:
    """Per step: each module processed every sample of the global micro-batch exactly once."""
    per_module: dict[str, list[list[int]]] = {}
    for module in ("vision", "language"):
        ranks = [r for r in results if r["module"] == module]
        steps_seen = []
        for s in range(steps):
            ids = sorted(i for r in ranks for i in r["seen"][s])
            if ids != list(range(s * micro_batch, (s + 1) * micro_batch)):
                raise InvariantViolation(f"{what}: {module} step {s} processed samples {ids}, expected each of "
                                         f"{s * micro_batch}..{(s + 1) * micro_batch - 1} exactly once")
            steps_seen.append(ids)
        per_module[module] = steps_seen
    vision = [r for r in results if r["module"] == "vision"]
    lang = [r for r in results if r["module"] == "language"]
    return {
        "losses": [[sum(r["losses"][s][0][k] for r in lang) for k in (0, 1)] for s in range(steps)],
        "vision_patches": [sum(r["patches"][s] for r in vision) for s in range(steps)],
    }


def _run(label, features, layout, spec, steps, micro_batch, seq_length, profile_dir, model_kw, progress, task,
         log_path, cpus=None):
    from mimo_accel.rehearse.ranks import run_ranks

    shutil.rmtree(profile_dir, ignore_errors=True)
    with open(log_path, "a", encoding="utf-8") as log:
        log.write(f"\n########## {label} run: {time.strftime('%H:%M:%S')} ##########\n")
    done: dict[int, int] = {}

    def on_progress(rank, step, total):
        done[rank] = step
        progress.update(task, completed=min(done.values()) if len(done) == layout.world_size else 0)

    return run_ranks(_rank, layout.world_size, layout, features, spec, steps, micro_batch, seq_length,
                     str(profile_dir), label, model_kw, cpus, deadline_s=600, on_progress=on_progress,
                     log_file=log_path)


def rehearse(profile_name: str, *, steps: Optional[int] = None, out_dir: Optional[str] = None,
             json_path: Optional[str] = None, seed: int = 0, console=None, vision_dp: Optional[int] = None,
             language_dp: Optional[int] = None, log_path: Optional[str] = None, pin_one_cpu: bool = True) -> dict:
    """Run the rehearsal; print progress, the loss comparison and the report on ``console``.

    Everything else — the third-party warnings megatron's imports print, every rank's output —
    goes to ``log_path`` (default ``<out_dir>/rehearsal.log``), named once on the console.
    """
    from rich.console import Console

    from mimo_accel.tools import report
    from mimo_accel.workloads import load_profile
    from mimo_accel.rehearse.ranks import MimoLayout, RankFailure

    console = console or Console()
    profile = load_profile(profile_name)
    r = profile.rehearsal
    steps = steps or r.steps
    micro_batch, seq_length = r.layout.micro_batch_size, r.layout.seq_length
    v, lang = r.layout.vision, r.layout.language
    layout = MimoLayout(replace(v, dp=vision_dp or v.dp), replace(lang, dp=language_dp or lang.dp))
    samples = profile.rehearsal_shapes(steps * micro_batch, seed)
    spec = TableSpec(tuple((s.images, s.text_tokens) for s in samples))
    model_kw = dict(vision_hidden=128, vision_layers=3, merge=r.merge_size)
    out, log = _start(out_dir, log_path, f"mimo-accel rehearse {profile.name}: {layout}", console,
                      lambda out: f"[bold]mimo-accel rehearse[/bold] {profile.name}: {layout} on "
                                  f"{layout.world_size} CPU ranks, {steps} steps x micro-batch {micro_batch}, "
                                  f"profiles in {out}")

    runs: dict[str, Any] = {}
    before_label, before_note = "baseline", "upstream as shipped"
    cpus = _cpus_for_ranks(pin_one_cpu, console)
    t0 = time.perf_counter()
    with _progress(console) as progress:
        task = progress.add_task("baseline (upstream)", total=steps)
        try:
            runs["before"] = _run("baseline", {}, layout, spec, steps, micro_batch, seq_length,
                                  out / "baseline", model_kw, progress, task, log, cpus)
        except RankFailure as exc:
            reason = _upstream_limit(exc)
            before_label, before_note = "sharded", f"upstream cannot run this data here ({reason}); before = sharded reads only"
            progress.update(task, description="[yellow]baseline failed upstream[/yellow]")
            task = progress.add_task("before: sharded reads, contiguous", total=steps)
            runs["before"] = _run("sharded", SHARDED_ONLY, layout, spec, steps, micro_batch, seq_length,
                                  out / "sharded", model_kw, progress, task, log, cpus)
        cost_model, cost_note = _calibrated(out / before_label, out / "cost-model.json")
        task = progress.add_task("accelerated (shard+reorder+pack)", total=steps)
        runs["after"] = _run("accelerated", dict(ALL_FEATURES, cost_model=cost_model), layout, spec, steps,
                             micro_batch, seq_length, out / "accelerated", model_kw, progress, task, log, cpus)
    elapsed = time.perf_counter() - t0

    before = _check_invariants(runs["before"], steps, micro_batch, before_label)
    after = _check_invariants(runs["after"], steps, micro_batch, "accelerated")
    if before["vision_patches"] != after["vision_patches"]:
        raise InvariantViolation(f"the runs did different image work per step: {before['vision_patches']} vs "
                                 f"{after['vision_patches']} patches")
    doc = _compare_and_report(
        console, "Per-step language loss (sum over replicas): the same samples, the same math", "step",
        [(str(s), lb, tb, la, ta) for s, ((lb, tb), (la, ta)) in enumerate(zip(before["losses"], after["losses"]))],
        out, before_label, before_note, cost_note, elapsed)
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
    return {"calibrated": True, "a": doc["a"], "b": doc["b"], "c": doc["c"], "fit": doc.get("fit", {}), "note": note}


def _calibrated(run_dir: Path, out_file: Path) -> tuple[Optional[str], str]:
    """Fit the cost model on the before-run's profile (what `mimo-accel calibrate --per-step`
    does), so the accelerated run plans with this machine's measured vision costs. One overhead
    per step: all vision ranks share one CPU, whose speed drifts from step to step on a shared
    machine alike for every replica; the plan only compares replicas within a step."""
    from mimo_accel.tools.calibrate import CalibrationError, fit
    from mimo_accel.profiler import read_run

    try:
        model, stats = fit(read_run(run_dir), per_step=True)
    except CalibrationError as exc:
        return None, f"default cost model (calibration failed: {exc})"
    model.to_file(out_file)
    r2 = (f"R²={stats['r2']:.2f} within steps ({stats['r2_across_steps']:.2f} across steps)" if stats["per_step"]
          else f"R²={stats['r2']:.2f}")
    return str(out_file), (f"calibrated on the before-run: a={model.a:.3g} s/patch, b={model.b:.3g} s/patch², "
                           f"c={model.c:.3g} s/token, {r2}")


# What megatron-bridge 0.6.2 says when it cannot run a profile's data (fan-in with uneven encoder
# rows; images per micro-batch not divisible by the encoder DP). Only these fall back to a
# "sharded reads only" before-run; any other failure (a port clash, a bug) is raised as it is.
UPSTREAM_LIMITS = ("Mismatch in shape", "Fan-in with variable", "is not divisible by encoder DP")


def _compare_and_report(console, title: str, unit: str, rows, out: Path, before_label: str, before_note: str,
                        cost_note: str, elapsed: float) -> dict:
    """Print the losses side by side (rows: name, before loss sum, tokens, after loss sum, tokens),
    refusing different token counts or losses, then the report; returns the report document."""
    from rich.table import Table

    from mimo_accel.tools import report
    from mimo_accel.profiler import read_run

    losses = Table(title=title)
    for col in (unit, f"{before_label} loss", "accelerated loss", "tokens", "rel. diff"):
        losses.add_column(col, justify="right")
    worst = 0.0
    for name, lb, tb, la, ta in rows:
        if tb != ta:
            raise InvariantViolation(f"{unit} {name}: {tb} loss tokens before vs {ta} after")
        rel = abs(la - lb) / max(abs(lb), 1e-12)
        worst = max(worst, rel)
        losses.add_row(name, f"{lb / tb:.6f}", f"{la / ta:.6f}", f"{int(tb)}", f"{rel:.1e}")
    console.print(losses)
    if worst > 1e-2:
        raise InvariantViolation(f"per-{unit} losses differ by {worst:.1e} relative: not the same computation")
    doc = report.build(read_run(out / before_label), read_run(out / "accelerated"))
    report.render(doc["before"], doc["after"], console=console)
    console.print(f"before = {before_label}: {before_note}. Plan costs: {cost_note}. "
                  f"Wall time of the rehearsal: {elapsed:.0f}s.")
    return doc


def _upstream_limit(exc: BaseException) -> str:
    text = str(exc)
    if not any(p in text for p in UPSTREAM_LIMITS):
        raise exc
    return _first_error_line(text)


def _first_error_line(text: str) -> str:
    lines = [l.strip() for l in text.splitlines() if "Error" in l and ":" in l and not l.strip().startswith("File")]
    return (lines[-1] if lines else text.splitlines()[0])[:160]


# ----------------------------------------------------------------------------------------------
# --loop bridge: examples/train_mimo.py (Bridge's pretrain_megatron_mimo), Qwen3-VL, image files
# ----------------------------------------------------------------------------------------------

# Receipts-like, sized so that vision dominates and a contiguous split leaves one replica far
# behind on this machine's CPU (measured on the 2-core VM, 8 ranks on one CPU: baseline vision
# straggler max/mean p50 ~1.37, ~0.35-0.45 s of encoder work per vision rank per step, ~2 min for
# both runs). One image per sample (so upstream as shipped can split every micro-batch by image
# count and runs the baseline), heights lognormal with a tall tail up to 120x8 patches
# (stack.IMAGE_MIXES["receipts"], workloads/receipts.toml's rehearsal sizes), 12 images per vision
# replica per step (one micro-batch of 48 per iteration), 10 iterations (the first is warm-up).
# Vision: Qwen3-VL hidden 64, 2 layers, 4 heads. With 8 heads (one run) the replicas holding the
# tallest images (800-960 patches) ran 20-30% over what a·Σp + b·Σp² predicts, even fitted on
# both runs (likely their attention scores, 20-29 MiB at 8 heads, outgrowing the 32 MiB L3 the
# two CPUs share): after-run straggler p50 1.05 instead of 1.03.
BRIDGE_DEFAULTS = dict(steps=10, vision_dp=4, language_dp=4, micro_batch=48)
BRIDGE_SEQ = 288  # the most placeholders one image takes (240) + its text
BRIDGE_MODEL = ("--encoder", "qwen3vl", "--vision-hidden", "64", "--vision-layers", "2", "--vision-heads", "4",
                "--image-mix", "receipts", "--max-image-rows", "240")


#: The default ``--loop bridge`` training script (the body of ``examples/train_mimo.py``).
BRIDGE_SCRIPT = "mimo_accel.rehearse.bridge_script"


def example_script(path: Optional[str] = None) -> Optional[Path]:
    """``--example PATH``: a training script to run instead of :data:`BRIDGE_SCRIPT`; None without one."""
    if path is None:
        return None
    script = Path(path)
    if not script.is_file():
        raise FileNotFoundError(f"--loop bridge runs the example training script, but {script} does not exist: "
                                f"pass --example PATH/train_mimo.py, or leave --example out to run {BRIDGE_SCRIPT}")
    return script


def _load_example(script: Optional[str]):
    """The training script as a module: :data:`BRIDGE_SCRIPT`, or the file ``script``."""
    if script is None:
        from mimo_accel.rehearse import bridge_script

        return bridge_script
    import importlib.util

    name = "mimo_accel_rehearsal_train_mimo"
    spec = importlib.util.spec_from_file_location(name, script)
    example = importlib.util.module_from_spec(spec)
    sys.modules[name] = example  # dataclasses resolve the module's annotations through it
    spec.loader.exec_module(example)
    return example


def _bridge_rank(rank, world, script, argv, features, profile_dir, label, steps, env, cpus=None):
    """One rank of a ``--loop bridge`` run: the example's own ``main(argv)``, profiler on."""
    _pin(cpus)
    _keep_freed_memory()
    os.environ.update(env, MIMO_ACCEL_PROFILE_LABEL=label)
    import mimo_accel
    from mimo_accel.rehearse.ranks import report_progress

    example = _load_example(script)
    home = sys.modules[example.main.__module__]  # where main's _Trace is (examples/train_mimo.py imports main)
    flush = home._Trace.flush

    def flush_and_report(trace):  # the trace flushes once per finished training iteration
        iteration = trace.current["iteration"] if trace.current is not None else None
        flush(trace)
        if iteration is not None:
            report_progress(iteration, steps)

    home._Trace.flush = flush_and_report
    mimo_accel.enable(profile=profile_dir, **features)
    try:
        example.main(argv)
        return mimo_accel.status()["active"]
    finally:
        mimo_accel.disable()


def _bridge_run(label, features, vdp, ldp, steps, micro_batch, out: Path, image_dir: Path, script: Optional[Path],
                seed: int, progress, task, log_path: Path, cpus=None) -> list[dict]:
    """One run of the example (``script``, or :data:`BRIDGE_SCRIPT` when None) on vdp + ldp ranks; returns its
    trace records."""
    from mimo_accel.rehearse.ranks import run_ranks

    profile_dir, trace = out / label, out / f"{label}-trace.jsonl"
    shutil.rmtree(profile_dir, ignore_errors=True)
    trace.unlink(missing_ok=True)
    with open(log_path, "a", encoding="utf-8") as log:
        log.write(f"\n########## {label} run: {time.strftime('%H:%M:%S')} ##########\n")
    argv = ["--cpu", *BRIDGE_MODEL, "--dataset", "images", "--image-dir", str(image_dir),
            "--vision-dp", str(vdp), "--language-dp", str(ldp), "--mbs", str(micro_batch),
            "--gbs", str(micro_batch), "--seq-length", str(BRIDGE_SEQ), "--train-iters", str(steps),
            "--eval-interval", "0", "--seed", str(1234 + seed), "--trace", str(trace)]
    env = {"MIMO_ACCEL_CACHE_DIR": str(out / "cache")}
    done: dict[int, int] = {}

    def on_progress(rank, step, total):
        done[rank] = step
        progress.update(task, completed=min(done.values()) if len(done) == vdp + ldp else 0)

    run_ranks(_bridge_rank, vdp + ldp, None if script is None else str(script), argv, features, str(profile_dir),
              label, steps, env, cpus, deadline_s=600, on_progress=on_progress, log_file=log_path)
    progress.update(task, completed=steps)
    import json

    return [json.loads(line) for line in trace.read_text().splitlines()]


def _bridge_steps(records: list[dict], steps: int, batch: int, what: str) -> list[dict]:
    """Per iteration from a trace: each module trained every sample of the iteration's global
    batch (``batch`` samples) exactly once; the global per-token loss and its token count."""
    out = []
    for it in range(1, steps + 1):
        rows = [r for r in records if r["iteration"] == it]
        want = list(range((it - 1) * batch, it * batch))
        for module in ("vision", "language"):
            ids = sorted(i for r in rows if r["module"] == module for micro in r["ids"] for i in micro)
            if ids != want:
                raise InvariantViolation(f"{what}: {module} iteration {it} trained samples {ids}, expected each of "
                                         f"{want[0]}..{want[-1]} exactly once")
        loss_sum = sum(r["loss_sum"] for r in rows if r["loss_sum"] is not None)
        tokens = sum(r["tokens"] for r in rows if r["tokens"] is not None)
        if not tokens:
            raise InvariantViolation(f"{what}: iteration {it} has no loss tokens in the trace")
        out.append({"loss_sum": loss_sum, "tokens": tokens})
    return out


def rehearse_bridge(*, steps: Optional[int] = None, vision_dp: Optional[int] = None,
                    language_dp: Optional[int] = None, out_dir: Optional[str] = None,
                    json_path: Optional[str] = None, seed: int = 0, example: Optional[str] = None,
                    console=None, log_path: Optional[str] = None, pin_one_cpu: bool = True,
                    micro_batch: Optional[int] = None) -> dict:
    """``mimo-accel rehearse --loop bridge``: Bridge's ``pretrain_megatron_mimo`` through
    ``examples/train_mimo.py --encoder qwen3vl --dataset images --image-mix receipts``, baseline
    then accelerated (sharded reads + reorder + packing, the cost model calibrated on the
    baseline), profiler on; checks the invariants on the traces and prints the same report as
    the stack loop. One micro-batch of ``micro_batch`` samples per iteration."""
    from rich.console import Console

    from mimo_accel.tools import report
    from mimo_accel.rehearse.ranks import MimoLayout, RankFailure

    console = console or Console()
    script = example_script(example)
    steps = steps or BRIDGE_DEFAULTS["steps"]
    vdp, ldp = vision_dp or BRIDGE_DEFAULTS["vision_dp"], language_dp or BRIDGE_DEFAULTS["language_dp"]
    mbs = micro_batch or BRIDGE_DEFAULTS["micro_batch"]
    layout = MimoLayout.from_dp(vdp, ldp)
    if mbs % vdp or mbs % ldp:
        raise ValueError(f"--loop bridge: the micro-batch of {mbs} samples must split evenly over vision DP "
                         f"{vdp} and language DP {ldp}")
    out, log = _start(out_dir, log_path, f"mimo-accel rehearse --loop bridge: {layout}", console,
                      lambda out: f"[bold]mimo-accel rehearse --loop bridge[/bold]: "
                                  f"{script.name if script else BRIDGE_SCRIPT} "
                                  f"(pretrain_megatron_mimo, Bridge's Qwen3-VL vision model, receipt-like image "
                                  f"files) on {layout.world_size} CPU ranks, {layout}, {steps} iterations x 1 "
                                  f"micro-batch of {mbs}, profiles in {out}")
    image_dir = out / "images"

    before_label, before_note = "baseline", "upstream as shipped"
    cpus = _cpus_for_ranks(pin_one_cpu, console)
    t0 = time.perf_counter()
    with _progress(console) as progress:
        task = progress.add_task("baseline (upstream)", total=steps)
        try:
            before_records = _bridge_run("baseline", {}, vdp, ldp, steps, mbs, out, image_dir, script, seed,
                                         progress, task, log, cpus)
        except RankFailure as exc:
            reason = _upstream_limit(exc)
            before_label, before_note = "sharded", f"upstream cannot run this data here ({reason}); before = sharded reads only"
            progress.update(task, description="[yellow]baseline failed upstream[/yellow]")
            task = progress.add_task("before: sharded reads, contiguous", total=steps)
            before_records = _bridge_run("sharded", SHARDED_ONLY, vdp, ldp, steps, mbs, out, image_dir, script,
                                         seed, progress, task, log, cpus)
        cost_model, cost_note = _calibrated(out / before_label, out / "cost-model.json")
        task = progress.add_task("accelerated (shard+reorder+pack)", total=steps)
        features = dict(ALL_FEATURES, **({"cost_model": cost_model} if cost_model else {}))
        after_records = _bridge_run("accelerated", features, vdp, ldp, steps, mbs, out, image_dir, script, seed,
                                    progress, task, log, cpus)
    elapsed = time.perf_counter() - t0

    before = _bridge_steps(before_records, steps, mbs, before_label)
    after = _bridge_steps(after_records, steps, mbs, "accelerated")
    doc = _compare_and_report(
        console, "Per-iteration global loss (per token): the same samples, the same math", "iteration",
        [(str(it), b["loss_sum"], b["tokens"], a["loss_sum"], a["tokens"])
         for it, (b, a) in enumerate(zip(before, after), start=1)],
        out, before_label, before_note, cost_note, elapsed)
    own = {"profile": "bridge-loop:qwen3vl-receipts", "loop": "bridge", "layout": str(layout), "steps": steps,
           "pinned_cpus": list(cpus or []),
           "micro_batch": mbs, "before_label": before_label, "before_note": before_note,
           "losses": {"before": [[b["loss_sum"], b["tokens"]] for b in before],
                      "after": [[a["loss_sum"], a["tokens"]] for a in after]},
           "profile_dir": str(out), "log": str(log), "wall_s": elapsed,
           "cost_model": _model_doc(cost_model, cost_note)}
    if json_path:
        report.write_json(json_path, doc, **own)
    return {**doc, **own}


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="mimo-accel rehearse", description=__doc__.split("\n\n")[0])
    p.add_argument("--loop", choices=("stack", "bridge"), default="stack",
                   help="stack (default): the tiny stack's train step over a profile's samples; bridge: "
                        "examples/train_mimo.py (Bridge's pretrain_megatron_mimo) with Bridge's Qwen3-VL "
                        "vision model on image files")
    p.add_argument("--example", help="--loop bridge: path of a training script to run instead of "
                   f"{BRIDGE_SCRIPT} (the body of examples/train_mimo.py)")
    p.add_argument("--profile", default=None, help="--loop stack: profile name or TOML path (default: receipts)")
    p.add_argument("--steps", type=int, help="training steps per run (default: the profile's rehearsal steps; "
                   f"--loop bridge: {BRIDGE_DEFAULTS['steps']})")
    p.add_argument("--vision-dp", type=int, help="override the profile's rehearsal vision DP "
                   f"(--loop bridge: default {BRIDGE_DEFAULTS['vision_dp']})")
    p.add_argument("--language-dp", type=int, help="override the profile's rehearsal language DP "
                   f"(--loop bridge: default {BRIDGE_DEFAULTS['language_dp']})")
    p.add_argument("--out", help="directory for the profiler runs (default: a temp dir)")
    p.add_argument("--json", help="write the report's JSON here (its keys at the top level, as `mimo-accel "
                   "report --json` writes them) with the rehearsal's own fields (losses, layout, log, ...)")
    p.add_argument("--seed", type=int, default=0,
                   help="the profile's sample draw (--loop bridge: the model's initialisation, added to 1234)")
    p.add_argument("--all-cpus", action="store_true",
                   help="spread the ranks over every CPU (faster, but thread-CPU times then differ by which "
                        "CPU a rank ran on: noisier straggler figures); default: all ranks on one CPU")
    args = p.parse_args(argv)
    if args.loop == "bridge" and args.profile is not None:
        p.error("--profile applies to --loop stack; --loop bridge trains on the example's image files")
    if args.loop == "stack" and args.example is not None:
        p.error("--example applies to --loop bridge")
    from mimo_accel.rehearse.ranks import RankFailure

    out = args.out or tempfile.mkdtemp(prefix="mimo-accel-rehearsal-")
    log = Path(out) / "rehearsal.log"
    try:
        if args.loop == "bridge":
            rehearse_bridge(steps=args.steps, vision_dp=args.vision_dp, language_dp=args.language_dp, out_dir=out,
                            json_path=args.json, seed=args.seed, example=args.example, log_path=str(log),
                            pin_one_cpu=not args.all_cpus)
        else:
            rehearse(args.profile or "receipts", steps=args.steps, out_dir=out, json_path=args.json,
                     seed=args.seed, vision_dp=args.vision_dp, language_dp=args.language_dp, log_path=str(log),
                     pin_one_cpu=not args.all_cpus)
    except InvariantViolation as exc:
        print(f"mimo-accel rehearse: INVARIANT VIOLATED: {exc}", file=sys.stderr)
        _print_log_path(log)
        return 3
    except RankFailure as exc:
        print(f"mimo-accel rehearse: a rank failed: {exc}", file=sys.stderr)
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
