"""The job's rendezvous store, as every part of mimo_accel uses it: one namespace for its keys, a
count of each part's rounds, a client per background thread, a wait that names the ranks that
never came, a set of ranks that gathers through it, and the thread a rank waits on gathers in. Bridge builds MIMO loaders on the
data-loading ranks only, so nothing collective over all ranks can run there: the store every rank
shares carries the gathers, the plan checks, the announcements and the metrics' figures.
"""

from __future__ import annotations

import datetime
import pickle
import queue
import threading
import time
from typing import Any, Callable, Optional, Sequence

ROOT = "mimo_accel"  # every key mimo_accel sets in the job's store starts here
# A wait that can be stopped waits this long at a time, so a stop is seen that soon (a thread still in
# a store call when the interpreter exits can abort the process); each such wait that times out (a
# rank over a second late) logs a c10d socket warning.
_POLL_S = 1.0

_lock = threading.Lock()
# what -> rounds of it this process has run (the same count on every rank taking part: they run
# alike). Process-lifetime on purpose: the job's store outlives mimo_accel's enable/disable, so a
# count that restarted would read another round's values under the same keys.
_rounds: dict = {}


def next_round(what) -> int:
    """The next round (1, 2, ...) of ``what`` in this process: a hashable naming a part and, where
    it has several, which (a plan check over some ranks, the gathers of a set of ranks)."""
    with _lock:
        n = _rounds[what] = _rounds.get(what, 0) + 1
    return n


def store_key(*parts) -> str:
    """A key in mimo_accel's namespace of the job's store: ``mimo_accel/<part>/<part>/...``."""
    return "/".join((ROOT, *map(str, parts)))


def ranks_key(ranks) -> str:
    """A short name of a set of ranks for store keys (a store key holds at most 8 KiB: 4,096 ranks
    spelt out would not fit)."""
    import hashlib

    ranks = tuple(sorted(ranks))
    return f"{len(ranks)}r{hashlib.sha256(','.join(map(str, ranks)).encode()).hexdigest()[:16]}"


def default_store():
    """The job's rendezvous store (torch.distributed's private ``_get_default_store``; declared in
    :data:`mimo_accel.patching.targets.INTERNALS`)."""
    from torch.distributed import distributed_c10d as c10d

    return c10d._get_default_store()


# Each background thread's own client of the job's store (dropped, and its connection closed,
# when the thread ends).
_clients = threading.local()


def background_store():
    """This thread's own client of the job's store, for waits off the training thread. A client
    runs one operation at a time: a wait on the training thread's client would hold up every store
    call the training thread makes meanwhile (Bridge's, the metrics'), and two background threads
    sharing one would wait behind each other's waits (two loaders' planners: a deadlock)."""
    store = default_store()
    entry = getattr(_clients, "entry", None)
    if entry is None or entry[0] is not store:
        entry = _clients.entry = (store, store.clone())
    return entry[1]


class RankSet:
    """A set of ranks that gathers Python objects through the job's rendezvous store.

    No process group is created, so nothing is collective with the ranks outside the set (Bridge
    builds loaders on the data-loading ranks only). Every member must call :meth:`gather` the same
    number of times, in the same order. ``rank``/``world`` are this process's place in the set.
    """

    def __init__(self, ranks: Sequence[int]):
        import torch.distributed as dist

        self.ranks = tuple(sorted(ranks))
        me = dist.get_rank()
        if me not in self.ranks:
            raise RuntimeError(f"mimo_accel: rank {me} builds a loader but is not one of the "
                               f"data-loading ranks {list(self.ranks)} of Bridge's layout")
        self.rank, self.world = self.ranks.index(me), len(self.ranks)

    def gather(self, obj) -> list:
        n = next_round(("gather", self.ranks))
        store = default_store()
        prefix = store_key("gather", ranks_key(self.ranks), n)
        keys = [f"{prefix}/{r}" for r in self.ranks]
        store.set(keys[self.rank], pickle.dumps(obj))
        wait_for(store, keys, self.ranks,
                 f"mimo_accel: ranks {{missing}} never reached this point (rank {self.ranks[self.rank]} waited for them)")
        return [pickle.loads(v) for v in store.multi_get(keys)]


def wait_for(store, keys: list[str], ranks: Sequence[int], failure: str,
             stop: Optional[threading.Event] = None) -> bool:
    """Wait until each of ``ranks`` has set its key of ``keys``, up to the store's own timeout, then
    raise a RuntimeError: ``failure`` with ``{missing}`` the ranks that never came. With ``stop``, the
    wait gives up (False) soon after it is set."""
    deadline = time.monotonic() + store.timeout.total_seconds()
    while True:
        try:
            if stop is None:
                store.wait(keys)
            else:
                store.wait(keys, datetime.timedelta(seconds=max(0.001, min(_POLL_S, deadline - time.monotonic()))))
            return True
        except Exception as exc:  # noqa: BLE001 - the store's timeout (DistStoreError), or this short wait's
            if stop is not None and stop.is_set():
                return False
            if stop is not None and time.monotonic() < deadline:
                continue
            missing = [r for r, k in zip(ranks, keys) if not store.check([k])]
            raise RuntimeError(f"{failure.format(missing=missing)}: {exc}") from exc


class Worker:
    """A thread that runs ``work(store, job, stop)`` for each job handed to it, in order, over its own
    store client (``store``, else :func:`background_store`), until :meth:`shutdown`: the gathers a
    rank waits on off the training thread (the metrics' writer, rank 0's step line). ``stop`` is set
    where the run failed: a wait in flight gives up."""

    def __init__(self, work: Callable[[Any, Any, threading.Event], None], name: str, store: Any = None):
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(work, store), daemon=True, name=name)
        self.thread.start()

    def submit(self, job: Any) -> None:
        self._jobs.put(job)  # no wait: the thread takes it when it next holds the GIL

    def shutdown(self, stop: bool = False) -> None:
        if stop:
            self.stop.set()
        self._jobs.put(None)
        self.thread.join()

    def _run(self, work, store) -> None:
        store = store if store is not None else background_store()
        while (job := self._jobs.get()) is not None:
            work(store, job, self.stop)
