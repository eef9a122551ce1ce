"""Each module's cost model learnt from the job's own step times (pure: numpy only).

Fed per training step and module: a row per data-parallel replica, its forward + backward seconds
and its features summed over the step (an encoder's ``rows``, ``Σ rows²``, ``items``; the language
model's ``tokens``, ``Σ tokens²``, ``samples``: what :class:`~mimo_accel.costs.ModuleCost`
prices). A refit (:meth:`OnlineCalibration.refit`) fits each module over its last ``window``
steps, the newest ``held_out`` share held out, by these rules (docs/design.md tells why):

1. on how a step's replicas differ (one free level per step): what they share moves no plan;
2. the current model scaled to seconds is the centre of the prior and of the plausibility bound;
3. non-negative least squares with a ridge prior towards it worth ``prior`` steps
   (:func:`~mimo_accel.costs.fit.fit_near`), each feature weighed at least as if it varied 5 %;
4. a feature that never differs within a step keeps the current model's proportion; a term the
   model lacks and the steps tell moves the prior's centre to the fit;
5. accepted only if its mean held-out error (:mod:`~mimo_accel.costs.share_error`) beats the
   current model's by ``min_gain`` and is at most ``noise_factor`` times its median error on its
   own steps (at least :data:`NOISE_FLOOR`); a FLOPs start is put in seconds at its first attempt
   (``Refit.scale_only``), so a step plan weighs every module in one unit;
6. dropped, said once, where a coefficient is non-finite, negative or all zero, or it (or the
   predicted work) moves outside ``[1/bound, bound]`` while its term carries 1 % of the work;
7. ``keep_pace`` (a step plan): a module in seconds off its newest ``pace_steps`` steps' time by
   more than that is rescaled, its shape kept, with a cost per item where its micro-batches tell one.

Deterministic (steps in order, a fixed solver order, nothing random): the same observations give
bit-identical coefficients on every rank, though the runtime fits on one rank and ships them.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, Optional

import numpy as np

from mimo_accel.costs.model import LANGUAGE, CostModel, ModuleCost
from mimo_accel.notices import Notices
from mimo_accel.costs.fit import fit_near, in_seconds, mean_overhead, scale_and_overhead
from mimo_accel.costs.observations import PER_ITEM_ROWS, Observation, Steps, per_item_level

__all__ = ["OnlineCalibration", "Refit", "features_of"]

logger = logging.getLogger(__name__)

ENCODER_FEATURES = ("rows", "sq_rows", "items")
LANGUAGE_FEATURES = ("tokens", "sq_tokens", "samples")
_COEFFICIENTS = ("a", "b", "k")
BOUND = 100.0  # a refit may move a coefficient (or the predicted work) at most this factor either way
NEGLIGIBLE = 0.01  # a term below this share of the predicted work may fall to 0 (or grow from it)
SCALE_ONLY = "in seconds"  # the reason of a refit that only scaled the model in use to seconds
# a candidate's held-out error may be at most this many times its steps' own noise (point 5; what the
# demo's recorded refits gave: tests/test_refit_rule.py)
NOISE_FACTOR = 3.0
NOISE_FLOOR = 0.02  # no timing is quieter (a fit to two steps can explain them all but exactly)


def features_of(module: str) -> tuple[str, ...]:
    """The features an observation of ``module`` carries, in column order: an encoder's
    ``(rows, sq_rows, items)``, the language model's ``(tokens, sq_tokens)``."""
    return LANGUAGE_FEATURES if module == LANGUAGE else ENCODER_FEATURES


