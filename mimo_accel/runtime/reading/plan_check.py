"""Same plan everywhere, at every window, before it trains.

Equal inputs (:mod:`~mimo_accel.runtime.reading.plan_inputs`) do not make equal plans where the
arithmetic differs between nodes, and a differing plan would pair one sample's text with another's
encoder rows. So every window's plan is agreed by every data-loading rank before any trains it
(:class:`WindowCheck`, on the planner threads), in four store operations per rank and window
whatever the number of ranks: ``compare_set`` of its digest (the first poster's stays), an ``add``
to count in, a wait for the verdict the last rank writes, a ``get``; only a verdict other than
"agreed" has every rank post its own digest, so the error names each side. Exchange mode, which
plans where it reads, compares each rank's plan with the first posted (:class:`FirstPlanCheck`).
Waits use a background client of the store (:func:`~mimo_accel.runtime.store.background_store`).
"""

from __future__ import annotations

import hashlib
from typing import Optional, Sequence

import numpy as np

from mimo_accel.runtime.store import background_store, next_round, ranks_key, store_key

AGREED = "agreed"
DIFFER = "differ"
_SEP = "|"


class PlanMismatch(RuntimeError):
    """The data-loading ranks planned a window differently (or a rank could not plan it)."""


def plan_digest(window: Sequence[int], order: Sequence[int], model: str = "") -> str:
    """A short digest of one window's plan: the window's global indices as upstream's sampler gave
    them, the planned order, and the digest of the cost model it was planned with (online
    calibration: every rank must plan a step with the same one)."""
    h = hashlib.sha256()
    h.update(np.asarray(window, dtype="<i8").tobytes())
    h.update(b"/")
    h.update(np.asarray(order, dtype="<i8").tobytes())
    h.update(f"/{model}".encode())
    return h.hexdigest()[:16]


def _sides(outcomes: dict[int, str]) -> str:
    sides: dict[str, list[int]] = {}
    for rank in sorted(outcomes):
        sides.setdefault(outcomes[rank], []).append(rank)
    return "; ".join(f"ranks {ranks} have plan {d}" for d, ranks in sides.items())


