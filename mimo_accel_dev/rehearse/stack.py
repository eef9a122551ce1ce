"""A small, real MegatronMIMO stack for CPU rehearsal and tests.

Everything here is upstream code put together the way Megatron Bridge puts it together: a
``MegatronMIMOProvider`` (vision module + GPT language module, megatron-core local layer specs),
``build_megatron_mimo_model`` with per-module DDP, the ``MultiModulePipelineCommunicator`` over the
real ``BridgeCommunicator``, ``get_mimo_optimizer``, Bridge's ``forward_step`` through
megatron-core's ``forward_backward_pipelining_without_interleaving``.

Two things are the project's own, because nothing upstream fits on a CPU:
- :class:`NativeViT`, a native-resolution vision encoder taking Qwen-style patch-packed input
  (``hidden_states`` [Σpatches, patch_dim] + ``grid_thw`` [images, 3]) with per-image attention,
  so its cost grows with the image the way Qwen3-VL's does (a fixed-resolution CLIP only varies
  with the image count). Bridge's own Qwen3-VL vision model ships with Transformer Engine specs.
  With ``resample_rows=R`` it ends with a per-image resampler (R learned queries attending to
  that image's rows, as Perceiver / Q-Former VLMs do): exactly R rows per image, the fixed
  placeholder count Bridge 0.6.2's ``MegatronMIMODataset`` inserts, while the cost still grows
  with each image's patches.
  ``StackConfig(encoder="qwen3vl")`` registers Bridge's own Qwen3-VL vision model instead
  (:mod:`mimo_accel_dev.rehearse.qwen3vl`: megatron-core local specs, no Transformer Engine), whose rows per
  image follow the image's grid (``t·h·w / 4``).
- :class:`SyntheticVLMDataset` / :class:`SyntheticMIMOProvider`: deterministic samples with 0/1/N
  images, each sample carrying its id so tests can check pairing end to end.
- Real image files through Bridge's own ``MegatronMIMODataset`` (:func:`images_dataset`):
  :func:`image_examples` writes deterministic JPEG/PNG files, :func:`offline_tokenizer` and
  :func:`qwen_image_processor` need no download, :func:`collate_mimo_images` patch-packs the
  variable-size ``pixel_values``, and ``IdentifiedMIMODataset`` adds each item's ``sample_id``;
  ``GridPlaceholderMIMODataset`` places as many placeholders per image as the image's grid gives
  encoder rows (Bridge 0.6.2 places a fixed count).
- A second encoder: ``StackConfig(audio_module=NAME)`` adds :mod:`mimo_accel_dev.rehearse.audio`'s
  Whisper-shaped ``AudioEncoder`` on its own grid; :func:`media_dataset` gives Bridge's
  ``MegatronMIMODataset`` over real image and WAV files (0/1 of each per sample), one placeholder
  per encoder row of each item (``ItemPlaceholderMIMODataset``), :func:`collate_mimo_media` packs
  both. The encoders are the layout's, named as the user names them; the image encoder is
  ``vision`` by default, the audio one ``audio``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence

import torch
from megatron.core.transformer.module import MegatronModule
from torch import nn
from torch.nn import functional as F

from mimo_accel_dev.rehearse import audio as audio_mod
from mimo_accel_dev.rehearse.audio import AUDIO_ENCODER_NAME, AUDIO_TOKEN_ID, MEL_BINS, AudioMix  # noqa: F401
from mimo_accel_dev.rehearse.qwen_processor import qwen_image_processor
from mimo_accel.modules import LANGUAGE, Module, Modules
from mimo_accel_dev.rehearse.ranks import VISION, parallelism_config, step_state

IMAGE_TOKEN_ID = 2047  # the vision placeholder token in input_ids (the last id of the vocabulary)
AUDIO = "audio"  # the audio modality's default name (the user names modalities; see StackConfig)
ENCODER_NAME = "vit"  # modality_inputs["vision"][ENCODER_NAME] = {hidden_states, grid_thw}
SAMPLE_ID_KEY = "sample_ids"


# ----------------------------------------------------------------------------------------------
# Vision encoder
# ----------------------------------------------------------------------------------------------


class NativeViT(MegatronModule):
    """Native-resolution ViT: per-image bidirectional attention, then a spatial merge.

    Input rows are patches; images are consecutive runs of ``t*h*w`` rows (``grid_thw``); each
    run of ``merge**2`` consecutive patches becomes one output row (Qwen's patch order keeps a
    merge window contiguous). Output: ``[Σpatches / merge², out_hidden]``.
    """

    def __init__(self, config, patch_dim: int, out_hidden: int, merge: int = 2,
                 resample_rows: Optional[int] = None, **_: Any):
        super().__init__(config=config)
        hidden, num_layers, num_heads = config.hidden_size, config.num_layers, config.num_attention_heads
        self.merge = merge
        self.num_heads = num_heads
        self.resample_rows = resample_rows
        self.embed = nn.Linear(patch_dim, hidden)
        self.layers = nn.ModuleList(
            nn.ModuleDict(dict(norm1=nn.LayerNorm(hidden), qkv=nn.Linear(hidden, 3 * hidden),
                               proj=nn.Linear(hidden, hidden), norm2=nn.LayerNorm(hidden),
                               fc1=nn.Linear(hidden, 2 * hidden), fc2=nn.Linear(2 * hidden, hidden)))
            for _ in range(num_layers))
        if resample_rows is None:
            self.merger = nn.Linear(hidden * merge * merge, out_hidden)
        else:
            if resample_rows < 1:
                raise ValueError(f"NativeViT: resample_rows must be >= 1, got {resample_rows}")
            # A Perceiver / Q-Former style resampler: R learned queries attend to one image's
            # patch rows, so every image becomes exactly R rows whatever its size.
            self.queries = nn.Parameter(torch.randn(resample_rows, hidden) * 0.02)
            self.resample_norm = nn.LayerNorm(hidden)
            self.resample_q = nn.Linear(hidden, hidden)
            self.resample_kv = nn.Linear(hidden, 2 * hidden)
            self.merger = nn.Linear(hidden, out_hidden)

    def _attend(self, layer: nn.ModuleDict, x: torch.Tensor, lengths: list[int]) -> torch.Tensor:
        h = layer["norm1"](x)
        q, k, v = layer["qkv"](h).chunk(3, dim=-1)
        outs = []
        start = 0
        for n in lengths:  # one attention per image: cost ∝ Σ nᵢ²
            # [1, heads, n, d]: the 4-D layout torch's fused CPU attention takes (blockwise, no
            # n x n matrix in memory): half the time of the 3-D math path, and steadier
            def heads(t):
                return t[start:start + n].view(n, self.num_heads, -1).transpose(0, 1).unsqueeze(0)
            o = F.scaled_dot_product_attention(heads(q), heads(k), heads(v)).squeeze(0)
            outs.append(o.transpose(0, 1).reshape(n, -1))
            start += n
        attn = torch.cat(outs) if outs else x[:0]
        x = x + layer["proj"](attn)
        return x + layer["fc2"](F.gelu(layer["fc1"](layer["norm2"](x))))

    def forward(self, hidden_states: torch.Tensor, grid_thw: torch.Tensor) -> torch.Tensor:
        lengths = [int(n) for n in grid_thw.prod(dim=-1).tolist()] if grid_thw.numel() else []
        if sum(lengths) != hidden_states.size(0):
            raise ValueError(f"NativeViT: hidden_states has {hidden_states.size(0)} patches but "
                             f"grid_thw describes {sum(lengths)}")
        x = self.embed(hidden_states)
        for layer in self.layers:
            x = self._attend(layer, x, lengths)
        if self.resample_rows is not None:
            return self.merger(self._resample(x, lengths))
        return self.merger(x.reshape(-1, x.size(-1) * self.merge * self.merge))

    def _resample(self, x: torch.Tensor, lengths: list[int]) -> torch.Tensor:
        """Each image's patch rows -> exactly ``resample_rows`` rows (cross-attention of the
        learned queries to that image's rows only: cost ∝ R · patches per image)."""
        r, heads = self.resample_rows, self.num_heads
        q = self.resample_q(self.queries).view(r, heads, -1).transpose(0, 1)  # [heads, R, d]
        k, v = self.resample_kv(self.resample_norm(x)).chunk(2, dim=-1)
        outs = []
        start = 0
        for n in lengths:
            def heads_of(t):
                return t[start:start + n].view(n, heads, -1).transpose(0, 1)
            o = F.scaled_dot_product_attention(q, heads_of(k), heads_of(v))  # [heads, R, d]
            outs.append(o.transpose(0, 1).reshape(r, -1) + self.queries)
            start += n
        return torch.cat(outs) if outs else x[:0]


