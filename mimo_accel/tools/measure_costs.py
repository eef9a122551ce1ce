"""Measure each module's cost curve on one device and write a cost-model file.

``mimo-accel calibrate-gpu --out cost-model.json [--points points.json] [--budget-s 420]
[--device cuda|cpu] [--size real|tiny] [--dtype bf16|fp32] [--warmup N] [--repeats N]``

``mimo-accel calibrate-gpu --from-points points.json --out cost-model.json`` fits saved
measurements again (no device needed).

``mimo-accel calibrate`` fits the cost model from a profiled training run; this command needs no
run and no data. It builds the modules themselves on one device, times forward + backward over a
designed set of inputs, fits each module's curve and writes a ``mimo-accel-cost-model/2`` file
(:class:`~mimo_accel.costs.CostModel`) with the module names ``calibrate`` writes: ``vision``
(``--vision-module`` renames it to the name the layout's config gives the image encoder) and
``language``. Use it as ``MIMO_ACCEL_COST_MODEL=cost-model.json`` (``cost_model=`` in ``enable()``)
or ``mimo-accel simulate --cost-model``.

What it measures (``--size real``):

- **vision**: Bridge's own ``Qwen3VLVisionModel``
  (megatron/bridge/models/qwen_vl/modelling_qwen3_vl/vision_model.py) at Qwen3-VL's real size,
  its config made by Bridge's ``get_vision_model_config``
  (megatron/bridge/models/qwen_vl/modelling_qwen3_vl/transformer_config.py) from transformers'
  ``Qwen3VLVisionConfig`` defaults (transformers/models/qwen3_vl/configuration_qwen3_vl.py): depth
  27, hidden 1152, 16 heads, MLP 4304, patch 16, temporal patch 2, spatial merge 2, 3 input
  channels, 2304 position embeddings, merger output 4096 (Qwen3-VL-8B's language width).
  ``deepstack_visual_indexes`` is empty, as MIMO's vision encoder has it
  (:mod:`mimo_accel.rehearse.qwen3vl`: MIMO keeps the model's first output only).
- **language**: 4 decoder layers of Qwen3-8B's shape (megatron-core ``TransformerBlock``, local
  GPT layer spec): hidden 4096, 32 heads in 8 KV groups (head dim 128), SwiGLU FFN 12288, RMSNorm,
  QK-norm, RoPE (base 1e6), no biases. Every layer does the same work, so the curve's shape — all a
  balancing plan uses (a module's replica spread is max/mean of its own costs) — is the same for 4
  layers as for 36; 4 keep memory at a few GiB and the largest point near 0.1-0.2 s on an H200, so
  every point gets its repeats inside the budget. The written coefficients are the measured
  block's scaled to ``--language-depth`` layers (default 36, Qwen3-8B's depth), so that absolute
  times read as the whole decoder's; the embedding and output layer (linear in tokens) are not in it.

``--size tiny`` builds the same two modules small (vision hidden 64, 2 layers; language hidden
64, 2 layers; a few hundred thousand parameters) so the whole command runs in seconds on a CPU:
that is how its logic is tested.

Points. Each point is one forward + backward (the gradient of the output with a fixed random
tensor) after ``--warmup`` untimed iterations; its time is the median of ``--repeats``. Vision
points span one large image down to many small ones, at equal and unequal patch totals (and
mixes), so ``rows`` (patches before merging), ``Σ rows²`` (per-image attention) and ``items``
(images: Qwen3-VL's per-image work in ``fast_pos_embed_interpolate`` / ``rot_pos_emb`` and one
attention call each) are told apart. Language points are THD-packed sequences of 256 to 16384
tokens, one sequence or several (causal attention within each), so ``a·tokens + b·tokens²`` is
determined over the per-sample sums the cost model uses. The first points of each module (the
smallest set that determines its fit) are always measured; the rest are added while
``--budget-s`` lasts (vision may use up to 55 % of it, the language model the rest): a point
whose predicted time does not fit in what is left is not started, and the command says how many
points it measured.

Timing. CUDA: ``torch.cuda.Event(enable_timing=True)`` around the work on the current stream,
then ``synchronize``; the events see the whole step, host-side gaps included. CPU:
``time.perf_counter`` before and after (the work is synchronous there).

Attention. Transformer Engine is not needed (the command runs wherever torch and the Megatron
packages do): both modules' core attention is a megatron-core ``DotProductAttention`` subclass
for packed (THD) q/k/v, bidirectional within an image, causal within a language sequence. On
CUDA it is torch's variable-length flash attention (``torch.nn.attention.varlen.varlen_attn``:
one call over every ``cu_seqlens`` segment, as TE's THD attention) where this torch has it and
a self-check at the module's heads and dtype (forward, backward, agreement with the fallback)
passes; otherwise, and always on CPU, ``torch.nn.functional.scaled_dot_product_attention`` once
per segment (torch picks its flash or memory-efficient kernel for bf16 on CUDA). Which one ran
is printed and stored (``fit.device.attention``). On CPU :func:`mimo_accel.rehearse.cpu.activate`
redirects megatron's CUDA hard-codes and torch runs one thread (a second thread on a shared CPU
makes timings swing several-fold); on CUDA the CPU layer is never activated.

Fit. Per module a non-negative least-squares fit (:func:`mimo_accel.costs.nnls.nnls`) of
the median times on ``rows, Σrows², items`` (vision) or ``tokens, Σtokens²`` (language) plus a
fixed overhead per call (not in the model, as in ``mimo-accel calibrate``), each point weighted
by 1/time so that small points count as much as large ones. The language fit has one more term
that is not written: a cost per packed sequence (megatron's unfused THD RoPE splits per
sequence, and the per-segment fallback calls attention once each; a TE job's fused THD kernels
do neither, and the model's language cost has no per-sample term), fitted so that it does not
leak into ``a`` and ``b``. R², relative RMSE and the worst point's error are printed with every
point and stored in the file's ``fit`` metadata; ``--points`` writes the raw measurements (every
repeat, after each module) for ``--from-points``. Coefficients are in seconds (``a`` s/row or
s/token, ``b`` s/row² or s/token², ``k`` s/image).

How to run it on an H200: in the training environment (torch with CUDA, megatron-core,
megatron-bridge; Transformer Engine optional), on one idle GPU,
``mimo-accel calibrate-gpu --out cost-model.json --points cost-points.json``. It builds the
vision model (456 M parameters), measures its points, frees it, builds the language block
(772 M parameters) and measures its points, all within ``--budget-s`` (default 420 s, so
the command ends well inside 8 minutes), prints a table of every point with the fit's
prediction and the coefficients, and writes ``cost-model.json`` atomically.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import math
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np

from mimo_accel.costs import CostModel, ModuleCost
from mimo_accel.costs.files import atomic_write
from mimo_accel.modules import LANGUAGE

__all__ = ["LanguagePoint", "MeasureError", "ModuleFit", "SIZES", "VisionPoint", "collect", "fit_language",
           "fit_vision", "language_points", "main", "model_from_fits", "vision_points"]

PROG = "mimo-accel calibrate-gpu"
POINTS_FORMAT = "mimo-accel-cost-points/1"
VISION = "vision"
VISION_SHARE = 0.55  # of the budget: the vision phase ends by then, the language one by the end
_MAX_CONDITION = 1e10  # of the column-normalised, weighted design (as mimo-accel calibrate)
_MARGIN = 1.25  # a point is started only if 1.25 × its predicted time fits in what is left


class MeasureError(ValueError):
    """A measurement or fit that cannot be made; the message says why and what to do."""


# ------------------------------------------------------------------------------------ shapes


@dataclass(frozen=True)
class VisionShape:
    """The vision encoder's size (the fields of transformers' ``Qwen3VLVisionConfig``)."""

    depth: int
    hidden_size: int
    num_heads: int
    intermediate_size: int
    out_hidden_size: int
    num_position_embeddings: int
    patch_size: int = 16
    temporal_patch_size: int = 2
    spatial_merge_size: int = 2
    in_channels: int = 3

    @property
    def patch_dim(self) -> int:
        """Width of one ``pixel_values`` row: channels · temporal patch · patch²."""
        return self.in_channels * self.temporal_patch_size * self.patch_size ** 2


@dataclass(frozen=True)
class LanguageShape:
    """The language decoder block measured, and the depth its coefficients are scaled to."""

    layers: int
    hidden_size: int
    num_heads: int
    num_query_groups: int
    ffn_hidden_size: int
    depth: int  # the whole decoder's layers: coefficients are scaled by depth / layers
    rotary_base: float = 1_000_000.0

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads


#: ``--size``: (vision, language). ``real``: Qwen3-VL-8B's vision encoder and Qwen3-8B's layers.
SIZES: dict[str, tuple[VisionShape, LanguageShape]] = {
    "real": (VisionShape(depth=27, hidden_size=1152, num_heads=16, intermediate_size=4304, out_hidden_size=4096,
                         num_position_embeddings=2304),
             LanguageShape(layers=4, hidden_size=4096, num_heads=32, num_query_groups=8, ffn_hidden_size=12288,
                           depth=36)),
    "tiny": (VisionShape(depth=2, hidden_size=64, num_heads=4, intermediate_size=128, out_hidden_size=64,
                         num_position_embeddings=256),
             LanguageShape(layers=2, hidden_size=64, num_heads=4, num_query_groups=2, ffn_hidden_size=128, depth=2)),
}


# ------------------------------------------------------------------------------------ points


@dataclass(frozen=True)
class VisionPoint:
    """One vision input: images of ``(h, w)`` patches (one frame each), packed as one call."""

    images: tuple[tuple[int, int], ...]

    @property
    def rows(self) -> int:
        return sum(h * w for h, w in self.images)

    @property
    def sq_rows(self) -> int:
        return sum((h * w) ** 2 for h, w in self.images)

    @property
    def items(self) -> int:
        return len(self.images)

    def features(self) -> tuple[float, ...]:
        return (float(self.rows), float(self.sq_rows), float(self.items))

    @property
    def label(self) -> str:
        return " + ".join(f"{n}×{h}×{w}" for (h, w), n in Counter(self.images).items())

    def to_doc(self) -> dict[str, Any]:
        return {"images": [list(hw) for hw in self.images], "rows": self.rows, "sq_rows": self.sq_rows,
                "items": self.items}


@dataclass(frozen=True)
class LanguagePoint:
    """One language input: sequences of these lengths packed THD into one ``[T]`` call."""

    segments: tuple[int, ...]

    @property
    def tokens(self) -> int:
        return sum(self.segments)

    @property
    def sq_tokens(self) -> int:
        return sum(n * n for n in self.segments)

    @property
    def items(self) -> int:
        return len(self.segments)

    def features(self) -> tuple[float, ...]:
        return (float(self.tokens), float(self.sq_tokens), float(self.items))

    @property
    def label(self) -> str:
        return " + ".join(f"{c}×{n}" for n, c in Counter(self.segments).items())

    def to_doc(self) -> dict[str, Any]:
        return {"segments": list(self.segments), "tokens": self.tokens, "sq_tokens": self.sq_tokens}


def _images(*groups: tuple[int, int, int]) -> VisionPoint:
    return VisionPoint(tuple((h, w) for n, h, w in groups for _ in range(n)))


# (the first CORE points determine the fit on their own: they are always measured)
VISION_CORE = 5
LANGUAGE_CORE = 5

_VISION_POINTS = {
    "real": [
        _images((1, 64, 64)),                      # 4096 patches, one image
        _images((16, 16, 16)),                     # 4096 patches, 16 images
        _images((1, 32, 32)),                      # 1024
        _images((1, 128, 128)),                    # 16384, one image (2048×2048 px)
        _images((64, 8, 8)),                       # 4096 patches, 64 small images
        _images((4, 32, 32)),                      # 4096, 4 images
        _images((1, 32, 128)),                     # 4096, one wide image
        _images((1, 48, 48)),                      # 2304
        _images((1, 96, 96)),                      # 9216
        _images((1, 64, 64), (4, 32, 32), (16, 8, 8)),  # 9216, unequal images
        _images((1, 96, 64), (8, 16, 16)),         # 8192, unequal
        _images((16, 32, 32)),                     # 16384, 16 images
        _images((64, 16, 16)),                     # 16384, 64 images
        _images((256, 8, 8)),                      # 16384, 256 small images
        _images((1, 128, 256)),                    # 32768, one very large image
    ],
    "tiny": [
        _images((1, 16, 16)),                      # 256 patches, one image
        _images((16, 4, 4)),                       # 256, 16 images
        _images((1, 8, 8)),                        # 64
        _images((1, 24, 24)),                      # 576
        _images((4, 8, 8)),                        # 256, 4 images
        _images((1, 8, 32)),                       # 256, wide
        _images((1, 16, 16), (4, 4, 4)),           # 320, unequal
        _images((9, 8, 8)),                        # 576, 9 images
        _images((1, 32, 32)),                      # 1024
    ],
}

_LANGUAGE_POINTS = {
    "real": [
        LanguagePoint((256,)),
        LanguagePoint((2048,)),
        LanguagePoint((8192,)),
        LanguagePoint((2048,) * 4),                # 8192 tokens as 4 sequences
        LanguagePoint((512,) * 16),                # 8192 tokens as 16 sequences
        LanguagePoint((1024,)),
        LanguagePoint((4096,)),
        LanguagePoint((512,)),
        LanguagePoint((6144,)),
        LanguagePoint((4096, 2048, 1024, 1024)),   # 8192, unequal
        LanguagePoint((4096,) * 2),
        LanguagePoint((16384,)),
    ],
    "tiny": [
        LanguagePoint((32,)),
        LanguagePoint((256,)),
        LanguagePoint((1024,)),
        LanguagePoint((256,) * 4),
        LanguagePoint((64,) * 8),
        LanguagePoint((128,)),
        LanguagePoint((512,)),
        LanguagePoint((512, 256, 128, 128)),
    ],
}


def vision_points(size: str) -> list[VisionPoint]:
    """The vision points of ``size``, the ones that determine the fit first."""
    return list(_VISION_POINTS[size])


def language_points(size: str) -> list[LanguagePoint]:
    """The language points of ``size``, the ones that determine the fit first."""
    return list(_LANGUAGE_POINTS[size])


# --------------------------------------------------------------------------------------- fit

# (coefficient, feature, units): the model's terms, then terms fitted but not written (nuisance)
_VISION_TERMS = (("a", "rows", "s / row"), ("b", "Σ rows²", "s / row²"), ("k", "items", "s / image"))
_LANGUAGE_TERMS = (("a", "tokens", "s / token"), ("b", "Σ tokens²", "s / token²"))
# The measured block's per-sequence work (megatron's unfused THD RoPE splits per sequence; without
# varlen attention, one SDPA call each): a TE job's fused THD kernels have none, and the language
# cost has no per-sample term, so it is fitted to keep it out of a and b, and not written.
_LANGUAGE_NUISANCE = (("per_sequence", "sequences", "s / sequence"),)


@dataclass(frozen=True)
class ModuleFit:
    """One module's fitted curve: ``coefficients`` (a, b[, k]) in seconds, what is fitted but not
    in the model (``nuisance``; the per-call ``overhead_s``), and how well it explains the points."""

    module: str
    coefficients: dict[str, float]
    overhead_s: float
    r2: float
    rel_rmse: float
    max_rel_err: float
    n: int
    predicted: tuple[float, ...]
    nuisance: dict[str, float] = dataclasses.field(default_factory=dict)

    def predict(self, features: Sequence[float]) -> float:
        """One call's time (s) at a point's ``features()``, overhead included."""
        w = [*self.coefficients.values(), *self.nuisance.values()]
        return float(np.dot(np.asarray(features, dtype=np.float64)[:len(w)], w) + self.overhead_s)

    def meta(self) -> dict[str, Any]:
        return {"r2": self.r2, "rel_rmse": self.rel_rmse, "max_rel_err": self.max_rel_err, "n": self.n,
                "overhead_s": self.overhead_s, **{f"{k}_s": v for k, v in self.nuisance.items()},
                "units": "seconds", "weights": "1/time"}


def _fit_curve(module: str, x: np.ndarray, y: np.ndarray, terms, nuisance=()) -> ModuleFit:
    """NNLS of ``y ≈ x·w + overhead`` on relative error (rows weighted 1/y); ``x``'s columns are
    ``terms`` then ``nuisance``."""
    from mimo_accel.costs.nnls import nnls

    names = [t[0] for t in (*terms, *nuisance)]
    n = y.size
    if n < len(names) + 2:
        raise MeasureError(f"{module}: {n} points cannot fit {len(names)} terms and an overhead with a check; "
                           f"need at least {len(names) + 2}")
    if not (np.isfinite(y).all() and (y > 0).all()):
        raise MeasureError(f"{module}: every measured time must be finite and > 0, got {y.tolist()}")
    design = np.column_stack([x[:, :len(names)], np.ones(n)])
    weighted = design / y[:, None]
    scale = np.linalg.norm(weighted, axis=0)
    scale[scale == 0] = 1.0
    xs = weighted / scale
    sv = np.linalg.svd(xs, compute_uv=False)
    if sv[-1] <= sv[0] / _MAX_CONDITION:
        raise MeasureError(f"{module}: the points cannot separate {', '.join(t[1] for t in (*terms, *nuisance))} "
                           "and the overhead (a singular design); measure points that vary them independently")
    w = nnls(xs, np.ones(n)) / scale
    pred = design @ w
    rss = float(((y - pred) ** 2).sum())
    tss = float(((y - y.mean()) ** 2).sum())
    rel = (pred - y) / y
    return ModuleFit(module=module, coefficients={t[0]: float(v) for t, v in zip(terms, w)},
                     nuisance={t[0]: float(v) for t, v in zip(nuisance, w[len(terms):-1])},
                     overhead_s=float(w[-1]), r2=1.0 - rss / tss if tss > 0 else 1.0,
                     rel_rmse=float(np.sqrt((rel ** 2).mean())), max_rel_err=float(np.abs(rel).max()), n=n,
                     predicted=tuple(float(p) for p in pred))


def fit_vision(points: Sequence[VisionPoint], seconds: Sequence[float], module: str = VISION) -> ModuleFit:
    """The encoder's ``a·rows + b·Σrows² + k·items`` (+ overhead) from per-point times (s)."""
    x = np.array([p.features() for p in points], dtype=np.float64).reshape(-1, 3)
    return _fit_curve(module, x, np.asarray(seconds, dtype=np.float64), _VISION_TERMS)


