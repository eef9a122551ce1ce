"""The cost model learnt while training, the same on every data rank at every step.

One rank fits: the job's last rank, which gathers every rank's step figures anyway
(:mod:`mimo_accel.runtime.measuring.metrics`). An accepted refit is *announced*: one store value
holding the model and the first iteration planned with it, far enough ahead that no planner thread
has reached it. Planner threads read the announcements before each window and plan iteration ``t``
with the last model announced for an iteration ``<= t`` (:class:`Schedule`): the model changes at a
step boundary every rank agrees on, and its digest is in every window's plan digest. The cold
start's first refit plans iteration ``F + 2`` (every planner waits there for its verdict); the
announcements are saved beside Bridge's checkpoints, so a resumed run plans as the interrupted one
did. The whole story: docs/design.md, "The cost model learnt while training".
"""

from __future__ import annotations

import json
import logging
import math
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional, Union

from mimo_accel.config import STEP_WINDOW, resolve_window
from mimo_accel.costs import CostModel
from mimo_accel.runtime.store import next_round, store_key

logger = logging.getLogger("mimo_accel")

FORMAT = "mimo-accel-cost-models/1"
FILE = Path("mimo_accel") / "cost-models.json"  # under checkpoint.save / checkpoint.load


@dataclass(frozen=True)
class WindowModel:
    """The cost model a window is planned with: the model, its digest (in the window's plan digest
    and each share's :class:`~mimo_accel.runtime.reading.shard.ReplicaShare`), and per module the
    per-replica seconds per step it leaves over (in the predicted straggler, never in a plan)."""

    model: CostModel
    digest: str
    overheads: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Announcement:
    """One model announced while training: from iteration ``step`` on, plans use ``model``.

    ``learnt_through``: the last iteration whose times it was fitted on; ``overheads``: per module,
    the per-replica seconds per step its coefficients leave over (in no plan, but in the predicted
    straggler, so that it is on the basis of the measured one); ``refits``: the refits it carries
    (their report records)."""

    number: int
    step: int
    learnt_through: int
    model: CostModel
    overheads: dict = field(default_factory=dict)
    refits: tuple = ()

    def to_doc(self) -> dict:
        return {"number": self.number, "step": self.step, "learnt_through": self.learnt_through,
                "model": self.model.to_doc(), "overheads": dict(self.overheads), "refits": list(self.refits)}

    @classmethod
    def from_doc(cls, doc: dict) -> "Announcement":
        return cls(int(doc["number"]), int(doc["step"]), int(doc["learnt_through"]), CostModel.from_doc(doc["model"]),
                   {str(k): float(v) for k, v in doc.get("overheads", {}).items()}, tuple(doc.get("refits", ())))


class Schedule:
    """The models in force by iteration: ``start``, then each announcement from its step on."""

    def __init__(self, start: CostModel, announcements: tuple = ()):
        self.start = start
        self.announcements: list[Announcement] = sorted(announcements, key=lambda a: a.number)

    def add(self, announcement: Announcement) -> None:
        if self.announcements and announcement.step <= self.announcements[-1].step:
            raise ValueError(f"mimo_accel online calibration: announcement {announcement.number} starts at "
                             f"iteration {announcement.step}, not after the last one's {self.announcements[-1].step}")
        self.announcements.append(announcement)

    def in_force(self, iteration: int) -> Optional[Announcement]:
        """The announcement whose model plans ``iteration`` (None: the start model); their steps rise."""
        return next((a for a in reversed(self.announcements) if a.step <= iteration), None)

    def model_for(self, iteration: int) -> CostModel:
        a = self.in_force(iteration)
        return self.start if a is None else a.model

    def overheads_for(self, iteration: int) -> dict:
        a = self.in_force(iteration)
        return {} if a is None else dict(a.overheads)

    def to_doc(self) -> dict:
        return {"format": FORMAT, "start": self.start.to_doc(),
                "announcements": [a.to_doc() for a in self.announcements]}