def packed_local_attention():
    """megatron-core's local ``DotProductAttention`` asserts on packed (THD) params — only
    Transformer Engine's attention takes them. This subclass runs the local attention once per
    ``cu_seqlens`` segment (real tokens only, at ``cu_seqlens_q_padded`` offsets, as TE's padded
    THD does) with a causal mask, so packed language shards train on CPU."""
    from megatron.core.transformer.dot_product_attention import DotProductAttention

    class PackedLocalAttention(DotProductAttention):
        def forward(self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None,
                    packed_seq_params=None):
            if packed_seq_params is None:
                return super().forward(query, key, value, attention_mask, attn_mask_type, attention_bias)
            real = packed_seq_params.cu_seqlens_q.tolist()
            starts = packed_seq_params.cu_seqlens_q_padded.tolist()
            out = query.new_zeros(query.size(0), self.hidden_size_per_partition)  # [T, heads * dim]
            for i in range(len(real) - 1):
                n = real[i + 1] - real[i]
                seg = slice(starts[i], starts[i] + n)
                mask = torch.triu(torch.ones(n, n, dtype=torch.bool, device=query.device), 1)[None, None]
                o = super().forward(query[seg].unsqueeze(1), key[seg].unsqueeze(1), value[seg].unsqueeze(1),
                                    mask, attn_mask_type)
                out[seg] = o.squeeze(1)
            return out

    return PackedLocalAttention


def seeded_transformer_layer():
    """megatron-core's ``TransformerLayer`` drawing its weights from a seed of its own: the run's seed
    and the layer's number in the whole model. Bridge seeds each pipeline stage apart (seed + 100 x
    the stage), so the same model under another PP would start from other weights; seeded per layer,
    every layout of a module starts from the same ones (the layout check compares their losses). The
    layer's number is megatron-core's own (``get_transformer_layer_offset`` over the config, which reads
    ``num_layers_in_{first,last}_pipeline_stage``), so an uneven split numbers its layers as the even
    one does; the output layer, drawn after the model's last layer on the last stage, follows that
    layer's seed in every layout."""
    from megatron.core.transformer.transformer_layer import TransformerLayer, get_transformer_layer_offset
    from megatron.core.utils import get_pg_rank

    class SeededTransformerLayer(TransformerLayer):
        def __init__(self, config, submodules, layer_number: int = 1, *args, init_seed: int = 0, **kwargs):
            groups = kwargs.get("pg_collection")
            stage = get_pg_rank(groups.pp) if groups is not None else None
            whole = layer_number + get_transformer_layer_offset(config, kwargs.get("vp_stage"), stage)
            torch.manual_seed(init_seed * 1_000_003 + whole)
            super().__init__(config, submodules, layer_number, *args, **kwargs)

    return SeededTransformerLayer


# ----------------------------------------------------------------------------------------------
# Data
# ----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SampleSpec:
    """What one synthetic sample holds: image grids (h, w in patches) and text tokens."""

    images: tuple[tuple[int, int], ...]
    text_tokens: int


def image_rows(h: int, w: int, merge: int = 2) -> int:
    return (h * w) // (merge * merge)


class SyntheticVLMDataset(torch.utils.data.Dataset):
    """Deterministic VLM samples: ``spec_fn(i) -> SampleSpec`` decides sample i's shape.

    Each sample: ``input_ids`` with one placeholder per encoder output row (images first, then
    text), right-padded to ``seq_length``; patch-packed vision input; and its id.
    """

    def __init__(self, num_samples: int, spec_fn: Callable[[int], SampleSpec], *, seq_length: int,
                 patch_dim: int, vocab_size: int, merge: int = 2, seed: int = 0):
        self.num_samples = num_samples
        self.spec_fn = spec_fn
        self.seq_length = seq_length
        self.patch_dim = patch_dim
        self.vocab_size = vocab_size
        self.merge = merge
        self.seed = seed

    def __len__(self) -> int:
        return self.num_samples

    @property
    def mimo_accel_cost_index(self):
        """Per-sample costs from the sample specs alone (no decoding): the plan-before-read source."""
        if getattr(self, "_cost_index", None) is None:
            from mimo_accel.costs import CostIndex, ResizeRule

            specs = [self.spec_fn(i) for i in range(self.num_samples)]
            per_image = [[h * w for h, w in s.images] for s in specs]
            self._cost_index = CostIndex(
                [sum(image_rows(h, w, self.merge) for h, w in s.images) + s.text_tokens for s in specs],
                {"vision": ([len(s.images) for s in specs], [sum(p) for p in per_image],
                            [sum(x * x for x in p) for p in per_image],
                            # sides are given in patches already: a 1-pixel "patch" rule leaves them as they are
                            ResizeRule(patch_size=1, merge_size=self.merge, min_pixels=1, max_pixels=1 << 40))})
        return self._cost_index

    def __getitem__(self, idx: int) -> dict:
        spec = self.spec_fn(idx)
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + idx)
        rows = sum(image_rows(h, w, self.merge) for h, w in spec.images)
        real = rows + spec.text_tokens
        if real > self.seq_length:
            raise ValueError(f"sample {idx}: {real} tokens exceed seq_length {self.seq_length}")
        ids = torch.zeros(self.seq_length, dtype=torch.long)
        ids[:rows] = IMAGE_TOKEN_ID
        ids[rows:real] = torch.randint(1, min(self.vocab_size, IMAGE_TOKEN_ID) - 1, (spec.text_tokens,),
                                       generator=g)
        attention = torch.zeros(self.seq_length, dtype=torch.long)
        attention[:real] = 1
        labels = torch.full((self.seq_length,), -100, dtype=torch.long)
        labels[:real - 1] = ids[1:real]
        loss_mask = ((labels != -100) & (labels != IMAGE_TOKEN_ID)).float()
        labels[labels == IMAGE_TOKEN_ID] = -100
        patches = sum(h * w for h, w in spec.images)
        return {
            "input_ids": ids,
            "labels": labels,
            "loss_mask": loss_mask,
            "attention_mask": attention,
            "position_ids": torch.arange(self.seq_length),
            "hidden_states": torch.randn(patches, self.patch_dim, generator=g),
            "grid_thw": torch.tensor([[1, h, w] for h, w in spec.images], dtype=torch.long).view(-1, 3),
            "sample_id": idx,
        }


