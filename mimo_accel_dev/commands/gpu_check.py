"""Check on one GPU what no CPU machine can: packing under Transformer Engine, the profiler's CUDA
timings, each module's cost curve, online calibration converging, the NVTX ranges.

``mimo-accel gpu-check --out DIR [--device cuda|cpu] [--size real|tiny] [--budget-s S] [--only a,b,...]``

One command, one device, sized to end within 10 minutes on one H200 (``--size real``; it has
not been run on one yet). It writes
``DIR/gpu-check.json`` (every check's status, result line and figures), prints a table, and
leaves beside them ``DIR/cost-model.json`` / ``DIR/cost-points.json`` (check c) and
``DIR/gpu-check.log`` (the imports' output and any traceback). Exit 0 when no check failed, 1
when one did, 2 (one ``error:`` line) when it cannot start: without CUDA, ``--device cuda`` (the
default) stops there.

The checks (``--only`` picks some):

- **(a) packing parity under Transformer Engine.** A megatron-core ``GPTModel`` with the
  Transformer Engine layer spec (bf16, RoPE, GQA) computes the loss and gradients of a right-padded
  ``[B, S]`` language shard (TE causal attention), then of the same shard THD-packed by
  :func:`mimo_accel.packing.pack_language_shard` with ``PackedSeqParams`` (TE's
  ``padding_causal`` THD attention over ``cu_seqlens``), for ``pad_multiple`` 1 (tight) and 8
  (padded THD, ``pad_between_seqs``). Passes when, for both, the per-token loss of the real
  tokens, the masked mean loss and the whole gradient agree with the padded batch's within rel
  1e-2 (relative L2 norms), ``cu_seqlens`` are int32 on the GPU, and a pack whose one segment
  lets samples see each other differs by more than that (the comparison can fail).
- **(b) the profiler's CUDA-event module times against wall time.** The profiler's module timer
  (:mod:`mimo_accel.profiler.timers`, CUDA-event clock) on a block of Qwen3-8B decoder layers,
  forward + backward of 8192 packed tokens, against ``torch.cuda.synchronize``-bracketed
  wall time of the same iterations: passes when the median ratio is within 5 %.
- **(c) calibrate-gpu's fit.** ``mimo-accel calibrate-gpu`` (:mod:`mimo_accel_dev.commands.calibrate_gpu`)
  within ``--budget-s`` (default 300 s): passes when it writes the model and every module's fit
  has R² >= 0.95.
- **(d) online calibration from the defaults.** One rank runs real per-sample work — Bridge's
  Qwen3-VL vision model and the Qwen3-8B layers of (c) — for a simulated layout (vision DP 4,
  language DP 2): each step the plan (:func:`mimo_accel.balance.balance_modules`) is made with
  the model in use, every simulated replica's samples run forward + backward (timed with CUDA
  events), and :class:`mimo_accel.costs.online.OnlineCalibration` gets the replica times. Passes
  when over the last half of the steps each module's median replica spread is <= 1.05, its
  median predicted-vs-measured spread error <= 0.02, and at least one refit was accepted.
- **(e) the NVTX ranges.** The plan, the sharded read, the packer and the profiler's module
  regions run once with a recorder in front of ``torch.cuda.nvtx``: passes when NVTX is on and
  every range is emitted, by name, and closed.

``--device cpu --size tiny`` runs the same logic on a CPU in under a minute (the test suite does), each
check with its stand-in said in its row: (a) megatron-core's local attention run per segment
(the rehearsal stack's), fp32, gate 1e-4; (b) the timer's wall clock against wall time (no
CUDA events); (c) and (d) tiny modules, timed with thread CPU time in (d), and their gates are
judged on CUDA only (status ``ran``: a shared CPU's timings say nothing about a GPU's); (e) a
stand-in for ``torch.cuda.nvtx`` records the names a CUDA process would emit (this CPU process
emits none).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import os
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np

from mimo_accel.costs.files import atomic_write
from mimo_accel.modules import LANGUAGE
from mimo_accel.profiler import json_safe  # NaN / inf as null: the file stays strict JSON
from mimo_accel.tools.arguments import TRACEBACK_ENV, UsageError, fail, one_line, output_dir, parse

__all__ = ["CHECKS", "Check", "main"]

PROG = "mimo-accel gpu-check"
FORMAT = "mimo-accel-gpu-check/1"
PASS, FAIL, RAN = "pass", "fail", "ran"  # ran: a CPU stand-in, its gate judged on CUDA only
VISION = "vision"


@dataclass
class Check:
    """One check's outcome: ``status`` pass / fail / ran, a one-line ``result`` (the figures and
    the gate, or why it failed), ``stand_in`` (what ran instead of the CUDA path; None on CUDA)."""

    key: str
    title: str
    status: str
    result: str
    stand_in: Optional[str] = None
    figures: dict = field(default_factory=dict)
    elapsed_s: float = 0.0

    def to_doc(self) -> dict[str, Any]:
        return {"check": self.key, "title": self.title, "status": self.status, "result": self.result,
                "stand_in": self.stand_in, "figures": self.figures, "elapsed_s": self.elapsed_s}


@dataclass
class _Setup:
    """What every check runs with."""

    device: str
    size: str
    dtype: str
    out: Path
    log: Path
    budget_s: float
    pg: Any = None

    @property
    def cuda(self) -> bool:
        return self.device == "cuda"


def _torch_dtype(name: str):
    import torch

    return {"bf16": torch.bfloat16, "fp32": torch.float32}[name]


def _sync(setup: _Setup) -> None:
    if setup.cuda:
        import torch

        torch.cuda.synchronize()


def _rel(a, b) -> float:
    """||a − b|| / ||b|| in float64 (0 when both are 0)."""
    import torch

    a, b = a.detach().double().reshape(-1), b.detach().double().reshape(-1)
    denominator = float(torch.linalg.vector_norm(b))
    difference = float(torch.linalg.vector_norm(a - b))
    return difference / denominator if denominator > 0 else (0.0 if difference == 0 else math.inf)


# --------------------------------------------------------------------- (a) packing parity


# (layers, hidden, heads, query groups, ffn, vocab, seq_len, the shard's real lengths)
_GPT = {
    "real": (4, 2048, 16, 4, 5632, 32000, 4096, (4096, 1000, 2900, 17, 3333, 640, 128, 2048)),
    "tiny": (2, 32, 4, 2, 64, 100, 16, (5, 15, 1, 9)),
}
_PACKING_GATE = {"bf16": 1e-2, "fp32": 1e-4}
# weights large enough that attending across samples moves the loss and gradient well past the
# gate (at megatron's default 0.02 a leaky pack moves the loss per token by ~2e-2 only)
_INIT_STD = {"real": 0.1, "tiny": 0.3}


def _transformer_engine() -> Optional[str]:
    """TE's version where the real package is importable, else None (a CPU stand-in is not it)."""
    from importlib import metadata

    from mimo_accel_dev.rehearse.cpu import STAND_IN_MARKER

    try:
        import transformer_engine
    except ImportError:
        return None
    if getattr(transformer_engine, STAND_IN_MARKER, False):
        return None
    for name in ("transformer-engine", "transformer_engine", "transformer-engine-cu12"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            return metadata.version(name)
    return getattr(transformer_engine, "__version__", "unknown")


def _shard(setup: _Setup):
    """A right-padded language shard (``[B, S]`` as Bridge's collate gives it) on the device."""
    import torch

    *_, vocab, seq_len, lengths = _GPT[setup.size]
    g = torch.Generator().manual_seed(0)
    n = len(lengths)
    real = torch.arange(seq_len)[None, :] < torch.tensor(lengths)[:, None]
    ids = torch.randint(1, vocab, (n, seq_len), generator=g) * real
    labels = torch.where(real, torch.roll(ids, -1, 1), torch.full_like(ids, -100))
    loss_mask = real.float()
    loss_mask[torch.arange(n), torch.tensor(lengths) - 1] = 0.0  # the last real token predicts nothing
    batch = {"input_ids": ids, "labels": labels, "loss_mask": loss_mask, "attention_mask": real.long(),
             "position_ids": torch.arange(seq_len)[None, :].repeat(n, 1) * real}
    return {k: v.to(setup.device) for k, v in batch.items()}, real.to(setup.device)


def _gpt(setup: _Setup, te: bool):
    import torch
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import (get_gpt_layer_local_spec,
                                                          get_gpt_layer_with_transformer_engine_spec)
    from megatron.core.transformer.transformer_config import TransformerConfig

    layers, hidden, heads, groups, ffn, vocab, seq_len, _ = _GPT[setup.size]
    dtype = _torch_dtype(setup.dtype)
    config = TransformerConfig(
        num_layers=layers, hidden_size=hidden, num_attention_heads=heads, num_query_groups=groups,
        ffn_hidden_size=ffn, hidden_dropout=0.0, attention_dropout=0.0, init_method_std=_INIT_STD[setup.size],
        bf16=setup.dtype == "bf16", params_dtype=dtype, pipeline_dtype=dtype,
        use_cpu_initialization=not setup.cuda, bias_activation_fusion=False, bias_dropout_fusion=False,
        apply_rope_fusion=False, masked_softmax_fusion=False, gradient_accumulation_fusion=False,
        persist_layer_norm=False)
    if te:
        spec = get_gpt_layer_with_transformer_engine_spec()
    else:
        from mimo_accel_dev.rehearse.stack import packed_local_attention

        spec = get_gpt_layer_local_spec()
        spec.submodules.self_attention.submodules.core_attention = packed_local_attention()
    torch.manual_seed(0)
    model = GPTModel(config=config, transformer_layer_spec=spec, vocab_size=vocab, max_sequence_length=seq_len,
                     position_embedding_type="rope", rotary_base=10000, pg_collection=setup.pg)
    return model.to(device=setup.device, dtype=dtype).train()


def _loss_and_grads(model, batch, mask, params=None):
    """Per-token loss, the masked mean loss and every parameter's gradient of one forward + backward."""
    import torch

    model.zero_grad(set_to_none=True)
    loss = model(batch["input_ids"], batch["position_ids"], mask, labels=batch["labels"], packed_seq_params=params)
    weights = batch["loss_mask"].to(loss.dtype)
    objective = (loss * weights).sum() / weights.sum()
    objective.backward()
    grads = torch.cat([p.grad.detach().float().reshape(-1) for p in model.parameters() if p.grad is not None])
    return loss.detach().float(), objective.detach().float(), grads


def check_packing(setup: _Setup) -> Check:
    """(a): the padded shard against its THD pack, pad_multiple 1 and 8; the leaky pack must differ."""
    import torch
    from megatron.core.packed_seq_params import PackedSeqParams

    from mimo_accel.packing import pack_language_shard
    from mimo_accel.runtime.local_batch import thd_kwargs

    title = "packing parity under Transformer Engine"
    te_version = _transformer_engine() if setup.cuda else None
    if setup.cuda and te_version is None:
        return Check("a", title, FAIL, "Transformer Engine is not installed here: the check needs megatron-core's TE "
                     "attention (pip install transformer-engine[pytorch] in the training environment)")
    stand_in = None if setup.cuda else ("megatron-core's local attention run once per cu_seqlens segment (the "
                                        "rehearsal stack's packed_local_attention), fp32")
    gate = _PACKING_GATE[setup.dtype]
    model = _gpt(setup, te=setup.cuda)
    batch, real = _shard(setup)
    seq_len = batch["input_ids"].size(1)
    # TE: causal attention over the padded rows, no mask; the local attention takes the causal mask
    causal = None if setup.cuda else torch.triu(torch.ones(seq_len, seq_len, dtype=torch.bool, device=setup.device),
                                                1)[None, None]
    ref_loss, ref_objective, ref_grads = _loss_and_grads(model, batch, causal)
    lengths = [int(n) for n in real.sum(dim=1).tolist()]  # every sample has a real token: one segment each
    figures: dict[str, Any] = {"transformer_engine": te_version, "dtype": setup.dtype, "gate": gate,
                               "lengths": lengths, "seq_len": seq_len}
    worst = 0.0
    problems = []
    for k in (1, 8):
        packed, kw = pack_language_shard(batch, pad_multiple=k)
        cu = kw["cu_seqlens_q"]
        layout = {"dtype": str(cu.dtype).replace("torch.", ""), "device": cu.device.type,
                  "pad_between_seqs": kw["pad_between_seqs"], "tokens": int(packed["input_ids"].size(1))}
        if cu.dtype != torch.int32 or cu.device.type != torch.device(setup.device).type:
            problems.append(f"pad_multiple {k}: cu_seqlens are {layout['dtype']} on {layout['device']}, TE takes int32 "
                            "on the GPU")
        starts = kw["cu_seqlens_q_padded"].tolist()[:-1]
        if len(starts) != len(lengths):
            problems.append(f"pad_multiple {k}: the pack has {len(starts)} segments for {len(lengths)} samples")
            continue
        loss, objective, grads = _loss_and_grads(model, packed, None, PackedSeqParams(qkv_format="thd", **thd_kwargs(kw)))
        tokens = torch.cat([loss[0, s:s + n] for s, n in zip(starts, lengths)])
        errors = {"per_token_loss": _rel(tokens, ref_loss[real]), "mean_loss": _rel(objective, ref_objective),
                  "gradient": _rel(grads, ref_grads)}
        figures[f"pad_multiple_{k}"] = {**layout, **errors}
        worst = max(worst, *errors.values())
        for name, value in errors.items():
            if not value <= gate:
                problems.append(f"pad_multiple {k}: {name.replace('_', ' ')} differs by {value:.2e} > {gate:g}")
    # sensitivity: one segment over the whole pack lets samples attend to each other
    packed, kw = pack_language_shard(batch)
    t = packed["input_ids"].size(1)
    whole = torch.tensor([0, t], dtype=torch.int32, device=setup.device)
    leaky = dict(kw, cu_seqlens_q=whole, cu_seqlens_kv=whole, cu_seqlens_q_padded=whole, cu_seqlens_kv_padded=whole,
                 max_seqlen_q=t, max_seqlen_kv=t, pad_between_seqs=False)
    loss, _, grads = _loss_and_grads(model, packed, None, PackedSeqParams(qkv_format="thd", **thd_kwargs(leaky)))
    first = lengths[0]
    leak = max(_rel(loss[0, first:int(real.sum())], ref_loss[real][first:]), _rel(grads, ref_grads))
    figures["leaky_pack"] = leak
    if not leak > gate:
        problems.append(f"a pack that lets samples attend to each other differs by only {leak:.2e} (<= the gate "
                        f"{gate:g}): the comparison cannot tell")
    del model
    summary = (f"worst rel error {worst:.2e} (gate {gate:g}) over loss per token, mean loss and gradient, "
               f"pad_multiple 1 and 8; cu_seqlens int32 on {setup.device}; leaky pack {leak:.2e}")
    return Check("a", title, FAIL if problems else PASS, "; ".join(problems) or summary, stand_in, figures)


# ------------------------------------------------------------------- (b) module timer vs wall


_TIMER_REPEATS = 10
_TIMER_GATE = 0.05


def check_timers(setup: _Setup) -> Check:
    """(b): the module timer's forward + backward against synchronize-bracketed wall time."""
    from mimo_accel.profiler import Recorder, attach_module_timer
    from mimo_accel_dev.commands import calibrate_gpu as cg
    from mimo_accel_dev.commands.calibrate_gpu import models as cg_models

    title = "profiler CUDA-event module times vs wall time"
    stand_in = None if setup.cuda else "the recorder's wall clock (no CUDA events on a CPU) against wall time"
    _, shape = cg.SIZES[setup.size]
    point = cg.LanguagePoint((4096, 4096) if setup.size == "real" else (512, 512))
    recorder = Recorder(setup.out / "profile-timers", rank=0, world_size=1, module=LANGUAGE, device=setup.device,
                        clock="cuda_event" if setup.cuda else "wall")
    pairs: list[tuple[float, float]] = []

    def timed(fn: Callable[[], None]) -> float:
        _sync(setup)
        t0 = time.perf_counter()
        fn()
        _sync(setup)
        wall = time.perf_counter() - t0
        line = recorder.end_step()
        pairs.append(((line[f"{LANGUAGE}_fwd_s"] or 0.0) + (line[f"{LANGUAGE}_bwd_s"] or 0.0), wall))
        return wall

    try:
        block, measure, attention = cg_models.language_measure(shape, setup.pg, setup.device, setup.dtype, timed, 2,
                                                         _TIMER_REPEATS)
        timer = attach_module_timer(block, recorder, name=LANGUAGE)
        measure(point)
        timer.remove()
    finally:
        recorder.close()
    timed_pairs = pairs[2:]  # the warm-up iterations are left out
    ratios = [r / w for r, w in timed_pairs if w > 0]
    median = float(np.median(ratios))
    figures = {"point": point.label, "attention": attention, "repeats": len(ratios), "median_ratio": median,
               "ratios": ratios, "module_s": [r for r, _ in timed_pairs], "wall_s": [w for _, w in timed_pairs],
               "gate": _TIMER_GATE}
    ok = abs(median - 1.0) <= _TIMER_GATE
    result = (f"module forward + backward / wall = {median:.3f} (median of {len(ratios)}, range "
              f"{min(ratios):.3f}-{max(ratios):.3f}; gate ±{_TIMER_GATE:.0%}) at {point.label} tokens, "
              f"{np.median([w for _, w in timed_pairs]) * 1e3:.1f} ms wall")
    return Check("b", title, PASS if ok else FAIL, result, stand_in, figures)


# ------------------------------------------------------------------------ (c) calibrate-gpu


def check_calibration(setup: _Setup) -> Check:
    """(c): calibrate-gpu within the budget; every module's R² >= 0.95 (judged on CUDA)."""
    from rich.console import Console

    from mimo_accel.costs import CostModel
    from mimo_accel_dev.commands import calibrate_gpu as cg

    title = "calibrate-gpu's fit of each module"
    stand_in = None if setup.cuda else "tiny modules on the CPU, 1 warm-up + 2 timed iterations per point"
    argv = ["--out", str(setup.out / "cost-model.json"), "--points", str(setup.out / "cost-points.json"),
            "--device", setup.device, "--size", setup.size, "--dtype", setup.dtype, "--budget-s", f"{setup.budget_s:g}"]
    if not setup.cuda:
        argv += ["--warmup", "1", "--repeats", "2"]
    text, errors = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(errors):
        code = cg.main(argv, console=Console(file=text, width=140, color_system=None))
    with open(setup.log, "a", encoding="utf-8") as log:
        log.write(f"--- {cg.PROG} {' '.join(argv)}\n{text.getvalue()}{errors.getvalue()}\n")
    if code != 0:
        said = [ln for ln in errors.getvalue().splitlines() if ln.strip()]
        return Check("c", title, FAIL, said[-1] if said else f"{cg.PROG} exited {code}", stand_in)
    model = CostModel.from_file(setup.out / "cost-model.json")
    fits = model.fit.get("modules", {})
    figures = {name: {**model.of(name).to_dict(), **{key: fit.get(key) for key in ("r2", "rel_rmse", "n")}}
               for name, fit in fits.items()}
    figures["elapsed_s"] = model.fit.get("elapsed_s")
    figures["budget_stopped"] = model.fit.get("budget_stopped")
    low = [f"{name} R² {f['r2']:.3f}" for name, f in figures.items() if isinstance(f, dict) and f["r2"] < 0.95]
    parts = [f"{name}: a={f['a']:.3g} b={f['b']:.3g}" + (f" k={f['k']:.3g}" if name != LANGUAGE else "")
             + f" (R² {f['r2']:.3f}, {f['n']} points)" for name, f in figures.items() if isinstance(f, dict)]
    result = "; ".join(parts) + f"; wrote {setup.out / 'cost-model.json'}"
    if not setup.cuda:
        return Check("c", title, RAN, result, stand_in, figures)
    if low:
        return Check("c", title, FAIL, f"{', '.join(low)} < 0.95 (is the GPU busy?); " + result, stand_in, figures)
    return Check("c", title, PASS, result, stand_in, figures)


# ------------------------------------------------------------------ (d) online calibration


_ONLINE = {  # samples per step, steps, vision DP, language DP
    "real": (32, 30, 4, 2),
    "tiny": (16, 12, 4, 2),  # the logic only: refits at steps 8, 10, 12
}
# per size, the image kinds (h, w in patches; even, for the 2x2 merge) and the text length range
_IMAGES = {
    "real": {"small": ((8, 8), (8, 12), (12, 12), (16, 16)), "large": ((32, 32), (48, 48), (64, 64)),
             "medium": ((16, 24), (24, 24), (32, 24)), "text": (64, 800)},
    "tiny": {"small": ((2, 2), (2, 4), (4, 4)), "large": ((16, 16), (24, 24)), "medium": ((8, 8), (8, 12)),
             "text": (8, 96)},
}
_SPREAD_GATE, _ERROR_GATE = 1.05, 0.02


@dataclass(frozen=True)
class _Sample:
    images: tuple[tuple[int, int], ...]
    tokens: int  # text + one placeholder per merged row


def _online_samples(rng, size: str, n: int) -> list[_Sample]:
    """Many small images, one large, or none / a medium one: the mix whose per-image cost the
    default model (no per-image term) misprices."""
    kinds = _IMAGES[size]
    out = []
    for _ in range(n):
        u = rng.random()
        if u < 0.4:
            images = [kinds["small"][rng.integers(len(kinds["small"]))] for _ in range(rng.integers(4, 13))]
        elif u < 0.7:
            images = [kinds["large"][rng.integers(len(kinds["large"]))]]
        else:
            images = [kinds["medium"][rng.integers(len(kinds["medium"]))] for _ in range(rng.integers(0, 2))]
        rows = sum(h * w for h, w in images)
        out.append(_Sample(tuple(images), int(rng.integers(*kinds["text"])) + rows // 4))
    return out


def _thread_timer(fn: Callable[[], None]) -> float:
    """CPU time of this thread (torch runs one intra-op thread here): other work on a shared
    machine is not counted."""
    t0 = time.thread_time()
    fn()
    return time.thread_time() - t0


def check_online(setup: _Setup) -> Check:
    """(d): plan with the model in use, time every simulated replica's real work, refit, repeat."""
    import torch

    from mimo_accel.balance import balance_modules
    from mimo_accel.costs import CostModel
    from mimo_accel.costs.online import OnlineCalibration
    from mimo_accel.costs.share_error import spread_error
    from mimo_accel_dev.commands import calibrate_gpu as cg
    from mimo_accel_dev.commands.calibrate_gpu import devices as cg_devices, models as cg_models

    title = "online calibration from the defaults"
    stand_in = None if setup.cuda else ("tiny modules on the CPU timed with thread CPU time; the gates are judged on "
                                        "CUDA only")
    n, steps, vision_dp, language_dp = _ONLINE[setup.size]
    dps = {VISION: vision_dp, LANGUAGE: language_dp}
    vision_shape, language_shape = cg.SIZES[setup.size]
    timer = cg_devices.CudaTimer(torch) if setup.cuda else _thread_timer
    vision_model, vision_measure, vision_attention = cg_models.vision_measure(
        vision_shape, language_shape, setup.pg, setup.device, setup.dtype, timer, 0, 1)
    language_model, language_measure, language_attention = cg_models.language_measure(
        language_shape, setup.pg, setup.device, setup.dtype, timer, 0, 1)
    def vision_seconds(group: list[_Sample]) -> float:
        images = tuple(i for s in group for i in s.images)
        return sum(vision_measure(cg.VisionPoint(images))) if images else 0.0  # no image: the encoder idles

    def language_seconds(group: list[_Sample]) -> float:
        return sum(language_measure(cg.LanguagePoint(tuple(s.tokens for s in group))))

    measure = {VISION: vision_seconds, LANGUAGE: language_seconds}
    warmup = 2
    cal = OnlineCalibration(CostModel(), [VISION, LANGUAGE], warmup=warmup)
    rng = np.random.default_rng(0)
    spreads: dict[str, list[float]] = {VISION: [], LANGUAGE: []}
    errors: dict[str, list[float]] = {VISION: [], LANGUAGE: []}
    t0 = time.perf_counter()
    for step in range(steps):
        samples = _online_samples(rng, setup.size, n)
        per_image = [[h * w for h, w in s.images] for s in samples]
        rows = np.array([sum(p) for p in per_image], dtype=np.float64)
        sq = np.array([sum(r * r for r in p) for p in per_image], dtype=np.float64)
        items = np.array([len(p) for p in per_image], dtype=np.float64)
        tokens = np.array([s.tokens for s in samples], dtype=np.float64)
        model = cal.model
        order = np.asarray(balance_modules({VISION: model.encoder_costs(VISION, rows, sq, items),
                                            LANGUAGE: model.language_costs(tokens)}, dps))
        for module, d in dps.items():
            groups = order.reshape(d, -1)
            if module == VISION:
                features = np.array([[rows[g].sum(), sq[g].sum(), items[g].sum()] for g in groups])
            else:
                features = np.array([[tokens[g].sum(), (tokens[g] ** 2).sum(), len(g)] for g in groups])
            seconds = np.array([measure[module]([samples[i] for i in g]) for g in groups])
            if step >= warmup:
                spreads[module].append(float(seconds.max() / seconds.mean()))
                errors[module].append(spread_error(cal.predict(module, features), seconds))
            cal.observe(step, module, features, seconds)
        cal.refit(step + 1)
    elapsed = time.perf_counter() - t0
    for m in (vision_model, language_model):
        cg_models.release(setup.device, m)

    def last_half(values: list[float]) -> float:
        return float(np.median(values[len(values) // 2:]))

    figures: dict[str, Any] = {
        "layout": dps, "samples_per_step": n, "steps": steps, "warmup": warmup, "elapsed_s": elapsed,
        "attention": {VISION: vision_attention, LANGUAGE: language_attention},
        "refits": [r.to_dict() for r in cal.refits], "attempts": len(cal.attempts),
        "model": {m: cal.model.of(m).to_dict() for m in dps},
        "per_module": {m: {"spread_first_4": float(np.median(spreads[m][:4])),
                           "spread_p50_last_half": last_half(spreads[m]),
                           "predicted_error_p50_last_half": last_half(errors[m]), "spread": spreads[m],
                           "predicted_error": errors[m]} for m in dps},
    }
    per = figures["per_module"]
    result = "; ".join(f"{m} spread {per[m]['spread_first_4']:.3f} first -> {per[m]['spread_p50_last_half']:.3f} "
                       f"(p50 last half), predicted error {per[m]['predicted_error_p50_last_half']:.4f}" for m in dps)
    result += f"; {len(cal.refits)} refits of {len(cal.attempts)} attempts in {steps} steps ({elapsed:.0f} s)"
    if not setup.cuda:
        return Check("d", title, RAN, result, stand_in, figures)
    problems = [f"{m} spread {per[m]['spread_p50_last_half']:.3f} > {_SPREAD_GATE}" for m in dps
                if not per[m]["spread_p50_last_half"] <= _SPREAD_GATE]
    problems += [f"{m} predicted error {per[m]['predicted_error_p50_last_half']:.4f} > {_ERROR_GATE}" for m in dps
                 if not per[m]["predicted_error_p50_last_half"] <= _ERROR_GATE]
    if not cal.refits:
        problems.append("no refit was accepted")
    return Check("d", title, FAIL if problems else PASS, ("; ".join(problems) + "; " if problems else "") + result,
                 stand_in, figures)


# ----------------------------------------------------------------------------- (e) NVTX ranges


EXPECTED_RANGES = ("mimo_accel/plan", "mimo_accel/read", "mimo_accel/pack", f"mimo_accel/{VISION}_fwd",
                   f"mimo_accel/{VISION}_bwd")


class _RangeRecorder:
    """``torch.cuda.nvtx``'s range functions, recording each range's name (and passing it on to
    the real ones, where there are)."""

    def __init__(self, real: Any = None) -> None:
        self._real = real
        self.pushed: list[str] = []
        self.popped = 0
        self.started: dict[Any, str] = {}
        self.ended: list[Any] = []

    def range_push(self, name: str):
        self.pushed.append(name)
        return self._real.range_push(name) if self._real is not None else len(self.pushed) - 1

    def range_pop(self):
        self.popped += 1
        return self._real.range_pop() if self._real is not None else None

    def range_start(self, name: str):
        handle = self._real.range_start(name) if self._real is not None else len(self.started) + 1
        self.started[handle] = name
        return handle

    def range_end(self, handle) -> None:
        self.ended.append(handle)
        if self._real is not None:
            self._real.range_end(handle)


@contextlib.contextmanager
def _recording_nvtx(real: Any):
    """Every mimo_accel NVTX range goes through a :class:`_RangeRecorder` (mimo_accel.nvtx decides
    once per process where ranges go; this swaps that decision for the block and restores it)."""
    from mimo_accel import nvtx

    recorder = _RangeRecorder(real)
    with nvtx.ranges_to(recorder):
        yield recorder


def _exercise_ranges(setup: _Setup) -> None:
    """The plan, the sharded read, the packer and one timed module forward + backward."""
    import torch
    from torch.utils.data import BatchSampler, DataLoader, SequentialSampler

    from mimo_accel.costs import CostIndex, CostModel
    from mimo_accel.costs.resize import ResizeRule
    from mimo_accel.grid import canonical_grid
    from mimo_accel.planner import CostIndexPlanner
    from mimo_accel.profiler import Recorder, attach_module_timer
    from mimo_accel.runtime.reading.sampler import shard_loader
    from mimo_accel.runtime.context import ShardContext, StepRole
    from mimo_accel.runtime.reading.shard import SHARD_TAG_KEY
    from mimo_accel.runtime.local_batch import pack_for_language_model

    n, batch_size = 16, 4
    rng = np.random.default_rng(0)
    patches = rng.integers(1, 50, n)
    index = CostIndex(rng.integers(1, 9, n), {"vision": (np.ones(n, int), patches, patches * patches, ResizeRule())})
    sizes = {VISION: 2, LANGUAGE: 1}
    ctx = ShardContext(VISION, 0, 2, canonical_grid(list(sizes.values())), sizes)

    class Samples(torch.utils.data.Dataset):
        def __len__(self):
            return n

        def __getitem__(self, i):
            return {"input_ids": torch.arange(8) + i, "attention_mask": (torch.arange(8) < 2 + i % 5).long()}

    upstream = DataLoader(Samples(), batch_sampler=BatchSampler(SequentialSampler(range(n)), batch_size, False),
                          collate_fn=lambda s: {k: torch.stack([x[k] for x in s]) for k in s[0]})
    loader = shard_loader(upstream, ctx, batch_size, planner=CostIndexPlanner(index, CostModel(), ctx.modules))
    batch = next(iter(loader))
    batch.pop(SHARD_TAG_KEY)
    pack_for_language_model(batch, StepRole(True, True, True, 1), 1, lambda key, message: None)
    # on a CPU the recorder is told it is on CUDA (so that it opens NVTX ranges) but keeps a wall clock
    recorder = Recorder(setup.out / "profile-nvtx", rank=0, world_size=1, module=VISION, device="cuda",
                        clock="cuda_event" if setup.cuda else "wall")
    encoder = torch.nn.Linear(8, 8).to(setup.device)
    timer = attach_module_timer(encoder, recorder, name=VISION)
    encoder(torch.randn(3, 8, device=setup.device)).sum().backward()
    recorder.end_step()
    timer.remove()
    recorder.close()


def check_nvtx(setup: _Setup) -> Check:
    """(e): every mimo_accel NVTX range emitted, by name, and closed."""
    import torch

    from mimo_accel import nvtx

    title = "NVTX ranges"
    stand_in = None if setup.cuda else ("a stand-in for torch.cuda.nvtx records the names a CUDA process emits "
                                        "(this CPU process emits none)")
    on = nvtx.enabled() if setup.cuda else None
    with _recording_nvtx(torch.cuda.nvtx if setup.cuda else None) as ranges:
        _exercise_ranges(setup)
    names = list(dict.fromkeys([*ranges.pushed, *ranges.started.values()]))
    missing = [name for name in EXPECTED_RANGES if name not in names]
    unclosed = (len(ranges.pushed) - ranges.popped) + len(set(ranges.started) - set(ranges.ended))
    figures = {"ranges": names, "expected": list(EXPECTED_RANGES), "unclosed": unclosed, "nvtx_enabled": on}
    problems = []
    if setup.cuda and not on:
        problems.append("mimo_accel.nvtx is off although CUDA is available")
    if not setup.cuda and nvtx.enabled():
        problems.append("mimo_accel.nvtx is on in a process without CUDA")
    if missing:
        problems.append(f"not emitted: {', '.join(missing)}")
    if unclosed:
        problems.append(f"{unclosed} ranges left open")
    result = f"emitted {', '.join(names)}" + ("" if unclosed else "; every range closed")
    return Check("e", title, FAIL if problems else PASS, "; ".join([*problems, result]), stand_in, figures)


# ----------------------------------------------------------------------------------- the run


#: (key, what it checks, the function); ``--only`` picks by key.
CHECKS: tuple[tuple[str, str, Callable[[_Setup], Check]], ...] = (
    ("a", "packing parity under Transformer Engine", check_packing),
    ("b", "profiler CUDA-event module times vs wall time", check_timers),
    ("c", "calibrate-gpu's fit of each module", check_calibration),
    ("d", "online calibration from the defaults", check_online),
    ("e", "NVTX ranges", check_nvtx),
)


def _run_check(key: str, title: str, fn: Callable[[_Setup], Check], setup: _Setup) -> Check:
    """One check; an exception is the check's failure, named in one line (its traceback in the log)."""
    from mimo_accel.tools import quiet

    t0 = time.perf_counter()
    try:
        with quiet.output_to(setup.log):  # megatron's warnings while building models
            check = fn(setup)
    except Exception as exc:
        if os.environ.get(TRACEBACK_ENV) == "1":
            raise
        with open(setup.log, "a", encoding="utf-8") as log:
            log.write(f"--- check {key} ({title}) failed\n")
            traceback.print_exc(file=log)
        check = Check(key, title, FAIL, f"{type(exc).__name__}: {one_line(exc)[:300]} (traceback in {setup.log})")
    check.elapsed_s = time.perf_counter() - t0
    return check


def _render(console, checks: list[Check], setup: _Setup, elapsed: float) -> None:
    from rich.table import Table

    table = Table(title=f"{PROG}: {setup.device}, size {setup.size}, {setup.dtype}, {elapsed:.0f} s",
                  title_justify="left", show_lines=True)
    table.add_column("check")
    table.add_column("status")
    table.add_column("result")
    if not setup.cuda:
        table.add_column("CPU stand-in")
    colour = {PASS: "green", FAIL: "red", RAN: "yellow"}
    for c in checks:
        row = [f"({c.key}) {c.title}", f"[{colour[c.status]}]{c.status}[/]", f"{c.result} [{c.elapsed_s:.1f} s]"]
        table.add_row(*row, *([c.stand_in or "—"] if not setup.cuda else []))
    console.print(table)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Check on one GPU what no CPU machine can: (a) packing parity under Transformer Engine, (b) the "
                    "profiler's CUDA-event module times against wall time, (c) calibrate-gpu's fit of each module, "
                    "(d) online calibration converging from the defaults, (e) the NVTX ranges. Writes "
                    "DIR/gpu-check.json and prints a table; sized for 10 minutes on one H200. --device cpu --size "
                    "tiny runs the logic on a CPU in under a minute.",
        epilog="e.g. mimo-accel gpu-check --out gpu-check/")
    p.add_argument("--out", metavar="DIR", required=True, help="where gpu-check.json, the cost model of (c) and the "
                   "log go (made if missing)")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="cuda (default), or cpu to check the "
                   "logic (with --size tiny)")
    p.add_argument("--size", choices=("real", "tiny"), help="real: Qwen3-VL's vision model and Qwen3-8B layers "
                   "(default on cuda); tiny: small shapes for a CPU (default on cpu)")
    p.add_argument("--budget-s", type=float, default=300.0, metavar="S",
                   help="calibrate-gpu's budget in (c) (default 300: the 10-minute target leaves the other checks "
                        "the rest)")
    p.add_argument("--only", metavar="KEYS", help="run only these checks, e.g. a,e (default: a,b,c,d,e)")
    return p


def _check_args(args) -> list[str]:
    keys = [k for k, _, _ in CHECKS]
    only = keys if args.only is None else [k.strip() for k in args.only.split(",") if k.strip()]
    unknown = [k for k in only if k not in keys]
    if unknown or not only:
        raise UsageError(f"--only {args.only}: the checks are {', '.join(keys)}; give some of them, e.g. --only a,e")
    if not (args.budget_s > 0 and math.isfinite(args.budget_s)):
        raise UsageError(f"--budget-s must be a positive number of seconds, got {args.budget_s:g}")
    if args.device == "cpu" and args.size == "real":
        raise UsageError("--size real on cpu would take hours (Qwen3-VL's vision model at its size); use --size tiny "
                         "on cpu, or run on a GPU")
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        why = "this torch has no CUDA" if torch.version.cuda is None else "no GPU is visible"
        raise UsageError(f"CUDA is not available here ({why}, torch {torch.__version__}); run it on a GPU machine, or "
                         "pass --device cpu --size tiny to check the logic")
    output_dir("--out", args.out)
    return [k for k in keys if k in only]


def main(argv: Optional[Sequence[str]] = None, *, console=None) -> int:
    """``mimo-accel gpu-check``: 0 when no check failed, 1 when one did, 2 when it cannot start."""
    from rich.console import Console

    from mimo_accel_dev.commands.calibrate_gpu import devices as cg_devices

    args = parse(_parser(), argv)
    if isinstance(args, int):
        return args
    try:
        keys = _check_args(args)
    except UsageError as exc:
        return fail(PROG, exc)
    size = args.size or ("real" if args.device == "cuda" else "tiny")
    setup = _Setup(device=args.device, size=size, dtype="bf16" if args.device == "cuda" else "fp32",
                   out=Path(args.out), log=Path(args.out) / "gpu-check.log", budget_s=args.budget_s)
    if console is None:
        console = Console() if sys.stdout.isatty() else Console(width=160)
    setup.out.mkdir(parents=True, exist_ok=True)
    setup.log.write_text("", encoding="utf-8")
    t0 = time.perf_counter()
    checks = []
    try:
        with cg_devices.session(setup.device, str(setup.log)) as pg:  # one rank of world size 1 (calibrate-gpu's)
            setup.pg = pg
            info = cg_devices.device_info(setup.device, setup.dtype)
            console.print(f"{PROG}: {info['name']} ({setup.device}, {setup.dtype}), size {setup.size}; checks "
                          f"{', '.join(keys)}", highlight=False)
            for key, title, fn in CHECKS:
                if key not in keys:
                    continue
                check = _run_check(key, title, fn, setup)
                console.print(f"  ({key}) {title}: {check.status} in {check.elapsed_s:.1f} s", highlight=False)
                checks.append(check)
    except Exception as exc:  # the session itself (imports, the process group): nothing could run
        if os.environ.get(TRACEBACK_ENV) == "1":
            raise
        with open(setup.log, "a", encoding="utf-8") as log:
            traceback.print_exc(file=log)
        return fail(PROG, f"{type(exc).__name__}: {one_line(exc)[:300]} (traceback and import output: {setup.log})")
    elapsed = time.perf_counter() - t0
    _render(console, checks, setup, elapsed)
    failed = [c.key for c in checks if c.status == FAIL]
    doc = {"format": FORMAT, "device": info, "size": setup.size, "dtype": setup.dtype, "elapsed_s": elapsed,
           "passed": not failed, "checks": [c.to_doc() for c in checks]}
    atomic_write(setup.out / "gpu-check.json", (json.dumps(json_safe(doc), indent=1, default=str, allow_nan=False)
                                                + "\n").encode())
    verdict = f"failed: {', '.join(failed)}" if failed else "no check failed"
    console.print(f"wrote {setup.out / 'gpu-check.json'} ({verdict}; log {setup.log})", highlight=False)
    return 1 if failed else 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
