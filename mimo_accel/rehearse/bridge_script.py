"""A complete MegatronMIMO training script on Megatron Bridge's own entry point.

The shape of upstream's Qwen3.5-VL MegatronMIMO example
(Megatron-Bridge examples/megatron_mimo/qwen35_vl/finetune_qwen35_vl.py): a
``ConfigContainer``, a ``MegatronMIMOParallelismConfig`` (vision on ranks [0, V), language
after it), a ``MegatronMIMOProvider``, ``build_data_iterators`` through Bridge's
``build_megatron_mimo_data_loaders``, Bridge's MIMO ``forward_step`` imported by value at the
top, and ``pretrain_megatron_mimo`` — training, interval evaluation, torch_dist checkpoints and
resume. The model is mimo_accel's tiny stack (``mimo_accel.rehearse.stack``: a native-resolution ViT and
a GPT language model, local layer specs). Data (--dataset):
  synthetic (default)  mimo_accel's synthetic VLM dataset, whose per-sample cost index lets
                       ``reorder`` plan before reading;
  images               Bridge's own ``MegatronMIMODataset`` over real JPEG/PNG files written at
                       startup (0/1 image per sample, a few large and many small), Qwen2-VL's
                       image processor, a fixed --image-rows placeholders per image (the ViT ends
                       with a per-image resampler to that many rows). No cost index and no flag:
                       mimo_accel derives the per-sample costs from the examples.
                       --image-mix receipts: one narrow image per sample instead, heights
                       lognormal with a tall tail (what `mimo-accel rehearse --loop bridge` uses).
The vision encoder (--encoder):
  native (default)     mimo_accel's NativeViT (mimo_accel.rehearse.stack);
  qwen3vl              Bridge's own Qwen3-VL vision model (mimo_accel.rehearse.qwen3vl, local specs, no
                       Transformer Engine needed): 16 px patches, 2x2 merge, t*h*w/4 rows per
                       image. With --dataset images: Qwen3-VL's image processing (at most
                       --max-image-rows rows per image) and as many placeholders per image as its
                       grid gives rows.

The modalities (--modalities, default ``vision``): each one an encoder module on its own grid, in
the order given, the language module after them; the names are the user's (the config keys, the
grid names, the ``--trace`` module field). ``--modalities vision,audio`` (upstream's names:
``images,audios``) adds an audio encoder (mimo_accel.rehearse.audio: a Whisper-shaped
megatron-core encoder over log-mel frames, a stride-2 convolution front) sized by --audio-dp /
--audio-tp / --audio-hidden / --audio-layers, trained next to the vision encoder into the language
model as upstream's examples/megatron_mimo/llava/megatron_mimo_training_llava_audio.py does; its
data is --dataset images with 0/1 audio clip per sample beside the 0/1 image: real WAV files of
varied lengths written at startup, Whisper's feature extractor without the 30 s padding, one
placeholder per encoder row (so the audio load per sample varies).

Run as ``examples/train_mimo.py`` (its docstring shows the torchrun commands) or as
``python -m mimo_accel.rehearse.bridge_script``, with the same arguments.

In-process use (tests): ``main(argv)`` initialises the process group from the torchrun
environment unless one is initialised already, and leaves an existing one alone.

--scalable-dp: upstream's own scalable reads (Megatron-Bridge PR #5525, not in a release): sets
    ``dataset.megatron_mimo_scalable_dp``, so every rank reads only its share on the canonical grid
    and the forward step does not slice. --dataloader-type single|cyclic picks the sampler.

--bridge-reorder: Bridge 0.7's merged reorder settings on ``cfg.dataset`` (scalable reads and
    ``megatron_mimo_intra_microbatch_reorder``), wired as upstream's Qwen3.5-VL example wires them
    (read when the iterators are built), ``mimo_accel.rehearse.merged_reorder`` standing in for its
    ``ReorderingBuffer``. The trace's ``bridge_reorder`` says whether the stand-in wrapped the iterator.

--upstream-packing: upstream's own in-batch packing in the forward step (Megatron-Bridge main:
    ``dataset.enable_in_batch_packing`` + ``defer_in_batch_packing_to_step``; not in 0.6.2).

--trace FILE: every rank appends one JSON line per finished training iteration: rank, module (the
    module's name: a modality's, or ``language``), dp_rank/dp_size, iteration, ``ids`` (the sample
    ids it trained, one list per micro-batch) and, on language ranks, ``loss_sum``/``tokens``/``loss``
    of those micro-batches.
Environment: TRAIN_MIMO_KILL=RANK:ITERATION makes global rank RANK kill itself with SIGKILL
    when training iteration ITERATION starts (to test failure handling and restart).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import signal
import sys
from dataclasses import dataclass
from datetime import timedelta
from typing import Optional

from mimo_accel.rehearse import cpu as _cpu

_cpu.prepare_imports_if_cpu(sys.argv[1:])  # --cpu: before any megatron.bridge import

import torch
import torch.distributed as dist
from megatron.core.distributed import DistributedDataParallelConfig

from megatron.bridge.data.megatron_mimo.base_provider import MegatronMIMODatasetProvider
from megatron.bridge.data.megatron_mimo.loaders import build_megatron_mimo_data_loaders
from megatron.bridge.training.config import (
    CheckpointConfig,
    ConfigContainer,
    LoggerConfig,
    OptimizerConfig,
    SchedulerConfig,
    TrainingConfig,
)
from megatron.bridge.training.megatron_mimo_step import forward_step as megatron_mimo_forward_step
from megatron.bridge.training.pretrain_megatron_mimo import pretrain_megatron_mimo
from megatron.bridge.training.state import TrainState
from megatron.bridge.training.tokenizers.config import TokenizerConfig

from mimo_accel.rehearse import merged_reorder, stack
from mimo_accel.modules import LANGUAGE, Modules, module
from mimo_accel.workloads import VISION
from mimo_accel.runtime.shard import SHARD_TAG_KEY

KILL_ENV = "TRAIN_MIMO_KILL"
HAS_SCALABLE_READS = importlib.util.find_spec("megatron.bridge.data.megatron_mimo.canonical_sampler") is not None


# ----------------------------------------------------------------------------------------------
# Data
# ----------------------------------------------------------------------------------------------


@dataclass(kw_only=True)
class SyntheticVLMProvider(MegatronMIMODatasetProvider):
    """mimo_accel's synthetic VLM samples (each carries its id) as a MegatronMIMO dataset provider."""

    # bridge/training/train_megatron_mimo.py (train_megatron_mimo) reads cfg.dataset.seq_length,
    # which the base MegatronMIMODatasetProvider does not declare.
    seq_length: int = 64
    varied: bool = False  # 0-3 images of varied sizes per sample instead of one 4x4 image
    patch_dim: int = 24
    vocab_size: int = 2048
    vision: str = VISION  # the image modality's (encoder module's) name

    def _dataset(self, num_samples: int, seed: int):
        spec = stack.VariedSpec() if self.varied else stack.uniform_spec(1, 4, 8)
        return stack.SyntheticVLMDataset(num_samples, spec, seq_length=self.seq_length,
                                         patch_dim=self.patch_dim, vocab_size=self.vocab_size, seed=seed)

    def build_datasets(self, context):
        valid = self._dataset(context.valid_samples, seed=1) if context.valid_samples else None
        return self._dataset(context.train_samples, seed=0), valid, None

    def get_collate_fn(self):
        if self.vision != VISION:
            from functools import partial

            return partial(stack.collate, vision=self.vision)
        return stack.collate