@dataclass(frozen=True)
class Refit:
    """One refit attempt of one module at a step boundary.

    ``coefficients``: the candidate's, in seconds; ``overhead_s``: the per-replica time per step they
    leave over (in no plan, but in a predicted spread). ``held_out_error_before`` / ``_after``: the
    mean :func:`~mimo_accel.costs.share_error.replica_share_error` over ``held_out_steps`` of the
    current model and the candidate; ``noise``: the candidate's median error on its own steps.
    ``accepted``: whether the model in use now has these coefficients, ``reason`` why or why not. A
    dropped candidate keeps the model in use's coefficients and a NaN ``held_out_error_after``."""

    step: int
    module: str
    coefficients: ModuleCost
    overhead_s: float
    held_out_error_before: float
    held_out_error_after: float
    held_out_steps: tuple[int, ...]
    accepted: bool
    reason: str
    noise: float = math.nan

    @property
    def scale_only(self) -> bool:
        """Whether it only put the model in use in seconds (its shape not learnt: not judged better)."""
        return self.reason.startswith(SCALE_ONLY)

    def to_dict(self) -> dict[str, Any]:
        """The report's record: step, module, coefficients, the held-out errors (and the rest)."""
        return {"step": self.step, "module": self.module, "coefficients": self.coefficients.to_dict(),
                "held_out_error_before": self.held_out_error_before,
                "held_out_error_after": self.held_out_error_after, "overhead_s": self.overhead_s,
                "held_out_steps": list(self.held_out_steps), "accepted": self.accepted, "reason": self.reason,
                "noise": self.noise}

    def message(self) -> str:
        """One log line: the module, its coefficients, the held-out error before → after."""
        c = self.coefficients
        terms = f"a={c.a:.4g} b={c.b:.4g} k={c.k:.4g}"
        return (f"mimo_accel online calibration: {self.module} at step {self.step}: {terms} "
                f"(held-out replica error {self.held_out_error_before:.4f} -> {self.held_out_error_after:.4f})")