def collate(samples: Sequence[dict], *, vision: str = VISION) -> dict:
    """Stack text tensors; patch-pack the images of all samples in sample order (as the input of
    the encoder module named ``vision``)."""
    batch = {k: torch.stack([s[k] for s in samples])
             for k in ("input_ids", "labels", "loss_mask", "attention_mask", "position_ids")}
    batch["modality_inputs"] = {vision: {ENCODER_NAME: {
        "hidden_states": torch.cat([s["hidden_states"] for s in samples]),
        "grid_thw": torch.cat([s["grid_thw"] for s in samples]),
    }}}
    batch[SAMPLE_ID_KEY] = torch.tensor([s["sample_id"] for s in samples], dtype=torch.long)
    return batch


def collate_bridge(samples: Sequence[dict], *, vision: str = VISION) -> dict:
    """Bridge's own ``megatron_mimo_collate_fn`` over samples of 0 or 1 image, all of one size: the
    image inputs of the samples that have one, stacked, and, where some sample has none, where they
    are (``_mimo_sample_indices``, PR #4986); the stacked patches become the encoder's patch-packed
    input, as :func:`collate`'s."""
    from megatron.bridge.data.megatron_mimo.collate import megatron_mimo_collate_fn

    text = ("input_ids", "labels", "loss_mask", "attention_mask", "position_ids")
    items = [{**{k: s[k] for k in text}, "modality_inputs": {vision: {
        "hidden_states": s["hidden_states"], "grid_thw": s["grid_thw"]}} if s["grid_thw"].numel() else {}}
        for s in samples]
    batch = megatron_mimo_collate_fn(items, modality_names=[vision])
    images = batch["modality_inputs"].get(vision)
    if images is not None:
        batch["modality_inputs"][vision] = {ENCODER_NAME: {k: images[k].flatten(0, 1)
                                                           for k in ("hidden_states", "grid_thw")}}
    batch[SAMPLE_ID_KEY] = torch.tensor([s["sample_id"] for s in samples], dtype=torch.long)
    return batch


def model_batches(batches, *, keep_attention_mask: bool = False, seen_ids: Optional[list] = None,
                  local_view: Optional[Callable[[dict], dict]] = None, seen_patches: Optional[list] = None):
    """Adapt loader batches for ``MimoModel.forward``, as Bridge's Qwen3.5-VL example does.

    The sample ids are removed from the batch (the model takes no such input) and recorded into
    ``seen_ids``, with the image patches into ``seen_patches``. ``local_view`` maps a small view
    of the batch to what this replica will actually process — pass the forward step's own
    ``slice_batch_for_megatron_mimo`` bound to the replica's (dp_rank, dp_size), so a global batch
    is cut exactly as the step will cut it. The ``[B, S]`` padding mask is dropped (causal
    attention + loss_mask already ignore right padding) unless a packer needs it.
    """
    from mimo_accel.runtime.reading.shard import SHARD_TAG_KEY

    for batch in batches:
        ids = batch.pop(SAMPLE_ID_KEY, None)
        if ids is not None and (seen_ids is not None or seen_patches is not None):
            view = {SAMPLE_ID_KEY: ids, "modality_inputs": batch.get("modality_inputs")}
            if SHARD_TAG_KEY in batch:
                view[SHARD_TAG_KEY] = batch[SHARD_TAG_KEY]
            view = local_view(view) if local_view is not None else view
            if seen_ids is not None:
                seen_ids.append(view[SAMPLE_ID_KEY].tolist())
            if seen_patches is not None:
                vi = (view.get("modality_inputs") or {}).get(VISION, {}).get(ENCODER_NAME)
                seen_patches.append(int(vi["grid_thw"].prod(dim=-1).sum()) if vi and vi["grid_thw"].numel() else 0)
        if not keep_attention_mask:
            batch["attention_mask"] = None
        yield batch


def _provider_class():
    from megatron.bridge.data.megatron_mimo.base_provider import MegatronMIMODatasetProvider

    @dataclass(kw_only=True)
    class SyntheticMIMOProvider(MegatronMIMODatasetProvider):
        """A MegatronMIMO dataset provider over :class:`SyntheticVLMDataset` (a validation split
        where asked for one, made the same way)."""

        dataset_factory: Callable[[int], torch.utils.data.Dataset] = None

        def build_datasets(self, context):
            valid = self.dataset_factory(context.valid_samples) if context.valid_samples else None
            return self.dataset_factory(context.train_samples), valid, None

        def get_collate_fn(self):
            return collate

    return SyntheticMIMOProvider


def make_data_provider(dataset_factory: Callable[[int], torch.utils.data.Dataset], *,
                       dataloader_type: str = "single", drop_last: bool = True):
    cls = _provider_class()
    return cls(dataset_factory=dataset_factory, dataloader_type=dataloader_type, num_workers=0,
               pin_memory=False, persistent_workers=False, drop_last=drop_last, data_sharding=True)


# ----------------------------------------------------------------------------------------------
# Real image files through Bridge's MegatronMIMODataset (offline: no downloads)
# ----------------------------------------------------------------------------------------------

OFFLINE_WORDS = ("[PAD]", "[UNK]", "[BOS]", "a", "cat", "dog", "describe", "the", "picture", "what", "is", "this",
                 "user", "assistant")
OFFLINE_SPECIAL = ("<|image_pad|>", "<|vision_start|>", "<|vision_end|>", "<|im_start|>", "<|im_end|>",
                   "<|video_pad|>")
QWEN2_PATCH_DIM = 3 * 2 * 14 * 14  # channels · temporal_patch_size · patch_size²: Qwen2-VL pixel_values rows


def offline_tokenizer(words: Sequence[str] = OFFLINE_WORDS, special_tokens: Sequence[str] = OFFLINE_SPECIAL):
    """A real fast HF tokenizer with a tiny word-level vocabulary and a BOS token (no downloads).

    Ids: ``[PAD]`` 0, ``[UNK]`` 1, ``[BOS]`` 2 (prepended to every text), the words, then the
    special tokens — all far below :data:`IMAGE_TOKEN_ID`.
    """
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="[BOS] $A", special_tokens=[("[BOS]", 2)])
    t = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", bos_token="[BOS]")
    t.add_special_tokens({"additional_special_tokens": list(special_tokens)})
    return t