@dataclass(kw_only=True)
class ImageMIMOProvider(MegatronMIMODatasetProvider):
    """Bridge's own ``MegatronMIMODataset`` over real JPEG/PNG files (``--dataset images``).

    Every rank writes the same deterministic files under ``image_dir`` (atomically; files already
    there are reused): 0 or 1 image per sample, receipts-like sizes (a few large, many small),
    Qwen2-VL's image processor, an offline word-level tokenizer and ``image_rows`` placeholders
    per image (Bridge 0.6.2 inserts a fixed ``encoder_seq_lengths`` per image; the encoder ends
    with a per-image resampler to that many rows). No cost index: mimo_accel derives one from
    the examples. Items carry their index as ``sample_id`` (a thin subclass; see --trace).
    With ``encoder="qwen3vl"``: Qwen3-VL's image processing (16 px patches) with at most
    ``image_rows`` rows per image, and as many placeholders per image as its grid gives rows
    (``stack.GridPlaceholderMIMODataset``).
    With ``audio`` (a modality name): the examples also carry 0 or 1 audio clip per sample, real
    WAV files of varied lengths written beside the images the same way, read with ``soundfile``
    into Whisper's log-mel features (no 30 s padding) and given as many placeholders per clip as
    the audio encoder makes rows (``stack.media_dataset``). The modalities are named ``vision``
    and ``audio`` (the encoder modules' names).
    """

    seq_length: int = 64
    image_dir: str = ""
    image_rows: int = 4
    # "qwen3vl": Qwen3-VL's image processing (16 px patches) with at most image_rows rows per
    # image, and placeholders per image following its grid (stack.GridPlaceholderMIMODataset).
    encoder: str = "native"
    # a key of stack.IMAGE_MIXES: "default" (0/1 image per sample, a few large) or "receipts"
    # (one image per sample, narrow, a long tail of tall ones)
    image_mix: str = "default"
    vision: str = VISION  # the image modality's name
    audio: Optional[str] = None  # the audio modality's name (None: images only)

    def _dataset(self, num_samples: int, seed: int):
        mix = stack.IMAGE_MIXES[self.image_mix]
        if self.audio is not None:
            grid = {}
            if self.encoder == "qwen3vl":
                from mimo_accel.rehearse import qwen3vl

                grid = dict(placeholders="grid", processor=qwen3vl.image_processor(max_rows=self.image_rows),
                            merge=qwen3vl.MERGE)
            return stack.media_dataset(self.image_dir, num_samples, seq_length=self.seq_length,
                                       image_rows=self.image_rows, seed=seed, mix=mix, vision=self.vision,
                                       audio=self.audio, **grid)
        if self.encoder == "qwen3vl":
            from mimo_accel.rehearse import qwen3vl

            return stack.images_dataset(self.image_dir, num_samples, seq_length=self.seq_length,
                                        image_rows=self.image_rows, seed=seed, placeholders="grid",
                                        processor=qwen3vl.image_processor(max_rows=self.image_rows),
                                        merge=qwen3vl.MERGE, mix=mix, vision=self.vision)
        return stack.images_dataset(self.image_dir, num_samples, seq_length=self.seq_length,
                                    image_rows=self.image_rows, seed=seed, mix=mix, vision=self.vision)

    def build_datasets(self, context):
        valid = self._dataset(context.valid_samples, seed=1) if context.valid_samples else None
        return self._dataset(context.train_samples, seed=0), valid, None

    def get_collate_fn(self):
        # Bridge's megatron_mimo_collate_fn cannot stack pixel_values of different sizes (nor clips
        # of different lengths).
        from functools import partial

        patch_dim = {}
        if self.encoder == "qwen3vl":
            from mimo_accel.rehearse import qwen3vl

            patch_dim = dict(patch_dim=qwen3vl.PATCH_DIM)
        if self.audio is not None:
            return partial(stack.collate_mimo_media, vision=self.vision, audio=self.audio, **patch_dim)
        if self.vision != VISION:
            return partial(stack.collate_mimo_images, vision=self.vision, **patch_dim)
        return partial(stack.collate_mimo_images, **patch_dim) if patch_dim else stack.collate_mimo_images