def read_saved(load_dir: Optional[str], iteration: int) -> list[Announcement]:
    """The announcements a run resumed from ``iteration`` of the checkpoints in ``load_dir`` plans
    with: those learnt from iterations ``<= iteration``. None saved: none (the configured model)."""
    if not load_dir or iteration <= 0:
        return []
    path = Path(load_dir) / FILE
    if not path.is_file():
        return []
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        if doc.get("format") != FORMAT:
            raise ValueError(f"format {doc.get('format')!r}, expected {FORMAT!r}")
        out = [Announcement.from_doc(a) for a in doc["announcements"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"mimo_accel online calibration: {path} is not a cost-model schedule this version "
                         f"reads ({exc}); remove it to resume from the configured cost model") from None
    return [a for a in out if a.learnt_through <= iteration]


def lead_steps(window: int, step_micro_batches: Optional[int], depth: int) -> int:
    """How many iterations ahead of the fitting rank's own an announcement takes effect: past every
    window a planner thread may have planned (``depth`` queued beyond the one training, one more in
    the check, one step of slack between ranks in training)."""
    per_step = max(1, (step_micro_batches or window) // max(1, window))
    return 2 + math.ceil((depth + 2) / per_step)


WARMUP = 1  # the first step a run measures pays for allocation and compilation: left out of every fit
FIRST_STEPS = 3  # measured steps the first refit is made from (two fitted, one held out)
PRIOR_STEPS = 16.0  # the model in use weighs as much as this many steps the fit learns from
PACE_TOLERANCE = 0.05  # a step plan's module off the newest steps' pace by more than this is rescaled


def first_refit(start: int) -> int:
    """The iteration whose figures a run started (or resumed) at iteration ``start`` makes its
    first refit from."""
    return start + WARMUP + FIRST_STEPS


class Calibration:
    """One training run's online calibration (made at Bridge's setup, on every rank).

    ``schedule`` is what every planner plans with; on the fitting rank, :meth:`observe` learns
    from each step's gathered figures and announces what it accepts. ``serial`` names the run's
    store keys (the same on every rank: setups run alike everywhere). ``state``: Bridge's
    GlobalState (the iteration a resumed run starts from); ``window``: the ``reorder_window`` setting."""

    def __init__(self, start: CostModel, serial: int, *, save_dir: Optional[str] = None,
                 load_dir: Optional[str] = None, notify=None, state: Any = None, window: Union[int, str] = 1,
                 relearn: Optional[str] = None):
        self.state, self.window = state, window
        # why the models learnt before the checkpoint do not price this layout (a module's TP changed
        # at the resume: its seconds per sample are another's), or None: they are restored
        self.relearn = relearn
        self.prefix = store_key("calibration", serial)
        self.schedule = Schedule(start)
        self.save_dir, self.load_dir = save_dir, load_dir
        self.notify = notify
        self._lock = threading.Lock()
        self._polling = threading.Lock()  # one poll at a time (a planner thread, the fitting thread)
        self._seen = 0  # announcements of this job read from the store
        self._restored = 0  # announcements restored from the checkpoint
        self._restored_at: Optional[int] = None
        self.fitter = None  # the fitting rank's OnlineCalibration, made at its first observation
        self.refits: list[dict] = []  # accepted refits (the fitting rank), for the step lines
        self.announced_through = 0  # the last iteration planned so far (a late announcement is an error)
        # the cold start: set on every rank whose figures the fitting rank gathers (metrics made)
        self.gathers = False
        self.first_planned: Optional[int] = None  # the iteration the first refit plans (a train loader's)
        self._first_said = False  # the fitting rank: the first refit's verdict published
        self._first_heard = False  # a planner: that verdict read

    @classmethod
    def for_setup(cls, state: Any, cfg, notify, start: Optional[CostModel] = None,
                  relearn: Optional[str] = None) -> "Calibration":
        """The calibration of the run Bridge's setup of ``state`` (its GlobalState) begins, from
        ``start`` (default: the configured cost model); ``relearn``: why what the checkpoint's run
        learnt is left behind (None: it is restored)."""
        from mimo_accel.planner import cost_model_for

        checkpoint = getattr(getattr(state, "cfg", None), "checkpoint", None)
        return cls(start if start is not None else cost_model_for(cfg.cost_model), next_round("calibration"),
                   save_dir=getattr(checkpoint, "save", None), load_dir=getattr(checkpoint, "load", None),
                   notify=notify, state=state, window=cfg.reorder_window, relearn=relearn)

    @property
    def lead(self) -> int:
        """How many iterations past the fitting rank's own an announcement takes effect."""
        from mimo_accel.runtime.reading.schedule import micro_batches_per_step
        from mimo_accel.runtime.reading.plan_ahead import DEPTH

        steps = micro_batches_per_step()
        return lead_steps(resolve_window(self.window, steps), steps, DEPTH)

    # ------------------------------------------------------------------------------ every rank

    def restore(self, iteration: Optional[int] = None) -> None:
        """At the train loader's build: the announcements of the checkpoint this run resumes from
        (iteration ``iteration``, default the one Bridge's train state loaded), once."""
        if iteration is None:
            train_state = getattr(self.state, "train_state", None)
            iteration = int(getattr(train_state, "step", 0) or 0)
        with self._lock:
            restored_at = self._restored_at
            if restored_at is None:
                self._restored_at = iteration
        if restored_at is not None:
            if restored_at != iteration and self.notify is not None:
                self.notify("calibration:restored-early", f"mimo_accel online calibration: the train loader was built "
                            f"at iteration {restored_at}, before the checkpoint of iteration {iteration} was loaded, "
                            "so this resumed run plans with what was learnt up to the former (every rank alike)")
            return
        if self.relearn is not None:
            if self.notify is not None and read_saved(self.load_dir, iteration):
                self.notify("calibration:relearn", f"mimo_accel online calibration: {self.relearn}; the cost models "
                            "learnt before the checkpoint are left behind and learnt again from the configured one")
            return
        with self._lock:
            for a in read_saved(self.load_dir, iteration):
                self.schedule.add(a)
            self._restored = len(self.schedule.announcements)
        if self._restored:
            logger.info("mimo_accel online calibration: resumed at iteration %d with %d cost model(s) learnt "
                        "before it (the last planning from iteration %d)", iteration, self._restored,
                        self.schedule.announcements[-1].step)

    def poll(self, store) -> None:
        """Read the announcements this job's fitting rank has made since the last poll."""
        with self._polling:
            count = int(store.add(f"{self.prefix}/count", 0))
            while self._seen < count:
                key = f"{self.prefix}/{self._seen + 1}"
                store.wait([key])
                a = Announcement.from_doc(json.loads(store.get(key)))
                with self._lock:
                    if a.step <= self.announced_through:
                        raise RuntimeError(
                            f"mimo_accel online calibration: the cost model announced for iteration {a.step} reached "
                            f"this rank after it had planned iteration {self.announced_through}; ranks could plan one "
                            "step with different models. Stopping rather than risk it.")
                    self.schedule.add(a)
                self._seen += 1

    @property
    def start_iteration(self) -> int:
        """The iteration this run started from (a resumed run's checkpoint; 0 before the restore)."""
        return self._restored_at or 0

    def _verdict_key(self) -> str:
        return f"{self.prefix}/first-refit"

    def model_for(self, iteration: int, store=None) -> CostModel:
        """The model that plans ``iteration`` (the store polled first, on a planner thread; from
        the first refit's iteration on, once that refit's verdict is known)."""
        if store is not None:
            if (self.gathers and not self._first_heard and self.first_planned is not None
                    and iteration >= self.first_planned):
                self._await_first_refit(store)
            self.poll(store)
        with self._lock:
            self.announced_through = max(self.announced_through, iteration)
            return self.schedule.model_for(iteration)

    def _await_first_refit(self, store) -> None:
        first = first_refit(self.start_iteration)
        try:
            store.wait([self._verdict_key()])
        except Exception as exc:  # noqa: BLE001 - the store's timeout, said with what was awaited
            raise RuntimeError(
                f"mimo_accel online calibration: the fitting rank (the job's last rank) did not say within the "
                f"store's timeout whether its first refit, made from iteration {first}, plans iteration "
                f"{self.first_planned} ({type(exc).__name__}: {exc}); did that rank stop? Pin the cost model "
                "(calibrate_online=False) to train without it") from None
        self._first_heard = True

    def models(self, step_micro_batches: int, prefetched: int = 0):
        """For a train loader's planner thread: the first micro-batch of a window -> the
        :class:`WindowModel` of the iteration it belongs to. ``prefetched``: the micro-batches the
        loader's workers take from its sampler ahead of training (a planner that waited for the
        first refit there would hold up the step that refit learns from)."""
        import torch.distributed as dist

        from mimo_accel.runtime.reading.plan_inputs import digest
        from mimo_accel.runtime.store import background_store

        ahead = -(-max(0, prefetched) // max(1, step_micro_batches))
        # a run resumed with models learnt before its checkpoint is no cold start: its refits wait out
        # the lead, as the uninterrupted run's did
        self.first_planned = None if self._restored else first_refit(self.start_iteration) + 2 + ahead

        def of_window(first_micro_batch: int) -> WindowModel:
            iteration = first_micro_batch // step_micro_batches + 1
            # the store through the planner thread's own client (None in a single process)
            model = self.model_for(iteration, background_store() if dist.is_initialized() else None)
            return WindowModel(model, digest(model.to_doc()), self.schedule.overheads_for(iteration))

        return of_window

    @property
    def language_per_micro_batch(self) -> bool:
        """Whether the language model is observed per micro-batch (its ranks gather them): under a
        step plan, whose fit at the machine's pace learns what a micro-batch costs whatever its length."""
        return self.window == STEP_WINDOW

    def digest(self) -> str:
        """What the plan-input check compares: the start model and every announcement known now."""
        from mimo_accel.runtime.reading.plan_inputs import digest

        with self._lock:
            return digest(self.schedule.to_doc())

    # -------------------------------------------------------------------------- the fitting rank

    def observe(self, iteration: int, figures: list, store, current_iteration: int, lead: int) -> list:
        """The fitting rank's part, on its metrics thread: learn from one step's gathered figures
        (:func:`~mimo_accel.runtime.measuring.step_figures.rank_figures` of every rank), and
        announce an accepted refit for iteration ``current_iteration + lead`` (the first refit: for the iteration every
        planner waits at, then say that it was made, accepted or not). Returns the accepted refits."""
        cold = not self._first_said and not self._restored and iteration >= first_refit(self.start_iteration)
        try:
            accepted = self._learn(iteration, figures)
            if accepted:
                for r in accepted:
                    logger.info(r.message())
                step = self.first_planned if cold and self.first_planned is not None else current_iteration + lead
                self.announce(store, iteration, step, self.fitter.model, {r.module: r.overhead_s for r in accepted},
                              [r.to_dict() for r in accepted], exact=cold)
            return list(accepted)
        finally:
            if cold:  # also when learning failed: no planner waits out the store's timeout
                store.set(self._verdict_key(), str(iteration))
                self._first_said = True

    def _learn(self, iteration: int, figures: list) -> tuple:
        from mimo_accel.costs.online import OnlineCalibration

        observations = step_observations(figures, language_per_micro_batch=self.language_per_micro_batch)
        if self.fitter is None:
            if not observations:
                return ()
            # a step plan weighs the modules against each other in seconds: each is kept at the pace
            # of the newest steps, not of the first ones it was learnt from
            pace = PACE_TOLERANCE if self.window == STEP_WINDOW else None
            self.fitter = OnlineCalibration(self.schedule.model_for(iteration), list(observations), warmup=WARMUP,
                                            min_steps=FIRST_STEPS, prior=PRIOR_STEPS, keep_pace=pace,
                                            pace_steps=FIRST_STEPS, notify=self.notify)
        for module, (features, seconds) in observations.items():
            if module in self.fitter.modules:
                self.fitter.observe(iteration, module, features, seconds)
        return self.fitter.refit(iteration + 1)

    def announce(self, store, learnt_through: int, step: int, model: CostModel, overheads: dict,
                 refits: list, exact: bool = False) -> Announcement:
        """``exact``: every planner waits for this announcement before it plans ``step`` (the
        first refit), so no rank can have planned it yet."""
        self.poll(store)  # the fitting rank alone announces: after this, this job's count is known
        with self._lock:
            last = self.schedule.announcements[-1] if self.schedule.announcements else None
            # past every iteration this rank has planned (another plans at most a window further)
            step = max(step, self.announced_through + (1 if exact else 2), last.step + 1 if last is not None else 0)
            earlier = dict(last.overheads) if last is not None else {}
            number = self._restored + self._seen + 1
        a = Announcement(number, step, learnt_through, model, {**earlier, **overheads}, tuple(refits))
        # one store value per refit: the model and its first iteration; then the count that shows it
        store.set(f"{self.prefix}/{number - self._restored}", json.dumps(a.to_doc()))
        store.add(f"{self.prefix}/count", 1)
        self.poll(store)
        with self._lock:
            self.refits.extend(dict(r, announced_for=step) for r in refits)
        self.save()
        return a

    def take_refits(self) -> list:
        """The accepted refits not yet written into a step line."""
        with self._lock:
            out, self.refits = self.refits, []
        return out

    def save(self) -> None:
        """Write the schedule beside the checkpoints (the fitting rank: at the start of training and
        at each announcement)."""
        if not self.save_dir:
            return
        from mimo_accel.costs.files import atomic_write

        path = Path(self.save_dir) / FILE
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(path, (json.dumps(self.schedule.to_doc(), indent=1) + "\n").encode())
        except OSError as exc:  # costs a resume's replay, not the run
            logger.warning("mimo_accel online calibration: could not write %s (%s); a resume will plan from the "
                           "configured cost model", path, exc)


def step_observations(figures: list, language_per_micro_batch: bool = False) -> dict:
    """Per module, one step's ``(features [rows, n], seconds [rows])`` from every rank's figures, a
    row per replica: its time its PP stages summed, each its slowest rank
    (:func:`~mimo_accel.modules.replica_seconds`), its features the largest any of its ranks counted; a
    module with an untimed replica is left out of that step. A module of one replica (and, with
    ``language_per_micro_batch``, the language model) is observed a row per micro-batch where its
    ranks gave them (the figures' ``micro``): its micro-batches differ as replicas would, and their
    level tells what a micro-batch costs whatever its size."""
    import numpy as np

    from mimo_accel.costs.online import features_of
    from mimo_accel.modules import LANGUAGE, replica_seconds

    by_module: dict = {}
    for i, f in enumerate(figures):
        if f.get("module") in (None, "unknown") or f.get("features") is None:
            continue
        ranks = by_module.setdefault(f["module"], {}).setdefault(f["dp_rank"], [])
        ranks.append((int(f.get("rank", i)), f.get("time_s"), list(f["features"]), int(f.get("stages") or 1),
                      f.get("micro")))
    out = {}
    for module, replicas in by_module.items():
        if (module == LANGUAGE and language_per_micro_batch) or len(replicas) == 1:
            per_micro = [_micro_batches(replicas[d]) for d in sorted(replicas)]
            if all(p is not None for p in per_micro):
                out[module] = tuple(np.concatenate(parts) for parts in zip(*per_micro))
                continue
        times, feats = {}, {}
        for d, members in replicas.items():
            feats[d] = [max(col) for col in zip(*(m[2] for m in members))]
            untimed = any(m[1] is None for m in members)
            times[d] = None if untimed else replica_seconds({m[0]: m[1] for m in members}, members[0][3])
        if any(t is None for t in times.values()):
            continue
        order = sorted(times)
        features = np.array([feats[d] for d in order], dtype=np.float64)
        if features.shape[1] != len(features_of(module)):
            continue
        out[module] = (features, np.array([times[d] for d in order], dtype=np.float64))
    return out


def _micro_batches(members: list):
    """``(features [W, n], seconds [W])`` of one replica's micro-batches: a micro-batch's features
    the largest over its ranks (TP, CP ranks run the same micro-batch), its seconds its stages
    summed, each its slowest rank (as :func:`~mimo_accel.modules.replica_seconds` sums a
    replica); None where a rank lacks them or the ranks differ in W."""
    import numpy as np

    from mimo_accel.modules import replica_seconds

    micro = [m[4] for m in members]
    if not all(isinstance(x, dict) for x in micro) or len({len(x["seconds"]) for x in micro}) != 1:
        return None
    features = np.max([np.asarray(x["features"], dtype=np.float64) for x in micro], axis=0)
    seconds = np.array([replica_seconds({m[0]: x["seconds"][j] for m, x in zip(members, micro)}, members[0][3])
                        for j in range(len(micro[0]["seconds"]))], dtype=np.float64)
    return features, seconds
