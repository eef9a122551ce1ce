"""Whether a job should move from the layout it runs to another, and what the gain is made of.

A change is recommended only beyond what the model cannot know:

(a) its gain on the mean (the objective's score of the mean step over the current layout's) is at
    least the ranking's own tie (:data:`TIE`); where a module's seconds are not measured (its FLOPs
    at an assumed efficiency) at least the tie plus :data:`ASSUMED_EFFICIENCY_SPREAD`;
(b) it is faster on every draw in the part of the step that depends on the data: each draw's step
    less its end (the DP gradient sync, a constant of a layout, the same on every draw, which an
    every-draw test would otherwise always pass);
(c) its gain is split into the parts of the two steps
    (:data:`~mimo_accel.tools.layout.pricing.PARTS`: compute, TP collectives, P2P, padding, the
    1F1B bubble, the DP gradient sync), which sum to it, so the answer says what it rests on.

The efficiency spread: FLOPs are priced at one assumed efficiency for every layout of a module (a
stated 0.40 of the peak). The efficiency a layout reaches is not known without measuring it:
Megatron-LM's own measurements of dense GPT models on H100 span 41-48 % MFU (its README, weak
scaling: larger GEMMs run more efficiently), ±8 % of their middle. A modelled gain inside that
spread may be the assumption's, not the layout's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["ASSUMED_EFFICIENCY_SPREAD", "TIE", "Change", "compare"]

TIE = 0.03
ASSUMED_EFFICIENCY_SPREAD = 0.08
_NAMES = {"compute": "compute", "tp_comm": "TP collectives", "p2p": "P2P", "padding": "padding",
          "bubble": "the 1F1B bubble", "dp_sync": "the DP gradient sync"}


@dataclass(frozen=True)
class Change:
    """A layout against the current one: ``gain`` its score of the mean step over the current's,
    minus 1; ``terms`` that gain by part of the step (summing to it); ``needed`` the gain a change
    needs (a); ``data_better`` of ``draws`` the draws on which it is faster less the step's end (b),
    ``data_range`` its gain on them, lowest and highest."""

    gain: float
    terms: dict[str, float]
    needed: float
    measured: bool
    data_better: int
    draws: int
    data_range: tuple[float, float]

    @property
    def worth(self) -> bool:
        return self.gain >= self.needed and self.data_better == self.draws

    def terms_said(self) -> str:
        parts = sorted(((k, v) for k, v in self.terms.items() if abs(v) >= 5e-4), key=lambda kv: -abs(kv[1]))
        return ", ".join(f"{_NAMES[k]} {v:+.1%}" for k, v in parts) or "nothing"

    def said(self) -> str:
        why = "the tie" if self.measured else (f"the {TIE:.0%} tie and {ASSUMED_EFFICIENCY_SPREAD:.0%} for the "
                                               "efficiency assumed where costs are not measured")
        low, high = self.data_range
        return (f"{self.gain:+.1%} on the mean (a change needs {self.needed:+.1%}: {why}); without the DP gradient "
                f"sync (the same on every draw) better on {self.data_better} of {self.draws} draws ({low:+.1%} … "
                f"{high:+.1%}); made of {self.terms_said()}")

    def to_doc(self) -> dict[str, Any]:
        return {"gain": self.gain, "gain_terms": dict(self.terms), "needed": self.needed, "worth": self.worth,
                "data_better_draws": self.data_better, "draws": self.draws, "data_gain_range": list(self.data_range)}


def compare(current, other, per_gpu: bool, measured: bool) -> Change:
    """``other`` against ``current`` (rows priced on the same draws, their ``accelerated`` figures
    with ``parts``), by samples/s (``per_gpu``: by tokens/s per GPU, the steps weighed by their
    GPUs); ``measured``: every module's seconds measured (:data:`TIE` alone is needed)."""
    a, b = current.accelerated, other.accelerated
    ga, gb = (current.gpus, other.gpus) if per_gpu else (1, 1)
    base = b.step_time_s * gb
    gain = a.step_time_s * ga / base - 1
    terms = {k: (a.parts.get(k, 0.0) * ga - b.parts.get(k, 0.0) * gb) / base for k in a.parts}
    ours = (np.asarray(a.step_time_s_draws) - a.parts["dp_sync"]) * ga
    theirs = (np.asarray(b.step_time_s_draws) - b.parts["dp_sync"]) * gb
    ratio = ours / theirs - 1
    needed = TIE if measured else TIE + ASSUMED_EFFICIENCY_SPREAD
    return Change(float(gain), terms, needed, measured, int((theirs < ours).sum()), len(ours),
                  (float(ratio.min()), float(ratio.max())))