def default_image_dir() -> str:
    """The same path on every rank (so the examples, and the derived index's cache key, agree)."""
    import tempfile

    user = os.getuid() if hasattr(os, "getuid") else os.environ.get("USERNAME", "user")
    return os.path.join(tempfile.gettempdir(), f"mimo_accel-train_mimo-images-{user}")


class _Trace:
    """Per-rank record of what each training iteration trained (see --trace)."""

    def __init__(self, path: Optional[str]):
        self.path = path
        self.where: dict = {}
        self.train_iterator = None
        self.pending_ids: list = []  # filled by the train iterator, drained by the forward step
        self.current: Optional[dict] = None

    def begin(self, iteration: int) -> None:
        if self.current is not None and self.current["iteration"] != iteration:
            self.flush()
        if self.current is None:
            self.current = dict(self.where, iteration=iteration, ids=[], loss_sum=None, tokens=None, loss=None)

    def take_ids(self) -> None:
        self.current["ids"].extend(self.pending_ids)
        self.pending_ids.clear()

    def add_loss(self, loss_sum: float, tokens: float) -> None:
        rec = self.current
        rec["loss_sum"] = (rec["loss_sum"] or 0.0) + loss_sum
        rec["tokens"] = (rec["tokens"] or 0.0) + tokens
        rec["loss"] = rec["loss_sum"] / rec["tokens"] if rec["tokens"] else None

    def flush(self) -> None:
        if self.current is None:
            return
        if self.path:
            line = (json.dumps(self.current) + "\n").encode()
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, line)  # one append per line: ranks can share the file
            finally:
                os.close(fd)
        self.current = None


def _module_replica(infra) -> tuple[str, int, int]:
    """(module, dp_rank, dp_size) of this rank."""
    me = dist.get_rank()
    for name, grid in infra.module_to_grid_map.items():
        if grid.rank_offset <= me < grid.rank_offset + grid.size:
            dp = grid.get_pg(["dp"])
            return name, dp.rank(), dp.size()
    raise RuntimeError(f"rank {me} is in no MegatronMIMO module grid")


