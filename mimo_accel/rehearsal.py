"""`mimo-accel rehearse`: a real non-colocated MegatronMIMO layout on CPU ranks, baseline vs accelerated.

Both runs train the same global samples with the real upstream stack (Bridge's loaders, provider,
forward step; megatron-core's BridgeCommunicator and pipeline schedule; forward, backward,
optimizer step), profiler on, on gloo ranks of this machine (``mimo_accel.cpu``):

- **baseline**: upstream as shipped (every data rank reads the whole micro-batch, contiguous
  slices, no packing). Where upstream cannot run the profile's data at all (megatron-bridge 0.6.2
  slices patch-packed images by image count, so multi-image samples break at vision DP > 1, and
  fan-in with uneven rows breaks in the backward), the rehearsal says so and uses
  "sharded reads only" (contiguous order) as the before, labelled as such;
- **accelerated**: sharded reads + plan-before-read reordering + THD packing.

While running it checks the invariants: every sample of every global micro-batch processed once
per module, the same samples and the same image work in both runs, per-step losses equal (the
reorder changes which replica computes a sample, not what is computed). Then the report.
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
        from mimo_accel.stack import SampleSpec

        images, text = self.samples[idx]
        return SampleSpec(tuple(tuple(i) for i in images), int(text))


def _rank(rank, world, layout, features, spec, steps, micro_batch, seq_length, profile_dir, label, model_kw):
    """One rank of a rehearsal run (module-level: the ranks unpickle it)."""
    os.environ["MIMO_ACCEL_PROFILE_LABEL"] = label
    import mimo_accel
    from megatron.bridge.data.megatron_mimo.loaders import build_megatron_mimo_data_loaders
    from megatron.bridge.training.megatron_mimo_step import forward_step
    from functools import partial
    from types import SimpleNamespace

    from mimo_accel import stack as st
    from mimo_accel.testing import module_of_rank, report_progress

    mimo_accel.enable(profile=profile_dir, **features)
    cfg = st.StackConfig(layout=layout, seq_length=seq_length, **model_kw)
    stack = st.build_stack(cfg)
    stack.provider._grids = stack.infra.module_to_grid_map
    data = st.make_data_provider(lambda n: st.SyntheticVLMDataset(
        n, spec, seq_length=seq_length, patch_dim=cfg.patch_dim, vocab_size=cfg.vocab_size))
    train, _, _ = build_megatron_mimo_data_loaders(
        SimpleNamespace(model=stack.provider, train=SimpleNamespace(micro_batch_size=micro_batch)),
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
        out, _ = stack.train_step(batches, 1, micro_batch, partial(forward_step, None))
        losses.append([[float(x) for x in o["lm loss"]] for o in out])
        report_progress(step + 1, steps)
    mimo_accel.disable()
    return dict(module=module, seen=seen, patches=patches, losses=losses)


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
         log_path):
    from mimo_accel.testing import run_ranks

    shutil.rmtree(profile_dir, ignore_errors=True)
    with open(log_path, "a", encoding="utf-8") as log:
        log.write(f"\n########## {label} run: {time.strftime('%H:%M:%S')} ##########\n")
    done: dict[int, int] = {}

    def on_progress(rank, step, total):
        done[rank] = step
        progress.update(task, completed=min(done.values()) if len(done) == layout.world_size else 0)

    return run_ranks(_rank, layout.world_size, layout, features, spec, steps, micro_batch, seq_length,
                     str(profile_dir), label, model_kw, deadline_s=600, on_progress=on_progress,
                     log_file=log_path)


def rehearse(profile_name: str, *, steps: Optional[int] = None, out_dir: Optional[str] = None,
             json_path: Optional[str] = None, seed: int = 0, console=None, vision_dp: Optional[int] = None,
             language_dp: Optional[int] = None, log_path: Optional[str] = None) -> dict:
    """Run the rehearsal; print progress, the loss comparison and the report on ``console``.

    Everything else — the third-party warnings megatron's imports print, every rank's output —
    goes to ``log_path`` (default ``<out_dir>/rehearsal.log``), named once on the console.
    """
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
    from rich.table import Table

    from mimo_accel import report
    from mimo_accel.profiler import read_run
    from mimo_accel.profiles import load_profile
    from mimo_accel.testing import MimoLayout, RankFailure

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
    out = Path(out_dir or tempfile.mkdtemp(prefix="mimo-accel-rehearsal-"))
    out.mkdir(parents=True, exist_ok=True)
    log = Path(log_path) if log_path else out / "rehearsal.log"
    log.write_text(f"mimo-accel rehearse {profile.name}: {layout}, {time.strftime('%Y-%m-%d %H:%M:%S')}\n"
                   "(third-party import output, then each run's rank logs)\n", encoding="utf-8")
    console.print(f"[bold]mimo-accel rehearse[/bold] {profile.name}: {layout} on {layout.world_size} CPU ranks, "
                  f"{steps} steps x micro-batch {micro_batch}, profiles in {out}")
    console.print(f"third-party warnings and rank logs: {log}", highlight=False, soft_wrap=True)

    runs: dict[str, Any] = {}
    before_label, before_note = "baseline", "upstream as shipped"
    t0 = time.perf_counter()
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total} steps"),
                  TimeElapsedColumn(), console=console, transient=False) as progress:
        task = progress.add_task("baseline (upstream)", total=steps)
        try:
            runs["before"] = _run("baseline", {}, layout, spec, steps, micro_batch, seq_length,
                                  out / "baseline", model_kw, progress, task, log)
        except RankFailure as exc:
            reason = _first_error_line(str(exc))
            before_label, before_note = "sharded", f"upstream cannot run this data here ({reason}); before = sharded reads only"
            progress.update(task, description="[yellow]baseline failed upstream[/yellow]")
            task = progress.add_task("before: sharded reads, contiguous", total=steps)
            runs["before"] = _run("sharded", SHARDED_ONLY, layout, spec, steps, micro_batch, seq_length,
                                  out / "sharded", model_kw, progress, task, log)
        cost_model, cost_note = _calibrated(out / before_label, out / "cost-model.json")
        task = progress.add_task("accelerated (shard+reorder+pack)", total=steps)
        runs["after"] = _run("accelerated", dict(ALL_FEATURES, cost_model=cost_model), layout, spec, steps,
                             micro_batch, seq_length, out / "accelerated", model_kw, progress, task, log)
    elapsed = time.perf_counter() - t0

    before = _check_invariants(runs["before"], steps, micro_batch, before_label)
    after = _check_invariants(runs["after"], steps, micro_batch, "accelerated")
    if before["vision_patches"] != after["vision_patches"]:
        raise InvariantViolation(f"the runs did different image work per step: {before['vision_patches']} vs "
                                 f"{after['vision_patches']} patches")
    losses = Table(title="Per-step language loss (sum over replicas): the same samples, the same math")
    for col in ("step", f"{before_label} loss", "accelerated loss", "tokens", "rel. diff"):
        losses.add_column(col, justify="right")
    worst = 0.0
    for s, ((lb, tb), (la, ta)) in enumerate(zip(before["losses"], after["losses"])):
        if tb != ta:
            raise InvariantViolation(f"step {s}: {tb} loss tokens before vs {ta} after")
        rel = abs(la - lb) / max(abs(lb), 1e-12)
        worst = max(worst, rel)
        losses.add_row(str(s), f"{lb / tb:.6f}", f"{la / ta:.6f}", f"{int(tb)}", f"{rel:.1e}")
    console.print(losses)
    if worst > 1e-2:
        raise InvariantViolation(f"per-step losses differ by {worst:.1e} relative: not the same computation")

    doc = report.build(read_run(out / before_label), read_run(out / "accelerated"))
    report.render(doc["before"], doc["after"], console=console)
    console.print(f"before = {before_label}: {before_note}. Plan costs: {cost_note}. "
                  f"Wall time of the rehearsal: {elapsed:.0f}s.")
    # The report's keys (format, before, after, change, warnings) at the top level, as
    # `mimo-accel report --json` writes them; the rehearsal's own fields beside them.
    own = {"profile": profile.name, "layout": str(layout), "steps": steps, "micro_batch": micro_batch,
           "before_label": before_label, "before_note": before_note,
           "losses": {"before": before["losses"], "after": after["losses"]}, "profile_dir": str(out),
           "log": str(log), "wall_s": elapsed}
    if json_path:
        report.write_json(json_path, doc, **own)
    return {**doc, **own}


def _calibrated(run_dir: Path, out_file: Path) -> tuple[Optional[str], str]:
    """Fit the cost model on the before-run's profile (what `mimo-accel calibrate` does), so the
    accelerated run plans with this machine's measured vision costs."""
    from mimo_accel.calibrate import CalibrationError, fit
    from mimo_accel.profiler import read_run

    try:
        model, stats = fit(read_run(run_dir))
    except CalibrationError as exc:
        return None, f"default cost model (calibration failed: {exc})"
    model.to_file(out_file)
    return str(out_file), (f"calibrated on the before-run: a={model.a:.3g} s/patch, b={model.b:.3g} s/patch², "
                           f"c={model.c:.3g} s/token, R²={stats['r2']:.2f}")