def fit_language(points: Sequence[LanguagePoint], seconds: Sequence[float], module: str = LANGUAGE) -> ModuleFit:
    """The language model's ``a·tokens + b·Σtokens²`` (+ a per-sequence term and an overhead, not
    in the model) from per-point times (s)."""
    x = np.array([p.features() for p in points], dtype=np.float64).reshape(-1, 3)
    return _fit_curve(module, x, np.asarray(seconds, dtype=np.float64), _LANGUAGE_TERMS, _LANGUAGE_NUISANCE)


def model_from_fits(vision: ModuleFit, language: ModuleFit, *, language_scale: float = 1.0,
                    meta: Optional[dict[str, Any]] = None) -> CostModel:
    """The v2 cost model: the vision encoder's (a, b, k) under ``vision.module``, the language
    model's (a, b) × ``language_scale`` (measured layers → the whole decoder) under ``language``;
    the default encoder coefficients (a, b) are the vision encoder's, as ``mimo-accel calibrate``
    writes them."""
    v, lm = vision.coefficients, language.coefficients
    modules = {vision.module: ModuleCost(v["a"], v["b"], v["k"]),
               LANGUAGE: ModuleCost(lm["a"] * language_scale, lm["b"] * language_scale)}
    fit_meta = {"units": "seconds", "source": PROG, **(meta or {}),
                "modules": {vision.module: vision.meta(), LANGUAGE: {**language.meta(), "scale": language_scale}}}
    return CostModel(a=v["a"], b=v["b"], c=0.0, fit=fit_meta, modules=modules)


