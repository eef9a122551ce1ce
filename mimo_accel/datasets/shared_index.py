"""Per-sample costs without an index: derived when the loaders are built, once, in parallel.

:func:`derive_cost_index` gives the :class:`~mimo_accel.costs.CostIndex` plan mode needs, with no
setup: a dataset's own ``mimo_accel_cost_index``, else Bridge's ``MegatronMIMODataset`` or
``DirectSFTDataset`` probed from their raw examples (:mod:`mimo_accel.datasets`), else a
:class:`~mimo_accel.datasets.DeriveError` naming the three ways out. Each rank of ``group`` probes
a contiguous 1/world share and ``all_gather_object`` assembles the identical index everywhere
(two gathers when every rank finds the cache, three when the index is built; a failure on any rank
reaches every rank as the same error, naming it). The result is cached on disk, memory-mapped,
under a key of the dataset's fingerprint (its settings, resize rules included, and every row's cost
inputs) and its files' contents digest (:mod:`mimo_accel.costs.contents`): ``cache_dir``, else
``$MIMO_ACCEL_CACHE_DIR``, else ``~/.cache/mimo_accel``; ``mimo-accel index --dataset MODULE:FACTORY`` fills it offline.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from pathlib import Path
from typing import Any, Callable, NamedTuple, Optional, Union

from mimo_accel.costs import CostIndex
from mimo_accel.costs.files import atomic_write
from mimo_accel.costs.contents import Contents
from mimo_accel.datasets.dispatch import source_for
from mimo_accel.datasets.fingerprints import sha256_hex
from mimo_accel.datasets.sources import (
    PROBE_FORMAT,
    DeriveError,
    Inputs,
    Probed,
    SampleError,
    SampleSource,
    fingerprint_of,
)

__all__ = ["ENV_CACHE_DIR", "Identified", "cache_path", "default_cache_dir", "derive_cost_index", "identify", "share"]

ENV_CACHE_DIR = "MIMO_ACCEL_CACHE_DIR"
_PROGRESS_FROM = 2048  # samples in rank 0's share from which a progress bar is shown by default

logger = logging.getLogger(__name__)

CacheDir = Union[str, "os.PathLike[str]", None, bool]


def default_cache_dir() -> Path:
    """``$MIMO_ACCEL_CACHE_DIR``, else ``$XDG_CACHE_HOME/mimo_accel``, else ``~/.cache/mimo_accel``."""
    if os.environ.get(ENV_CACHE_DIR):
        return Path(os.environ[ENV_CACHE_DIR]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base).expanduser() / "mimo_accel"


def cache_path(key: str, cache_dir: CacheDir = None) -> Optional[Path]:
    """Where the index with fingerprint ``key`` is cached (None: caching off, ``cache_dir=False``)."""
    if cache_dir is False:
        return None
    root = default_cache_dir() if cache_dir is None or cache_dir is True else Path(cache_dir).expanduser()
    return root / f"cost-index-{key[:32]}.npz"


def share(rank: int, world: int, n: int) -> tuple[int, int]:
    """Rank ``rank``'s contiguous share ``[lo, hi)`` of ``n`` samples (sizes differ by at most 1)."""
    return rank * n // world, (rank + 1) * n // world


def _load_cached(path: Optional[Path], length: int) -> Optional[CostIndex]:
    if path is None or not path.exists():
        return None
    try:
        index = CostIndex.load(path)
    except (ValueError, OSError) as exc:
        logger.warning("mimo_accel: ignoring the unreadable cost-index cache %s (%s); rebuilding it", path, exc)
        return None
    if len(index) != length:
        logger.warning("mimo_accel: the cost-index cache %s holds %d samples, the dataset %d; rebuilding it",
                       path, len(index), length)
        return None
    return index


def _save(index: CostIndex, path: Path, source: SampleSource, key: str) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        index.save(path)  # atomic: written beside, then renamed over
        about = {"key": key, "dataset": source.describe(),
                 "rules": {name: index.rule_of(name).to_dict() for name in index.encoders},
                 "samples": len(index), "digest": index.digest(), "created": time.strftime("%Y-%m-%dT%H:%M:%S")}
        atomic_write(path.with_suffix(".json"), (json.dumps(about, indent=2) + "\n").encode())
    except OSError as exc:  # a read-only or full cache dir costs a rebuild next time, nothing more
        logger.warning("mimo_accel: could not write the cost-index cache %s: %s", path, exc)