class OnlineCalibration:
    """Learns every module's cost coefficients from per-step replica times (see the module doc).

    ``start``: the model a job starts with; :attr:`model` is it, updated by every accepted refit.
    ``modules``: the layout's module names. Options: ``min_steps`` observed steps before a module's
    first refit, then one attempt per ``every`` new steps; ``window`` the newest steps a fit uses,
    ``held_out`` the share of them a candidate is judged on; ``prior`` the current model's weight in
    steps; ``warmup`` the first steps left out (allocation, compilation); ``min_gain``,
    ``noise_factor`` (point 5; ``math.inf``: no bound), ``bound`` (point 6), ``keep_pace`` and
    ``pace_steps`` (point 7; None: off). ``notify(key, message)`` hears what it cannot act on, under
    a key per module and kind (default: a warning once per key).
    """

    def __init__(self, start: CostModel, modules: Sequence[str], *, min_steps: int = 4, every: int = 1,
                 window: int = 32, held_out: float = 0.25, prior: float = 2.0, warmup: int = 0,
                 min_gain: float = 0.02, bound: float = BOUND, keep_pace: Optional[float] = None,
                 pace_steps: int = 3, noise_factor: float = NOISE_FACTOR,
                 notify: Optional[Callable[[str, str], object]] = None) -> None:
        if not isinstance(start, CostModel):
            raise ValueError(f"OnlineCalibration: start must be a CostModel, got {type(start).__name__}")
        names = list(modules)
        if not names or any(not isinstance(n, str) or not n for n in names) or len(set(names)) != len(names):
            raise ValueError(f"OnlineCalibration: modules must be distinct non-empty names, got {names!r}")
        _check_int("min_steps", min_steps, 3)
        _check_int("every", every, 1)
        _check_int("window", window, min_steps)
        _check_int("warmup", warmup, 0)
        for name, value, low, high in (("held_out", held_out, 0.0, 1.0), ("prior", prior, 0.0, math.inf),
                                       ("min_gain", min_gain, 0.0, 1.0), ("bound", bound, 1.0, math.inf)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value < high \
                    or not math.isfinite(value):
                raise ValueError(f"OnlineCalibration: {name} must be a number in [{low:g}, {high:g}), got {value!r}")
        _check_int("pace_steps", pace_steps, 1)
        if isinstance(noise_factor, bool) or not isinstance(noise_factor, (int, float)) or not noise_factor >= 1:
            raise ValueError(f"OnlineCalibration: noise_factor must be >= 1 (math.inf: no bound), got {noise_factor!r}")
        if keep_pace is not None and (isinstance(keep_pace, bool) or not isinstance(keep_pace, (int, float))
                                      or not 0.0 <= keep_pace < 1.0):
            raise ValueError(f"OnlineCalibration: keep_pace must be None or a number in [0, 1), got {keep_pace!r}")
        if held_out <= 0:
            raise ValueError("OnlineCalibration: held_out must be > 0 (a refit is judged on held-out steps)")
        self._model = start
        self._modules = tuple(names)
        self.min_steps, self.every, self.window, self.warmup = min_steps, every, window, warmup
        self.held_out, self.prior = float(held_out), float(prior)
        self.min_gain, self.bound, self.noise_factor = float(min_gain), float(bound), float(noise_factor)
        self.keep_pace, self.pace_steps = keep_pace, pace_steps
        self._notify = notify if notify is not None else Notices(logger).say_once
        self._steps: dict[str, dict[int, Observation]] = {m: {} for m in names}
        self._last_step: dict[str, int] = {}
        self._skipped = dict.fromkeys(names, 0)
        self._new = dict.fromkeys(names, 0)
        # the current model of each module in seconds per its own unit, and its per-replica overhead
        self._level: dict[str, tuple[float, float]] = {}
        # a start in FLOPs put in seconds: the factor that makes its work total the measured time, and
        # that model's held-out error
        self._in_seconds: dict[str, tuple[float, float]] = {}
        self._attempts: list[Refit] = []
        self._accepted: list[Refit] = []
        # a start in FLOPs (costs.prior) is not in seconds: each module's first attempt puts it there,
        # its shape learnt or not, so a step plan weighs every module in one unit
        self._to_seconds: set[str] = set(names) if start.fit.get("start") == "flops" else set()

    # ---------------------------------------------------------------------------- what it holds

    @property
    def model(self) -> CostModel:
        """The model in use: ``start``, with every accepted refit's module coefficients."""
        return self._model

    @property
    def modules(self) -> tuple[str, ...]:
        return self._modules

    @property
    def refits(self) -> tuple[Refit, ...]:
        """The accepted refits, in order."""
        return tuple(self._accepted)

    @property
    def attempts(self) -> tuple[Refit, ...]:
        """Every refit attempt (accepted or not, with its reason), in order."""
        return tuple(self._attempts)

    def predict(self, module: str, features: Any) -> np.ndarray:
        """Per-replica seconds the model in use predicts for one step of ``module`` (rows of
        ``features`` as :meth:`observe` takes them), its overhead included: in seconds once the
        module has had a refit attempt (its scale and overhead are fitted then), in the model's
        own unit before."""
        x = self._features(module, features)
        scale, overhead = self._level.get(module, (1.0, 0.0))
        return scale * (x @ self._coefficients(module)) + overhead

    # ------------------------------------------------------------------------------- observing

    def observe(self, step: int, module: str, features: Any, seconds: Any) -> None:
        """One step of ``module``: ``features`` ``[replicas, n_features]`` (:func:`features_of`:
        summed over the step's micro-batches) and ``seconds`` ``[replicas]`` (forward + backward).
        Steps of a module must come in increasing order; the first ``warmup`` are left out."""
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
            raise ValueError(f"OnlineCalibration.observe: step must be an integer >= 0, got {step!r}")
        step = int(step)
        x = self._features(module, features)
        y = np.array(seconds, dtype=np.float64, copy=True).reshape(-1) if np.ndim(seconds) else None
        if y is None or y.shape != (x.shape[0],):
            raise ValueError(f"OnlineCalibration.observe: {module} step {step}: seconds must hold one time per "
                             f"replica ({x.shape[0]}), got shape {np.shape(seconds)}")
        if not np.isfinite(y).all() or (y < 0).any():
            raise ValueError(f"OnlineCalibration.observe: {module} step {step}: replica times must be finite "
                             f"seconds >= 0, got {y.tolist()}")
        last = self._last_step.get(module)
        if last is not None and step <= last:
            raise ValueError(f"OnlineCalibration.observe: {module} step {step} after step {last}: observe each "
                             "step once, in increasing order")
        self._last_step[module] = step
        if self._skipped[module] < self.warmup:
            self._skipped[module] += 1
            return
        steps = self._steps[module]
        steps[step] = Observation(x, y)
        while len(steps) > self.window:
            del steps[min(steps)]
        self._new[module] += 1

    def _features(self, module: str, features: Any) -> np.ndarray:
        if module not in self._steps:
            raise ValueError(f"OnlineCalibration: unknown module {module!r}; the layout's modules are "
                             f"{list(self._modules)}")
        names = features_of(module)
        x = np.array(features, dtype=np.float64, copy=True)
        if x.ndim != 2 or x.shape[1] != len(names) or x.shape[0] < 1:
            raise ValueError(f"OnlineCalibration: {module} features must be [replicas, {len(names)}] "
                             f"({', '.join(names)} per replica), got shape {x.shape}")
        if not np.isfinite(x).all() or (x < 0).any():
            raise ValueError(f"OnlineCalibration: {module} features ({', '.join(names)}) must be finite and >= 0")
        return x

    def _coefficients(self, module: str) -> np.ndarray:
        cost = self._model.of(module)
        return np.array([getattr(cost, c) for c in _COEFFICIENTS[:len(features_of(module))]], dtype=np.float64)

    # ------------------------------------------------------------------------------- refitting

    def refit(self, step: int) -> tuple[Refit, ...]:
        """At the boundary before ``step``: attempt a refit of every module that has ``min_steps``
        observations and ``every`` new ones since its last attempt; the accepted ones (at most one
        per module, in module order) are in :attr:`model` when this returns."""
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)) or step < 0:
            raise ValueError(f"OnlineCalibration.refit: step must be an integer >= 0, got {step!r}")
        accepted = []
        for module in self._modules:
            steps = self._steps[module]
            if len(steps) < self.min_steps or self._new[module] < self.every:
                continue
            self._new[module] = 0
            numbers = sorted(steps)
            attempt = self._attempt(int(step), module, [steps[s] for s in numbers], numbers)
            if attempt is not None and not attempt.accepted and module in self._to_seconds \
                    and module in self._in_seconds:
                attempt = self._scaled(attempt)
            if self.keep_pace is not None:
                attempt = self._at_pace(int(step), module, attempt, [steps[s] for s in numbers], numbers)
            if attempt is None:
                continue
            self._attempts.append(attempt)
            if attempt.accepted:
                self._adopt(attempt)
                self._accepted.append(attempt)
                accepted.append(attempt)
        return tuple(accepted)

    def _attempt(self, step: int, module: str, obs: list[Observation], numbers: list[int]) -> Optional[Refit]:
        n = len(obs)
        h = min(n - 2, max(1, math.ceil(self.held_out * n)))
        train, test, test_steps = Steps(obs[:n - h]), Steps(obs[n - h:]), tuple(numbers[n - h:])
        x, y = train.features, train.seconds
        with np.errstate(all="ignore"):
            current = self._coefficients(module)
            # judged with its best level (scale and overhead fitted to the training steps' times) ...
            scale, overhead = scale_and_overhead(x @ current, y)
            self._level[module] = (scale, overhead)
            before = test.share_error(scale * current, overhead)
            # ... and held to as priced so that its work is the measured time (the fitted split of
            # scale and overhead is loose while the plan keeps the model's own costs even)
            factor = in_seconds(x @ current, y)
            centre = factor * current
            self._in_seconds[module] = (factor, test.share_error(centre, 0.0))
            w, varying = fit_near(x, y, train.labels, centre, self.prior)
        names = features_of(module)
        if not varying.any():
            self._notify(f"online:{module}:nothing-varies",
                      f"mimo_accel online calibration: {module}: no feature ({', '.join(names)}) differs between its "
                      "replicas within a step (one replica, or equal work on every one), so its cost cannot be learnt "
                      "from the step times; its model stays as it is (a start in FLOPs is put in seconds, once)")
            if module not in self._to_seconds:
                return None
            # one module in seconds and another in its start's units would mislead the step plan,
            # which weighs the pipeline's modules against each other
            return self._scaled(Refit(step, module, self._model.of(module), overhead, before, math.nan, test_steps,
                                      False, "only the scale can be learnt"))
        paced = self.keep_pace is not None and train.counts.min() >= PER_ITEM_ROWS  # the pace tells k (point 7)
        # the language model's samples never differ (as many in every replica): news only where the pace tells k
        held = [f"{names[j]} ({_COEFFICIENTS[j]})" for j in np.flatnonzero(~varying) if paced or names[j] != "samples"]
        if held:
            self._notify(f"online:{module}:held:{','.join(held)}",
                      f"mimo_accel online calibration: {module}: {', '.join(held)} never differs between its "
                      "replicas within a step, so the steps cannot tell its coefficient (it keeps the current "
                      "model's proportion" + ("; the fit to the machine's pace sets k" if paced else "") + ")")
        with np.errstate(all="ignore"):
            problem = self._implausible(module, w, centre, x)
        if problem is not None:
            self._notify(f"online:{module}:dropped",
                      f"mimo_accel online calibration: {module}: the refit at step {step} {problem}; it is dropped and "
                      "the model in use is kept (said once: later refits are judged the same way). Check the module's "
                      "timings, or start from a cost model measured on this hardware (mimo-accel calibrate-gpu)")
            return Refit(step, module, self._model.of(module), overhead, before, math.nan, test_steps, False,
                         f"dropped: {problem}")
        candidate = ModuleCost(*(float(v) for v in w))
        with np.errstate(all="ignore"):
            new_overhead = mean_overhead(x @ w, y)
            after = test.share_error(w, new_overhead)
            own = train.share_errors(w, new_overhead)
        judged = dict(noise=max(NOISE_FLOOR, float(np.median(own))) if own.size else NOISE_FLOOR)
        if not math.isfinite(before) or not math.isfinite(after):
            return Refit(step, module, candidate, new_overhead, before, after, test_steps, False,
                         "not judged: the held-out steps carry no work", **judged)
        if not after < before * (1.0 - self.min_gain):
            return Refit(step, module, candidate, new_overhead, before, after, test_steps, False,
                         f"not better on the held-out steps by {self.min_gain:.0%}", **judged)
        noise = judged["noise"]
        if after > self.noise_factor * noise:  # better than a model that missed those steps too
            why = f"held-out error {after:.3f} is over {self.noise_factor:g}x the {noise:.3f} its own steps leave"
            self._notify(f"online:{module}:not-good-enough",
                      f"mimo_accel online calibration: {module}: the refit at step {step} is not planned with: its "
                      f"{why} (they hold what its terms do not explain); the model in use plans while it learns "
                      "(said once: later refits are judged the same way)")
            return Refit(step, module, candidate, new_overhead, before, after, test_steps, False,
                         f"not good enough to act on: {why} (still learning)", **judged)
        return Refit(step, module, candidate, new_overhead, before, after, test_steps, True,
                     "better on the held-out steps", **judged)

    def _scaled(self, attempt: Refit) -> Refit:
        """A first attempt not taken: the model in use, put in seconds (its work totals the measured
        time: a plan prices no overhead), so every module of a step plan has one unit."""
        factor, error = self._in_seconds[attempt.module]
        current = self._coefficients(attempt.module)
        reason = (f"{SCALE_ONLY}: {attempt.reason}" if attempt.reason == "only the scale can be learnt"
                  else f"{SCALE_ONLY}: the model in use, scaled ({attempt.reason})")
        return replace(attempt, coefficients=ModuleCost(*(float(v) for v in factor * current)), overhead_s=0.0,
                       held_out_error_after=error, accepted=True, reason=reason)

    def _at_pace(self, step: int, module: str, attempt: Optional[Refit], obs: list[Observation],
                 numbers: list[int]) -> Optional[Refit]:
        """``keep_pace``: the module's model (the refit just accepted, or the one in use), once in
        seconds, scaled so that its work totals the newest ``pace_steps`` steps' measured time,
        where it is off by more than ``keep_pace`` (relative). A step plan prices every module in
        seconds and no overhead, so a machine whose pace drifts from the steps a model was learnt
        from would otherwise mislead the predicted step, while the plan's proportions hold."""
        taken = attempt is not None and attempt.accepted
        if module in self._to_seconds and not taken:
            return attempt  # not in seconds yet: its first attempt puts it there
        base = attempt.coefficients if taken else self._model.of(module)
        w = np.array([getattr(base, c) for c in _COEFFICIENTS[:len(features_of(module))]], dtype=np.float64)
        recent = Steps(obs[-self.pace_steps:])
        with np.errstate(all="ignore"):
            factor = in_seconds(recent.features @ w, recent.seconds)
        level = per_item_level(w, recent)
        if level is not None and self._implausible(module, level, factor * w, recent.features) is not None:
            level = None
        # the drift is the model's predicted work over the measured time, less one (none measured:
        # none); a module just put in seconds takes its cost per item at once where its steps tell it
        just_in_seconds = taken and module in self._to_seconds
        if not (math.isfinite(factor) and factor > 0) or (abs(1.0 / factor - 1.0) <= self.keep_pace
                                                          and not (just_in_seconds and level is not None)):
            return attempt
        new = factor * w
        why = f"{SCALE_ONLY}: at the pace of steps {numbers[-len(recent.counts)]}-{numbers[-1]} (x{factor:.3f})"
        if level is not None:
            new = level
            rows_scale = float(new[:2].sum() / w[:2].sum())  # per_item_level leaves a, b in proportion
            why = (f"at the pace of steps {numbers[-len(recent.counts)]}-{numbers[-1]}: x{rows_scale:.3f} "
                   f"per row, {new[2]:.3g} s per item")
        coefficients = ModuleCost(*(float(v) for v in new))
        if attempt is None:
            return Refit(step, module, coefficients, 0.0, recent.share_error(w, 0.0), recent.share_error(new, 0.0),
                         tuple(numbers[-len(recent.counts):]), True, why)
        # the model now in use is judged on the attempt's held-out steps as it prices them (no
        # overhead), not by the candidate's error where the attempt kept the model in use
        held = [obs[numbers.index(s)] for s in attempt.held_out_steps if s in numbers]
        after = Steps(held).share_error(new, 0.0) if held else math.nan
        return replace(attempt, coefficients=coefficients, overhead_s=0.0, held_out_error_after=after,
                       accepted=True, reason=f"{why}; {attempt.reason}")

    def _implausible(self, module: str, w: np.ndarray, centre: np.ndarray, x: np.ndarray) -> Optional[str]:
        names = features_of(module)
        if not np.isfinite(w).all():
            return "gives a non-finite coefficient"
        if (w < 0).any():
            return "gives a negative coefficient"
        mean_x = x.mean(axis=0)
        work, current = float(mean_x @ w), float(mean_x @ centre)
        if not work > 0:
            return "gives every coefficient 0 (the times do not grow with any feature)"
        for j, name in enumerate(names):
            # a term that carries a real share of the work in both models may not jump; one that is
            # negligible in either may come or go (k from 0 when items turn out to cost, b to ~0
            # under flash attention)
            if w[j] * mean_x[j] >= NEGLIGIBLE * work and centre[j] * mean_x[j] >= NEGLIGIBLE * current:
                ratio = w[j] / centre[j]
                if not 1.0 / self.bound <= ratio <= self.bound:
                    return (f"would move {_COEFFICIENTS[j]} (per {name}) {ratio:.3g}x from the current "
                            f"{centre[j]:.4g} s, outside [1/{self.bound:g}, {self.bound:g}]")
        if current > 0 and not 1.0 / self.bound <= work / current <= self.bound:
            return (f"would predict {work / current:.3g}x the current model's work, outside "
                    f"[1/{self.bound:g}, {self.bound:g}]")
        return None

    def _adopt(self, refit: Refit) -> None:
        module = refit.module
        modules = dict(self._model.modules)
        modules[module] = refit.coefficients
        online = dict(self._model.fit.get("online", {}))
        online[module] = refit.step
        self._model = replace(self._model, modules=modules, fit={**self._model.fit, "online": online})
        self._level[module] = (1.0, refit.overhead_s)
        self._to_seconds.discard(module)


# ------------------------------------------------------------------------------------ the fit


def _check_int(name: str, value: Any, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ValueError(f"OnlineCalibration: {name} must be an integer >= {low}, got {value!r}")