# ---------------------------------------------------------------------------- collect (budget)


@dataclass
class Measured:
    """One point's timed repeats (seconds)."""

    point: Any
    times: list[float]

    @property
    def median(self) -> float:
        return float(statistics.median(self.times))


@dataclass
class Collection:
    module: str
    measured: list[Measured]
    planned: int
    stopped: Optional[str] = None  # why points were left out (the budget), else None
    skipped: list[str] = dataclasses.field(default_factory=list)  # points that failed (e.g. out of memory)


def collect(module: str, points: Sequence[Any], measure: Callable[[Any], list[float]], *, deadline: float,
            core: int, iterations: int, fit: Callable[[list, list], ModuleFit],
            clock: Callable[[], float] = time.monotonic,
            on_point: Optional[Callable[[int, Measured], None]] = None,
            skip_errors: tuple[type[BaseException], ...] = ()) -> Collection:
    """Measure ``points`` in order: the first ``core`` always, each later one only if its predicted
    duration (``iterations`` × the fit so far, × a margin) fits before ``deadline`` on ``clock``.
    ``measure(point)`` returns the timed repeats of one point. A point whose measure raises one of
    ``skip_errors`` is left out and named (e.g. out of device memory)."""
    out = Collection(module, [], len(points))
    for i, point in enumerate(points):
        if i >= core:
            left = deadline - clock()
            need = _predicted(out, point, fit) * iterations * _MARGIN
            if left <= 0 or need > left:
                out.stopped = (f"the budget is spent: {module} measured {len(out.measured)} of {len(points)} points"
                               f" (the next, {point.label}, would take ~{need:.3g} s; {max(left, 0.0):.3g} s left)")
                break
        try:
            times = measure(point)
        except skip_errors as exc:
            out.skipped.append(f"{point.label}: {' '.join(str(exc).split())[:200]}")
            continue
        m = Measured(point, list(times))
        out.measured.append(m)
        if on_point is not None:
            on_point(i, m)
    return out