class _Alone:
    """A single process as a gather group (what a :class:`~mimo_accel.runtime.store.RankSet` is for
    several): rank 0 of 1, gathering its own object."""

    rank, world = 0, 1

    @staticmethod
    def gather(obj: Any) -> list[Any]:
        return [obj]


def _raise_first_error(reports: list[tuple], what: Callable[[int], str], local: Optional[BaseException]) -> None:
    if len(reports) == 1 and local is not None:
        raise local  # a single process: the error as it was raised
    for r, report in enumerate(reports):
        if report[0] == "error":
            kind = SampleError if report[2] else DeriveError  # a bad sample stays one on every rank
            raise kind(f"mimo_accel: deriving per-sample costs failed on {what(r)}: {report[1]}")


def _error_report(exc: BaseException) -> tuple:
    text = str(exc) if isinstance(exc, DeriveError) else f"{type(exc).__name__}: {exc}"
    return "error", text, isinstance(exc, SampleError)


def _progress_bar(enabled: bool, total: int, description: str):
    """A rich progress bar (a context manager and an ``advance(n)`` callable), or a no-op."""
    if not enabled or total <= 0:
        return None
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                        TimeRemainingColumn(), console=Console(stderr=True), transient=False)
    task = progress.add_task(description, total=total)
    return progress, (lambda n: progress.advance(task, n))


class Identified(NamedTuple):
    """A dataset as every rank of a group sees it alike (:func:`identify`)."""

    source: SampleSource  # what reads it: its rules, its files
    identity: dict  # what an index of it records (:func:`dataset_identity`)
    contents: Contents  # its files' digest, with the files that could not be read


def identify(dataset: Any, comm: Any = None, workers: Optional[int] = None) -> Identified:
    """The dataset's source, identity and files' digest — the same on every rank of ``comm`` (None:
    one process). Each rank reads its share of the samples' inputs (:meth:`SampleSource.read_inputs`:
    their files' names, sizes and first bytes, :mod:`mimo_accel.costs.contents`; their texts;
    every row's cost inputs) and one gather adds the shares up. An unknown dataset fails every
    rank."""
    comm = comm if comm is not None else _Alone
    rank, world = comm.rank, comm.world
    failure: Optional[BaseException] = None
    try:
        source = source_for(dataset)
        lo, hi = share(rank, world, source.base_length)
        hello: tuple = ("ok", source.settings_fingerprint(), source.length, source.base_length,
                        source.read_inputs(lo, hi, workers))
    except Exception as exc:  # reported to every rank below, so none waits in a collective
        source, hello, failure = None, _error_report(exc), exc
    hellos = comm.gather(hello)
    _raise_first_error(hellos, lambda r: f"rank {r}", failure)
    assert source is not None
    lengths = {r: h[2:4] for r, h in enumerate(hellos)}
    if len(set(lengths.values())) > 1:
        raise DeriveError(f"mimo_accel: the ranks see datasets of different lengths (samples, distinct): "
                          f"{lengths}; every rank must build the same dataset")
    settings = hellos[0][1]
    differ = [r for r, h in enumerate(hellos) if h[1] != settings]
    if differ and rank == 0:
        logger.warning("mimo_accel: ranks %s fingerprint the dataset differently from rank 0; using rank 0's. "
                       "The index is assembled from every rank's share either way.", differ)
    inputs = sum((h[4] for h in hellos), Inputs.none())  # the shares cover every sample once
    identity = {"dataset": fingerprint_of(settings, inputs.rows), "format": PROBE_FORMAT,
                "contents": inputs.contents.record(), "texts": inputs.texts.record() if inputs.texts else None,
                "describe": source.describe(), "samples": source.length}
    return Identified(source, {k: v for k, v in identity.items() if v is not None}, inputs.contents)


def cache_key(identity: dict) -> str:
    """The derive cache's key of a dataset's identity: its fingerprint (its settings and every
    row's cost inputs) and its files' contents digest, so any row edited (a text grown) and any
    file rewritten in place (an image re-exported) is probed again, and a copy of the dataset
    elsewhere finds the cache."""
    return sha256_hex(json.dumps([identity["dataset"], identity["contents"]["digest"]]))