@dataclass(frozen=True)
class ImageMix:
    """What :func:`image_examples` draws, receipts-like: some samples have no image, a few carry a
    large (tall) image, most a small one. Sides in pixels, both ends inclusive."""

    no_image: float = 0.25
    large: float = 0.15  # of all samples
    small_sides: tuple[int, int] = (24, 96)
    large_height: tuple[int, int] = (600, 1400)
    large_width: tuple[int, int] = (200, 500)
    words: tuple[int, int] = (3, 40)
    # Receipts-like instead (``no_image``, ``large`` and the sides above then unused): every sample
    # has one image, height lognormal (median px, sigma, min px, max px), width uniform in
    # ``tall_width`` px: narrow images with a long tail of very tall ones.
    tall: Optional[tuple[float, float, int, int]] = None
    tall_width: tuple[int, int] = (96, 128)


#: ``--image-mix`` choices of examples/train_mimo.py. "receipts": workloads/receipts.toml's
#: rehearsal sizes in pixels (16 px patches: height median 16 patches, sigma 0.9, 8-120; width
#: 6-8), one image per sample, so upstream as shipped can split every micro-batch by image count.
IMAGE_MIXES = {"default": ImageMix(),
               "receipts": ImageMix(no_image=0.0, large=0.0, tall=(256.0, 0.9, 128, 1920), tall_width=(96, 128)),
               # every image the same size (a fixed-resolution document set): nothing for a plan to move
               # in the encoder, only the texts' lengths differ
               "fixed": ImageMix(no_image=0.0, large=0.0, tall=(256.0, 0.0, 256, 256), tall_width=(112, 112))}