def make_build_data_iterators(args, trace: _Trace):
    """``build_data_iterators(cfg, infra, *, train_state=None)`` for ``pretrain_megatron_mimo``."""

    def build_data_iterators(cfg, megatron_mimo_infra, *, train_state=None):
        import mimo_accel

        if train_state is None:
            train_state = TrainState()
        gbs = cfg.train.global_batch_size
        evaluations = cfg.train.train_iters // args.eval_interval if args.eval_interval else 0
        train_loader, valid_loader, _ = build_megatron_mimo_data_loaders(
            cfg=cfg, train_state=train_state, megatron_mimo_provider=cfg.dataset,
            train_samples=cfg.train.train_iters * gbs,
            valid_samples=evaluations * cfg.validation.eval_iters * cfg.validation.eval_global_batch_size,
            test_samples=0)
        if train_loader is None:
            return None, None
        module, dp_rank, dp_size = _module_replica(megatron_mimo_infra)
        layout = build_layout(args)
        # Bridge 0.7's wiring, decided from cfg.dataset as its example does when it builds the iterators
        bridge_reorders = merged_reorder.wanted(cfg, layout.dp_sizes.values())
        trace.where = dict(rank=dist.get_rank(), module=module, dp_rank=dp_rank, dp_size=dp_size,
                           bridge_reorder=bridge_reorders)
        # upstream reads shards only where this Bridge has scalable reads (--bridge-reorder sets the flag anyway)
        scalable = bool(getattr(cfg.dataset, "megatron_mimo_scalable_dp", False)) and HAS_SCALABLE_READS

        def trained_here(view: dict) -> dict:
            # A sharded read (mimo_accel, or upstream's scalable reads) is this replica's share
            # already; a whole global micro-batch is cut contiguously by the forward step.
            if SHARD_TAG_KEY in view or scalable:
                return view
            ids = view[stack.SAMPLE_ID_KEY]
            n = ids.numel() // dp_size
            return {stack.SAMPLE_ID_KEY: ids[dp_rank * n:(dp_rank + 1) * n]}

        # The packer reads the [B, S] padding mask as its length source; otherwise it is dropped
        # (causal attention and loss_mask already ignore right padding).
        keep_mask = "packing" in mimo_accel.status()["active"] or args.upstream_packing
        batches = iter(train_loader)
        if bridge_reorders:
            batches = merged_reorder.MergedReorderStandIn(
                batches, grid=layout.grid, dp_group=megatron_mimo_infra.module_to_grid_map[module].get_pg(["dp"]))
        train_iter = stack.model_batches(batches, keep_attention_mask=keep_mask,
                                         seen_ids=trace.pending_ids if trace.path else None,
                                         local_view=trained_here)
        valid_iter = (stack.model_batches(iter(valid_loader), keep_attention_mask=keep_mask)
                      if valid_loader is not None else None)
        trace.train_iterator = train_iter
        return train_iter, valid_iter

    return build_data_iterators


class TracedForwardStep:
    """Bridge's MIMO forward step, plus the --trace record and the TRAIN_MIMO_KILL switch."""

    def __init__(self, forward_step, trace: _Trace, kill: Optional[tuple[int, int]]):
        self.forward_step = forward_step
        self.trace = trace
        self.kill = kill

    def __call__(self, state, data_iterator, model):
        training = data_iterator is self.trace.train_iterator and data_iterator is not None
        if not training:  # evaluation: nothing to record
            return self.forward_step(state, data_iterator, model)
        iteration = state.train_state.step + 1
        if self.kill is not None and self.kill == (dist.get_rank(), iteration):
            self.trace.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        self.trace.begin(iteration)
        output, loss_func = self.forward_step(state, data_iterator, model)
        self.trace.take_ids()
        if loss_func is None:
            return output, None

        def traced_loss(output_tensor):
            total, tokens, report = loss_func(output_tensor)
            loss_sum, n = (float(x) for x in report["lm loss"].view(-1).tolist())
            self.trace.add_loss(loss_sum, n)
            return total, tokens, report

        return output, traced_loss


def _kill_switch() -> Optional[tuple[int, int]]:
    raw = os.environ.get(KILL_ENV)
    if not raw:
        return None
    try:
        rank, iteration = (int(x) for x in raw.split(":"))
    except ValueError:
        raise SystemExit(f"{KILL_ENV}={raw!r}: expected RANK:ITERATION, e.g. 1:5") from None
    return rank, iteration


# ----------------------------------------------------------------------------------------------
# Config
# ----------------------------------------------------------------------------------------------


