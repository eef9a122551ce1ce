"""The command line of the MegatronMIMO training script (:mod:`mimo_accel_dev.rehearse.bridge_script`).

Its flags, their checks, the modalities they name and the layout they give. Imports no
megatron.bridge module: the script runs ``mimo_accel_dev.rehearse.cpu.prepare_imports_if_cpu`` first.
"""

from __future__ import annotations

import argparse
import importlib.util
from typing import Optional

from mimo_accel.modules import LANGUAGE, Modules, module
from mimo_accel_dev.rehearse import stack
from mimo_accel.workloads import VISION

DESCRIPTION = "A complete MegatronMIMO training script on Megatron Bridge's own entry point."
HAS_SCALABLE_READS = importlib.util.find_spec("megatron.bridge.data.megatron_mimo.canonical_sampler") is not None

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
                    module(LANGUAGE, args.language_dp, tp=args.language_tp, pp=args.language_pp)))


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=DESCRIPTION,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cpu", action="store_true",
                   help="rehearse on CPU: gloo ranks through mimo_accel_dev.rehearse.cpu (refused where CUDA exists)")
    p.add_argument("--vision-dp", type=int, default=1)
    p.add_argument("--language-dp", type=int, default=1)
    p.add_argument("--vision-tp", type=int, default=1)
    p.add_argument("--language-tp", type=int, default=1)
    p.add_argument("--language-pp", type=int, default=1,
                   help="language pipeline-parallel size: world = encoders' ranks + language tp*pp*dp; the "
                        "language model's layers split evenly across the stages (default: one layer a stage)")
    p.add_argument("--language-first-stage-layers", type=int, default=None, metavar="N",
                   help="the language model's layers on its first PP stage (megatron-core's "
                        "num_layers_in_first_pipeline_stage; the rest even over the stages between)")
    p.add_argument("--language-last-stage-layers", type=int, default=None, metavar="N",
                   help="the language model's layers on its last PP stage (num_layers_in_last_pipeline_stage)")
    p.add_argument("--language-recompute", choices=("selective", "full"), default=None,
                   help="the language model's activation recompute (megatron-core's recompute_granularity; full: "
                        "each layer's input kept, recompute_method uniform over one layer)")
    p.add_argument("--vision-pp", type=int, default=1,
                   help="encoder pipeline parallelism: only 1 (upstream does not support encoder PP > 1)")
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
    p.add_argument("--load-rng", action=argparse.BooleanOptionalAction, default=True,
                   help="load each rank's RNG state (checkpoint.load_rng); it is kept per TP/PP rank, so a resume "
                        "on another TP or PP needs --no-load-rng")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--dataset", choices=("synthetic", "images"), default=None,
                   help="synthetic (default without an audio modality): mimo_accel's synthetic VLM samples (they "
                        "carry a cost index); images (the default with one): Bridge's MegatronMIMODataset over "
                        "real image files written at startup (no index), with an audio modality also real WAV "
                        "clips beside them")
    p.add_argument("--varied", action="store_true", help="synthetic: 0-3 images of varied sizes per sample")
    p.add_argument("--sparse", action="store_true",
                   help="synthetic: 0 or 1 4x4 image per sample, collated by Bridge's megatron_mimo_collate_fn "
                        "(its PR #4986 records where the images are: sparse modality DP ownership)")
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
    p.add_argument("--language-layers", type=int, default=None,
                   help=f"language model layers (default {stack.StackConfig.language_layers} per --language-pp stage)")
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
    p.add_argument("--equal-work", action="store_true",
                   help="images: every replica of every module trains the same samples (each global micro-batch "
                        "one block repeated on every canonical group): how unevenly the machine times equal work")
    p.add_argument("--dataloader-type", choices=("single", "cyclic"), default="single")
    p.add_argument("--scalable-dp", action="store_true",
                   help="upstream's scalable reads (dataset.megatron_mimo_scalable_dp; Megatron-Bridge PR #5525, "
                        "not merged)")
    p.add_argument("--bridge-reorder", action="store_true",
                   help="the settings of Megatron-Bridge PR #4608's reorder_buffer (not merged) on cfg.dataset "
                        "(megatron_mimo_scalable_dp, megatron_mimo_intra_microbatch_reorder), wired as its "
                        "example wires them, with "
                        "mimo_accel_dev.rehearse.reorder_buffer standing in for its ReorderingBuffer")
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
    if args.vision_pp != 1:
        p.error(f"--vision-pp {args.vision_pp}: encoders take no pipeline parallelism (Megatron Bridge's MIMO "
                "docs: encoder PP > 1 is not supported); pipeline the language model with --language-pp")
    if args.language_pp < 1:
        p.error(f"--language-pp must be >= 1 (got {args.language_pp})")
    first, last = args.language_first_stage_layers, args.language_last_stage_layers
    if args.language_layers is None:
        args.language_layers = stack.StackConfig.language_layers * args.language_pp
        if first is not None or last is not None:
            p.error("--language-first/last-stage-layers split the --language-layers: give --language-layers too")
    if first is None and last is None:
        if args.language_layers % args.language_pp:  # megatron-core splits the layers evenly
            p.error(f"--language-layers {args.language_layers} must divide evenly across --language-pp "
                    f"{args.language_pp} stages (or give --language-first/last-stage-layers)")
    else:
        from mimo_accel.tools.layout.spec import stage_layers

        try:
            stage_layers(args.language_layers, args.language_pp, first, last)
        except ValueError as exc:
            p.error(f"--language-first-stage-layers {first} --language-last-stage-layers {last} with --language-layers "
                    f"{args.language_layers} --language-pp {args.language_pp}: {exc}")
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
    if args.varied and args.sparse:
        p.error("--varied and --sparse are two synthetic datasets: give one")
    if args.dataset == "images":
        if args.varied or args.sparse:
            p.error("--varied and --sparse apply to --dataset synthetic")
        if args.encoder == "qwen3vl":
            args.max_image_rows = 16 if args.max_image_rows is None else args.max_image_rows
            if not 1 <= args.max_image_rows < args.seq_length:
                p.error(f"--max-image-rows must be in [1, --seq-length) (got {args.max_image_rows})")
        else:
            args.image_rows = 4 if args.image_rows is None else args.image_rows
            if not 1 <= args.image_rows < args.seq_length:
                p.error(f"--image-rows must be in [1, --seq-length) (got {args.image_rows})")
    elif args.equal_work:
        p.error("--equal-work applies to --dataset images")
    elif args.image_rows is not None or args.max_image_rows is not None:
        p.error("--image-rows / --max-image-rows apply to --dataset images")
    if args.upstream_packing and importlib.util.find_spec("megatron.bridge.data.megatron_mimo.sequence_pack") is None:
        p.error("--upstream-packing needs a megatron-bridge whose MegatronMIMO step packs "
                "(data/megatron_mimo/sequence_pack.py, Megatron-Bridge main); this one has none")
    if args.scalable_dp and not HAS_SCALABLE_READS:
        p.error("--scalable-dp needs a megatron-bridge with scalable MegatronMIMO reads "
                "(data/megatron_mimo/canonical_sampler.py, Megatron-Bridge PR #5525); this one has none")
    return args