def _predicted(c: Collection, point: Any, fit: Callable[[list, list], ModuleFit]) -> float:
    """One iteration's predicted time at ``point``: the fit of what is measured, else the
    slowest point so far scaled by its size."""
    pts, ys = [m.point for m in c.measured], [m.median for m in c.measured]
    try:
        return fit(pts, ys).predict(point.features())
    except MeasureError:
        if not ys:
            return 0.0
        return max(y * point.features()[0] / max(p.features()[0], 1.0) for p, y in zip(pts, ys))


# ------------------------------------------------------------------------------ the devices


class _CudaTimer:
    """Seconds of ``fn()`` on the current CUDA stream (CUDA events, then synchronize)."""

    def __init__(self, torch):
        self._torch = torch

    def __call__(self, fn: Callable[[], None]) -> float:
        cuda = self._torch.cuda
        start, end = cuda.Event(enable_timing=True), cuda.Event(enable_timing=True)
        cuda.synchronize()
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3


def _cpu_timer(fn: Callable[[], None]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _sdpa_segments(q, k, v, bounds: list[int], causal: bool, scale: float):
    """Attention once per ``bounds`` segment of packed ``[T, heads, dim]`` q/k/v with torch SDPA;
    KV groups expanded to the query heads. Returns ``[T, heads * dim]``."""
    import torch
    from torch.nn import functional as F

    groups = q.size(1) // k.size(1)
    outs = []
    for start, stop in zip(bounds[:-1], bounds[1:]):
        qs, ks, vs = (t[start:stop].transpose(0, 1) for t in (q, k, v))  # [heads, n, dim]
        if groups > 1:
            ks, vs = ks.repeat_interleave(groups, dim=0), vs.repeat_interleave(groups, dim=0)
        o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=causal, scale=scale)
        outs.append(o.transpose(0, 1).reshape(stop - start, -1))
    return torch.cat(outs)


def _varlen_kernel():
    """torch's variable-length flash attention (``torch.nn.attention.varlen.varlen_attn``: one
    call over every ``cu_seqlens`` segment, as Transformer Engine's THD attention) as
    ``call(q, k, v, cu, max_len, causal, scale) -> [T, heads, dim]``, or None where this torch has
    none. Its keyword names changed between torch releases; both spellings are handled."""
    try:
        import inspect

        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    params = inspect.signature(varlen_attn).parameters
    if "window_size" not in params and "is_causal" not in params:
        return None

    def call(q, k, v, cu, max_len, causal, scale):
        kw: dict[str, Any] = {"scale": scale}
        if k.size(1) != q.size(1):
            if "enable_gqa" in params:
                kw["enable_gqa"] = True
            else:
                groups = q.size(1) // k.size(1)
                k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        if "window_size" in params:
            kw["window_size"] = (-1, 0) if causal else (-1, -1)
        else:
            kw["is_causal"] = causal
        return varlen_attn(q, k, v, cu, cu, max_len, max_len, **kw)

    return call


def _choose_attention(device: str, dtype: str, heads: int, groups: int, head_dim: int, causal: bool):
    """(kernel or None, its name): torch's varlen flash attention on CUDA where it runs here,
    forward and backward, at these heads and this dtype and agrees with per-segment SDPA on a
    small packed input; else per-segment SDPA (always on CPU)."""
    if device != "cuda":
        return None, "sdpa per segment"
    call = _varlen_kernel()
    if call is None:
        return None, "sdpa per segment (this torch has no varlen attention)"
    import torch

    try:
        g = torch.Generator(device="cpu").manual_seed(0)
        shape_q, shape_kv = (96, heads, head_dim), (96, groups, head_dim)
        q, k, v = (torch.randn(s, generator=g).to(device="cuda", dtype=_torch_dtype(dtype)).requires_grad_(True)
                   for s in (shape_q, shape_kv, shape_kv))
        cu = torch.tensor([0, 32, 96], dtype=torch.int32, device="cuda")
        scale = head_dim ** -0.5
        out = call(q, k, v, cu, 64, causal, scale)
        out.float().square().sum().backward()
        ref = _sdpa_segments(q.detach(), k.detach(), v.detach(), [0, 32, 96], causal, scale)
        err = float((out.detach().reshape(96, -1) - ref).abs().max())
        if not math.isfinite(err) or err > 5e-2:
            return None, f"sdpa per segment (varlen attention disagreed with it by {err:.3g})"
        if q.grad is None or not bool(torch.isfinite(q.grad).all()):
            return None, "sdpa per segment (varlen attention gave no finite gradient)"
    except Exception as exc:  # an unsupported dtype, head dim or GPU: the portable path
        return None, f"sdpa per segment (varlen attention unavailable: {type(exc).__name__}: " \
                     f"{' '.join(str(exc).split())[:120]})"
    return call, "varlen flash attention (torch.nn.attention.varlen)"


def _core_attention(kernel):
    """Megatron-core's ``DotProductAttention`` interface for packed (THD) q/k/v: ``kernel`` (one
    varlen call) or torch SDPA once per ``cu_seqlens`` segment; bidirectional for a ``no_mask``
    layer (an image), causal for a ``causal`` one (a sequence)."""
    from megatron.core.transformer.dot_product_attention import DotProductAttention
    from megatron.core.transformer.enums import AttnMaskType

    class PackedAttention(DotProductAttention):
        def forward(self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None,
                    packed_seq_params=None):
            if packed_seq_params is None:
                raise ValueError(f"{PROG}: the measured modules run packed (THD) inputs only")
            causal = self.attn_mask_type == AttnMaskType.causal
            cu = packed_seq_params.cu_seqlens_q
            if kernel is not None:
                longest = packed_seq_params.max_seqlen_q
                longest = int(longest) if longest is not None else int((cu[1:] - cu[:-1]).max())
                out = kernel(query, key, value, cu.int(), longest, causal, self.softmax_scale)
                return out.reshape(query.size(0), -1)
            return _sdpa_segments(query, key, value, cu.tolist(), causal, self.softmax_scale)

    return PackedAttention