IMAGE, AUDIO = "image", "audio"  # the kinds of modality the example trains (an encoder for each)
_KIND_OF_NAME = {"vision": IMAGE, "image": IMAGE, "images": IMAGE, "audio": AUDIO, "audios": AUDIO}


def parse_modalities(text: str) -> dict[str, str]:
    """``--modalities``: modality (= encoder module) name -> kind (``image`` / ``audio``), in rank order.

    Entries ``NAME`` or ``NAME:KIND``, comma-separated. Without a kind: ``vision``/``image``/``images``
    are the image encoder, ``audio``/``audios`` the audio encoder, any other name the image encoder
    when first and the audio encoder when second. One image modality, at most one audio modality.
    """
    out: dict[str, str] = {}
    entries = [e.strip() for e in text.split(",") if e.strip()]
    for position, entry in enumerate(entries):
        name, _, kind = (part.strip() for part in entry.partition(":"))
        kind = kind or _KIND_OF_NAME.get(name) or (IMAGE, AUDIO)[min(position, 1)]
        if not name or not name.replace("_", "").replace("-", "").isalnum():
            raise ValueError(f"--modalities: {entry!r} is not a modality name")
        if name == LANGUAGE:
            raise ValueError(f"--modalities: {LANGUAGE!r} is the language module, not a modality")
        if kind not in (IMAGE, AUDIO):
            raise ValueError(f"--modalities: {entry!r}: the kind must be {IMAGE!r} or {AUDIO!r}")
        if name in out:
            raise ValueError(f"--modalities: {name!r} is named twice")
        out[name] = kind
    kinds = list(out.values())
    if kinds.count(IMAGE) != 1 or kinds.count(AUDIO) > 1:
        raise ValueError(f"--modalities {text!r}: the example trains one image modality and at most one audio "
                         f"modality (got {', '.join(f'{n}:{k}' for n, k in out.items()) or 'none'})")
    return out


def modality_names(args) -> tuple[str, Optional[str]]:
    """(the image modality's name, the audio modality's name or None)."""
    kinds = parse_modalities(args.modalities)
    by_kind = {k: n for n, k in kinds.items()}
    return by_kind[IMAGE], by_kind.get(AUDIO)


def build_layout(args) -> Modules:
    """Each modality's encoder (of its kind) on its own ranks in ``--modalities`` order, the language
    model after them."""
    sizes = {IMAGE: dict(tp=args.vision_tp, dp=args.vision_dp), AUDIO: dict(tp=args.audio_tp or 1, dp=args.audio_dp or 1)}
    return Modules((*(module(name, sizes[kind]["dp"], kind=kind, tp=sizes[kind]["tp"])
                      for name, kind in parse_modalities(args.modalities).items()),
                    module(LANGUAGE, args.language_dp, tp=args.language_tp)))