class WindowCheck:
    """Every window's plan, agreed by the data-loading ``ranks`` before any of them trains it.

    :meth:`agree` blocks until every rank has posted the window and raises :class:`PlanMismatch`
    naming each side when they differ. Every rank agrees a pass's windows in order, so none is more
    than a window ahead of another; a rank that stops early posts :meth:`abandon` for its next window
    so the others are not left waiting. The rank completing a window deletes the keys of the one
    before (every rank has read its verdict by then).
    """

    def __init__(self, ranks: Sequence[int], what: str, *, me: Optional[int] = None, store=None,
                 serial: Optional[int] = None):
        """``me``: this rank (default: torch.distributed's); ``store``: the job's store (default: a
        background client of it); ``serial``: which check over these ranks this is (default:
        counted in this process, the same on every rank as they build their loaders alike)."""
        if me is None:
            import torch.distributed as dist

            me = dist.get_rank()
        self.ranks = tuple(sorted(ranks))
        self.what = what
        self.me = me
        self._store = store
        # a loader built again in the same job agrees under keys of its own (ranks build loaders alike)
        serial = next_round(("plan", self.ranks, what)) if serial is None else serial
        self.prefix = store_key("plan", ranks_key(self.ranks), what, serial)
        self.agreed = 0  # windows agreed so far (all passes)

    def store(self):
        return self._store if self._store is not None else background_store()

    def _key(self, pass_no: int, ordinal: int) -> str:
        return f"{self.prefix}/{pass_no}/{ordinal}"

    def _post(self, key: str, outcome: str, before: Optional[str]) -> bool:
        """Post this rank's outcome of a window; True when it agrees with the first one posted.
        ``before``: the key of the window before, whose keys the rank completing this one deletes
        (every rank posts a window only after reading the verdict of the one before)."""
        store = self.store()
        first = store.compare_set(f"{key}/plan", "", f"{outcome}{_SEP}{self.me}").decode()
        agrees = first.rsplit(_SEP, 1)[0] == outcome
        if not agrees:
            store.add(f"{key}/differ", 1)
        if store.add(f"{key}/n", 1) == len(self.ranks):  # the last to arrive gives the verdict
            differ = store.add(f"{key}/differ", 0)
            store.set(f"{key}/verdict", AGREED if differ == 0 else DIFFER)
            if before is not None:
                for suffix in ("plan", "n", "differ", "verdict"):
                    store.delete_key(f"{before}/{suffix}")
        return agrees

    def _keys(self, pass_no: int, ordinal: int) -> tuple[str, Optional[str]]:
        return self._key(pass_no, ordinal), self._key(pass_no, ordinal - 1) if ordinal > 0 else None

    def agree(self, pass_no: int, ordinal: int, digest: str, *, first_index: int = -1) -> None:
        """Block until every rank has posted its plan of window ``ordinal`` of pass ``pass_no``
        (``digest``: :func:`plan_digest`); raise :class:`PlanMismatch` if they differ."""
        key, before = self._keys(pass_no, ordinal)
        self._post(key, digest, before)
        if self._wait(key, ordinal) != AGREED:
            self._raise(key, digest, ordinal, first_index)
        self.agreed += 1

    def abandon(self, pass_no: int, ordinal: int, reason: str) -> None:
        """This rank plans no further in this pass: its next window is posted as ``reason`` (the
        other ranks' check of it then fails with the reason, instead of waiting for this rank)."""
        key, before = self._keys(pass_no, ordinal)
        outcome = f"not planned ({reason.replace(_SEP, '/')})"
        self.store().set(f"{key}/rank/{self.me}", outcome)
        self._post(key, outcome, before)

    def failed(self, pass_no: int, ordinal: int, error: BaseException) -> None:
        """This rank's planner raised on the window: post that, so the others stop too (this rank
        raises its own error)."""
        self.abandon(pass_no, ordinal, f"its planner raised {type(error).__name__}: {error}"[:400])

    def _wait(self, key: str, ordinal: int) -> str:
        store = self.store()
        try:
            store.wait([f"{key}/verdict"])
        except Exception as exc:  # the store's own timeout: say how many ranks never planned it
            arrived = store.add(f"{key}/n", 0)
            raise PlanMismatch(
                f"mimo_accel: only {arrived} of the {len(self.ranks)} data-loading ranks planned window "
                f"{ordinal} of the {self.what} in time ({exc}). Every data rank plans ahead from the moment "
                "its loader is built and each time an iterator over it is made; a rank whose training stopped, "
                "or that makes a new iterator over the loader later than the others, leaves the others "
                "waiting.") from exc
        return store.get(f"{key}/verdict").decode()

    def _raise(self, key: str, digest: str, ordinal: int, first_index: int) -> None:
        store = self.store()
        store.set(f"{key}/rank/{self.me}", digest)
        keys = [f"{key}/rank/{r}" for r in self.ranks]
        store.wait(keys)
        outcomes = {r: v.decode() for r, v in zip(self.ranks, store.multi_get(keys))}
        where = f"window {ordinal} of this pass (the window from global sample {first_index})"
        failed = {r: o for r, o in outcomes.items() if o.startswith("not planned")}
        if failed:
            raise PlanMismatch(
                f"mimo_accel: the {self.what} could not agree on {where}: "
                + "; ".join(f"rank {r} {o}" for r, o in sorted(failed.items()))
                + ". Stopping before any rank trains it.")
        raise PlanMismatch(
            f"mimo_accel: the {self.what}'s plans differ between ranks at {where}: {_sides(outcomes)}. The ranks "
            "planned from the same inputs, so their arithmetic differs; ranks on each side would pair different "
            "samples (text with another sample's encoder rows). Stopping before any rank trains it.")


class FirstPlanCheck:
    """Exchange mode's check: each rank compares its plan of a micro-batch with the first one posted
    (``compare_set`` and ``add``), before it trains it. It plans where it reads (a language rank only
    after the encoder's first output), so no rank may wait for all: the one that differs stops, and
    the iteration cannot complete without it.
    """

    def __init__(self, ranks: Sequence[int], what: str, *, me: Optional[int] = None, store=None,
                 serial: Optional[int] = None):
        self.window = WindowCheck(ranks, what, me=me, store=store, serial=serial)
        self.checked = 0

    def __call__(self, ordinal: int, digest: str) -> None:
        w = self.window
        key = w._key(0, ordinal)
        store = w.store()
        first = store.compare_set(f"{key}/plan", "", f"{digest}{_SEP}{w.me}").decode()
        theirs, who = first.rsplit(_SEP, 1)
        if store.add(f"{key}/n", 1) == len(w.ranks) and ordinal > 0:
            # every rank has posted this micro-batch, so none reads the one before any more
            for suffix in ("plan", "n"):
                store.delete_key(f"{w._key(0, ordinal - 1)}/{suffix}")
        if theirs != digest:
            raise PlanMismatch(
                f"mimo_accel: the {w.what}'s exchange plans differ at micro-batch {ordinal}: rank {w.me} has plan "
                f"{digest}, rank {who} (the first to plan it) has {theirs}. Stopping before this rank trains it.")
        self.checked += 1
