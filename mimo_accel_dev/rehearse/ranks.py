"""Multi-rank harness: run a function on N gloo ranks, and build the real MIMO grids.

Used by the test suite and the rehearsal. Ranks are forked from a forkserver that has already
imported torch and megatron (20-30 s of imports paid once per session, not once per rank).
Every run has a hard deadline; when a rank fails, the others are killed and the failing rank's
traceback (and the tail of its output) is raised in the caller — no hang when one rank dies.
Each rank leads its own process group, so whatever it started (the spawn Manager a torch_dist
checkpoint save starts) is killed with it.
"""

from __future__ import annotations

import faulthandler
import multiprocessing as mp
import os
import queue
import shutil
import signal
import socket
import sys
import tempfile
import time
import traceback
from datetime import timedelta
from typing import Any, Callable

from mimo_accel.modules import LANGUAGE, Modules, module  # noqa: F401  (re-exported for the tests)
from mimo_accel.workloads import VISION

_PRELOAD = "mimo_accel_dev.rehearse._preload"
_progress = None  # in a rank: the parent's queue, for report_progress()


def report_progress(done: int, total: int) -> None:
    """From inside a rank function: tell the parent's ``on_progress`` callback how far it is."""
    if _progress is not None:
        _progress.put((_rank_of_this_process, "progress", (done, total)))


_rank_of_this_process = -1


class RankFailure(AssertionError):
    """A rank raised, died or missed the deadline. ``str()`` carries its traceback."""


def layout_of(vision_dp: int, language_dp: int, **encoder_dps: int) -> Modules:
    """DP sizes only (tp = pp = 1): ``"vision"``, then the ``encoder_dps`` encoders in their order,
    then the language module."""
    return Modules.from_dp_sizes({VISION: vision_dp, **encoder_dps, LANGUAGE: language_dp})


def parallelism_config(layout: Modules):
    """Bridge's ``MegatronMIMOParallelismConfig`` for this layout (finalized): each module's sizes at
    its :meth:`~mimo_accel.modules.Modules.rank_offsets` offset."""
    from megatron.bridge.models.megatron_mimo.megatron_mimo_config import (
        MegatronMIMOParallelismConfig,
        ModuleParallelismConfig,
    )

    offsets = layout.rank_offsets()
    cfg = MegatronMIMOParallelismConfig(module_parallelisms={
        name: ModuleParallelismConfig(tensor_model_parallel_size=layout[name].tp,
                                      pipeline_model_parallel_size=layout[name].pp,
                                      data_parallel_size=layout[name].dp, rank_offset=offset)
        for name, offset in offsets.items()})
    cfg.finalize(layout.world_size)
    return cfg


def build_grids(layout: Modules):
    """The HyperCommGrids Bridge builds for this layout (its own ``build_hypercomm_grids``).

    Collective: every rank of the world must call it, in the same order.
    """
    from megatron.bridge.models.megatron_mimo.megatron_mimo_builder import build_hypercomm_grids

    return build_hypercomm_grids(parallelism_config(layout))


def module_of_rank(layout: Modules, rank: int) -> str | None:
    return layout.module_of_rank(rank)


# ----------------------------------------------------------------------------------------------
# The parts of Bridge's ConfigContainer / GlobalState that the harness calls read
# ----------------------------------------------------------------------------------------------


def loader_config(provider, micro_batch_size: int, *, eval_micro_batch_size: int | None = None):
    """What ``build_megatron_mimo_data_loaders(cfg, ...)`` reads of ``cfg``: ``cfg.model`` (the
    ``MegatronMIMOProvider``), ``cfg.train.micro_batch_size`` and -- upstream main (#5606), not
    0.6.2 -- ``cfg.validation.eval_micro_batch_size`` for the valid/test loaders (default: the
    training micro-batch size, as ``ConfigContainer`` does when it is unset)."""
    from types import SimpleNamespace

    eval_mbs = micro_batch_size if eval_micro_batch_size is None else eval_micro_batch_size
    return SimpleNamespace(model=provider, train=SimpleNamespace(micro_batch_size=micro_batch_size),
                           validation=SimpleNamespace(eval_micro_batch_size=eval_mbs))


def step_state(dataset_cfg: Any = None):
    """The ``state`` for Bridge's MIMO ``forward_step(state, data_iterator, model)`` outside the
    training loop. 0.6.2 reads nothing of it (``None`` works there); upstream main reads
    ``state.cfg.dataset`` (``resolve_step_packing``: no dataset config -> no step packing)."""
    from types import SimpleNamespace

    return SimpleNamespace(cfg=SimpleNamespace(dataset=dataset_cfg))