def build_config(args, layout: Modules) -> ConfigContainer:
    images = args.dataset == "images"
    native_images = images and args.encoder == "native"
    vision, audio = modality_names(args)
    audio_sizes = (dict(audio_hidden=args.audio_hidden, audio_layers=args.audio_layers)
                   if audio is not None else {})
    scfg = stack.StackConfig(layout=layout, seq_length=args.seq_length, seed=args.seed, lr=args.lr,
                             hidden=args.hidden, language_layers=args.language_layers, encoder=args.encoder, vision_hidden=args.vision_hidden, vision_layers=args.vision_layers,
                             vision_heads=args.vision_heads, vision_module=vision, audio_module=audio,
                             **audio_sizes,
                             **(dict(patch_dim=stack.QWEN2_PATCH_DIM, resample_rows=args.image_rows)
                                if native_images else {}))
    provider = stack.build_provider(scfg)
    if args.per_token_loss:
        # Loss = sum over tokens / global token count (finalize_model_grads_multimodule divides):
        # the gradient does not depend on which DP replica holds which sample.
        for config in (provider.language_model_spec.params["config"],
                       *stack.encoder_transformer_configs(provider).values()):
            config.calculate_per_token_loss = True
    # bridge/training/eval.py (evaluate) reads cfg.model.seq_length and
    # cfg.model.moe_expert_rank_capacity_factor, which MegatronMIMOProvider lacks.
    provider.seq_length = args.seq_length
    provider.moe_expert_rank_capacity_factor = None

    loader = dict(dataloader_type=args.dataloader_type, num_workers=0, pin_memory=False, persistent_workers=False,
                  drop_last=True, data_sharding=True)
    if images:
        data = ImageMIMOProvider(seq_length=args.seq_length, image_dir=args.image_dir or default_image_dir(),
                                 image_rows=args.image_rows if native_images else args.max_image_rows,
                                 encoder=args.encoder, image_mix=args.image_mix, vision=vision, audio=audio,
                                 **loader)
    else:
        data = SyntheticVLMProvider(seq_length=args.seq_length, varied=args.varied, patch_dim=scfg.patch_dim,
                                    vocab_size=scfg.vocab_size, vision=vision, **loader)
    if args.upstream_packing:
        # Megatron-Bridge main, training/megatron_mimo_step.py (resolve_step_packing) reads these.
        data.enable_in_batch_packing = True
        data.defer_in_batch_packing_to_step = True
    if args.scalable_dp:
        # Megatron-Bridge #5525: loaders.py and megatron_mimo_step.py read this from cfg.dataset.
        data.megatron_mimo_scalable_dp = True
    if args.bridge_reorder:
        # Bridge 0.7's merged reorder (DirectHFSFTDatasetConfig's fields), wired by the stand-in
        data.megatron_mimo_scalable_dp = True
        data.megatron_mimo_intra_microbatch_reorder = True
    checkpoint = CheckpointConfig(save=args.save, load=args.load,
                                  save_interval=args.save_interval or args.train_iters,
                                  ckpt_format="torch_dist", async_save=False, fully_parallel_save=False)
    cfg = ConfigContainer(
        train=TrainingConfig(micro_batch_size=args.mbs, global_batch_size=args.gbs, train_iters=args.train_iters,
                             eval_interval=args.eval_interval, eval_iters=args.eval_iters),
        model=provider,
        # fp32 without the distributed optimizer (FP32Optimizer): what gloo ranks can run. On CPU
        # clip_grad must stay 0 (megatron's clipping asserts CUDA tensors; the norm is computed).
        optimizer=OptimizerConfig(optimizer="adam", lr=args.lr, min_lr=0.0, bf16=False, fp16=False,
                                  use_distributed_optimizer=False, clip_grad=0.0 if args.cpu else args.clip_grad),
        scheduler=SchedulerConfig(
            lr_decay_style="constant", lr_warmup_iters=0,
            # core/optimizer_param_scheduler.py: resuming with another train_iters changes
            # lr_decay_steps (checked against the checkpoint); pin it.
            max_steps=max(args.lr_max_steps, args.train_iters),
            # core/optimizer_param_scheduler.py: start_wd is None on the MIMO path, which never
            # derives it from the optimizer's weight decay.
            start_weight_decay=0.0, end_weight_decay=0.0, weight_decay_incr_style="constant"),
        dataset=data,
        # --tensorboard-dir: Bridge's own TensorBoard writer (on the last rank), every iteration;
        # with the profiler on, mimo_accel's per-step figures go through it under mimo_accel/
        logger=LoggerConfig(log_interval=1, tensorboard_dir=args.tensorboard_dir),
        tokenizer=TokenizerConfig(),
        checkpoint=checkpoint,
        ddp=DistributedDataParallelConfig(),
    )
    cfg.rng.seed = args.seed
    # bridge/training/train_megatron_mimo.py reads cfg.train.eval_interval, bridge/training/eval.py
    # reads cfg.validation.*; megatron_mimo_runtime_config_update (training/config.py) never
    # runs ConfigContainer.validate(), which would fill the eval batch sizes.
    cfg.validation.eval_interval = args.eval_interval
    cfg.validation.eval_iters = args.eval_iters
    cfg.validation.eval_micro_batch_size = args.mbs
    cfg.validation.eval_global_batch_size = args.gbs
    return cfg


