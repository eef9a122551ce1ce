"""The steps a layout is priced on: ``steps`` global batches drawn (seeded) from a workload profile
or a cost index, their language tokens cut at the sequence length (what a padded batch holds)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

import numpy as np

from mimo_accel.costs import CostIndex, EncoderColumns
from mimo_accel.workloads import Profile

__all__ = ["Draws", "draw"]


@dataclass(frozen=True)
class Draws:
    """``steps × gbs`` samples in the order drawn, step s being samples ``s·gbs … (s+1)·gbs − 1``, as
    a cost index whose tokens are at most ``seq_length`` (``clipped`` samples were longer)."""

    index: CostIndex
    steps: int
    gbs: int
    seq_length: int
    source: str
    clipped: int = 0

    def step(self, s: int) -> np.ndarray:
        return np.arange(s * self.gbs, (s + 1) * self.gbs)

    def largest_rows(self, column: str, k: int) -> float:
        """The most rows ``k`` drawn samples hold together on ``column`` (an encoder's busiest local
        micro-batch could hold them)."""
        rows = np.sort(self.index.rows(column, np.arange(len(self.index))))[::-1]
        return float(rows[:k].sum())


def _rehearsal_columns(profile: Profile, n: int, seed: int):
    """The profile's CPU-sized [rehearsal] samples (sides in patches), as the rehearsal trains them."""
    shapes = profile.rehearsal_shapes(n, seed)
    m = profile.rehearsal.merge_size
    items = np.array([len(s.images) for s in shapes], dtype=np.int64)
    rows = np.array([s.patches for s in shapes], dtype=np.int64)
    sq = np.array([s.sq_patches for s in shapes], dtype=np.int64)
    tokens = rows // (m * m) + np.array([s.text_tokens for s in shapes], dtype=np.int64)
    return tokens, {"vision": EncoderColumns.of("vision", items, rows, sq, profile.rule)}


def draw(data: Profile | CostIndex, *, steps: int, gbs: int, seq_length: int, seed: int = 0,
         rehearsal: bool = False, pixels: Optional[tuple[int, int]] = None) -> Draws:
    """``steps`` global batches of ``gbs`` samples: a profile's draw (the same samples
    ``simulate`` draws: ``sample_table(steps · gbs, seed)``; ``rehearsal``: its [rehearsal]
    samples; ``pixels``: the model's processor's (min, max) pixels an image is resized into, in
    place of the profile's), or a cost index's samples picked at random (seeded, without
    replacement where it holds enough; its rows are as indexed)."""
    n = steps * gbs
    if isinstance(data, Profile) and pixels is not None and not rehearsal:
        data = replace(data, rule=replace(data.rule, min_pixels=pixels[0] or data.rule.min_pixels,
                                          max_pixels=pixels[1]))
    if isinstance(data, Profile):
        if rehearsal:
            tokens, encoders = _rehearsal_columns(data, n, seed)
            source = f"workload {data.name} ([rehearsal] samples)"
        else:
            table = data.sample_table(n, seed)
            tokens, encoders, source = table.tokens, dict(table.encoders), f"workload {data.name}"
    else:
        rng = np.random.default_rng([int(seed), 0x1A70])
        pick = rng.choice(len(data), size=n, replace=len(data) < n)
        tokens = data.tokens(pick)
        encoders = {m: EncoderColumns.of(m, data.items(m, pick), data.rows(m, pick), data.sq_rows(m, pick),
                                         data.rule_of(m)) for m in data.encoders}
        source = f"cost index of {len(data):,} samples"
    tokens = np.asarray(tokens, dtype=np.int64)
    clipped = int((tokens > seq_length).sum())
    return Draws(CostIndex(np.minimum(tokens, seq_length), encoders), steps, gbs, int(seq_length), source, clipped)