@contextlib.contextmanager
def _session(device: str, log_path: str) -> Iterator[Any]:
    """One process as one rank of world size 1: the process group, megatron's global memory
    buffer and RNG tracker; on CPU the CPU layer (:func:`mimo_accel.rehearse.cpu.activate`),
    never on CUDA. Yields the ``ProcessGroupCollection``; undoes what it set up."""
    from mimo_accel.rehearse import cpu, quiet

    with quiet.output_to(log_path):
        cpu.prepare_imports()  # the 3.11 back-port; stand-ins only for packages not installed
        import torch
        import torch.distributed as dist
        from megatron.core import parallel_state
        from megatron.core.process_groups_config import ProcessGroupCollection
        from megatron.core.tensor_parallel import random as mp_random
        import megatron.bridge.models.qwen_vl.modelling_qwen3_vl.vision_model  # noqa: F401

    activated = False
    threads = torch.get_num_threads()
    if device == "cpu":
        torch.set_num_threads(1)  # a second thread on a shared CPU makes timings swing several-fold
        if not cpu.is_active():
            with quiet.output_to(log_path):  # it imports more of megatron.bridge
                cpu.activate(force=True)
            activated = True
    created = False
    buffer = False
    store = tempfile.mkdtemp(prefix="mimo-accel-calibrate-gpu-")
    try:
        if device == "cuda":
            torch.cuda.set_device(torch.cuda.current_device())
        if not dist.is_initialized():
            dist.init_process_group("nccl" if device == "cuda" else "gloo", init_method=f"file://{store}/pg",
                                    rank=0, world_size=1)
            created = True
        elif dist.get_world_size() != 1:
            raise MeasureError(f"run it as one process (this one is a rank of {dist.get_world_size()}); "
                               "it measures one device")
        if getattr(parallel_state, "_GLOBAL_MEMORY_BUFFER", None) is None:
            parallel_state._set_global_memory_buffer()
            buffer = True
        torch.manual_seed(0)
        if device == "cuda":
            try:
                mp_random.model_parallel_cuda_manual_seed(1, tp_rank=0, ep_rank=0, etp_rank=0)
            except TypeError:  # a megatron-core without the explicit ranks
                mp_random.model_parallel_cuda_manual_seed(1)
        else:
            cpu._seed_cpu_rng_tracker(1)
        g = dist.group.WORLD
        yield ProcessGroupCollection(tp=g, cp=g, pp=g, dp=g, dp_cp=g)
    finally:
        if buffer:
            parallel_state.destroy_global_memory_buffer()
        if created:
            dist.destroy_process_group()
        if activated:
            cpu.deactivate()
            cpu.prepare_imports()  # megatron.bridge stays imported: keep what its imports need
        torch.set_num_threads(threads)
        with contextlib.suppress(OSError):
            for name in os.listdir(store):
                os.unlink(os.path.join(store, name))
            os.rmdir(store)


def _torch_dtype(name: str):
    import torch

    return {"bf16": torch.bfloat16, "fp32": torch.float32}[name]


def _language_base_config(shape: LanguageShape, device: str, dtype: str, layers: int):
    from megatron.core.transformer.transformer_config import TransformerConfig
    from torch.nn import functional as F

    return TransformerConfig(
        num_layers=layers, hidden_size=shape.hidden_size, num_attention_heads=shape.num_heads,
        num_query_groups=shape.num_query_groups, kv_channels=shape.head_dim, ffn_hidden_size=shape.ffn_hidden_size,
        normalization="RMSNorm", qk_layernorm=True, layernorm_epsilon=1e-6, gated_linear_unit=True,
        activation_func=F.silu, add_bias_linear=False, hidden_dropout=0.0, attention_dropout=0.0,
        bf16=dtype == "bf16", params_dtype=_torch_dtype(dtype), pipeline_dtype=_torch_dtype(dtype),
        use_cpu_initialization=device == "cpu", bias_activation_fusion=False, bias_dropout_fusion=False,
        apply_rope_fusion=False, masked_softmax_fusion=False, gradient_accumulation_fusion=False,
        persist_layer_norm=False,
    )


def _vision_config(shape: VisionShape, language_config, dtype: str):
    """Bridge's ``get_vision_model_config`` over transformers' ``Qwen3VLVisionConfig`` (as
    Bridge's Qwen3-VL provider builds it), with the device's dtype and MIMO's deepstack."""
    from megatron.bridge.models.qwen_vl.modelling_qwen3_vl.transformer_config import get_vision_model_config
    from transformers.models.qwen3_vl.configuration_qwen3_vl import Qwen3VLVisionConfig

    hf = Qwen3VLVisionConfig(depth=shape.depth, hidden_size=shape.hidden_size, num_heads=shape.num_heads,
                             intermediate_size=shape.intermediate_size, out_hidden_size=shape.out_hidden_size,
                             num_position_embeddings=shape.num_position_embeddings, patch_size=shape.patch_size,
                             temporal_patch_size=shape.temporal_patch_size, in_channels=shape.in_channels,
                             spatial_merge_size=shape.spatial_merge_size, deepstack_visual_indexes=[])
    config = get_vision_model_config(hf, megatron_config=language_config)
    config.params_dtype = _torch_dtype(dtype)
    config.pipeline_dtype = _torch_dtype(dtype)
    config.bf16 = dtype == "bf16"
    config.gradient_accumulation_fusion = False
    config.masked_softmax_fusion = False
    config.persist_layer_norm = False
    config.deepstack_visual_indexes = []
    return config


def _fresh(model) -> None:
    for p in model.parameters():
        p.grad = None