def dataset_identity(dataset: Any, *, group: Any = None) -> tuple[dict, Contents]:
    """What a cost index of ``dataset`` must record to describe it (collective over ``group``):
    ``dataset`` (its fingerprint: settings and every row's cost inputs) and ``format`` (the scheme
    that fingerprint follows), ``contents`` (its files' digest: :meth:`Contents.record`), ``texts``
    (its texts' digest, where it has texts a manifest could give), ``describe``, ``samples``; and
    the files' digest itself (it counts the files that could not be read)."""
    _, identity, contents = identify(dataset, group)
    return identity, contents


def derive_cost_index(dataset: Any, *, group: Any = None, cache_dir: CacheDir = None, refresh: bool = False,
                      progress: Optional[bool] = None, workers: Optional[int] = None) -> CostIndex:
    """The per-sample cost index of ``dataset``, identical on every rank of ``group``.

    ``group``: the ranks that all call this together, each probing 1/world of the samples (a
    :class:`~mimo_accel.runtime.store.RankSet`: ``rank``, ``world``, ``gather(obj)``; None: one
    process probes all). ``cache_dir``: None for :func:`default_cache_dir`, False
    for none; ``refresh`` rebuilds a cached index; ``progress``: a bar on the group's rank 0 (None:
    from 2048 samples a share); ``workers``: threads reading file headers (1: serial). The index
    depends only on the dataset and its processors, never on the world size. A sample that cannot be
    probed is a :class:`DeriveError` naming the rank and sample; an unknown dataset names the three
    ways out."""
    carried = getattr(dataset, "mimo_accel_cost_index", None)
    if carried is not None:
        if not isinstance(carried, CostIndex):
            raise DeriveError(f"{type(dataset).__name__}.mimo_accel_cost_index must be a "
                              f"mimo_accel.costs.CostIndex, got {type(carried).__name__}")
        if len(carried) < len(dataset):
            raise DeriveError(f"{type(dataset).__name__}.mimo_accel_cost_index covers {len(carried)} samples, "
                              f"the dataset has {len(dataset)}")
        return carried

    comm = group if group is not None else _Alone
    rank, world = comm.rank, comm.world
    start = time.perf_counter()

    # 1. Every rank names what it sees; an unknown dataset fails everywhere, together.
    source, identity, _ = identify(dataset, comm, workers)
    key = cache_key(identity)

    # 2. The cache: used only when every rank holds the identical index.
    path = cache_path(key, cache_dir)
    cached = None if refresh else _load_cached(path, source.length)
    mine = (cached.digest() if cached is not None else None, socket.gethostname(),
            str(path.resolve()) if path is not None else None)
    states = comm.gather(mine)
    digests = {s[0] for s in states}
    # one writer per (host, cache file) among the ranks
    writer: dict[tuple, int] = {}
    for r, (_, host, where) in enumerate(states):
        writer.setdefault((host, where), r)
    if cached is not None and len(digests) == 1:
        if rank == 0:
            logger.info("mimo_accel: cost index of %s read from the cache %s", source.describe(), path)
        return cached.with_identity(**identity)

    # 3. Probe this rank's share; one gather assembles the whole index everywhere.
    failure: Optional[BaseException] = None
    lo, hi = share(rank, world, source.base_length)
    show = rank == 0 and (progress if progress is not None else hi - lo >= _PROGRESS_FROM)
    bar = _progress_bar(show, hi - lo, f"mimo_accel: probing samples (rank 0's {hi - lo:,} of {source.base_length:,})")
    t0 = time.perf_counter()
    try:
        if bar is None:
            probed = source.probe(lo, hi, workers=workers)
        else:
            with bar[0]:
                probed = source.probe(lo, hi, on_progress=bar[1], workers=workers)
        part: tuple = ("ok", probed, time.perf_counter() - t0)
    except Exception as exc:
        part, failure = _error_report(exc), exc
    parts = comm.gather(part)
    _raise_first_error(parts, lambda r: f"rank {r} (samples {share(r, world, source.base_length)[0]}.."
                                        f"{share(r, world, source.base_length)[1] - 1})", failure)
    index = source.to_index(Probed.concat([p[1] for p in parts])).with_identity(**identity)

    # The writer of each (host, cache file) whose cache is stale or missing writes it.
    if path is not None:
        if writer[(mine[1], mine[2])] == rank and mine[0] != index.digest():
            _save(index, path, source, key)
    if rank == 0:
        slowest = max(p[2] for p in parts)
        logger.info("mimo_accel: derived the cost index of %s on %d rank(s) in %.1f s (slowest probe %.1f s)%s",
                    source.describe(), world, time.perf_counter() - start, slowest,
                    f"; cached at {path}" if path is not None else "")
    return index