# ----------------------------------------------------------------------------------------------
# Running a function on N ranks
# ----------------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def preload_megatron_in_forkserver() -> None:
    """Make the process's forkserver import megatron (and the 3.11 back-port it needs) when it starts.

    A process has one forkserver, and it reads its preload list once, when it starts: whoever
    starts it first (these ranks, or a test's own ``torch.multiprocessing`` forkserver ranks)
    decides for every later rank. A rank whose function lives in a module that imports
    ``megatron.bridge`` at its top needs the back-port in place before it unpickles that function.
    So this is set before any forkserver starts (the test suite's ``pytest_configure``), not only
    when ranks are started here."""
    mp.set_forkserver_preload([_PRELOAD])


def _context():
    preload_megatron_in_forkserver()
    return mp.get_context("forkserver")


def _results_queue_by_fork() -> None:
    """torch_dist saves pass their write results through a ``Manager().Queue()`` started with
    spawn (megatron/core/dist_checkpointing/strategies/filesystem_async.py
    ``get_write_results_queue``); the fresh server imports torch to unpickle them, 2-7 s per
    save on 2 cores. A rank has torch loaded already: start that server by fork instead."""
    try:
        from megatron.core.dist_checkpointing.strategies import filesystem_async
    except ImportError:
        return
    spawn_started = filesystem_async.get_write_results_queue

    def get_write_results_queue(mp_mode: str = "spawn"):
        return spawn_started("fork" if mp_mode == "spawn" else mp_mode)

    filesystem_async.get_write_results_queue = get_write_results_queue  # this rank process only


def _rank_main(fn, rank, world_size, port, args, results, log_path, deadline_s, cpu_layer):
    global _progress, _rank_of_this_process
    _progress, _rank_of_this_process = results, rank
    # The parent starts ranks daemonic (they die with it), but a daemonic process may not start
    # children, and a torch_dist save starts a spawn Manager (megatron/core/dist_checkpointing/
    # strategies/filesystem_async.py get_write_results_queue). Inside the rank the flag only
    # governs that; the rank leads a process group of its own, which the parent kills whole.
    mp.current_process().daemon = False
    os.setpgrp()
    _results_queue_by_fork()
    log = open(log_path, "w", buffering=1)
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    # If the parent's deadline is about to kill us, leave every thread's stack in the log.
    faulthandler.dump_traceback_later(max(1.0, deadline_s - 3.0), exit=False, file=log)
    try:
        import torch
        import torch.distributed as dist

        torch.set_num_threads(1)
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                          RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank))
        if cpu_layer:
            from mimo_accel_dev.rehearse import cpu

            cpu.activate()
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world_size, timeout=timedelta(seconds=deadline_s))
        value = fn(rank, world_size, *args)
        results.put((rank, "ok", value))
        dist.barrier()
        dist.destroy_process_group()
    except BaseException:
        results.put((rank, "error", traceback.format_exc()))
        results.close()
        results.join_thread()  # the report must leave before the hard exit below
        sys.stderr.flush()
        os._exit(1)
    finally:
        faulthandler.cancel_dump_traceback_later()


def _tail(path: str, limit: int = 4000) -> str:
    try:
        with open(path, errors="replace") as f:
            text = f.read()
    except OSError:
        return ""
    return text[-limit:]


def _died_without_report(rank: int, exitcode: int) -> str:
    if exitcode < 0:
        try:
            how = f"was killed by signal {signal.Signals(-exitcode).name}"
        except ValueError:
            how = f"was killed by signal {-exitcode}"
    else:
        how = f"exited with code {exitcode}"
    return f"rank {rank} {how} without a report"


def _kill_rank(p) -> None:
    """Kill a rank and everything it started (its process group); reap it."""
    if p.pid is None:
        return
    if p.exitcode is None or p.exitcode != 0:
        try:
            os.killpg(p.pid, signal.SIGKILL)  # the rank called setpgrp(): its pid is its group's id
        except (ProcessLookupError, PermissionError):
            pass
    if p.is_alive():
        p.kill()
    p.join(timeout=5)