def _vision_measure(shape: VisionShape, language: LanguageShape, pg, device: str, dtype: str, timer, warmup: int,
                    repeats: int):
    """(the model, measure(point) -> timed repeats, the attention kernel's name) for Bridge's
    Qwen3-VL vision model."""
    import torch
    from megatron.bridge.models.qwen_vl.modelling_qwen3_vl.attention import Qwen3VLSelfAttention
    from megatron.bridge.models.qwen_vl.modelling_qwen3_vl.utils import PatchMergerSubmodules
    from megatron.bridge.models.qwen_vl.modelling_qwen3_vl.vision_model import Qwen3VLVisionModel
    from megatron.core.models.vision.vit_layer_specs import get_vit_layer_with_local_spec
    from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    # the language config stands for Bridge's provider (recompute, TP size, CPU initialisation)
    config = _vision_config(shape, _language_base_config(language, device, dtype, language.layers), dtype)
    layer = get_vit_layer_with_local_spec()
    layer.submodules.self_attention.module = Qwen3VLSelfAttention
    kernel, attention = _choose_attention(device, dtype, shape.num_heads, shape.num_heads,
                                          shape.hidden_size // shape.num_heads, causal=False)
    layer.submodules.self_attention.submodules.core_attention = _core_attention(kernel)
    merger = PatchMergerSubmodules(patch_norm=WrappedTorchNorm, linear_fc1=ColumnParallelLinear,
                                   linear_fc2=RowParallelLinear)
    model = Qwen3VLVisionModel(transformer_config=config, transformer_layer_spec=layer, patch_merger_spec=merger,
                               pre_process=True, post_process=True, pg_collection=pg)
    model = model.to(device=device, dtype=_torch_dtype(dtype)).train()
    unit = shape.spatial_merge_size ** 2
    gen = torch.Generator(device="cpu").manual_seed(0)

    def measure(point: VisionPoint) -> list[float]:
        grid = torch.tensor([[1, h, w] for h, w in point.images], dtype=torch.long, device=device)
        x = torch.randn(point.rows, shape.patch_dim, generator=gen).to(device=device, dtype=_torch_dtype(dtype))
        grad = torch.randn(point.rows // unit, shape.out_hidden_size, generator=gen).to(device=device,
                                                                                      dtype=_torch_dtype(dtype))

        def step():
            out, _ = model(x, grid)
            out.backward(grad)

        times = []
        for i in range(warmup + repeats):
            t = timer(step)
            _fresh(model)
            if i >= warmup:
                times.append(t)
        return times

    return model, measure, attention


def _language_measure(shape: LanguageShape, pg, device: str, dtype: str, timer, warmup: int, repeats: int):
    """(the block, measure(point) -> timed repeats, the attention kernel's name) for a THD-packed
    decoder block."""
    import torch
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.packed_seq_params import PackedSeqParams
    from megatron.core.transformer.transformer_block import TransformerBlock

    config = _language_base_config(shape, device, dtype, shape.layers)
    spec = get_gpt_layer_local_spec(qk_layernorm=True, normalization="RMSNorm")
    kernel, attention = _choose_attention(device, dtype, shape.num_heads, shape.num_query_groups, shape.head_dim,
                                          causal=True)
    spec.submodules.self_attention.submodules.core_attention = _core_attention(kernel)
    block = TransformerBlock(config, spec, pg_collection=pg).to(device=device, dtype=_torch_dtype(dtype)).train()
    rope = RotaryEmbedding(kv_channels=shape.head_dim, rotary_percent=1.0, rotary_base=shape.rotary_base)
    gen = torch.Generator(device="cpu").manual_seed(0)

    def measure(point: LanguagePoint) -> list[float]:
        t = point.tokens
        cu = torch.tensor([0, *np.cumsum(point.segments).tolist()], dtype=torch.int32, device=device)
        longest = max(point.segments)
        params = PackedSeqParams(qkv_format="thd", cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=longest,
                                 max_seqlen_kv=longest)
        freqs = rope(longest).to(device)
        x = torch.randn(t, 1, shape.hidden_size, generator=gen).to(device=device, dtype=_torch_dtype(dtype))
        x.requires_grad_(True)
        grad = torch.randn(t, 1, shape.hidden_size, generator=gen).to(device=device, dtype=_torch_dtype(dtype))

        def step():
            out = block(hidden_states=x, attention_mask=None, rotary_pos_emb=freqs, packed_seq_params=params)
            out.backward(grad)

        times = []
        for i in range(warmup + repeats):
            s = timer(step)
            _fresh(block)
            x.grad = None
            if i >= warmup:
                times.append(s)
        return times

    return block, measure, attention


def _release(device: str, model) -> None:
    import gc

    import torch

    del model
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


# ------------------------------------------------------------------------------------ output


def _points_doc(args, device_info: dict, collections: dict[str, Collection], elapsed: float) -> dict[str, Any]:
    vision_shape, language_shape = _shapes(args)
    return {
        "format": POINTS_FORMAT, "device": device_info, "size": args.size, "dtype": args.dtype,
        "warmup": args.warmup, "repeats": args.repeats, "budget_s": args.budget_s, "elapsed_s": elapsed,
        "vision_module": args.vision_module,
        "shapes": {VISION: dataclasses.asdict(vision_shape), LANGUAGE: dataclasses.asdict(language_shape)},
        "modules": {name: {"points": [{**m.point.to_doc(), "times_s": m.times} for m in c.measured],
                           "planned": c.planned, "stopped": c.stopped, "skipped": c.skipped}
                    for name, c in collections.items()},
    }


def _read_points(path: str) -> tuple[dict[str, Any], list[Measured], list[Measured]]:
    """(the document, vision measurements, language measurements) of a ``--points`` file."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise MeasureError(f"{path}: not a JSON points file ({exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != POINTS_FORMAT:
        found = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        raise MeasureError(f"{path}: expected \"format\": \"{POINTS_FORMAT}\", found {found!r}; write it with "
                           f"{PROG} --points")
    vision_name = doc.get("vision_module", VISION)
    mods = doc.get("modules")
    for name in (vision_name, LANGUAGE):
        if not isinstance(mods, dict) or name not in mods:
            raise MeasureError(f"{path}: no {name} points (the measuring run stopped before them?); measure again")
    try:
        vision = [Measured(VisionPoint(tuple((int(h), int(w)) for h, w in p["images"])),
                           [float(t) for t in p["times_s"]]) for p in mods[vision_name]["points"]]
        language = [Measured(LanguagePoint(tuple(int(n) for n in p["segments"])), [float(t) for t in p["times_s"]])
                    for p in mods[LANGUAGE]["points"]]
    except (KeyError, TypeError, ValueError) as exc:
        raise MeasureError(f"{path}: malformed points ({type(exc).__name__}: {exc})") from None
    if any(not m.times for m in vision + language):
        raise MeasureError(f"{path}: a point without times")
    return doc, vision, language


def _render(console, fits: dict[str, ModuleFit], collections: dict[str, Collection], scale: float,
            language_shape: LanguageShape) -> None:
    from rich.table import Table

    for name, c in collections.items():
        f = fits.get(name)
        is_vision = name != LANGUAGE
        t = Table(title=f"{name}: measured points (forward + backward, median of repeats)", title_justify="left")
        cols = (("point", "left"), ("rows" if is_vision else "tokens", "right"),
                ("Σ rows²" if is_vision else "Σ tokens²", "right"), ("images" if is_vision else "sequences", "right"),
                ("median ms", "right"), ("min–max ms", "right"), ("fit ms", "right"), ("error", "right"))
        for col, justify in cols:
            t.add_column(col, justify=justify)
        for i, m in enumerate(c.measured):
            p = m.point
            feats = (p.rows, p.sq_rows, p.items) if is_vision else (p.tokens, p.sq_tokens, p.items)
            pred = f.predicted[i] if f is not None else None
            t.add_row(p.label, f"{feats[0]:,}", f"{feats[1]:.3g}", str(feats[2]), f"{m.median * 1e3:.3f}",
                      f"{min(m.times) * 1e3:.3f}–{max(m.times) * 1e3:.3f}",
                      "—" if pred is None else f"{pred * 1e3:.3f}",
                      "—" if pred is None else f"{(pred - m.median) / m.median:+.1%}")
        console.print(t)
        if f is None:
            continue
        q = Table(title=f"{name}: fitted cost (written to the file)", title_justify="left")
        for col in ("term", "coefficient", "units"):
            q.add_column(col, justify="right" if col == "coefficient" else "left")
        terms = _VISION_TERMS if is_vision else _LANGUAGE_TERMS
        for key, label, units in terms:
            value = f.coefficients[key] * (1.0 if is_vision else scale)
            q.add_row(f"{key} · {label}", f"{value:.4g}", units)
        for key, label, units in _LANGUAGE_NUISANCE if not is_vision else ():
            q.add_row(f"per {label[:-1]}: THD RoPE / attention calls (not in the model)", f"{f.nuisance[key]:.4g}",
                      units)
        q.add_row("overhead per call (not in the model)", f"{f.overhead_s:.4g}", "s")
        q.add_row("R²", f"{f.r2:.4f}", "")
        q.add_row("relative RMSE / worst point", f"{f.rel_rmse:.2%} / {f.max_rel_err:.2%}", "")
        a, b = f.coefficients["a"], f.coefficients["b"]
        q.add_row("b / a", "—" if a <= 0 else f"{b / a:.3g}", "1 / row" if is_vision else "1 / token")
        if not is_vision and scale != 1.0:
            q.add_row("language scale", f"× {scale:g}",
                      f"{language_shape.layers} layers measured → {language_shape.depth}")
        console.print(q)
        if f.r2 < 0.95:
            console.print(f"[yellow]warning:[/] {name}: R² = {f.r2:.3f}; the machine may be busy — rerun on an idle "
                          "device")


# -------------------------------------------------------------------------------------- main


def _shapes(args) -> tuple[VisionShape, LanguageShape]:
    vision, language = SIZES[args.size]
    if args.language_depth is not None:
        language = dataclasses.replace(language, depth=args.language_depth)
    return vision, language


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Measure each module's cost curve on this machine's GPU — Bridge's Qwen3-VL vision model at "
                    "its real size and a stack of Qwen3-8B decoder layers, forward + backward, timed with CUDA "
                    "events — fit it, and write a cost-model file (the format `mimo-accel calibrate` writes, "
                    "with the modules vision and language). --device cpu --size tiny checks the logic in seconds "
                    "without a GPU; --from-points fits saved measurements again.",
        epilog="e.g. mimo-accel calibrate-gpu --out cost-model.json --points cost-points.json")
    p.add_argument("--out", metavar="FILE", required=True, help="the cost-model file to write (use it with "
                   "MIMO_ACCEL_COST_MODEL=FILE)")
    p.add_argument("--points", metavar="FILE", help="also write the raw measurements (every repeat) as JSON")
    p.add_argument("--from-points", metavar="FILE", help="fit the measurements of a --points file again: no device")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="where to measure (default cuda; cpu "
                   "for tests, with --size tiny)")
    p.add_argument("--size", choices=tuple(SIZES), default="real",
                   help="real: Qwen3-VL vision (depth 27, hidden 1152) and 4 Qwen3-8B layers (default); tiny: "
                        "small shapes that run in seconds on a CPU")
    p.add_argument("--dtype", choices=("bf16", "fp32"), help="parameter and activation dtype (default bf16 on "
                   "cuda, fp32 on cpu)")
    p.add_argument("--budget-s", type=float, default=420.0, metavar="S",
                   help="wall-clock budget for the whole command (default 420): no further point is started "
                        "once it would not fit; the points a fit needs are always measured")
    p.add_argument("--warmup", type=int, default=2, metavar="N", help="untimed iterations per point (default 2)")
    p.add_argument("--repeats", type=int, default=5, metavar="N", help="timed iterations per point; the median "
                   "counts (default 5)")
    p.add_argument("--language-depth", type=int, metavar="L", help="scale the language coefficients to a decoder "
                   "of L layers (default: 36 for real, Qwen3-8B; the measured layers for tiny)")
    p.add_argument("--vision-module", default=VISION, metavar="NAME",
                   help="the vision encoder's module name in the file (default vision: the name your layout "
                        "gives the image encoder)")
    return p


def _check_args(args) -> None:
    for opt in ("out", "points"):
        value = getattr(args, opt)
        if value is None:
            continue
        parent = Path(value).resolve().parent
        if not parent.is_dir():
            raise MeasureError(f"--{opt} {value}: the directory {parent} does not exist; create it or give another "
                               "path")
    if args.from_points is not None:
        if not Path(args.from_points).is_file():
            raise MeasureError(f"--from-points {args.from_points}: no such file")
        return
    if not (args.budget_s > 0 and math.isfinite(args.budget_s)):
        raise MeasureError(f"--budget-s must be a positive number of seconds, got {args.budget_s}")
    if args.warmup < 0 or args.repeats < 1:
        raise MeasureError(f"--warmup must be >= 0 and --repeats >= 1, got {args.warmup} and {args.repeats}")
    if args.language_depth is not None and args.language_depth < 1:
        raise MeasureError(f"--language-depth must be >= 1, got {args.language_depth}")
    if not args.vision_module or args.vision_module == LANGUAGE:
        raise MeasureError(f"--vision-module must name the vision encoder (not {args.vision_module!r})")
    if args.device == "cpu" and args.size == "real":
        raise MeasureError("--size real on cpu would take hours (27 vision layers at 16k patches); use --size tiny "
                           "on cpu, or run on a GPU")
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        why = "this torch has no CUDA" if torch.version.cuda is None else "no GPU is visible"
        raise MeasureError(f"--device cuda: CUDA is not available here ({why}, torch {torch.__version__}); run it "
                           "on a GPU machine, or pass --device cpu --size tiny to check the logic")


def _device_info(device: str, dtype: str) -> dict[str, Any]:
    from importlib import metadata

    import torch

    info: dict[str, Any] = {"kind": device, "dtype": dtype, "torch": torch.__version__}
    for pkg in ("megatron-core", "megatron-bridge", "transformer-engine"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            info[pkg] = metadata.version(pkg)
    if device == "cuda":
        info["name"] = torch.cuda.get_device_name()
        info["cuda"] = torch.version.cuda
    else:
        import platform

        info["name"] = platform.processor() or platform.machine()
        info["threads"] = torch.get_num_threads()
    return info


def _measure_all(args, console, log_path: str,
                 save: Callable[[dict[str, Collection], dict[str, Any], float], None]
                 ) -> tuple[dict[str, Collection], dict[str, Any], float]:
    """Measure both modules inside the budget; returns (collections, device info, elapsed s).
    ``save`` gets what is measured after each module (so a later failure keeps the points)."""
    clock = time.monotonic
    start = clock()
    vision_shape, language_shape = _shapes(args)
    iterations = args.warmup + args.repeats
    collections: dict[str, Collection] = {}
    from mimo_accel.rehearse import quiet

    with _session(args.device, log_path) as pg:
        import torch

        timer = _CudaTimer(torch) if args.device == "cuda" else _cpu_timer
        oom = (torch.cuda.OutOfMemoryError,) if args.device == "cuda" else ()
        info = _device_info(args.device, args.dtype)
        console.print(f"{PROG}: {info['name']} ({args.device}, {args.dtype}), size {args.size}, budget "
                      f"{args.budget_s:g} s, {args.warmup} warm-up + {args.repeats} timed iterations per point")

        def progress(name, total):
            def on_point(i, m):
                console.print(f"  {name} {i + 1}/{total} {m.point.label}: {m.median * 1e3:.3f} ms "
                              f"(min {min(m.times) * 1e3:.3f}, max {max(m.times) * 1e3:.3f}) "
                              f"at {clock() - start:.0f} s", highlight=False)
            return on_point

        phases = (
            (args.vision_module, vision_points(args.size), VISION_CORE, start + VISION_SHARE * args.budget_s,
             lambda: _vision_measure(vision_shape, language_shape, pg, args.device, args.dtype, timer, args.warmup,
                                     args.repeats),
             lambda pts, ys: fit_vision(pts, ys, args.vision_module)),
            (LANGUAGE, language_points(args.size), LANGUAGE_CORE, start + args.budget_s,
             lambda: _language_measure(language_shape, pg, args.device, args.dtype, timer, args.warmup,
                                       args.repeats),
             fit_language),
        )
        for name, points, core, deadline, build, fit in phases:
            t0 = clock()
            with quiet.output_to(log_path):  # megatron's deprecation warnings while configuring
                model, measure, attention = build()
            info.setdefault("attention", {})[name] = attention
            console.print(f"{name}: built {sum(p.numel() for p in model.parameters()) / 1e6:.1f} M parameters in "
                          f"{clock() - t0:.1f} s; attention: {attention}; {len(points)} points", highlight=False)
            collections[name] = collect(name, points, measure, deadline=deadline, core=core, iterations=iterations,
                                        fit=fit, clock=clock, on_point=progress(name, len(points)),
                                        skip_errors=oom)
            del measure
            _release(args.device, model)
            c = collections[name]
            for s in c.skipped:
                console.print(f"[yellow]{name}: point left out:[/] {s}")
            if c.stopped:
                console.print(f"[yellow]{c.stopped}[/]")
            save(collections, info, clock() - start)
    return collections, info, clock() - start


def main(argv: Optional[Sequence[str]] = None, *, console=None) -> int:
    """``mimo-accel calibrate-gpu``. Returns 0, or 2 (one ``error:`` line) when it cannot measure or fit."""
    from rich.console import Console

    try:
        args = _parser().parse_args(argv)
    except SystemExit as exc:  # --help, or a usage error argparse already printed
        return int(exc.code or 0)
    if args.dtype is None:
        args.dtype = "bf16" if args.device == "cuda" else "fp32"
    if console is None:
        console = Console() if sys.stdout.isatty() else Console(width=120)
    fd, log_path = tempfile.mkstemp(prefix="mimo-accel-calibrate-gpu-", suffix=".log")
    os.close(fd)
    try:
        _check_args(args)
        if args.from_points is not None:
            doc, vision, language = _read_points(args.from_points)
            args.vision_module = doc.get("vision_module", VISION)
            args.size, args.warmup, args.repeats = (doc.get(k, getattr(args, k)) for k in ("size", "warmup", "repeats"))
            said = {name: doc["modules"][name] for name in (args.vision_module, LANGUAGE)}
            collections = {name: Collection(name, measured, said[name].get("planned", len(measured)),
                                            stopped=said[name].get("stopped"))
                           for name, measured in ((args.vision_module, vision), (LANGUAGE, language))}
            info, elapsed = doc.get("device", {}), doc.get("elapsed_s")
            shape = doc.get("shapes", {}).get(LANGUAGE)
            language_shape = LanguageShape(**shape) if shape else _shapes(args)[1]
            if args.language_depth is not None:
                language_shape = dataclasses.replace(language_shape, depth=args.language_depth)
            source = {"points": str(args.from_points)}
        else:
            def save(collections, info, elapsed):
                if args.points:
                    atomic_write(Path(args.points), (json.dumps(_points_doc(args, info, collections, elapsed),
                                                                indent=1) + "\n").encode())

            collections, info, elapsed = _measure_all(args, console, log_path, save)
            language_shape = _shapes(args)[1]
            source = {}
        fits: dict[str, ModuleFit] = {}
        errors = []
        fitters = {args.vision_module: lambda pts, ys: fit_vision(pts, ys, args.vision_module), LANGUAGE: fit_language}
        for name, c in collections.items():
            try:
                fits[name] = fitters[name]([m.point for m in c.measured], [m.median for m in c.measured])
            except MeasureError as exc:
                errors.append(str(exc))
        scale = language_shape.depth / language_shape.layers
        _render(console, fits, collections, scale, language_shape)
        if errors:
            raise MeasureError("; ".join(errors) + (f" (the measurements are in {args.points})" if args.points else ""))
        stopped = [c.stopped for c in collections.values() if c.stopped]
        meta = {"device": info, "size": args.size, "dtype": info.get("dtype", args.dtype), "elapsed_s": elapsed,
                "budget_s": None if args.from_points else args.budget_s, "warmup": args.warmup,
                "repeats": args.repeats, "budget_stopped": stopped,
                "language_layers": {"measured": language_shape.layers, "scaled_to": language_shape.depth},
                **source}
        model = model_from_fits(fits[args.vision_module], fits[LANGUAGE], language_scale=scale, meta=meta)
        model.to_file(args.out)
    except MeasureError as exc:
        print(f"{PROG}: error: {' '.join(str(exc).split())}", file=sys.stderr)
        with contextlib.suppress(OSError):
            os.unlink(log_path)
        return 2
    except Exception as exc:  # a failure in megatron/torch: one line; the traceback goes to the log
        from mimo_accel.tools.cli import TRACEBACK_ENV

        if os.environ.get(TRACEBACK_ENV) == "1":
            raise
        import traceback

        with open(log_path, "a", encoding="utf-8") as log:
            traceback.print_exc(file=log)
        print(f"{PROG}: error: {type(exc).__name__}: {' '.join(str(exc).split())[:400]} (traceback and import "
              f"output: {log_path})", file=sys.stderr)
        return 2
    with contextlib.suppress(OSError):
        os.unlink(log_path)  # named only when something failed
    v, lm = model.of(args.vision_module), model.of(LANGUAGE)
    budget = "; ".join(stopped) if stopped else "every planned point measured"
    took = f" in {elapsed:.0f} s" if isinstance(elapsed, (int, float)) else ""
    console.print(f"wrote {args.out}: {args.vision_module} a={v.a:.4g} b={v.b:.4g} k={v.k:.4g}; language "
                  f"a={lm.a:.4g} b={lm.b:.4g} (measured{took}; {budget}). Use: MIMO_ACCEL_COST_MODEL={args.out}, or "
                  f"mimo-accel simulate --cost-model {args.out}", highlight=False)
    if args.points and not args.from_points:
        console.print(f"raw measurements: {args.points} (refit: {PROG} --from-points {args.points} --out FILE)")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
