"""The runs `mimo-accel rehearse` compares (:mod:`mimo_accel_dev.commands.rehearse` drives them and
reports): a real non-colocated MegatronMIMO layout trained on gloo ranks of this machine.

- :func:`run_stack`: each rank trains the tiny stack's train step over a table of sample shapes
  (Bridge's loaders, provider and forward step; megatron-core's BridgeCommunicator and pipeline
  schedule), profiler on; :func:`check_invariants` then checks that each module processed every
  sample of every global micro-batch once.
- :func:`run_bridge`: each rank runs the example's ``main(argv)`` (``examples/train_mimo.py``,
  i.e. :mod:`mimo_accel_dev.rehearse.bridge_script`: Bridge's ``pretrain_megatron_mimo``) with
  Bridge's Qwen3-VL vision model on image files; :func:`bridge_steps` checks its ``--trace``.

:func:`upstream_limit` tells a failure of upstream as shipped on the data (which falls back to a
"sharded reads only" before-run) from any other.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

from mimo_accel.modules import LANGUAGE

ALL_FEATURES = dict(sharded_reads=True, reorder=True, packing=True)
SHARDED_ONLY = dict(sharded_reads=True)
# the floor run: the accelerated run's reads and packing over equal work (nothing to plan)
FLOOR_FEATURES = dict(sharded_reads=True, packing=True)
FLOOR_STEPS = 8  # the first is warm-up


class InvariantViolation(AssertionError):
    """Samples lost, duplicated or mis-paired, or the runs disagree on what was computed."""


@dataclass(frozen=True)
class TableSpec:
    """Sample i's shape from a precomputed table (picklable, so ranks can rebuild the dataset)."""

    samples: tuple  # of (images ((h, w), ...), text_tokens)

    def __call__(self, idx: int):
        from mimo_accel_dev.rehearse.stack import SampleSpec

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


def _pin(cpus: Optional[Sequence[int]]) -> None:
    if cpus:
        os.sched_setaffinity(0, set(cpus))


# What a rank's working set still grows by after its first step: the demo's heaviest vision steps
# add about 400 MiB (16 images of up to 960 rows, their attention kept for the backward).
WARM_POOL_MIB = 512


def _libc():
    import ctypes
    import ctypes.util

    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def _keep_freed_memory() -> None:
    """Let this rank's malloc keep the memory it frees (glibc: no trimming, a fixed 32 MiB mmap
    threshold). By default glibc hands freed blocks of the encoder's attention buffers back to the
    OS and faults them in again on the next step; those page faults land in the thread-CPU time
    the profiler reads, unevenly: measured on the 2-core VM, the same forward+backward took
    112-209 ms that way and 136-150 ms with freed memory kept. No-op where glibc is absent."""
    libc = _libc()
    if libc is None or not hasattr(libc, "mallopt"):
        return
    m_trim_threshold, m_mmap_threshold = -1, -3  # <malloc.h>
    libc.mallopt(m_trim_threshold, 1 << 30)
    libc.mallopt(m_mmap_threshold, 32 << 20)


