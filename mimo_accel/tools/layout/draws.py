"""The steps a layout is priced on: ``steps`` global batches drawn (seeded) from a workload profile
or a cost index, their language tokens cut at the sequence length (what a padded batch holds);
each step is one draw, and every layout is priced on the same draws. Beside them, the heaviest
rows each encoder's samples can hold: what its memory must hold, from the whole data (every
sample of a cost index; a profile's stated tail), never from the draws."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Optional

import numpy as np

from mimo_accel.costs import CostIndex, EncoderColumns
from mimo_accel.workloads import Profile
from mimo_accel.workloads.profile import AUDIO, VIDEO, VISION, max_patches

__all__ = ["Draws", "draw"]


@dataclass(frozen=True)
class Draws:
    """``steps × gbs`` samples in the order drawn, step s being samples ``s·gbs … (s+1)·gbs − 1``, as
    a cost index whose tokens are at most ``seq_length`` (``clipped`` samples were longer);
    ``heaviest[column]``: the rows of the data's heaviest samples, heaviest first (a profile's
    stated tail: one sample's most, repeated), enough for any micro-batch of ``gbs``."""

    index: CostIndex
    steps: int
    gbs: int
    seq_length: int
    source: str
    clipped: int = 0
    heaviest: Mapping[str, np.ndarray] = field(default_factory=dict, compare=False)

    def step(self, s: int) -> np.ndarray:
        return np.arange(s * self.gbs, (s + 1) * self.gbs)

    def heaviest_rows(self, module: str, encoders: Sequence[str], samples: int) -> float:
        """The most rows ``samples`` of the data's samples hold together on ``module``'s column."""
        rows = self.heaviest[self.index.column_for(module, encoders, lambda *_: None)]
        return float(rows[:samples].sum() + max(0, samples - rows.size) * (rows[-1] if rows.size else 0))


def _stated_tail(profile: Profile, column: str, rehearsal: bool) -> int:
    """The most rows one sample of ``profile`` can hold on ``column`` (its distributions' maxima)."""
    if rehearsal:
        r = profile.rehearsal
        up = lambda x: -(-x // r.merge_size) * r.merge_size  # noqa: E731 - sides rounded as the rehearsal draws them
        return r.image_count.max * up(r.height.max) * up(r.width.max)
    if column == VISION:
        return profile.image_count.max * max_patches(profile.rule, profile.size, profile.height, profile.width)
    if column == AUDIO:
        a = profile.audio
        return a.count.max * int(a.clip_rows(np.array([a.seconds.max]))[0])
    v, rule = profile.video, profile.rule
    return v.count.max * -(-v.frames.max // rule.temporal_patch_size) * max_patches(rule, None, v.height, v.width)


def _rehearsal_columns(profile: Profile, n: int, seed: int):
    """The profile's CPU-sized [rehearsal] samples (sides in patches), as the rehearsal trains them."""
    shapes = profile.rehearsal_shapes(n, seed)
    m = profile.rehearsal.merge_size
    items = np.array([len(s.images) for s in shapes], dtype=np.int64)
    rows = np.array([s.patches for s in shapes], dtype=np.int64)
    sq = np.array([s.sq_patches for s in shapes], dtype=np.int64)
    tokens = rows // (m * m) + np.array([s.text_tokens for s in shapes], dtype=np.int64)
    return tokens, {VISION: EncoderColumns.of(VISION, items, rows, sq, profile.rule)}


def draw(data: Profile | CostIndex, *, steps: int, gbs: int, seq_length: int, seed: int = 0,
         rehearsal: bool = False, pixels: Optional[tuple[int, int]] = None) -> Draws:
    """``steps`` global batches of ``gbs`` samples: a profile's draw (the same samples ``sample_table(steps ·
    gbs, seed)`` gives; ``rehearsal``: its [rehearsal] samples; ``pixels``: the model's processor's
    (min, max) pixels an image is resized into, in place of the profile's), or a cost index's samples
    picked at random (seeded, without replacement where it holds enough; its rows are as indexed)."""
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
        heaviest = {c: np.array([_stated_tail(data, c, rehearsal)], dtype=np.float64) for c in encoders}
    else:
        rng = np.random.default_rng([int(seed), 0x1A70])
        pick = rng.choice(len(data), size=n, replace=len(data) < n)
        tokens = data.tokens(pick)
        encoders = {m: EncoderColumns.of(m, data.items(m, pick), data.rows(m, pick), data.sq_rows(m, pick),
                                         data.rule_of(m)) for m in data.encoders}
        source = f"cost index of {len(data):,} samples"
        every = np.arange(len(data))
        heaviest = {}
        for m in data.encoders:
            rows = data.rows(m, every).astype(np.float64)
            top = np.partition(rows, -min(gbs, rows.size))[-min(gbs, rows.size):] if rows.size else rows
            heaviest[m] = np.sort(top)[::-1]
    tokens = np.asarray(tokens, dtype=np.int64)
    clipped = int((tokens > seq_length).sum())
    return Draws(CostIndex(np.minimum(tokens, seq_length), encoders), steps, gbs, int(seq_length), source, clipped,
                 heaviest)
