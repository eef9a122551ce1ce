"""Bridge's direct HF SFT dataset (``DirectSFTDataset``, what ``DirectHFSFTDatasetBuilder`` builds for
the Qwen3.5-VL MegatronMIMO example), probed from its conversation examples.

Their ``{"type": "image"}`` parts hold a path, ``file://`` path, ``data:image`` URI, bytes or PIL
image. The Qwen collate's two resizes are reproduced: qwen_vl_utils' ``fetch_image`` (factor 28)
and then the processor with the collate's ``min_pixels``/``max_pixels``. Tokens are the chat
template's tokens with each image token expanded to its ``patches / merge²`` rows.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Mapping
from typing import Any, Iterator, Optional

import numpy as np

from mimo_accel.costs import ResizeRule
from mimo_accel.costs.index import DEFAULT_ENCODER, per_sample_sums
from mimo_accel.datasets.fingerprints import callable_name, relocatable, sha256_hex, tokenizer_fingerprint
from mimo_accel.datasets.processors import QwenFetchResize, qwen_resize_rule, unwrap
from mimo_accel.datasets.sources import (
    WAYS_OUT,
    DeriveError,
    Probed,
    SampleSource,
    ImageItem,
    RowInputs,
    local_path,
    per_sample_patches,
    read_sizes,
    token_lengths,
)

__all__ = ["ConversationSource"]


def _collate_of(dataset: Any) -> Any:
    """The collate function a Bridge DirectSFTDataset binds (a closure over it), or None."""
    fn = getattr(dataset, "collate_fn", None)
    try:
        free = inspect.getclosurevars(fn).nonlocals if fn is not None else {}
    except TypeError:
        free = {}
    for name in ("collate_impl", "collator"):
        impl = free.get(name)
        if impl is not None:
            return getattr(impl, "collate_fn", impl)
    try:  # Bridge resolves it by processor class name when none was given
        import sys

        registry = sys.modules.get("megatron.bridge.data.collators.registry")
        resolve = getattr(registry, "resolve_model_collate", None)
        return resolve(type(dataset._processor).__name__) if resolve else None
    except Exception:
        return None


def _pixel_bounds(collate: Any) -> tuple[bool, Optional[int], Optional[int]]:
    """(takes min/max pixels, min_pixels, max_pixels) of a collate: its defaults, then a partial's
    keywords."""
    collate, keywords = unwrap(collate)
    try:
        params = inspect.signature(collate).parameters
    except (TypeError, ValueError):
        return False, None, None
    if "min_pixels" not in params and "max_pixels" not in params:
        return False, None, None

    def value(name: str) -> Optional[int]:
        if name in keywords:
            return keywords[name]
        p = params.get(name)
        return None if p is None or p.default is inspect.Parameter.empty else p.default

    return True, value("min_pixels"), value("max_pixels")


class ConversationSource(SampleSource):
    """Bridge's direct HF SFT dataset (``DirectSFTDataset``): conversation examples, repeated to
    the target length, collated by the model's collate (Qwen: ``qwen2_5_collate_fn``)."""

    kind = "DirectSFTDataset"

    def __init__(self, dataset: Any):
        self.examples = dataset._base_examples
        self.base_length = len(self.examples)
        self.length = len(dataset)
        self.processor = dataset._processor
        self.tokenizer = getattr(self.processor, "tokenizer", None) or self.processor
        self.collate = _collate_of(dataset)
        takes_pixels, lo, hi = _pixel_bounds(self.collate)
        ip = getattr(self.processor, "image_processor", None)
        self.has_image_processor = ip is not None
        rule = qwen_resize_rule(ip, min_pixels=lo, max_pixels=hi) if ip is not None else None
        if ip is not None and rule is None:
            raise DeriveError(
                f"DirectSFTDataset with a {type(ip).__name__}: only Qwen-VL image processors (patch_size, "
                "merge_size) are understood. " + WAYS_OUT)
        # A Qwen collate resizes twice: qwen_vl_utils first, then the processor.
        self.pre = QwenFetchResize() if rule is not None and takes_pixels else None
        # its one image encoder, which the dataset does not name: the index's name for an unnamed
        # encoder; the planner pairs it with the layout's one encoder (CostIndex.column_for)
        self.rules = {DEFAULT_ENCODER: rule if rule is not None else ResizeRule()}
        self.merge = rule.merge_size if rule is not None else 1
        self.image_token = getattr(self.processor, "image_token", None) if rule is not None else None
        self.template = getattr(self.processor, "apply_chat_template", None)
        if not callable(self.template):
            raise DeriveError(f"DirectSFTDataset: its processor {type(self.processor).__name__} has no "
                              "apply_chat_template. " + WAYS_OUT)

    def fingerprint_material(self) -> dict[str, Any]:
        template = getattr(self.processor, "chat_template", None) or getattr(self.tokenizer, "chat_template", None)
        return {
            "pre_resize": self.pre.to_dict() if self.pre else None,
            "image_token": self.image_token,
            "chat_template": sha256_hex(json.dumps(template, sort_keys=True, default=str)),
            "tokenizer": tokenizer_fingerprint(self.tokenizer),
            "processor": type(self.processor).__name__,
            "collate": callable_name(self.collate),
        }

    def describe(self) -> str:
        return f"{self.kind} of {self.length:,} samples ({self.base_length:,} distinct)"

    def row_inputs(self, lo: int, hi: int) -> Iterator[RowInputs]:
        """Each base sample's local image files, no text a manifest could give (the chat template
        renders its turns), and its conversation and tools (what the template reads)."""
        for i in range(lo, hi):
            example = self.examples[i]
            conversation = example.get("conversation") if isinstance(example, Mapping) else None
            files = []
            if isinstance(conversation, list):
                for part in _vision_parts(conversation, i):
                    path = local_path(part["image"] if "image" in part else part.get("image_url"))
                    if path is not None:
                        files.append((path, "image"))
            inputs = ({"conversation": conversation, "tools": example.get("tools")} if isinstance(example, Mapping)
                      else example)
            yield RowInputs(i, tuple(files), None, _relocatable_example(inputs))

    def _probe_chunk(self, start: int, stop: int, workers: Optional[int]) -> Probed:
        images: list[ImageItem] = []
        texts = []
        for j in range(stop - start):
            i = start + j
            example = self.examples[i]
            conversation = example.get("conversation") if isinstance(example, Mapping) else None
            if not isinstance(conversation, list):
                raise DeriveError(f"example {i}: no \"conversation\" list; only conversation examples are "
                                  "understood. " + WAYS_OUT)
            for k, part in enumerate(_vision_parts(conversation, i)):
                where = f"example {i}, image {k}"
                if "video" in part and "image" not in part and "image_url" not in part:
                    raise DeriveError(f"{where}: video parts are not supported. " + WAYS_OUT)
                if not self.has_image_processor:
                    raise DeriveError(f"{where}: an image, but the processor {type(self.processor).__name__} "
                                      "has no image processor. " + WAYS_OUT)
                obj = part["image"] if "image" in part else part.get("image_url")
                im = ImageItem(j, obj, where, part=part)
                if self.pre is not None and not self.pre.needs_header(part):
                    im.size = (1, 1)  # replaced by the part's resized_height/width
                images.append(im)
            kwargs = {"tools": example["tools"]} if example.get("tools") is not None else {}
            try:
                texts.append(self.template(conversation, tokenize=False, **kwargs))
            except Exception as exc:
                raise DeriveError(f"example {i}: the chat template failed ({type(exc).__name__}: {exc})") from None
        read_sizes(images, workers)
        if self.pre is not None:
            _fetch_resize(images, self.pre)
        n = stop - start
        patches, sq, count, per_image = per_sample_patches(n, images, self.rules[DEFAULT_ENCODER])
        tokens = np.asarray(token_lengths(self.tokenizer, texts), dtype=np.int64).reshape(-1)
        if self.image_token:
            # The processor replaces each image token by the image's merged rows.
            rows, _, _ = per_sample_sums(n, [im.sample for im in images], per_image // (self.merge ** 2) - 1)
            tokens = tokens + rows
        return Probed(tokens, {DEFAULT_ENCODER: (count, patches, sq)})


def _vision_parts(conversation: list, i: int) -> list[Mapping[str, Any]]:
    """The image/video parts of a conversation, as qwen_vl_utils finds them."""
    parts = []
    for turn in conversation:
        content = turn.get("content") if isinstance(turn, Mapping) else None
        if isinstance(content, Mapping):
            content = [content]
        if not isinstance(content, list):
            continue
        for part in content:
            if not isinstance(part, Mapping):
                continue
            if ("image" in part or "image_url" in part or "video" in part
                    or part.get("type", "text") in ("image", "image_url", "video")):
                if not any(k in part for k in ("image", "image_url", "video")):
                    raise DeriveError(f"example {i}: a {part.get('type')!r} part without an \"image\" or "
                                      "\"image_url\" value")
                parts.append(part)
    return parts


def _relocatable_example(example: Any) -> Any:
    """A conversation example with the files of its image parts named by base name."""
    conversation = example.get("conversation") if isinstance(example, Mapping) else None
    if not isinstance(conversation, list):
        return example

    def part(p: Any) -> Any:
        if not isinstance(p, Mapping):
            return p
        return {k: relocatable(v) if k in ("image", "image_url", "video") else v for k, v in p.items()}

    def turn(t: Any) -> Any:
        if not isinstance(t, Mapping):
            return t
        content = t.get("content")
        if isinstance(content, list):
            content = [part(p) for p in content]
        elif isinstance(content, Mapping):
            content = part(content)
        return {**t, "content": content}

    return {**example, "conversation": [turn(t) for t in conversation]}


def _fetch_resize(images: list[ImageItem], pre: QwenFetchResize) -> None:
    """Each image's size as qwen_vl_utils' ``fetch_image`` hands it to the processor."""
    for im in images:
        if im.patches is None:
            h, w = im.size if im.size is not None else (1, 1)
            try:
                im.size = pre.size(h, w, im.part or {})
            except ValueError as exc:
                raise DeriveError(f"{im.where}: {exc}") from None


def looks_like_direct_sft(dataset: Any) -> bool:
    return isinstance(getattr(dataset, "_base_examples", None), list) and hasattr(dataset, "_processor")