# ----------------------------------------------------------------------------------------------
# Entry points
# ----------------------------------------------------------------------------------------------


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cpu", action="store_true",
                   help="rehearse on CPU: gloo ranks through mimo_accel.rehearse.cpu (refused where CUDA exists)")
    p.add_argument("--vision-dp", type=int, default=1)
    p.add_argument("--language-dp", type=int, default=1)
    p.add_argument("--vision-tp", type=int, default=1)
    p.add_argument("--language-tp", type=int, default=1)
    p.add_argument("--modalities", default=VISION,
                   help="the modalities (= encoder modules, each on its own grid, in rank order before the "
                        "language model), comma-separated NAME or NAME:KIND (kind image or audio): 'vision' "
                        "(default), 'vision,audio' (an audio encoder too; needs --dataset images), upstream's "
                        "'images,audios'. --vision-* size the image modality's encoder, --audio-* the audio one")
    p.add_argument("--audio-dp", type=int, default=None, help="audio encoder data-parallel size (default 1)")
    p.add_argument("--audio-tp", type=int, default=None, help="audio encoder tensor-parallel size (default 1)")
    p.add_argument("--audio-hidden", type=int, default=None,
                   help=f"audio encoder hidden size (default {stack.StackConfig.audio_hidden})")
    p.add_argument("--audio-layers", type=int, default=None,
                   help=f"audio encoder transformer layers (default {stack.StackConfig.audio_layers})")
    p.add_argument("--train-iters", type=int, default=4)
    p.add_argument("--mbs", type=int, default=4, help="global micro-batch size (split across each module's DP)")
    p.add_argument("--gbs", type=int, default=8, help="global batch size per iteration")
    p.add_argument("--seq-length", type=int, default=64)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--lr-max-steps", type=int, default=1000)
    p.add_argument("--clip-grad", type=float, default=1.0, help="GPU only; CPU runs use 0")
    p.add_argument("--per-token-loss", action=argparse.BooleanOptionalAction, default=True,
                   help="normalise by the global token count (default) instead of per replica")
    p.add_argument("--eval-interval", type=int, default=2, help="0 turns evaluation off")
    p.add_argument("--eval-iters", type=int, default=1)
    p.add_argument("--save", default=None, help="checkpoint directory to save into")
    p.add_argument("--save-interval", type=int, default=None, help="default: --train-iters")
    p.add_argument("--load", default=None, help="checkpoint directory to resume from")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--dataset", choices=("synthetic", "images"), default=None,
                   help="synthetic (default without an audio modality): mimo_accel's synthetic VLM samples (they "
                        "carry a cost index); images (the default with one): Bridge's MegatronMIMODataset over "
                        "real image files written at startup (no index), with an audio modality also real WAV "
                        "clips beside them")
    p.add_argument("--varied", action="store_true", help="synthetic: 0-3 images of varied sizes per sample")
    p.add_argument("--image-dir", default=None,
                   help="images: where the image files are written/reused (default: a fixed temp dir)")
    p.add_argument("--image-rows", type=int, default=None,
                   help="images, --encoder native: placeholder tokens per image = rows the encoder's "
                        "resampler makes (default 4)")
    p.add_argument("--encoder", choices=stack.ENCODERS, default="native",
                   help="native: mimo_accel's NativeViT; qwen3vl: Bridge's Qwen3-VL vision model "
                        "(rows per image follow the image's grid)")
    p.add_argument("--hidden", type=int, default=stack.StackConfig.hidden,
                   help="language model hidden size (the encoders' projections map into it)")
    p.add_argument("--language-layers", type=int, default=stack.StackConfig.language_layers,
                   help="language model layers")
    p.add_argument("--vision-hidden", type=int, default=stack.StackConfig.vision_hidden,
                   help="vision encoder hidden size")
    p.add_argument("--vision-layers", type=int, default=stack.StackConfig.vision_layers,
                   help="vision encoder layers")
    p.add_argument("--vision-heads", type=int, default=None,
                   help=f"vision encoder attention heads (default: the stack's {stack.StackConfig.heads})")
    p.add_argument("--image-mix", choices=sorted(stack.IMAGE_MIXES), default="default",
                   help="images: default: 0/1 image per sample, a few large, many small; receipts: one "
                        "image per sample, narrow, heights lognormal with a long tail of tall ones")
    p.add_argument("--max-image-rows", type=int, default=None,
                   help="images, --encoder qwen3vl: the most rows (= placeholders) one image may take; "
                        "Qwen3-VL's processor resizes larger images down to it (default 16)")
    p.add_argument("--dataloader-type", choices=("single", "cyclic"), default="single")
    p.add_argument("--scalable-dp", action="store_true",
                   help="upstream's scalable reads (dataset.megatron_mimo_scalable_dp; Megatron-Bridge #5525)")
    p.add_argument("--bridge-reorder", action="store_true",
                   help="Bridge 0.7's merged reorder settings on cfg.dataset (megatron_mimo_scalable_dp, "
                        "megatron_mimo_intra_microbatch_reorder), wired as its example wires them, with "
                        "mimo_accel.rehearse.merged_reorder standing in for its ReorderingBuffer")
    p.add_argument("--upstream-packing", action="store_true",
                   help="upstream's own step packing (dataset.enable_in_batch_packing; Megatron-Bridge main)")
    p.add_argument("--trace", default=None, help="append one JSON line per rank and training iteration")
    p.add_argument("--tensorboard-dir", default=None,
                   help="Bridge's logger writes TensorBoard event files here (LoggerConfig(tensorboard_dir=..., "
                        "log_interval=1)); with the profiler on, mimo_accel's per-step figures too, under mimo_accel/")
    p.add_argument("--dist-timeout", type=float, default=300.0, help="seconds (CPU/gloo process group)")
    args = p.parse_args(argv)
    if args.eval_interval == 0:
        args.eval_interval = None
    try:
        audio = modality_names(args)[1]
    except ValueError as exc:
        p.error(str(exc))
    if audio is None:
        given = [f for f in ("audio_dp", "audio_tp", "audio_hidden", "audio_layers") if getattr(args, f) is not None]
        if given:
            p.error(f"--{given[0].replace('_', '-')} sizes an audio encoder; name an audio modality in --modalities "
                    "(e.g. --modalities vision,audio)")
    else:
        args.audio_hidden = stack.StackConfig.audio_hidden if args.audio_hidden is None else args.audio_hidden
        args.audio_layers = stack.StackConfig.audio_layers if args.audio_layers is None else args.audio_layers
        if args.dataset == "synthetic":
            p.error(f"--modalities {args.modalities}: the audio modality {audio!r} needs real clips: --dataset "
                    "images (the default with an audio modality) writes WAV files beside the images")
    if args.dataset is None:
        args.dataset = "synthetic" if audio is None else "images"
    if args.encoder == "qwen3vl":
        if args.image_rows is not None:
            p.error("--image-rows sets the fixed rows of --encoder native's resampler; with --encoder qwen3vl "
                    "the rows per image follow its grid: bound them with --max-image-rows instead")
    elif args.max_image_rows is not None:
        p.error("--max-image-rows applies to --encoder qwen3vl (--encoder native takes --image-rows)")
    if args.dataset == "images":
        if args.varied:
            p.error("--varied applies to --dataset synthetic")
        if args.encoder == "qwen3vl":
            args.max_image_rows = 16 if args.max_image_rows is None else args.max_image_rows
            if not 1 <= args.max_image_rows < args.seq_length:
                p.error(f"--max-image-rows must be in [1, --seq-length) (got {args.max_image_rows})")
        else:
            args.image_rows = 4 if args.image_rows is None else args.image_rows
            if not 1 <= args.image_rows < args.seq_length:
                p.error(f"--image-rows must be in [1, --seq-length) (got {args.image_rows})")
    elif args.image_rows is not None or args.max_image_rows is not None:
        p.error("--image-rows / --max-image-rows apply to --dataset images")
    if args.upstream_packing and importlib.util.find_spec("megatron.bridge.data.megatron_mimo.sequence_pack") is None:
        p.error("--upstream-packing needs a megatron-bridge whose MegatronMIMO step packs "
                "(data/megatron_mimo/sequence_pack.py, Megatron-Bridge main); this one has none")
    if args.scalable_dp and not HAS_SCALABLE_READS:
        p.error("--scalable-dp needs a megatron-bridge with scalable MegatronMIMO reads "
                "(data/megatron_mimo/canonical_sampler.py, Megatron-Bridge PR #5525); this one has none")
    return args


