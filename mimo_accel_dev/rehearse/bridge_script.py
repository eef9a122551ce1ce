"""A complete MegatronMIMO training script on Megatron Bridge's own entry point.

The shape of upstream's Qwen3.5-VL MegatronMIMO example
(Megatron-Bridge examples/megatron_mimo/qwen35_vl/finetune_qwen35_vl.py): a
``ConfigContainer``, a ``MegatronMIMOParallelismConfig`` (vision on ranks [0, V), language
after it), a ``MegatronMIMOProvider``, ``build_data_iterators`` through Bridge's
``build_megatron_mimo_data_loaders``, Bridge's MIMO ``forward_step`` imported by value at the
top, and ``pretrain_megatron_mimo`` — training, interval evaluation, torch_dist checkpoints and
resume. The model is mimo_accel's tiny stack (``mimo_accel_dev.rehearse.stack``: a native-resolution ViT and
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
  native (default)     mimo_accel's NativeViT (mimo_accel_dev.rehearse.stack);
  qwen3vl              Bridge's own Qwen3-VL vision model (mimo_accel_dev.rehearse.qwen3vl, local specs, no
                       Transformer Engine needed): 16 px patches, 2x2 merge, t*h*w/4 rows per
                       image. With --dataset images: Qwen3-VL's image processing (at most
                       --max-image-rows rows per image) and as many placeholders per image as its
                       grid gives rows.

The modalities (--modalities, default ``vision``): each one an encoder module on its own grid, in
the order given, the language module after them; the names are the user's (the config keys, the
grid names, the ``--trace`` module field). ``--modalities vision,audio`` (upstream's names:
``images,audios``) adds an audio encoder (mimo_accel_dev.rehearse.audio: a Whisper-shaped
megatron-core encoder over log-mel frames, a stride-2 convolution front) sized by --audio-dp /
--audio-tp / --audio-hidden / --audio-layers, trained next to the vision encoder into the language
model as upstream's examples/megatron_mimo/llava/megatron_mimo_training_llava_audio.py does; its
data is --dataset images with 0/1 audio clip per sample beside the 0/1 image: real WAV files of
varied lengths written at startup, Whisper's feature extractor without the 30 s padding, one
placeholder per encoder row (so the audio load per sample varies).

Run as ``examples/train_mimo.py`` (its docstring shows the torchrun commands) or as
``python -m mimo_accel_dev.rehearse.bridge_script``, with the same arguments.

In-process use (tests): ``main(argv)`` initialises the process group from the torchrun
environment unless one is initialised already, and leaves an existing one alone.

--scalable-dp: upstream's own scalable reads (Megatron-Bridge PR #5525, not merged): sets
    ``dataset.megatron_mimo_scalable_dp``, so every rank reads only its share on the canonical grid
    and the forward step does not slice. --dataloader-type single|cyclic picks the sampler.

--bridge-reorder: PR #4608's reorder_buffer settings on ``cfg.dataset`` (scalable reads and
    ``megatron_mimo_intra_microbatch_reorder``), wired as upstream's Qwen3.5-VL example wires them
    (read when the iterators are built), ``mimo_accel_dev.rehearse.reorder_buffer`` standing in for its
    ``ReorderingBuffer``. The trace's ``bridge_reorder`` says whether the stand-in wrapped the iterator.

--upstream-packing: upstream's own in-batch packing in the forward step (Megatron-Bridge main:
    ``dataset.enable_in_batch_packing`` + ``defer_in_batch_packing_to_step``; not in 0.6.2).

--trace FILE: every rank appends one JSON line per finished training iteration: rank, module (the
    module's name: a modality's, or ``language``), dp_rank/dp_size, pp_rank/pp_size (its pipeline
    stage), iteration, ``layer_numbers`` (the megatron-core transformer layers the rank built, by their
    number in the whole model), ``ids`` (the sample ids it trained, one list per micro-batch: every stage
    of a replica lists the same) and, on the last language stage, ``loss_sum``/``tokens``/``loss`` of
    those micro-batches (other ranks: null).

--language-pp N: the language model on N pipeline stages (its layers split evenly; default one
    layer a stage; --language-first-stage-layers / --language-last-stage-layers set megatron-core's
    uneven split, ``num_layers_in_{first,last}_pipeline_stage`` on the language model's
    TransformerConfig), trained by megatron-core's multi-module 1F1B schedule: world size = the
    encoders' ranks + language tp*pp*dp. Every language stage loads the same samples (the first
    stage uses input_ids, the last labels and loss_mask). Encoders take no PP (--vision-pp > 1
    is refused: upstream does not support encoder PP > 1).

Environment: TRAIN_MIMO_KILL=RANK:ITERATION makes global rank RANK kill itself with SIGKILL
    when training iteration ITERATION starts (to test failure handling and restart).
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass
from datetime import timedelta
from typing import Optional

from mimo_accel_dev.rehearse import cpu as _cpu

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

from mimo_accel_dev.rehearse import reorder_buffer, stack
from mimo_accel.modules import Modules
from mimo_accel.workloads import VISION
from mimo_accel.runtime.reading.shard import SHARD_TAG_KEY
from mimo_accel_dev.rehearse.bridge_trace import KILL_ENV, TracedForwardStep, _kill_switch, _Trace  # noqa: F401
from mimo_accel_dev.rehearse.bridge_args import (  # noqa: F401  (re-exported: the script's in-process use)
    AUDIO,
    HAS_SCALABLE_READS,
    IMAGE,
    build_layout,
    modality_names,
    parse_args,
    parse_modalities,
)


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
    sparse: bool = False  # 0 or 1 4x4 image per sample, collated by Bridge's own collate
    patch_dim: int = 24
    vocab_size: int = 2048
    vision: str = VISION  # the image modality's (encoder module's) name

    def _dataset(self, num_samples: int, seed: int):
        spec = (stack.VariedSpec() if self.varied else stack.VariedSpec(max_images=1, sides=(4,)) if self.sparse
                else stack.uniform_spec(1, 4, 8))
        return stack.SyntheticVLMDataset(num_samples, spec, seq_length=self.seq_length,
                                         patch_dim=self.patch_dim, vocab_size=self.vocab_size, seed=seed)

    def build_datasets(self, context):
        valid = self._dataset(context.valid_samples, seed=1) if context.valid_samples else None
        return self._dataset(context.train_samples, seed=0), valid, None

    def get_collate_fn(self):
        collate = stack.collate_bridge if self.sparse else stack.collate
        if self.vision != VISION:
            from functools import partial

            return partial(collate, vision=self.vision)
        return collate


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
    equal_work: tuple = ()  # (micro-batch, canonical groups): every replica trains the same samples

    def _dataset(self, num_samples: int, seed: int):
        mix = stack.IMAGE_MIXES[self.image_mix]
        if self.audio is not None:
            grid = {}
            if self.encoder == "qwen3vl":
                from mimo_accel_dev.rehearse import qwen3vl

                grid = dict(placeholders="grid", processor=qwen3vl.image_processor(max_rows=self.image_rows),
                            merge=qwen3vl.MERGE)
            return stack.media_dataset(self.image_dir, num_samples, seq_length=self.seq_length,
                                       image_rows=self.image_rows, seed=seed, mix=mix, vision=self.vision,
                                       audio=self.audio, **grid)
        if self.encoder == "qwen3vl":
            from mimo_accel_dev.rehearse import qwen3vl

            return stack.images_dataset(self.image_dir, num_samples, seq_length=self.seq_length,
                                        image_rows=self.image_rows, seed=seed, placeholders="grid",
                                        processor=qwen3vl.image_processor(max_rows=self.image_rows),
                                        merge=qwen3vl.MERGE, mix=mix, vision=self.vision)
        return stack.images_dataset(self.image_dir, num_samples, seq_length=self.seq_length,
                                    image_rows=self.image_rows, seed=seed, mix=mix, vision=self.vision)

    def build_datasets(self, context):
        valid = self._dataset(context.valid_samples, seed=1) if context.valid_samples else None
        train = self._dataset(context.train_samples, seed=0)
        return (EqualWork(train, *self.equal_work) if self.equal_work else train), valid, None

    def get_collate_fn(self):
        # Bridge's megatron_mimo_collate_fn cannot stack pixel_values of different sizes (nor clips
        # of different lengths).
        from functools import partial

        patch_dim = {}
        if self.encoder == "qwen3vl":
            from mimo_accel_dev.rehearse import qwen3vl

            patch_dim = dict(patch_dim=qwen3vl.PATCH_DIM)
        if self.audio is not None:
            return partial(stack.collate_mimo_media, vision=self.vision, audio=self.audio, **patch_dim)
        if self.vision != VISION:
            return partial(stack.collate_mimo_images, vision=self.vision, **patch_dim)
        return partial(stack.collate_mimo_images, **patch_dim) if patch_dim else stack.collate_mimo_images


class EqualWork(torch.utils.data.Dataset):
    """``--equal-work``: each global micro-batch of ``micro_batch`` samples is one block of
    ``micro_batch / groups`` samples repeated on every canonical group (``groups``: the lcm of the
    module DPs), so every replica of every module computes the same samples and any spread of
    their times is the machine's (the rehearsal's floor). Read in order (a ``single`` loader)."""

    def __init__(self, base, micro_batch: int, groups: int):
        if micro_batch % groups:
            raise ValueError(f"--equal-work: the micro-batch ({micro_batch}) must split evenly over the "
                             f"{groups} canonical groups")
        self.base, self.micro_batch, self.block = base, micro_batch, micro_batch // groups

    def __len__(self) -> int:
        return len(self.base)

    def __getitem__(self, index: int):
        first, position = divmod(int(index), self.micro_batch)
        return self.base[first * self.micro_batch + position % self.block]


def default_image_dir() -> str:
    """The same path on every rank (so the examples, and the derived index's cache key, agree)."""
    import tempfile

    user = os.getuid() if hasattr(os, "getuid") else os.environ.get("USERNAME", "user")
    return os.path.join(tempfile.gettempdir(), f"mimo_accel-train_mimo-images-{user}")


def _module_replica(infra) -> tuple[str, int, int, int, int, int]:
    """(module, dp_rank, dp_size, pp_rank, pp_size, tp_rank) of this rank."""
    me = dist.get_rank()
    for name, grid in infra.module_to_grid_map.items():
        if grid.rank_offset <= me < grid.rank_offset + grid.size:
            dp, pp, tp = grid.get_pg(["dp"]), grid.get_pg(["pp"]), grid.get_pg(["tp"])
            return name, dp.rank(), dp.size(), pp.rank(), pp.size(), tp.rank()
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
        module, dp_rank, dp_size, pp_rank, pp_size, tp_rank = _module_replica(megatron_mimo_infra)
        layout = build_layout(args)
        # #4608's wiring, decided from cfg.dataset as its example does when it builds the iterators
        bridge_reorders = reorder_buffer.wanted(cfg, layout.dp_sizes.values())
        # every pipeline stage and TP rank of a replica loads (and traces) the same samples; the loss
        # is the last stage's, on each of its TP ranks
        trace.where = dict(rank=dist.get_rank(), module=module, dp_rank=dp_rank, dp_size=dp_size,
                           pp_rank=pp_rank, pp_size=pp_size, tp_rank=tp_rank, bridge_reorder=bridge_reorders)
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
            batches = reorder_buffer.ReorderBufferStandIn(
                batches, grid=layout.grid, dp_group=megatron_mimo_infra.module_to_grid_map[module].get_pg(["dp"]),
                shared_reads=scalable)
        train_iter = stack.model_batches(batches, keep_attention_mask=keep_mask,
                                         seen_ids=trace.pending_ids if trace.path else None,
                                         local_view=trained_here)
        valid_iter = (stack.model_batches(iter(valid_loader), keep_attention_mask=keep_mask)
                      if valid_loader is not None else None)
        trace.train_iterator = train_iter
        return train_iter, valid_iter

    return build_data_iterators


# ----------------------------------------------------------------------------------------------
# Config (the flags, the modalities and the layout: mimo_accel_dev.rehearse.bridge_args)
# ----------------------------------------------------------------------------------------------


def build_config(args, layout: Modules) -> ConfigContainer:
    images = args.dataset == "images"
    native_images = images and args.encoder == "native"
    vision, audio = modality_names(args)
    audio_sizes = (dict(audio_hidden=args.audio_hidden, audio_layers=args.audio_layers)
                   if audio is not None else {})
    scfg = stack.StackConfig(layout=layout, seq_length=args.seq_length, seed=args.seed, lr=args.lr,
                             hidden=args.hidden, language_layers=args.language_layers,
                             language_first=args.language_first_stage_layers,
                             language_last=args.language_last_stage_layers,
                             language_recompute=args.language_recompute, encoder=args.encoder,
                             vision_hidden=args.vision_hidden, vision_layers=args.vision_layers,
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
                                 equal_work=(args.mbs, layout.grid) if args.equal_work else (), **loader)
    else:
        data = SyntheticVLMProvider(seq_length=args.seq_length, varied=args.varied, sparse=args.sparse,
                                    patch_dim=scfg.patch_dim,
                                    vocab_size=scfg.vocab_size, vision=vision, **loader)
    if args.upstream_packing:
        # Megatron-Bridge main, training/megatron_mimo_step.py (resolve_step_packing) reads these.
        data.enable_in_batch_packing = True
        data.defer_in_batch_packing_to_step = True
    if args.scalable_dp:
        # Megatron-Bridge #5525: loaders.py and megatron_mimo_step.py read this from cfg.dataset.
        data.megatron_mimo_scalable_dp = True
    if args.bridge_reorder:
        # #4608's reorder_buffer (DirectHFSFTDatasetConfig's fields there), wired by the stand-in
        data.megatron_mimo_scalable_dp = True
        data.megatron_mimo_intra_microbatch_reorder = True
    checkpoint = CheckpointConfig(save=args.save, load=args.load, load_rng=args.load_rng,
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
            # lr_decay_steps (checked against the checkpoint); pin it. A Bridge without
            # scheduler.max_steps (PR #4986's base) derives every step count from train_iters:
            # there a resume takes the checkpoint's (LR and weight decay are constant here).
            **({"max_steps": max(args.lr_max_steps, args.train_iters)}
               if "max_steps" in SchedulerConfig.__dataclass_fields__ else {"use_checkpoint_opt_param_scheduler": True}),
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


def run(args: argparse.Namespace) -> None:
    """Train on this rank. Initialises the process group from the torchrun environment unless
    one exists (then it is left as it is)."""
    if args.cpu:
        from mimo_accel_dev.rehearse import cpu

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
