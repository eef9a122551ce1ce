"""Per-rank step recorder: region timers and counters, one JSON line per training step.

Each rank writes ``<out_dir>/rank<N>.jsonl``: a header line, then one line per step, flushed as
soon as the step ends, so a killed run leaves files that :func:`mimo_accel.profiler.run.read_run` can still
load (a torn last line is dropped with a warning).

Clocks (recorded in the header under ``"clock"``): :mod:`~mimo_accel.profiler.clocks`.

The file format (``FORMAT``): a region declared to the recorder (at creation, ``regions=``, or by
:meth:`Recorder.declare`, as a module timer does when it is attached) is present in every later
step line, null when it was not timed that step; any other region only in the steps that timed it.
The counters ``COUNTERS`` are always present (0 if unset); an encoder module's counters
``<module>_items`` / ``<module>_rows`` / ``<module>_sq_rows`` (``MODULE_COUNTERS``) from the first
step they were declared or added in (0 when unset). ``micro`` (older files lack it): each call of
a module's region in the step, ``{"<module>_fwd": [seconds, ...]}`` in call order, one a
micro-batch, and where the runtime counted them, an encoder's counters per forward
(``"<module>_rows": [rows, ...]``) and a language rank's real tokens per micro-batch (``"tokens"``,
``"sq_tokens"``), :meth:`Recorder.add_micro`. The header lists what was
declared at creation (``regions``, ``counters``), ``build``: how this rank's modules were
built (their pipeline split, sequence parallelism, recompute, precision, the distributed optimizer:
:mod:`mimo_accel.runtime.measuring.job_build`), null where the run did not say, and the run the
file belongs to (``run_id``, the same on every rank of one run; ``run_id_from``: what it was
derived from; null in older files).
:func:`mimo_accel.profiler.run.read_run` refuses a file of an older format (``FORMAT_V1``), naming the
rerun that records this one.

The recorder does no collective communication and imports torch only when a CUDA clock or the
module timer needs it, so ``mimo_accel.tools.report`` can load runs without importing torch.
"""

from __future__ import annotations

import json
import math
import os
import platform
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from mimo_accel import nvtx
from mimo_accel.profiler.clocks import make_clock, resolve_device

FORMAT = "mimo-accel-profile/2"
#: The format before per-module timing, which :func:`mimo_accel.profiler.run.read_run` refuses.
FORMAT_V1 = "mimo-accel-profile/1"
#: Counters that :meth:`Recorder.add` accumulates per step; always present in a step line (0 if unset).
#: ``tokens`` / ``sq_tokens``: the batch's real tokens, Σ L and Σ L² over its samples.
COUNTERS = ("samples", "tokens", "sq_tokens", "samples_read", "bytes_read", "bytes_exchanged")
#: Per-encoder counters: ``<module>_items`` (images / clips), ``<module>_rows`` (encoder rows summed over
#: the items), ``<module>_sq_rows`` (rows² summed over the items).
MODULE_COUNTERS = ("items", "rows", "sq_rows")
#: The regions of a module: ``<module>_fwd`` and ``<module>_bwd``.
MODULE_REGIONS = ("fwd", "bwd")
#: The name an encoder is timed under when nothing names its module (the profiler says so once).
UNNAMED_ENCODER = "vision"
#: That encoder's regions.
UNNAMED_REGIONS = tuple(f"{UNNAMED_ENCODER}_{part}" for part in MODULE_REGIONS)
#: Fields :meth:`Recorder.set` may fill that are always present in a step line (null if unset).
SETTABLE = ("predicted_spread",)
_MICRO_SUFFIXES = ("_fwd", "_bwd")
_MICRO_COUNTERS = ("tokens", "sq_tokens")  # the language model's, per micro-batch

_RESERVED = frozenset(
    {"kind", "step", "step_time_s", "step_cpu_s", "t", "timed_calls", "clock_fallbacks", "micro"}
    | set(COUNTERS)
)


def module_regions(module: str) -> tuple[str, str]:
    """The forward and backward region names of module ``module``: ``(<module>_fwd, <module>_bwd)``."""
    return tuple(f"{module}_{part}" for part in MODULE_REGIONS)  # type: ignore[return-value]


def module_counters(module: str) -> tuple[str, str, str]:
    """An encoder module's counters: ``(<module>_items, <module>_rows, <module>_sq_rows)``."""
    return tuple(f"{module}_{part}" for part in MODULE_COUNTERS)  # type: ignore[return-value]