def warm_memory_pool(mib: int = WARM_POOL_MIB) -> None:
    """Fault in ``mib`` MiB of heap on this thread and free it, kept (:func:`_keep_freed_memory`).

    Kept memory still has to be faulted in once: without this, each step whose working set outgrows
    every earlier one pays for it on the timed thread, on whichever replica the plan gave that
    step's tallest images, and in the demo's first steps that cost, not the plan, decided which
    replica straggled (docs/measurements.md). Called once, when the warm-up step's trace is flushed
    at the start of the next step's first forward (outside its timed regions, inside its wall time;
    the warm-up step's own setup allocations would otherwise take the pool), on the training thread
    whose arena the steps allocate from. A GPU's caching allocator keeps its pool the same way, and
    its growth is no page faults on a timed thread."""
    import ctypes

    libc = _libc()
    if libc is None or not hasattr(libc, "malloc"):
        return
    malloc, free, memset = libc.malloc, libc.free, libc.memset
    malloc.restype, malloc.argtypes, free.argtypes = ctypes.c_void_p, [ctypes.c_size_t], [ctypes.c_void_p]
    memset.restype, memset.argtypes = ctypes.c_void_p, [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
    chunk = 16 << 20  # below the mmap threshold: from the heap, which keeps it once freed
    blocks = [malloc(chunk) for _ in range(mib // 16)]
    for block in blocks:
        if block:
            memset(block, 1, chunk)  # a written page is faulted in now, not in a timed step
    for block in blocks:
        free(block)


def _rank(rank, world, layout, features, spec, steps, micro_batch, seq_length, profile_dir, label, model_kw,
          cpus=None):
    """One rank of a rehearsal run (module-level: the ranks unpickle it)."""
    _pin(cpus)
    _keep_freed_memory()
    os.environ["MIMO_ACCEL_PROFILE_LABEL"] = label
    import mimo_accel
    from megatron.bridge.training.megatron_mimo_step import forward_step
    from functools import partial
    from types import SimpleNamespace

    from mimo_accel_dev.rehearse import stack as st
    from mimo_accel_dev.rehearse.ranks import loader_config, module_of_rank, report_progress, step_state

    mimo_accel.enable(profile=profile_dir, **features)
    # after enable(): Bridge's loader builder is bound by value here
    from megatron.bridge.data.megatron_mimo.loaders import build_megatron_mimo_data_loaders

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

    from mimo_accel.runtime.reading.shard import SHARD_TAG_KEY

    if SHARD_TAG_KEY in view:
        return view
    upstream = getattr(dp_utils.slice_batch_for_megatron_mimo, "__wrapped__", dp_utils.slice_batch_for_megatron_mimo)
    return upstream(view, dp_rank, dp_size)


def check_invariants(results: list[dict], steps: int, micro_batch: int, what: str) -> dict:
    """Per step: each module processed every sample of the global micro-batch exactly once."""
    per_module: dict[str, list[list[int]]] = {}
    for module in _modules_of(results):
        ranks = [r for r in results if r["module"] == module]
        steps_seen = []
        for s in range(steps):
            ids = sorted(i for r in ranks for i in r["seen"][s])
            if ids != list(range(s * micro_batch, (s + 1) * micro_batch)):
                raise InvariantViolation(f"{what}: {module} step {s} processed samples {ids}, expected each of "
                                         f"{s * micro_batch}..{(s + 1) * micro_batch - 1} exactly once")
            steps_seen.append(ids)
        per_module[module] = steps_seen
    encoders = [r for r in results if r["module"] != LANGUAGE]
    lang = [r for r in results if r["module"] == LANGUAGE]
    return {
        "losses": [[sum(r["losses"][s][0][k] for r in lang) for k in (0, 1)] for s in range(steps)],
        "vision_patches": [sum(r["patches"][s] for r in encoders) for s in range(steps)],
    }


def _modules_of(records: list[dict]) -> list[str]:
    """The modules the ranks' records name, in the order first seen."""
    return list(dict.fromkeys(r["module"] for r in records))


def run_stack(label, features, layout, spec, steps, micro_batch, seq_length, profile_dir, model_kw, progress,
              task, log_path, cpus=None):
    """One run of the stack on the layout's ranks; returns each rank's record (module, seen, patches, losses)."""
    from mimo_accel_dev.rehearse.ranks import run_ranks

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


# What megatron-bridge 0.6.2 says when it cannot run a workload's data (fan-in with uneven encoder
# rows; images per micro-batch not divisible by the encoder DP). Only these fall back to a
# "sharded reads only" before-run; any other failure (a port clash, a bug) is raised as it is.
UPSTREAM_LIMITS = ("Mismatch in shape", "Fan-in with variable", "is not divisible by encoder DP")


def upstream_limit(exc: BaseException) -> str:
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
# straggler max/mean p50 1.37-1.49, ~0.3 s of encoder work per vision rank per step, ~2 min for
# both runs). One image per sample (so upstream as shipped can split every micro-batch by image
# count and runs the baseline), heights lognormal with a tall tail up to 120x8 patches
# (stack.IMAGE_MIXES["receipts"], workloads/receipts.toml's rehearsal sizes), 16 images per vision
# replica per step (one micro-batch of 64 per iteration), 10 iterations (the first is warm-up).
# Vision: Qwen3-VL hidden 64, 4 layers, 4 heads (four runs: after-run vision straggler
# p50 1.019-1.036, language 1.007-1.014, planning with the cost model calibrated on the before-run).
# With 8 heads (one run) the replicas holding the tallest images (800-960 patches) ran 20-30%
# over what a·Σp + b·Σp² predicts (likely their attention scores, 20-29 MiB at 8 heads,
# outgrowing the 32 MiB L3 the two CPUs share).
BRIDGE_DEFAULTS = dict(steps=24, vision_dp=4, language_dp=4, micro_batch=64)
BRIDGE_SEQ = 288  # the most placeholders one image takes (240) + its text
BRIDGE_MODEL = ("--encoder", "qwen3vl", "--vision-hidden", "64", "--vision-layers", "4", "--vision-heads", "4",
                "--hidden", "256", "--language-layers", "3",
                "--image-mix", "receipts", "--max-image-rows", "240")


#: The default ``--loop bridge`` training script (the body of ``examples/train_mimo.py``).
BRIDGE_SCRIPT = "mimo_accel_dev.rehearse.bridge_script"


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
        from mimo_accel_dev.rehearse import bridge_script

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
    from mimo_accel_dev.rehearse import peers
    from mimo_accel_dev.rehearse.ranks import report_progress

    peers.install_from_env()  # a peer's planner in place of the joint plan, where the run names one

    # before the script is imported: it binds Bridge's loader builder by value at its top
    mimo_accel.enable(profile=profile_dir, **features)
    example = _load_example(script)
    home = sys.modules[example.main.__module__]  # where main's _Trace is (examples/train_mimo.py imports main)
    flush = home._Trace.flush

    warmed = []

    def flush_and_report(trace):  # the trace flushes once per finished training iteration
        iteration = trace.current["iteration"] if trace.current is not None else None
        flush(trace)
        if iteration is not None:
            if not warmed:  # after the warm-up step, before the next one's timed regions
                warm_memory_pool()
                warmed.append(iteration)
            report_progress(iteration, steps)

    home._Trace.flush = flush_and_report
    try:
        example.main(argv)
        return mimo_accel.status()["active"]
    finally:
        mimo_accel.disable()


def run_bridge(label, features, vdp, ldp, steps, micro_batch, out: Path, image_dir: Path, script: Optional[Path],
               seed: int, progress, task, log_path: Path, cpus=None, env: Optional[dict] = None,
               extra_argv: Sequence[str] = (), language_ranks: int = 1) -> list[dict]:
    """One run of the example (``script``, or :data:`BRIDGE_SCRIPT` when None) on vdp + ldp ranks (each
    language replica on ``language_ranks``: its TP x PP), with ``extra_argv`` after the rehearsal's own
    flags; returns its trace records."""
    from mimo_accel_dev.rehearse.ranks import run_ranks

    profile_dir, trace = out / label, out / f"{label}-trace.jsonl"
    shutil.rmtree(profile_dir, ignore_errors=True)
    trace.unlink(missing_ok=True)
    with open(log_path, "a", encoding="utf-8") as log:
        log.write(f"\n########## {label} run: {time.strftime('%H:%M:%S')} ##########\n")
    argv = ["--cpu", *BRIDGE_MODEL, "--dataset", "images", "--image-dir", str(image_dir),
            "--vision-dp", str(vdp), "--language-dp", str(ldp), "--mbs", str(micro_batch),
            "--gbs", str(micro_batch), "--seq-length", str(BRIDGE_SEQ), "--train-iters", str(steps),
            "--eval-interval", "0", "--seed", str(1234 + seed), "--trace", str(trace), *extra_argv]
    env = {"MIMO_ACCEL_CACHE_DIR": str(out / "cache"), **(env or {})}
    done: dict[int, int] = {}
    world = vdp + ldp * language_ranks

    def on_progress(rank, step, total):
        done[rank] = step
        progress.update(task, completed=min(done.values()) if len(done) == world else 0)

    run_ranks(_bridge_rank, world, None if script is None else str(script), argv, features, str(profile_dir),
              label, steps, env, cpus, deadline_s=600, on_progress=on_progress, log_file=log_path)
    progress.update(task, completed=steps)
    import json

    return [json.loads(line) for line in trace.read_text().splitlines()]


def run_floor(console, progress, vdp, ldp, mbs, out: Path, image_dir: Path, script: Optional[Path], seed: int,
              log_path: Path, cpus=None) -> Optional[Path]:
    """The machine's floor: the accelerated run's reads and packing over equal work on every replica
    (``--equal-work``), :data:`FLOOR_STEPS` steps; its profile directory, or None (said) where the
    example cannot run it."""
    from mimo_accel_dev.rehearse.ranks import RankFailure

    task = progress.add_task("floor: the same samples on every replica", total=FLOOR_STEPS)
    try:
        run_bridge("floor", FLOOR_FEATURES, vdp, ldp, FLOOR_STEPS, mbs, out, image_dir, script, seed, progress, task,
                   log_path, cpus, extra_argv=["--equal-work"])
    except RankFailure as exc:
        progress.update(task, description="[yellow]floor not measured[/yellow]")
        console.print(f"[yellow]the machine's floor was not measured: the example could not run equal work "
                      f"({upstream_limit(exc)})[/yellow]")
        return None
    return out / "floor"


def bridge_steps(records: list[dict], steps: int, batch: int, what: str, first: int = 1) -> list[dict]:
    """Per iteration from a trace (``first``..``steps``: a resumed run's from the one after its
    checkpoint): each module trained every sample of the iteration's global batch (``batch``
    samples) exactly once; the global per-token loss and its token count."""
    out = []
    # a replica's TP ranks train the same samples and report the same loss; its pipeline stages too,
    # the loss being the last stage's
    records = list({(r["module"], r["dp_rank"], r.get("pp_rank", 0), r["iteration"]): r for r in records}.values())
    for it in range(first, steps + 1):
        rows = [r for r in records if r["iteration"] == it]
        want = list(range((it - 1) * batch, it * batch))
        for module in _modules_of(records):
            ids = sorted(i for r in rows if r["module"] == module and not r.get("pp_rank", 0)
                         for micro in r["ids"] for i in micro)
            if ids != want:
                raise InvariantViolation(f"{what}: {module} iteration {it} trained samples {ids}, expected each of "
                                         f"{want[0]}..{want[-1]} exactly once")
        loss_sum = sum(r["loss_sum"] for r in rows if r["loss_sum"] is not None)
        tokens = sum(r["tokens"] for r in rows if r["tokens"] is not None)
        if not tokens:
            raise InvariantViolation(f"{what}: iteration {it} has no loss tokens in the trace")
        out.append({"loss_sum": loss_sum, "tokens": tokens})
    return out