def run_ranks(fn: Callable[..., Any], world_size: int, *args: Any, deadline_s: float = 240.0,
              cpu_layer: bool = True, on_progress: Callable[[int, int, int], None] | None = None,
              log_file: str | os.PathLike | None = None) -> list[Any]:
    """Run ``fn(rank, world_size, *args)`` on ``world_size`` gloo ranks; return each rank's result.

    ``fn`` and ``args`` must be picklable (a module-level function). With ``cpu_layer`` each rank
    activates :mod:`mimo_accel_dev.rehearse.cpu` before ``init_process_group``.
    Raises :class:`RankFailure` naming the first failing rank with its traceback.

    Each rank's stdout/stderr goes to a log of its own. With ``log_file`` those logs are appended
    to it afterwards (one section per rank, in rank order), and, if this call starts the
    forkserver, what its preload import of megatron prints goes there too (not the console).
    """
    ctx = _context()
    results = ctx.Queue()
    port = free_port()
    logdir = tempfile.mkdtemp(prefix="mimo-accel-ranks-")
    logs = [os.path.join(logdir, f"rank{r}.log") for r in range(world_size)]
    procs = [ctx.Process(target=_rank_main, daemon=True,
                         args=(fn, r, world_size, port, args, results, logs[r], deadline_s, cpu_layer))
             for r in range(world_size)]
    out: dict[int, Any] = {}
    errors: dict[int, str] = {}
    end = time.monotonic() + deadline_s
    try:
        _start(procs, log_file)
        while len(out) < world_size and not errors:
            try:
                rank, status, value = results.get(timeout=0.2)
            except queue.Empty:
                dead = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0) and r not in out]
                if dead:
                    # A rank died without reporting (killed, segfault): allow a moment for its
                    # queued report to arrive, then call it.
                    try:
                        rank, status, value = results.get(timeout=1.0)
                    except queue.Empty:
                        r = dead[0]
                        errors[r] = _died_without_report(r, procs[r].exitcode)
                        break
                elif time.monotonic() > end:
                    raise RankFailure(
                        f"deadline of {deadline_s:.0f}s passed; ranks done: {sorted(out)}, "
                        f"still running: {[r for r in range(world_size) if r not in out]}\n"
                        + "".join(f"\n--- rank {r} output (tail) ---\n{_tail(logs[r])}"
                                  for r in range(world_size) if r not in out))
                else:
                    continue
            if status == "ok":
                out[rank] = value
            elif status == "progress":
                if on_progress is not None:
                    on_progress(rank, *value)
            else:
                errors[rank] = value
        if errors:
            # Other ranks usually fail *because* the first one did; give them a moment to report.
            grace = time.monotonic() + 2.0
            while time.monotonic() < grace:
                try:
                    rank, status, value = results.get(timeout=0.2)
                    if status == "error":
                        errors.setdefault(rank, value)
                except queue.Empty:
                    pass
            # A rank that died without a report (killed by a signal, a segfault) is the root
            # cause: the others fail only because their collectives lost it, and they may well
            # report first.
            silent = [r for r, p in enumerate(procs)
                      if r not in errors and r not in out and p.exitcode not in (None, 0)]
            for r in silent:
                errors[r] = _died_without_report(r, procs[r].exitcode)
            first = silent[0] if silent else next(iter(errors))  # else the first to report, usually
            raise RankFailure(
                f"rank {first} of {world_size} failed:\n{errors[first]}"
                f"\n--- rank {first} output (tail) ---\n{_tail(logs[first])}"
                + (f"\n(other failing ranks: {sorted(set(errors) - {first})})" if len(errors) > 1 else ""))
        for p in procs:
            p.join(timeout=max(1.0, end - time.monotonic()))
        return [out[r] for r in range(world_size)]
    finally:
        for p in procs:
            _kill_rank(p)
        if log_file is not None:
            _collect_logs(logs, logdir, log_file, getattr(fn, "__qualname__", repr(fn)))


def _start(procs, log_file) -> None:
    """Start the ranks; the first start also starts the forkserver, which inherits the environment
    (the import log's path) now."""
    from mimo_accel.tools.quiet import IMPORT_LOG_ENV

    previous = os.environ.get(IMPORT_LOG_ENV)
    if log_file is not None:
        os.environ[IMPORT_LOG_ENV] = os.fspath(log_file)
    try:
        for p in procs:
            p.start()
    finally:
        if log_file is not None:
            if previous is None:
                os.environ.pop(IMPORT_LOG_ENV, None)
            else:
                os.environ[IMPORT_LOG_ENV] = previous


def _collect_logs(logs: list[str], logdir: str, log_file, what: str) -> None:
    """Append each rank's log to ``log_file`` (a section per rank) and remove the per-rank logs."""
    with open(log_file, "a", encoding="utf-8", errors="replace") as out:
        for r, path in enumerate(logs):
            out.write(f"\n===== {what}: rank {r} of {len(logs)} =====\n")
            try:
                with open(path, errors="replace") as f:
                    shutil.copyfileobj(f, out)
            except OSError as exc:
                out.write(f"(no log: {exc})\n")
    shutil.rmtree(logdir, ignore_errors=True)
