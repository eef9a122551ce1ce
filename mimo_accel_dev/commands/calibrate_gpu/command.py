"""Measure each module's cost curve on one device and write a cost-model file.

``mimo-accel calibrate-gpu --out cost-model.json [--points points.json] [--budget-s 420]
[--device cuda|cpu] [--size real|tiny] [--dtype bf16|fp32] [--warmup N] [--repeats N]``

``mimo-accel calibrate-gpu --from-points points.json --out cost-model.json`` fits saved
measurements again (no device needed).

``mimo-accel calibrate`` fits the cost model from a profiled training run; this command needs no
run and no data. It builds the modules themselves on one device, times forward + backward over a
designed set of inputs, fits each module's curve and writes a ``mimo-accel-cost-model/3`` file
(:class:`~mimo_accel.costs.CostModel`) with the module names ``calibrate`` writes: ``vision``
(``--vision-module`` renames it to the name the layout's config gives the image encoder) and
``language``. Use it as ``MIMO_ACCEL_COST_MODEL=cost-model.json`` (``cost_model=`` in ``enable()``)
or ``mimo-accel rehearse --cost-model``.

What it measures (``--size real``):

- **vision**: Bridge's own ``Qwen3VLVisionModel``
  (megatron/bridge/models/qwen_vl/modelling_qwen3_vl/vision_model.py) at Qwen3-VL's real size,
  its config made by Bridge's ``get_vision_model_config``
  (megatron/bridge/models/qwen_vl/modelling_qwen3_vl/transformer_config.py) from transformers'
  ``Qwen3VLVisionConfig`` defaults (transformers/models/qwen3_vl/configuration_qwen3_vl.py): depth
  27, hidden 1152, 16 heads, MLP 4304, patch 16, temporal patch 2, spatial merge 2, 3 input
  channels, 2304 position embeddings, merger output 4096 (Qwen3-VL-8B's language width).
  ``deepstack_visual_indexes`` is empty, as MIMO's vision encoder has it
  (:mod:`mimo_accel_dev.rehearse.qwen3vl`: MIMO keeps the model's first output only).
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
is printed and stored (``fit.device.attention``). On CPU :func:`mimo_accel_dev.rehearse.cpu.activate`
redirects megatron's CUDA hard-codes and torch runs one thread (a second thread on a shared CPU
makes timings swing several-fold); on CUDA the CPU layer is never activated.

Fit. Per module a non-negative least-squares fit (:func:`mimo_accel.costs.fit.fit_costs`) of
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
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Optional

from mimo_accel.costs.files import atomic_write
from mimo_accel.modules import LANGUAGE
from mimo_accel_dev.commands.calibrate_gpu.budget import Collection, collect
from mimo_accel_dev.commands.calibrate_gpu.devices import CudaTimer, cpu_timer, device_info, session
from mimo_accel_dev.commands.calibrate_gpu.fit import ModuleFit, fit_language, fit_vision, model_from_fits
from mimo_accel_dev.commands.calibrate_gpu.models import language_measure, release, vision_measure
from mimo_accel_dev.commands.calibrate_gpu.points import (LANGUAGE_CORE, PROG, SIZES, VISION, VISION_CORE, LanguageShape,
                                                   MeasureError, language_points, shapes, vision_points)
from mimo_accel_dev.commands.calibrate_gpu.results import points_doc, read_points, render


# -------------------------------------------------------------------------------------- main

VISION_SHARE = 0.55  # of the budget: the vision phase ends by then, the language one by the end


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


def _measure_all(args, console, log_path: str,
                 save: Callable[[dict[str, Collection], dict[str, Any], float], None]
                 ) -> tuple[dict[str, Collection], dict[str, Any], float]:
    """Measure both modules inside the budget; returns (collections, device info, elapsed s).
    ``save`` gets what is measured after each module (so a later failure keeps the points)."""
    clock = time.monotonic
    start = clock()
    vision_shape, language_shape = shapes(args)
    iterations = args.warmup + args.repeats
    collections: dict[str, Collection] = {}
    from mimo_accel.tools import quiet

    with session(args.device, log_path) as pg:
        import torch

        timer = CudaTimer(torch) if args.device == "cuda" else cpu_timer
        oom = (torch.cuda.OutOfMemoryError,) if args.device == "cuda" else ()
        info = device_info(args.device, args.dtype)
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
             lambda: vision_measure(vision_shape, language_shape, pg, args.device, args.dtype, timer, args.warmup,
                                     args.repeats),
             lambda pts, ys: fit_vision(pts, ys, args.vision_module)),
            (LANGUAGE, language_points(args.size), LANGUAGE_CORE, start + args.budget_s,
             lambda: language_measure(language_shape, pg, args.device, args.dtype, timer, args.warmup,
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
            release(args.device, model)
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
            doc, vision, language = read_points(args.from_points)
            args.vision_module = doc.get("vision_module", VISION)
            args.size, args.warmup, args.repeats = (doc.get(k, getattr(args, k)) for k in ("size", "warmup", "repeats"))
            said = {name: doc["modules"][name] for name in (args.vision_module, LANGUAGE)}
            collections = {name: Collection(name, measured, said[name].get("planned", len(measured)),
                                            stopped=said[name].get("stopped"))
                           for name, measured in ((args.vision_module, vision), (LANGUAGE, language))}
            info, elapsed = doc.get("device", {}), doc.get("elapsed_s")
            shape = doc.get("shapes", {}).get(LANGUAGE)
            language_shape = LanguageShape(**shape) if shape else shapes(args)[1]
            if args.language_depth is not None:
                language_shape = dataclasses.replace(language_shape, depth=args.language_depth)
            source = {"points": str(args.from_points)}
        else:
            def save(collections, info, elapsed):
                if args.points:
                    atomic_write(Path(args.points), (json.dumps(points_doc(args, info, collections, elapsed),
                                                                indent=1) + "\n").encode())

            collections, info, elapsed = _measure_all(args, console, log_path, save)
            language_shape = shapes(args)[1]
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
        render(console, fits, collections, scale, language_shape)
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
                  f"mimo-accel rehearse --cost-model {args.out}", highlight=False)
    if args.points and not args.from_points:
        console.print(f"raw measurements: {args.points} (refit: {PROG} --from-points {args.points} --out FILE)")
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
