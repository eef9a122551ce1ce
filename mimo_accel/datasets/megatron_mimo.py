"""Bridge's ``MegatronMIMODataset`` (0.6.2), probed from its raw examples.

``examples`` is an HF ``datasets.Dataset`` (image columns read from the arrow table, undecoded) or a
list of dicts; an image is a path, bytes, a PIL image, an undecoded HF ``{"bytes", "path"}`` cell,
or a list of those. Qwen2-VL / Qwen3-VL image processors give a :class:`ResizeRule`; a
fixed-resolution processor (CLIP, SigLIP) gives ``encoder_seq_lengths[modality]`` rows per image
(:class:`FixedPatches`). Tokens are the dataset's ``num_real_tokens``: the placeholders plus the
truncated text tokens.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

import numpy as np

from mimo_accel.costs import FixedPatches, ResizeRule
from mimo_accel.costs.images import _images_in
from mimo_accel.datasets.fingerprints import (
    _callable_name,
    _is_hf_dataset,
    examples_fingerprint,
    tokenizer_fingerprint,
)
from mimo_accel.datasets.processors import _is_audio, _is_fixed_resolution, qwen_resize_rule
from mimo_accel.datasets.sources import (
    WAYS_OUT,
    DeriveError,
    Probed,
    SampleSource,
    _Image,
    _per_sample,
    _read_sizes,
    _token_lengths,
)

__all__ = ["MimoDatasetSource"]


class MimoDatasetSource(SampleSource):
    """Bridge's ``MegatronMIMODataset``: one modality column per encoder, placeholders first."""

    kind = "MegatronMIMODataset"

    def __init__(self, dataset: Any):
        self.dataset = dataset
        self.examples = dataset.examples
        self.tokenizer = dataset.tokenizer
        self.seq_length = int(dataset.seq_length)
        self.text_column = getattr(dataset, "text_column", "text")
        self.preprocess_fn = getattr(dataset, "preprocess_fn", None)
        self.special = dict(getattr(dataset, "special_token_ids", None) or {})
        self.enc_lengths = dict(getattr(dataset, "encoder_seq_lengths", None) or {})
        self.length = self.base_length = len(dataset)
        processors = dict(getattr(dataset, "processors", None) or {})
        # Modalities the dataset processes (it skips those without a processor), in its order.
        self.modalities: dict[str, str] = {m: c for m, c in dict(dataset.modality_columns).items()
                                           if processors.get(m) is not None}
        self.image_rules: dict[str, ResizeRule | FixedPatches] = {}
        for modality in self.modalities:
            proc = processors[modality]
            rule = qwen_resize_rule(proc)
            if rule is None and not _is_audio(proc) and _is_fixed_resolution(proc):
                rows = self.enc_lengths.get(modality)
                if rows is None:
                    raise DeriveError(
                        f"MegatronMIMODataset modality {modality!r}: a fixed-resolution {type(proc).__name__} "
                        "but no encoder_seq_lengths entry to say how many rows an image becomes. " + WAYS_OUT)
                rule = FixedPatches(rows)
            if rule is not None:
                self.image_rules[modality] = rule
            elif not _is_audio(proc):
                raise DeriveError(
                    f"MegatronMIMODataset modality {modality!r}: cannot tell how many encoder rows an image "
                    f"becomes with a {type(proc).__name__} (neither a Qwen-VL resize rule nor a fixed "
                    "resolution). " + WAYS_OUT)
        if not self.image_rules:
            raise DeriveError(
                f"MegatronMIMODataset with modalities {sorted(self.modalities)} has no image modality: "
                "there is no vision cost to balance. " + WAYS_OUT)
        rules = set(self.image_rules.values())
        if len(rules) > 1:
            raise DeriveError(
                f"MegatronMIMODataset image modalities resize differently ({self.image_rules}); one cost "
                "index holds one rule. " + WAYS_OUT)
        self.rule = rules.pop()

    def fingerprint_material(self) -> dict[str, Any]:
        return {
            "examples": examples_fingerprint(self.examples, self.length),
            "text_column": self.text_column,
            "modality_columns": sorted(self.modalities.items()),
            "image_rules": {m: r.to_dict() for m, r in sorted(self.image_rules.items())},
            "seq_length": self.seq_length,
            "special_token_ids": sorted(self.special.items()),
            "encoder_seq_lengths": sorted(self.enc_lengths.items()),
            "tokenizer": tokenizer_fingerprint(self.tokenizer),
            "preprocess_fn": _callable_name(self.preprocess_fn),
        }

    def _rows(self, start: int, stop: int) -> list[Mapping[str, Any]]:
        ex = self.examples
        if self.preprocess_fn is None and _is_hf_dataset(ex):
            # The arrow table: image cells stay {"bytes", "path"}, nothing is decoded.
            wanted = [c for c in dict.fromkeys([*self.modalities.values(), self.text_column])
                      if c in ex.column_names]
            if getattr(self, "_arrow_view", None) is None:
                self._arrow_view = ex.select_columns(wanted).with_format("arrow")
            table = self._arrow_view[start:stop]
            columns = {c: table.column(c).to_pylist() for c in wanted}
            return [{c: columns[c][j] for c in wanted} for j in range(stop - start)]
        rows = []
        for i in range(start, stop):
            row = ex[i]
            if self.preprocess_fn is not None:
                row = self.preprocess_fn(row)
            rows.append(row)
        return rows

    def _probe_chunk(self, start: int, stop: int, workers: Optional[int]) -> Probed:
        rows = self._rows(start, stop)
        images: list[_Image] = []
        prefix = np.zeros(len(rows), np.int64)
        texts = []
        for j, row in enumerate(rows):
            i = start + j
            for modality, column in self.modalities.items():
                if column not in row or row[column] is None:
                    continue
                if modality in self.special:
                    prefix[j] += self.enc_lengths.get(modality, 1)
                rule = self.image_rules.get(modality)
                if rule is None:
                    continue
                for k, obj in enumerate(_images_in(row[column])):
                    where = f"sample {i}, column {column!r}" + (f" image {k}" if isinstance(row[column], (list, tuple)) else "")
                    fixed = rule.patches_per_image if isinstance(rule, FixedPatches) else None
                    images.append(_Image(j, obj, where, patches=fixed))
            text = row.get(self.text_column, "") if hasattr(row, "get") else ""
            if not isinstance(text, str):
                raise DeriveError(f"sample {i}: column {self.text_column!r} holds a {type(text).__name__}, "
                                  "not a string; MegatronMIMODataset tokenizes one string per sample")
            texts.append(text)
        _read_sizes(images, workers)
        patches, sq, count, _ = _per_sample(len(rows), images, self.rule)
        lengths = np.asarray(_token_lengths(self.tokenizer, texts, truncation=True, max_length=self.seq_length),
                             dtype=np.int64).reshape(-1)
        return Probed(patches, sq, _mimo_real_tokens(lengths, prefix, self.seq_length), count)


def _mimo_real_tokens(text: np.ndarray, prefix: np.ndarray, seq: int) -> np.ndarray:
    """``num_real_tokens`` of MegatronMIMODataset: text (already truncated to seq) cut to make room
    for the placeholders — ``ids[:seq - P]``, a Python slice, negative stops included — then
    the placeholders, all capped at seq."""
    room = seq - prefix
    kept = np.where(room >= 0, np.minimum(text, room), np.maximum(text + room, 0))
    return np.minimum(np.where(prefix > 0, kept + prefix, text), seq)


def _looks_like_mimo_dataset(dataset: Any) -> bool:
    return all(hasattr(dataset, a) for a in ("examples", "processors", "tokenizer", "modality_columns",
                                             "seq_length", "encoder_seq_lengths"))