def _first_error_line(text: str) -> str:
    lines = [l.strip() for l in text.splitlines() if "Error" in l and ":" in l and not l.strip().startswith("File")]
    return (lines[-1] if lines else text.splitlines()[0])[:160]


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="mimo-accel rehearse", description=__doc__.split("\n\n")[0])
    p.add_argument("--profile", default="receipts", help="profile name or TOML path (default: receipts)")
    p.add_argument("--steps", type=int, help="training steps per run (default: the profile's rehearsal steps)")
    p.add_argument("--vision-dp", type=int, help="override the profile's rehearsal vision DP")
    p.add_argument("--language-dp", type=int, help="override the profile's rehearsal language DP")
    p.add_argument("--out", help="directory for the profiler runs (default: a temp dir)")
    p.add_argument("--json", help="write the report's JSON here (its keys at the top level, as `mimo-accel "
                   "report --json` writes them) with the rehearsal's own fields (losses, layout, log, ...)")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    from mimo_accel.testing import RankFailure

    out = args.out or tempfile.mkdtemp(prefix="mimo-accel-rehearsal-")
    log = Path(out) / "rehearsal.log"
    try:
        rehearse(args.profile, steps=args.steps, out_dir=out, json_path=args.json, seed=args.seed,
                 vision_dp=args.vision_dp, language_dp=args.language_dp, log_path=str(log))
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