def run(args: argparse.Namespace) -> None:
    """Train on this rank. Initialises the process group from the torchrun environment unless
    one exists (then it is left as it is)."""
    if args.cpu:
        from mimo_accel.rehearse import cpu

        cpu.activate()
    owns_group = not dist.is_initialized()
    if owns_group:
        if args.cpu:
            dist.init_process_group("gloo", timeout=timedelta(seconds=args.dist_timeout))
        else:
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
            dist.init_process_group("nccl")
    layout = build_layout(args)
    if layout.world_size != dist.get_world_size():
        raise SystemExit(f"layout {layout} needs {layout.world_size} ranks, but the world has "
                         f"{dist.get_world_size()}: set --nproc-per-node (or the dp/tp sizes) to match")
    cfg = build_config(args, layout)
    if dist.get_rank() == 0:
        import mimo_accel

        print(f"train_mimo: layout {layout}; mimo_accel features: "
              f"{', '.join(mimo_accel.status()['active']) or 'none'}", flush=True)
    trace = _Trace(args.trace)
    kill = _kill_switch()
    forward_step = megatron_mimo_forward_step
    if args.trace or kill is not None:
        forward_step = TracedForwardStep(megatron_mimo_forward_step, trace, kill)
    pretrain_megatron_mimo(cfg=cfg, forward_step_func=forward_step,
                           build_data_iterators_fn=make_build_data_iterators(args, trace))
    trace.flush()
    if owns_group:  # as upstream's example: only after a successful run
        dist.destroy_process_group()


def main(argv=None) -> int:
    run(parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