def _write_image_once(path, height: int, width: int, rng) -> None:
    """Write a deterministic image to ``path`` unless it exists; atomic (written beside, renamed
    over), so ranks writing the same file at once are safe."""
    import os

    import numpy as np
    from PIL import Image

    if path.exists():
        return
    coarse = rng.integers(0, 256, size=(max(1, height // 8), max(1, width // 8), 3), dtype=np.uint8)
    image = Image.fromarray(coarse, "RGB").resize((width, height), Image.NEAREST)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    image.save(tmp, format="JPEG" if path.suffix == ".jpg" else "PNG")
    os.replace(tmp, path)


def image_examples(root, num_samples: int, *, seed: int = 0, mix: ImageMix = ImageMix()) -> list[dict]:
    """``num_samples`` examples ``{"image": path or None, "text": str}`` over real JPEG/PNG files
    written under ``root`` (created; files already there are reused).

    Deterministic in (seed, sample, mix): every rank computes the same list and may write the
    same files concurrently. A file's name carries its split seed, sample and size.
    """
    from pathlib import Path

    import numpy as np

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    words = [w for w in OFFLINE_WORDS if not w.startswith("[")]
    out = []
    for i in range(num_samples):
        rng = np.random.default_rng([seed, i])
        draw = float(rng.random())
        count = int(rng.integers(*mix.words, endpoint=True))
        text = " ".join(words[int(j)] for j in rng.integers(0, len(words), count))
        if mix.tall is not None:
            median, sigma, low, high = mix.tall
            h = int(min(high, max(low, round(float(rng.lognormal(np.log(median), sigma))))))
            w = int(rng.integers(*mix.tall_width, endpoint=True))
        elif draw < mix.no_image:
            out.append({"image": None, "text": text})
            continue
        elif draw < mix.no_image + mix.large:
            h = int(rng.integers(*mix.large_height, endpoint=True))
            w = int(rng.integers(*mix.large_width, endpoint=True))
        else:
            h, w = (int(x) for x in rng.integers(*mix.small_sides, size=2, endpoint=True))
        path = root / f"s{seed}-{i:06d}-{w}x{h}.{'jpg' if i % 2 else 'png'}"
        _write_image_once(path, h, w, rng)
        out.append({"image": str(path), "text": text})
    return out


def collate_mimo_images(samples: Sequence[dict], *, patch_dim: int = QWEN2_PATCH_DIM, vision: str = VISION) -> dict:
    """Collate ``MegatronMIMODataset`` items whose images have native-resolution (varying) patch
    counts: stack the text tensors, and concatenate the images' ``pixel_values`` ``[patches,
    patch_dim]`` and ``image_grid_thw`` in sample order into the encoder's patch-packed inputs
    ``modality_inputs[vision][ENCODER_NAME] = {hidden_states [Σpatches, patch_dim], grid_thw
    [images, 3]}``. (Bridge 0.6.2's ``megatron_mimo_collate_fn`` tries to stack them and, when
    sizes differ, keeps a list the encoder cannot take.) Samples without an image add nothing;
    a batch without any gives empty tensors. A ``sample_id`` on the items becomes
    ``batch[SAMPLE_ID_KEY]``. ``vision``: the image modality's (module's) name."""
    batch = {k: torch.stack([s[k] for s in samples])
             for k in ("input_ids", "labels", "loss_mask", "attention_mask", "position_ids")}
    batch["modality_inputs"] = {vision: _patch_packed_images(samples, vision, patch_dim)}
    if samples and "sample_id" in samples[0]:
        batch[SAMPLE_ID_KEY] = torch.tensor([s["sample_id"] for s in samples], dtype=torch.long)
    return batch


def collate_mimo_media(samples: Sequence[dict], *, vision: str = VISION, audio: str = AUDIO,
                       patch_dim: int = QWEN2_PATCH_DIM, mel_bins: int = MEL_BINS) -> dict:
    """:func:`collate_mimo_images` for items carrying images (modality ``vision``) and audio clips
    (modality ``audio``): the images patch-packed as there, the clips clip-packed
    (:func:`mimo_accel_dev.rehearse.audio.collate_clips`: ``input_features [Σ frames, mel bins]`` and
    ``frames [clips]``), both in sample order."""
    batch = collate_mimo_images(samples, patch_dim=patch_dim, vision=vision)
    batch["modality_inputs"][audio] = audio_mod.collate_clips(samples, audio, mel_bins)
    return batch


def _patch_packed_images(samples: Sequence[dict], modality: str, patch_dim: int) -> dict:
    """``{ENCODER_NAME: {hidden_states, grid_thw}}`` of the samples' images (see collate_mimo_images)."""
    pixels, grids = [], []
    for n, s in enumerate(samples):
        vision = (s.get("modality_inputs") or {}).get(modality)
        if not vision:
            continue
        pv, grid = vision["pixel_values"], vision["image_grid_thw"].reshape(-1, 3).to(torch.long)
        pv = pv.reshape(-1, pv.size(-1))
        if pv.size(-1) != patch_dim or pv.size(0) != int(grid.prod(dim=-1).sum()):
            raise ValueError(f"collate_mimo_images: sample {n} has pixel_values {tuple(pv.shape)} for "
                             f"image_grid_thw {grid.tolist()}; expected [Σ t·h·w, {patch_dim}]")
        pixels.append(pv)
        grids.append(grid)
    return {ENCODER_NAME: {
        "hidden_states": torch.cat(pixels) if pixels else torch.zeros(0, patch_dim),
        "grid_thw": torch.cat(grids) if grids else torch.zeros(0, 3, dtype=torch.long),
    }}


def _identified_mimo_dataset_class():
    from megatron.bridge.data.megatron_mimo.dataset import MegatronMIMODataset

    class IdentifiedMIMODataset(MegatronMIMODataset):
        """Bridge's ``MegatronMIMODataset``, unchanged, with each item's index as ``sample_id``
        (for tracing which samples a rank trained). Still a ``MegatronMIMODataset``: mimo_accel
        derives its per-sample costs from its raw examples like the parent's."""

        def __getitem__(self, idx: int) -> dict:
            item = super().__getitem__(idx)
            item["sample_id"] = idx
            return item

    # picklable (DataLoader workers) as mimo_accel_dev.rehearse.stack.IdentifiedMIMODataset, through __getattr__
    IdentifiedMIMODataset.__module__ = __name__
    IdentifiedMIMODataset.__qualname__ = "IdentifiedMIMODataset"
    return IdentifiedMIMODataset


@dataclass(frozen=True)
class GridRows:
    """Placeholders of one image item: ``t·h·w / merge²`` of its ``image_grid_thw`` (a
    native-resolution encoder such as Qwen3-VL's), at most ``cap``."""

    merge: int = 2
    owner: str = "GridPlaceholderMIMODataset"  # who refuses a grid (the error's first word)

    @property
    def rows_per_placeholder(self) -> int:
        """Encoder rows (patches) per placeholder, as mimo_accel's cost probe counts them."""
        return self.merge * self.merge

    def __call__(self, modality: str, inputs: dict, cap: Optional[int]) -> Optional[int]:
        grid = inputs.get("image_grid_thw") if isinstance(inputs, dict) else None
        if grid is None:
            return None
        patches = int(torch.as_tensor(grid).reshape(-1, 3).prod(dim=-1).sum())
        rows = patches // (self.merge * self.merge)
        if patches % (self.merge * self.merge) or (cap is not None and rows > cap):
            raise ValueError(
                f"{self.owner}: modality {modality!r} image grid {grid.tolist()} gives "
                f"{patches} patches = {patches / self.merge ** 2:g} rows at merge {self.merge}; expected a "
                f"whole number of at most encoder_seq_lengths[{modality!r}] = {cap} (the processor's "
                "max_pixels and merge_size must match the encoder)")
        return rows


def _item_placeholder_dataset_class():
    base = __getattr__("IdentifiedMIMODataset")

    class ItemPlaceholderMIMODataset(base):
        """``IdentifiedMIMODataset`` whose placeholders per item follow what the encoder makes of it.

        Bridge 0.6.2's ``MegatronMIMODataset._tokenize_with_placeholders``
        (megatron/bridge/data/megatron_mimo/dataset.py) inserts ``encoder_seq_lengths[modality]``
        placeholders for every item: right for a fixed-resolution encoder (CLIP) or a fixed-length
        one (Whisper padding every clip to 30 s), wrong for a native-resolution image encoder or an
        audio encoder over clips of their own length (the language side raises when counts differ).
        ``rows_rules[modality](modality, inputs, cap)`` gives an item's rows from its processed
        inputs (:class:`GridRows`, :class:`mimo_accel_dev.rehearse.audio.ClipRows`; None: Bridge's
        fixed count); this thin subclass inserts that many, and keeps Bridge's placement,
        truncation and padding by calling the parent with the item's own count.
        ``encoder_seq_lengths[modality]`` stays the most rows one item can become: the parent
        checks their sum against ``seq_length``, and an item above it is refused. (A cost index
        derived from the examples counts that maximum per item in its ``tokens`` column.)
        ``cost_index``: what the dataset carries as ``mimo_accel_cost_index`` (None: derived).
        """

        def __init__(self, *args: Any, rows_rules: Optional[dict] = None, cost_index: Any = None, **kwargs: Any):
            super().__init__(*args, **kwargs)
            self.rows_rules = dict(rows_rules or {})
            self.mimo_accel_cost_index = cost_index

        @property
        def mimo_accel_rows_per_placeholder(self) -> dict:
            """Per modality, encoder rows per placeholder token (what mimo_accel's cost probe needs to
            count this dataset's real tokens: its placeholders follow the items' rows)."""
            return {m: rule.rows_per_placeholder for m, rule in self.rows_rules.items()
                    if getattr(rule, "rows_per_placeholder", None)}

        def _tokenize_with_placeholders(self, text, modality_inputs):
            counts = {}
            for modality, inputs in modality_inputs.items():
                rule = self.rows_rules.get(modality)
                if rule is None or modality not in self.special_token_ids:
                    continue
                rows = rule(modality, inputs, self.encoder_seq_lengths.get(modality))
                if rows is not None:
                    counts[modality] = rows
            caps = self.encoder_seq_lengths
            # One item at a time (a DataLoader worker owns its copy of the dataset).
            self.encoder_seq_lengths = {**caps, **counts}
            try:
                return super()._tokenize_with_placeholders(text, modality_inputs)
            finally:
                self.encoder_seq_lengths = caps

    ItemPlaceholderMIMODataset.__module__ = __name__
    ItemPlaceholderMIMODataset.__qualname__ = "ItemPlaceholderMIMODataset"
    return ItemPlaceholderMIMODataset


def _grid_placeholder_dataset_class():
    base = __getattr__("ItemPlaceholderMIMODataset")

    class GridPlaceholderMIMODataset(base):
        """``IdentifiedMIMODataset`` whose placeholders per image follow the image's grid.

        Bridge 0.6.2 inserts a fixed ``encoder_seq_lengths[modality]`` placeholders for every
        image: wrong for a native-resolution encoder (Qwen3-VL gives ``t·h·w / merge²`` rows per
        image). This thin subclass inserts that many instead (:class:`GridRows` for every modality
        with a placeholder token; see :class:`ItemPlaceholderMIMODataset`).
        ``encoder_seq_lengths[modality]`` stays the most rows one image can become (the
        processor's ``max_pixels`` bound): the parent checks it against ``seq_length``, and an
        image above it is refused here. (A cost index derived from the examples counts that
        maximum per image in its ``tokens`` column, which only the fan-out token balance reads.)
        """

        def __init__(self, *args: Any, merge: int = 2, **kwargs: Any):
            super().__init__(*args, **kwargs)
            self.merge = merge
            self.rows_rules = {m: GridRows(merge) for m in self.special_token_ids}

    GridPlaceholderMIMODataset.__module__ = __name__
    GridPlaceholderMIMODataset.__qualname__ = "GridPlaceholderMIMODataset"
    return GridPlaceholderMIMODataset


_lazy: dict = {}
_LAZY_CLASSES = {"IdentifiedMIMODataset": _identified_mimo_dataset_class,
                 "ItemPlaceholderMIMODataset": _item_placeholder_dataset_class,
                 "GridPlaceholderMIMODataset": _grid_placeholder_dataset_class}


def __getattr__(name: str):
    # These subclass a Bridge class; Bridge is imported on first use only.
    if name in _LAZY_CLASSES:
        if name not in _lazy:
            _lazy[name] = _LAZY_CLASSES[name]()
        return _lazy[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def images_dataset(root, num_samples: int, *, seq_length: int, image_rows: int, seed: int = 0,
                   mix: ImageMix = ImageMix(), processor: Any = None, placeholders: str = "fixed",
                   merge: int = 2, vision: str = VISION):
    """Bridge's ``MegatronMIMODataset`` over :func:`image_examples`: the offline tokenizer,
    ``processor`` (default Qwen2-VL's image processor) and placeholder tokens
    (:data:`IMAGE_TOKEN_ID`) per image:

    - ``placeholders="fixed"``: an :class:`IdentifiedMIMODataset` with ``image_rows`` per image
      (Bridge's own behaviour; the encoder must resample every image to that many rows);
    - ``placeholders="grid"``: a :class:`GridPlaceholderMIMODataset` with ``t·h·w / merge²``
      per image (a native-resolution encoder such as Qwen3-VL's); ``image_rows`` is the most one
      image may take, which ``processor``'s ``max_pixels`` must respect.

    ``vision``: the image modality's name (the encoder module's).
    """
    if placeholders not in ("fixed", "grid"):
        raise ValueError(f"images_dataset: placeholders must be 'fixed' or 'grid', got {placeholders!r}")
    kwargs = dict(examples=image_examples(root, num_samples, seed=seed, mix=mix),
                  processors={vision: processor if processor is not None else qwen_image_processor()},
                  tokenizer=offline_tokenizer(), seq_length=seq_length,
                  special_token_ids={vision: IMAGE_TOKEN_ID}, encoder_seq_lengths={vision: image_rows},
                  modality_columns={vision: "image"})
    if placeholders == "grid":
        return __getattr__("GridPlaceholderMIMODataset")(merge=merge, **kwargs)
    return __getattr__("IdentifiedMIMODataset")(**kwargs)


def media_examples(root, num_samples: int, *, seed: int = 0, mix: ImageMix = ImageMix(),
                   audio_mix: AudioMix = AudioMix()) -> list[dict]:
    """:func:`image_examples` (0/1 image per sample, the text) with an ``"audio"`` column: the path of
    a real WAV file (0/1 clip per sample, variable length, :func:`mimo_accel_dev.rehearse.audio.audio_clips`)
    or None. All files under ``root``, written once, deterministic in (seed, sample, mixes)."""
    examples = image_examples(root, num_samples, seed=seed, mix=mix)
    clips = audio_mod.audio_clips(root, num_samples, seed=seed, mix=audio_mix)
    return [dict(example, audio=clip) for example, clip in zip(examples, clips)]


def media_dataset(root, num_samples: int, *, seq_length: int, image_rows: int, seed: int = 0,
                  mix: ImageMix = ImageMix(), audio_mix: AudioMix = AudioMix(), processor: Any = None,
                  placeholders: str = "fixed", merge: int = 2, vision: str = VISION, audio: str = AUDIO,
                  audio_padding: str = "longest", cost_index: Any = None):
    """Bridge's ``MegatronMIMODataset`` over :func:`media_examples`: two modalities, images
    (``vision``: ``processor``, default Qwen2-VL's, and ``placeholders`` per image as in
    :func:`images_dataset`) and audio clips (``audio``: read with ``soundfile``, log-mel features
    from transformers' ``WhisperFeatureExtractor`` without its 30 s padding — see
    :class:`~mimo_accel_dev.rehearse.audio.AudioFileFeatures` — and as many placeholders
    (:data:`AUDIO_TOKEN_ID`) per clip as the audio encoder gives rows). An
    :class:`ItemPlaceholderMIMODataset`; ``cost_index``: the ``mimo_accel_cost_index`` it carries
    (None: mimo_accel derives one when reorder needs it)."""
    if placeholders not in ("fixed", "grid"):
        raise ValueError(f"media_dataset: placeholders must be 'fixed' or 'grid', got {placeholders!r}")
    if vision == audio or LANGUAGE in (vision, audio):
        raise ValueError(f"media_dataset: the image and audio modalities need two names apart from "
                         f"{LANGUAGE!r}, got {vision!r} and {audio!r}")
    rules = {audio: audio_mod.ClipRows()}
    if placeholders == "grid":
        rules[vision] = GridRows(merge, owner="media_dataset")
    features = audio_mod.AudioFileFeatures(padding=audio_padding)
    # the most rows one clip can become: the mix's longest clip, or Whisper's 30 s when padded to it
    audio_cap = (audio_mix.max_rows if audio_padding == "longest"
                 else audio_mod.clip_rows(audio_mod.frames_of(features.feature_extractor.n_samples)))
    return __getattr__("ItemPlaceholderMIMODataset")(
        examples=media_examples(root, num_samples, seed=seed, mix=mix, audio_mix=audio_mix),
        processors={vision: processor if processor is not None else qwen_image_processor(), audio: features},
        tokenizer=offline_tokenizer(), seq_length=seq_length,
        special_token_ids={vision: IMAGE_TOKEN_ID, audio: AUDIO_TOKEN_ID},
        encoder_seq_lengths={vision: image_rows, audio: audio_cap},
        modality_columns={vision: "image", audio: "audio"}, rows_rules=rules, cost_index=cost_index)


# ----------------------------------------------------------------------------------------------
# Model, communicator, optimizer — as Bridge's setup_megatron_mimo builds them
# ----------------------------------------------------------------------------------------------


ENCODERS = ("native", "qwen3vl")


@dataclass
class StackConfig:
    layout: Modules
    hidden: int = 32
    vision_hidden: int = 32
    vision_layers: int = 1
    language_layers: int = 1
    # The language model's layers on its first / last PP stage (megatron-core's
    # num_layers_in_{first,last}_pipeline_stage; the rest even over the stages between). None: even.
    language_first: Optional[int] = None
    language_last: Optional[int] = None
    # megatron-core's recompute_granularity of the language model: None, "selective" (core attention) or
    # "full" (each layer's input kept: recompute_method "uniform", one layer a chunk)
    language_recompute: Optional[str] = None
    heads: int = 4
    vision_heads: Optional[int] = None  # None: ``heads``
    # None: the encoder's own — 24 for NativeViT, 1536 (3·2·16²) for qwen3vl, which takes no other.
    patch_dim: Optional[int] = None
    vocab_size: int = 2048
    seq_length: int = 64
    merge: int = 2
    seed: int = 1234
    lr: float = 1e-3
    # None: the encoder merges merge² patches into a row (rows ∝ patches, one placeholder per
    # row). R: it ends with a per-image resampler to exactly R rows (Bridge 0.6.2's
    # MegatronMIMODataset inserts a fixed encoder_seq_lengths[vision] placeholders per image).
    resample_rows: Optional[int] = None
    # "native": the project's NativeViT; "qwen3vl": Bridge's Qwen3VLVisionModel (mimo_accel_dev.rehearse.qwen3vl),
    # vision_hidden / vision_layers / heads / merge sized, rows per image = t·h·w / merge².
    encoder: str = "native"
    # The modules are the layout's encoders (named by the user) and the language model. The image
    # encoder's name: None = the layout's encoder that is not ``audio_module`` (with one encoder:
    # that one). ``audio_module``: the name of an audio encoder (mimo_accel_dev.rehearse.audio's
    # AudioEncoder, audio_hidden / audio_layers / audio_heads sized, over mel_bins log-mel bins);
    # None: no audio encoder.
    vision_module: Optional[str] = None
    audio_module: Optional[str] = None
    audio_hidden: int = 32
    audio_layers: int = 1
    audio_heads: Optional[int] = None  # None: ``heads``
    mel_bins: int = MEL_BINS

    def __post_init__(self):
        names = tuple(m.name for m in self.layout.encoders)
        others = [n for n in names if n != self.audio_module]
        if self.audio_module is not None and self.audio_module not in names:
            raise ValueError(f"StackConfig: audio_module {self.audio_module!r} is not an encoder of the layout "
                             f"(encoders: {', '.join(names)})")
        if self.vision_module is None:
            if len(others) != 1:
                raise ValueError(f"StackConfig: the layout's encoders are {', '.join(names)}; the stack builds one "
                                 "image encoder (vision_module) and at most one audio encoder (audio_module)")
            self.vision_module = others[0]
        if sorted(names) != sorted({self.vision_module, *([self.audio_module] if self.audio_module else [])}):
            raise ValueError(f"StackConfig: the layout's encoders are {', '.join(names)}, but the stack builds "
                             f"vision_module={self.vision_module!r} and audio_module={self.audio_module!r}")
        if self.encoder not in ENCODERS:
            raise ValueError(f"StackConfig: unknown encoder {self.encoder!r}; choose one of {ENCODERS}")
        if self.encoder == "qwen3vl":
            from mimo_accel_dev.rehearse.qwen3vl import PATCH_DIM

            if self.patch_dim not in (None, PATCH_DIM):
                raise ValueError(f"StackConfig: the qwen3vl encoder takes patch_dim {PATCH_DIM} (3·2·16²: "
                                 f"Qwen3-VL's pixel_values rows), got {self.patch_dim}; leave patch_dim unset")
            if self.resample_rows is not None:
                raise ValueError("StackConfig: the qwen3vl encoder has no resampler (its merger gives "
                                 "t·h·w / merge² rows per image); leave resample_rows unset and place that "
                                 "many placeholders per image (images_dataset(placeholders='grid'))")
            self.patch_dim = PATCH_DIM
        elif self.patch_dim is None:
            self.patch_dim = 24
        if self.language_first is not None or self.language_last is not None:
            from mimo_accel.tools.layout.spec import stage_layers

            # refused here, naming the fix, rather than by megatron-core's config mid-build
            stage_layers(self.language_layers, self.layout.language.pp, self.language_first, self.language_last)


def encoder_transformer_config(provider, module: str = VISION):
    """An encoder module's TransformerConfig inside a provider built by :func:`build_provider`
    (default: the vision encoder's)."""
    (spec,) = provider.modality_submodules_spec[module].submodules["encoders"].values()
    params = spec.params
    return params["transformer_config"] if "transformer_config" in params else params["config"]


def encoder_transformer_configs(provider) -> dict:
    """Module name -> TransformerConfig of every encoder in a provider built by :func:`build_provider`."""
    return {name: encoder_transformer_config(provider, name) for name in provider.modality_submodules_spec}


def _vision_config(cfg: StackConfig):
    return _transformer_config(cfg.vision_layers, cfg.vision_hidden, cfg.vision_heads or cfg.heads,
                               cfg.layout[cfg.vision_module])


def _audio_config(cfg: StackConfig):
    return _transformer_config(cfg.audio_layers, cfg.audio_hidden, cfg.audio_heads or cfg.heads,
                               cfg.layout[cfg.audio_module])


def _language_config(cfg: StackConfig):
    full = dict(recompute_method="uniform", recompute_num_layers=1) if cfg.language_recompute == "full" else {}
    return _transformer_config(cfg.language_layers, cfg.hidden, cfg.heads, cfg.layout.language,
                               num_layers_in_first_pipeline_stage=cfg.language_first,
                               num_layers_in_last_pipeline_stage=cfg.language_last,
                               recompute_granularity=cfg.language_recompute, **full)


def _transformer_config(num_layers: int, hidden: int, heads: int, module: Optional[Module] = None, **split):
    from megatron.core.transformer.transformer_config import TransformerConfig

    # TP/PP sizes as the module's grid has them (megatron-core builds layers from the config's)
    tp, pp = (module.tp, module.pp) if module is not None else (1, 1)
    return TransformerConfig(
        num_layers=num_layers, hidden_size=hidden, ffn_hidden_size=2 * hidden,
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp,
        num_attention_heads=heads, use_cpu_initialization=True, variable_seq_lengths=True,
        pipeline_dtype=torch.float32, bf16=False, hidden_dropout=0.0, attention_dropout=0.0,
        bias_activation_fusion=False, bias_dropout_fusion=False, apply_rope_fusion=False,
        masked_softmax_fusion=False, gradient_accumulation_fusion=False,
        moe_token_dispatcher_type="alltoall",  # required with variable_seq_lengths
        **split,
    )


@functools.lru_cache(maxsize=None)
def _owning_groups(submodules_class: type) -> type:
    """``submodules_class`` that owns the process groups Bridge's provider hands its encoders.

    Megatron-LM main (#6570, megatron/core/models/mimo/optimizer.py ``get_mimo_optimizer``) builds
    each module's optimizer from the modality submodule's own ``pg_collection``; Bridge main
    (067f987, ``MegatronMIMOProvider._inject_pg_collection_into_modality_spec``) injects it into the
    encoders' params only, so its own providers fail there. This is what Bridge will have to do."""

    class Owning(submodules_class):
        @classmethod
        def from_spec(cls, module_spec, *args, **kwargs):
            built = super().from_spec(module_spec, *args, **kwargs)
            if built.pg_collection is None:
                encoders = (module_spec.submodules or {}).get("encoders", {}).values()
                built.pg_collection = next((e.params["pg_collection"] for e in encoders
                                            if "pg_collection" in (e.params or {})), None)
            return built

    Owning.__name__ = Owning.__qualname__ = submodules_class.__name__
    return Owning


def build_provider(cfg: StackConfig):
    """The ``MegatronMIMOProvider`` for the tiny stack (not yet built)."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.models.mimo.submodules.audio import AudioModalitySubmodules
    from megatron.core.models.mimo.submodules.vision import VisionModalitySubmodules
    from megatron.core.transformer.spec_utils import ModuleSpec

    from megatron.bridge.models.megatron_mimo.megatron_mimo_provider import MegatronMIMOProvider

    if cfg.encoder == "qwen3vl":
        from mimo_accel_dev.rehearse import qwen3vl

        encoder = qwen3vl.encoder_spec(hidden=cfg.vision_hidden, layers=cfg.vision_layers,
                                       heads=cfg.vision_heads or cfg.heads,
                                       out_hidden=cfg.hidden, merge=cfg.merge)
    else:
        encoder = ModuleSpec(module=NativeViT, params=dict(
            config=_vision_config(cfg), patch_dim=cfg.patch_dim, out_hidden=cfg.hidden,
            merge=cfg.merge, resample_rows=cfg.resample_rows))
    submodules = {cfg.vision_module: ModuleSpec(module=_owning_groups(VisionModalitySubmodules), params={},
                                                submodules={"encoders": {ENCODER_NAME: encoder}})}
    special = {cfg.vision_module: IMAGE_TOKEN_ID}
    if cfg.audio_module is not None:
        clips = ModuleSpec(module=audio_mod.AudioEncoder, params=dict(
            transformer_config=_audio_config(cfg), num_mel_bins=cfg.mel_bins, out_hidden=cfg.hidden))
        submodules[cfg.audio_module] = ModuleSpec(module=_owning_groups(AudioModalitySubmodules), params={},
                                                  submodules={"encoders": {AUDIO_ENCODER_NAME: clips}})
        special[cfg.audio_module] = AUDIO_TOKEN_ID
    names = [m.name for m in cfg.layout.encoders]  # rank order
    layer_spec = get_gpt_layer_local_spec()
    layer_spec.submodules.self_attention.submodules.core_attention = packed_local_attention()
    layer_spec.module, layer_spec.params = seeded_transformer_layer(), {**layer_spec.params, "init_seed": cfg.seed}
    language = ModuleSpec(module=GPTModel, params=dict(
        config=_language_config(cfg), transformer_layer_spec=layer_spec,
        vocab_size=cfg.vocab_size, max_sequence_length=cfg.seq_length))
    return MegatronMIMOProvider(
        language_model_spec=language,
        modality_submodules_spec={name: submodules[name] for name in names},
        special_token_ids={name: special[name] for name in names},
        megatron_mimo_parallelism_config=parallelism_config(cfg.layout),
        topology={**{name: [LANGUAGE] for name in names}, LANGUAGE: []},
        bf16=False,
    )


@dataclass
class Stack:
    """What ``setup_megatron_mimo`` hands the training loop, for the tiny model."""

    cfg: StackConfig
    provider: Any
    model: Any
    infra: Any
    communicator: Any
    pg_collection: Any
    module_to_grid_tuple: list
    optimizer: Any

    def train_step(self, data_iterator, num_microbatches: int, micro_batch_size: int,
                   forward_step_func: Optional[Callable] = None):
        """One iteration: zero grads, forward/backward through the pipeline schedule, optimizer step.

        Returns (losses_reduced, grad_norm). ``forward_step_func`` defaults to Bridge's MIMO
        ``forward_step`` looked up at call time (so a patched step is used when patched).
        """
        from functools import partial

        from megatron.core.pipeline_parallel.schedules import forward_backward_pipelining_without_interleaving

        from megatron.bridge.training import megatron_mimo_step
        from megatron.bridge.training.megatron_mimo_parallel_utils import zero_grad_buffer_for_multimodule

        if forward_step_func is None:
            # upstream main reads state.cfg.dataset (step packing); 0.6.2 reads nothing of state
            forward_step_func = partial(megatron_mimo_step.forward_step, step_state())
        zero_grad_buffer_for_multimodule(self.module_to_grid_tuple)
        losses = forward_backward_pipelining_without_interleaving(
            forward_step_func=forward_step_func, data_iterator=data_iterator, model=[self.model],
            num_microbatches=num_microbatches, seq_length=self.cfg.seq_length,
            micro_batch_size=micro_batch_size, forward_only=False,
            p2p_communicator=self.communicator, pg_collection=self.pg_collection)
        _, grad_norm, _ = self.optimizer.step()
        return losses, grad_norm


def build_stack(cfg: StackConfig) -> Stack:
    """Build the model, communicator and optimizer as ``setup_megatron_mimo`` does (collective)."""
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.models.mimo.optimizer import get_mimo_optimizer
    from megatron.core.optimizer import OptimizerConfig
    from megatron.core.pipeline_parallel.multimodule_communicator import MultiModulePipelineCommunicator
    from megatron.core.utils import get_model_config

    from megatron.bridge.models.megatron_mimo import build_megatron_mimo_model
    from megatron.bridge.training import setup_megatron_mimo as setup_mod
    from megatron.bridge.training.megatron_mimo_parallel_utils import (
        build_pg_collection_for_schedule,
        get_module_to_grid_tuple,
        unwrap_megatron_mimo_model,
    )

    provider = build_provider(cfg)
    model, infra = build_megatron_mimo_model(provider, ddp_config=DistributedDataParallelConfig(),
                                             fp16=False, bf16=False, seed=cfg.seed)
    model_config = get_model_config(model)
    if model_config.pipeline_dtype is None:
        model_config.pipeline_dtype = torch.float32
    communicator = MultiModulePipelineCommunicator(
        infra.module_to_grid_map, infra.topology, model_config,
        dim_mapping={"s": 0, "b": 1, "h": 2}, module_output_ndim=infra.module_output_ndim)
    pg_collection = build_pg_collection_for_schedule(infra)
    module_to_grid_tuple = get_module_to_grid_tuple(model, infra)
    # clip_grad=0: megatron's grad clipping asserts CUDA tensors (the norm is still computed).
    opt_cfg = OptimizerConfig(optimizer="adam", lr=cfg.lr, bf16=False, fp16=False,
                              use_distributed_optimizer=False, clip_grad=0.0)
    optimizer = get_mimo_optimizer(unwrap_megatron_mimo_model(model), opt_cfg)
    setup_mod._update_megatron_mimo_model_config_funcs(model, optimizer, infra, module_to_grid_tuple)
    return Stack(cfg, provider, model, infra, communicator, pg_collection, module_to_grid_tuple,
                 optimizer)


def module_parameters_with_grad(stack: Stack) -> tuple[int, int]:
    """(parameters with a non-zero main grad, parameters) on this rank."""
    total = with_grad = 0
    for p in stack.model.parameters():
        if not p.requires_grad:
            continue
        total += 1
        g = getattr(p, "main_grad", None)
        if g is None:
            g = p.grad
        if g is not None and bool(torch.isfinite(g).all()) and float(g.abs().sum()) > 0:
            with_grad += 1
    return with_grad, total


def uniform_spec(images_per_sample: int = 1, side: int = 4, text_tokens: int = 8) -> Callable[[int], SampleSpec]:
    return _UniformSpec(images_per_sample, side, text_tokens)


@dataclass(frozen=True)
class _UniformSpec:
    images: int
    side: int
    text: int

    def __call__(self, idx: int) -> SampleSpec:
        return SampleSpec(((self.side, self.side),) * self.images, self.text)


@dataclass(frozen=True)
class VariedSpec:
    """0/1/N images of varied sizes, decided by the sample id (deterministic, picklable)."""

    max_images: int = 3
    sides: tuple[int, ...] = (2, 4, 6, 8)
    text_tokens: tuple[int, int] = (4, 16)

    def __call__(self, idx: int) -> SampleSpec:
        g = torch.Generator().manual_seed(idx * 7919 + 17)
        n = int(torch.randint(0, self.max_images + 1, (1,), generator=g))
        sides = [self.sides[int(i)] for i in torch.randint(0, len(self.sides), (2 * n,), generator=g)]
        imgs = tuple((sides[2 * k], sides[2 * k + 1]) for k in range(n))
        lo, hi = self.text_tokens
        return SampleSpec(imgs, int(torch.randint(lo, hi + 1, (1,), generator=g)))