def is_counter(name: str) -> bool:
    """Whether :meth:`Recorder.add` accepts ``name``: one of ``COUNTERS`` or ``<module>_items`` /
    ``<module>_rows`` / ``<module>_sq_rows`` for a non-empty module name."""
    if name in COUNTERS:
        return True
    for part in ("sq_rows", "items", "rows"):  # sq_rows before rows: "x_sq_rows" is module x's
        if name.endswith(f"_{part}") and len(name) > len(part) + 1:
            return True
    return False


def rank_file(out_dir: str | os.PathLike[str], rank: int) -> Path:
    """The path rank ``rank`` writes to: ``<out_dir>/rank<rank>.jsonl``."""
    return Path(out_dir) / f"rank{int(rank)}.jsonl"


def _default_versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    try:
        from mimo_accel._version import __version__

        versions["mimo_accel"] = __version__
    except Exception:  # pragma: no cover
        pass
    for name, module in (("torch", sys.modules.get("torch")), ("megatron-bridge", sys.modules.get("megatron.bridge"))):
        if getattr(module, "__version__", None) is not None:
            versions[name] = str(module.__version__)
    return versions


# ------------------------------------------------------------------------------------- recorder


class Recorder:
    """Records one rank's steps to ``<out_dir>/rank<rank>.jsonl`` (``out_dir`` None: to no file; the
    step lines :meth:`end_step` returns are all there is).

    A step runs from :meth:`begin_step` (or, if that is not called, from the previous
    :meth:`end_step` / the recorder's creation) to :meth:`end_step`, which writes and flushes the
    line. Between them, :meth:`add` accumulates counters, :meth:`set` sets fields, and
    :meth:`start`/:meth:`stop` (or ``with recorder.time(name)``) time regions; a region timed
    several times in a step (micro-batches) is summed. Nested starts of the same region count
    once (the outermost pair). A region still open at ``end_step`` is carried into the next step.

    Not a collective: every rank records on its own. Thread-safe for start/stop from autograd's
    threads.
    """

    def __init__(
        self,
        out_dir: str | os.PathLike[str],
        *,
        rank: int,
        world_size: int,
        module: str,
        dp_rank: int = 0,
        dp_size: int = 1,
        layout: dict[str, Any] | None = None,
        config: dict[str, Any] | None = None,
        versions: dict[str, str] | None = None,
        label: str = "",
        build: dict[str, Any] | None = None,
        device: str = "auto",
        clock: str = "auto",
        append: bool = False,
        fsync: bool = False,
        regions: tuple[str, ...] | list[str] = (),
        counters: tuple[str, ...] | list[str] = (),
        run_id: str | None = None,
        run_id_from: str | None = None,
    ) -> None:
        if not (0 <= rank < world_size):
            raise ValueError(f"rank must be in [0, world_size={world_size}); got {rank}")
        if not (0 <= dp_rank < dp_size):
            raise ValueError(f"dp_rank must be in [0, dp_size={dp_size}); got {dp_rank}")
        self.rank = int(rank)
        self.device = resolve_device(device)
        self._clock = make_clock(clock, self.device)
        # host CPU time of the whole step: the region clock's when it is a CPU clock, else thread CPU
        cpu_name = self._clock.name if self._clock.name in ("thread_cpu", "process_cpu") else "thread_cpu"
        self._cpu_fn = time.process_time if cpu_name == "process_cpu" else time.thread_time
        self._fsync = fsync
        self._lock = threading.Lock()
        self._declared_regions: list[str] = []
        self._declared_counters: list[str] = []
        self._check_declaration(regions, counters)
        self._declared_regions.extend(dict.fromkeys(regions))
        self._declared_counters.extend(c for c in dict.fromkeys(counters) if c not in COUNTERS)

        # out_dir None: the step lines are made (for what reads them in training: the metrics, the
        # online calibration) but written nowhere
        self.path = rank_file(out_dir, rank) if out_dir is not None else None
        self._file = None
        self._closed = False
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._file = open(self.path, "a" if append else "w", encoding="utf-8")  # noqa: SIM115
        self.header: dict[str, Any] = {
            "kind": "header",
            "format": FORMAT,
            "rank": self.rank,
            "world_size": int(world_size),
            "module": str(module),
            "dp_rank": int(dp_rank),
            "dp_size": int(dp_size),
            "layout": dict(layout or {}),
            "versions": {**_default_versions(), **(versions or {})},
            "config": dict(config or {}),
            "build": dict(build) if build is not None else None,
            "device": self.device,
            "label": str(label),
            "clock": {"step": "wall", "step_cpu": cpu_name, "regions": self._clock.name},
            "regions": list(self._declared_regions),
            "counters": [*COUNTERS, *self._declared_counters],
            "pid": os.getpid(),
            "host": platform.node(),
            "t": time.time(),
            # the same on every rank of one run (runtime.measuring.run_id): the reader refuses a
            # directory whose files name different runs
            "run_id": run_id,
            "run_id_from": run_id_from,
        }
        self.header = json_safe(self.header)
        self._write(self.header)

        self._next_step = 0
        self._open: dict[str, tuple[int, Any]] = {}  # name -> (depth, start mark)
        # on CUDA, each region is also an NVTX range mimo_accel/<name> (mimo_accel.nvtx), opened
        # and closed with the region (start/end ranges: a backward may close on another thread)
        self._nvtx = self.device == "cuda"
        self._ranges: dict[str, Any] = {}
        self._pending: list[tuple[str, Any, Any]] = []  # lazy clocks: (name, start, stop)
        self._reset_step()

    # -- step lifecycle -------------------------------------------------------------------------

    def _reset_step(self) -> None:
        self._counters = dict.fromkeys((*COUNTERS, *self._declared_counters), 0)
        self._fields: dict[str, Any] = {}
        self._regions: dict[str, float] = {}
        self._micro: dict[str, list] = {}  # a module's region: each call's time; its counters: each call's count
        self._calls: dict[str, int] = {}
        self._fallbacks = 0
        self._t0 = time.perf_counter()
        self._cpu0 = self._cpu_fn()

    def begin_step(self) -> None:
        """Mark the start of a step (optional; excludes the time since the last ``end_step``).

        Counters, fields and region times recorded since the last ``end_step`` are kept.
        """
        self._t0 = time.perf_counter()
        self._cpu0 = self._cpu_fn()

    def end_step(self, step: int | None = None) -> dict[str, Any]:
        """Close the step: resolve region times, write and flush its line; return the record.

        ``step`` is the training iteration number (default: one more than the last step).
        """
        t1 = time.perf_counter()
        cpu1 = self._cpu_fn()
        with self._lock:
            pending, self._pending = self._pending, []
        for name, seconds, fellback in self._clock.resolve(pending) if pending else ():
            self._add_time(name, seconds, fellback)
        if step is None:
            step = self._next_step
        self._next_step = int(step) + 1

        record: dict[str, Any] = {"kind": "step", "step": int(step), "step_time_s": t1 - self._t0,
                                  "step_cpu_s": cpu1 - self._cpu0}
        declared = self._declared_regions
        for name in declared:
            record[f"{name}_s"] = self._regions.get(name)
        for name, seconds in self._regions.items():
            if name not in declared:
                record[f"{name}_s"] = seconds
        record.update(self._counters)
        for name in SETTABLE:
            record[name] = None
        record.update(json_safe(self._fields))
        record["timed_calls"] = dict(self._calls)
        if self._micro:
            record["micro"] = json_safe(self._micro)
        if self._fallbacks:
            record["clock_fallbacks"] = self._fallbacks
        record["t"] = time.time()
        self._write(record)
        self._reset_step()
        return record

    # -- counters and fields --------------------------------------------------------------------

    def add(self, **counters: int) -> None:
        """Add to this step's counters (``COUNTERS``: ``samples``, ``tokens``, ``sq_tokens``,
        ``samples_read``, ``bytes_read``, ``bytes_exchanged``; an encoder's ``<module>_items`` /
        ``<module>_rows`` / ``<module>_sq_rows``). A module counter added once is written in every
        later step line (0 when unset)."""
        c = self._counters
        for name, value in counters.items():
            if name not in c:
                if not is_counter(name):
                    raise TypeError(f"unknown counter {name!r}; counters are: {', '.join(COUNTERS)}, and "
                                    "<module>_items, <module>_rows, <module>_sq_rows for an encoder module")
                with self._lock:
                    if name not in self._declared_counters:
                        self._declared_counters.append(name)
                c[name] = 0
            c[name] += int(value)

    def add_micro(self, **counts: int) -> None:
        """Append one micro-batch's value to each of this step's per-call lists of encoder counters
        (``<module>_items`` / ``_rows`` / ``_sq_rows``) or language tokens (``tokens``,
        ``sq_tokens``), written under ``micro`` beside the per-call times: what each forward
        computed (how a forward's time grows with its work, and what it costs whatever its size)."""
        for name, value in counts.items():
            if name not in _MICRO_COUNTERS and (name in COUNTERS or not is_counter(name)):
                raise TypeError(f"add_micro takes an encoder's <module>_items, <module>_rows or <module>_sq_rows, "
                                f"or the language model's tokens / sq_tokens, got {name!r}")
            with self._lock:
                self._micro.setdefault(name, []).append(int(value))

    def declare(self, *, regions: tuple[str, ...] | list[str] = (), counters: tuple[str, ...] | list[str] = ()) -> None:
        """From this step on, every step line carries ``<region>_s`` for each of ``regions`` (null when
        not timed in that step) and each of ``counters`` (0 when unset)."""
        self._check_declaration(regions, counters)
        with self._lock:
            for r in regions:
                if r not in self._declared_regions:
                    self._declared_regions.append(r)
            for name in counters:
                if name not in self._counters:
                    self._declared_counters.append(name)
                    self._counters[name] = 0

    @staticmethod
    def _check_declaration(regions, counters) -> None:
        for r in regions:
            if not isinstance(r, str) or not r or f"{r}_s" in _RESERVED:
                raise ValueError(f"{r!r} cannot be a region name")
        for name in counters:
            if not isinstance(name, str) or not is_counter(name):
                raise TypeError(f"unknown counter {name!r}; counters are: {', '.join(COUNTERS)}, and "
                                "<module>_items, <module>_rows, <module>_sq_rows for an encoder module")

    def set(self, **fields: Any) -> None:
        """Set fields of this step's line (e.g. ``predicted_spread=0.04``); last value wins.

        Any JSON-serialisable name is allowed except the recorder's own fields.
        """
        for name in fields:
            if (name in _RESERVED or name in self._counters
                    or (name.endswith("_s") and (name[:-2] in self._regions or name[:-2] in self._declared_regions))):
                raise ValueError(f"{name!r} is written by the recorder itself; use add()/start() instead")
        self._fields.update(fields)

    # -- regions --------------------------------------------------------------------------------

    def start(self, name: str) -> None:
        """Start timing region ``name`` (reported as ``<name>_s``). Re-entrant: nested starts of
        the same name are counted once."""
        with self._lock:
            depth, mark = self._open.get(name, (0, None))
            if depth == 0:
                mark = self._clock.mark()
                if self._nvtx:
                    self._ranges[name] = nvtx.start(f"mimo_accel/{name}")
            self._open[name] = (depth + 1, mark)

    def stop(self, name: str) -> None:
        """Stop timing region ``name``. A stop without a start is ignored."""
        with self._lock:
            depth, mark = self._open.get(name, (0, None))
            if depth == 0:
                return
            if depth > 1:
                self._open[name] = (depth - 1, mark)
                return
            del self._open[name]
            stop = self._clock.mark()
            if self._nvtx:
                nvtx.end(self._ranges.pop(name, None))
            self._calls[name] = self._calls.get(name, 0) + 1
            if self._clock.lazy:
                self._pending.append((name, mark, stop))
                return
            self._add_time(name, *self._clock.elapsed(mark, stop))

    def _add_time(self, name: str, seconds: float, fellback: bool) -> None:
        self._regions[name] = self._regions.get(name, 0.0) + seconds
        self._fallbacks += fellback
        if name.endswith(_MICRO_SUFFIXES):  # a module's forward/backward: one call a micro-batch
            self._micro.setdefault(name, []).append(seconds)

    @contextmanager
    def time(self, name: str) -> Iterator[None]:
        """``with recorder.time("vision_fwd"): ...`` times the block as region ``name``."""
        self.start(name)
        try:
            yield
        finally:
            self.stop(name)

    # -- file -----------------------------------------------------------------------------------

    def _write(self, record: dict[str, Any]) -> None:
        if self._file is None:
            return
        line = json.dumps(record, default=_json_default, allow_nan=False, separators=(",", ":"))
        self._file.write(line + "\n")
        self._file.flush()
        if self._fsync:
            os.fsync(self._file.fileno())

    def close(self) -> None:
        """Close the file. Steps not ended are not written."""
        self._closed = True
        if self._file is not None and not self._file.closed:
            self._file.close()

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def json_safe(obj: Any) -> Any:
    """Copy with non-finite floats replaced by None (the file stays strict JSON)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj


def _json_default(obj: Any) -> Any:
    item = getattr(obj, "item", None)  # numpy / torch scalars
    if callable(item):
        try:
            return json_safe(item())
        except Exception:
            pass
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    return str(obj)
