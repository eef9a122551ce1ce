"""Bridge's ``MegatronMIMODataset`` (0.6.2), probed from its raw examples, one encoder per modality.

``examples`` is an HF ``datasets.Dataset`` (modality columns read undecoded from the arrow table) or
a list of dicts. Each modality's column is costed with that modality's processor into the index
column of its name: images (paths, bytes, PIL images, HF cells, or lists of them) by a Qwen-VL
:class:`ResizeRule`, or ``encoder_seq_lengths[modality]`` rows each for a fixed-resolution
processor (:class:`FixedPatches`); audio by a Whisper-style :class:`AudioRule` from the clip's file
header (every clip padded to 30 s costs the same); video arrays or frame lists by a Qwen-VL video
processor's temporal patches (:meth:`ResizeRule.video_rows`; a video file, or a processor that
samples frames, is refused with the fix). Tokens are the dataset's ``num_real_tokens``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, Iterator, Optional

import numpy as np

from mimo_accel.costs import AudioRule, FixedPatches, ResizeRule
from mimo_accel.costs.audio import AudioSizeError, audio_clips_in, audio_samples_of
from mimo_accel.costs.files import map_reads
from mimo_accel.costs.images import ImageSizeError, images_in, is_pil, image_size_of
from mimo_accel.costs.index import per_sample_sums
from mimo_accel.datasets.fingerprints import callable_name, is_hf_dataset, relocatable, tokenizer_fingerprint
from mimo_accel.datasets.processors import (
    is_audio,
    is_fixed_resolution,
    is_video,
    audio_rule,
    qwen_resize_rule,
    qwen_video_rule,
)
from mimo_accel.datasets.sources import (
    CHUNK,
    WAYS_OUT,
    DeriveError,
    Probed,
    SampleSource,
    ImageItem,
    RowInputs,
    SampleError,
    empty_list_problem,
    is_empty_list,
    local_path,
    per_sample_patches,
    read_sizes,
    token_lengths,
)

__all__ = ["MimoDatasetSource"]

_ID_KEYS = ("id", "sample_id", "uid")  # a row's own name, where it has one, beside its position


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
        # A dataset whose placeholders per item follow the encoder's rows (a native-resolution
        # encoder: Qwen-VL's merged patches, an audio encoder's frames) says so per modality: rows
        # per placeholder. Bridge's own dataset inserts encoder_seq_lengths placeholders per item.
        self.rows_per_placeholder: dict[str, int] = {}
        for modality, per in dict(getattr(dataset, "mimo_accel_rows_per_placeholder", None) or {}).items():
            if isinstance(per, bool) or not isinstance(per, int) or per < 1:
                raise DeriveError(f"{type(dataset).__name__}.mimo_accel_rows_per_placeholder[{modality!r}] must be "
                                  f"a positive integer (encoder rows per placeholder token), got {per!r}")
            self.rows_per_placeholder[modality] = per
        self.length = self.base_length = len(dataset)
        processors = dict(getattr(dataset, "processors", None) or {})
        # Modalities the dataset processes (it skips those without a processor), in its order.
        self.modalities: dict[str, str] = {m: c for m, c in dict(dataset.modality_columns).items()
                                           if processors.get(m) is not None}
        self.kinds: dict[str, str] = {}  # modality -> "image" | "audio" | "video"
        self.rules: dict[str, Any] = {}
        for modality in self.modalities:
            self.kinds[modality], self.rules[modality] = _rule_of(modality, processors[modality], self.enc_lengths)
        if not self.rules:
            raise DeriveError(
                f"MegatronMIMODataset with modality columns {sorted(dict(dataset.modality_columns))} has no "
                "modality with a processor: there is no encoder cost to balance. " + WAYS_OUT)

    def fingerprint_material(self) -> dict[str, Any]:
        return {
            "text_column": self.text_column,
            "modality_columns": sorted(self.modalities.items()),
            "kinds": sorted(self.kinds.items()),
            "seq_length": self.seq_length,
            "special_token_ids": sorted(self.special.items()),
            "encoder_seq_lengths": sorted(self.enc_lengths.items()),
            "rows_per_placeholder": sorted(self.rows_per_placeholder.items()),
            "tokenizer": tokenizer_fingerprint(self.tokenizer),
            "preprocess_fn": callable_name(self.preprocess_fn),
        }

    def row_inputs(self, lo: int, hi: int) -> Iterator[RowInputs]:
        """Each base sample's files (every image and audio file a modality column names, and every
        frame file of a video given as frames, kind ``"image"``), its text (what the dataset
        tokenizes) and its modality cells and text."""
        for start in range(lo, hi, CHUNK):
            for j, row in enumerate(self._rows(start, min(hi, start + CHUNK))):
                get = row.get if hasattr(row, "get") else (lambda key, default=None: default)
                files = []
                for modality, column in self.modalities.items():
                    kind, cell = self.kinds[modality], get(column)
                    if kind == "audio":
                        items = audio_clips_in(cell)
                    elif kind == "video":  # a video file is refused by the probe; frames are images
                        items = [f for v in _videos_in(cell) if isinstance(v, (list, tuple)) for f in v]
                    else:
                        items = images_in(cell)
                    for item in items:
                        path = local_path(item)
                        if path is not None:
                            files.append((path, "audio" if kind == "audio" else "image"))
                text = get(self.text_column, "")
                inputs = {column: relocatable(get(column)) for column in self.modalities.values()}
                inputs[self.text_column] = text
                problems = tuple(empty_list_problem(self._sample_name(start + j), column)
                                 for column in self.modalities.values() if is_empty_list(get(column)))
                yield RowInputs(start + j, tuple(files), text if isinstance(text, str) else str(text), inputs, problems)

    def _sample_name(self, i: int) -> str:
        """``sample i``, with the row's ``id`` where it has one (read for a message only)."""
        try:
            row = self.examples[i]
            key = next((k for k in _ID_KEYS if isinstance(row, Mapping) and row.get(k) is not None), None)
        except Exception:  # the name is a courtesy: the position alone names the sample
            return f"sample {i}"
        return f"sample {i} ({key} {row[key]!r})" if key else f"sample {i}"

    def _rows(self, start: int, stop: int) -> list[Mapping[str, Any]]:
        ex = self.examples
        if self.preprocess_fn is None and is_hf_dataset(ex):
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
        n = len(rows)
        images: dict[str, list[ImageItem]] = {m: [] for m, k in self.kinds.items() if k == "image"}
        clips: dict[str, list[_Clip]] = {m: [] for m, k in self.kinds.items() if k == "audio"}
        videos: dict[str, list[tuple[int, Any, str]]] = {m: [] for m, k in self.kinds.items() if k == "video"}
        prefix = np.zeros(n, np.int64)
        texts = []
        for j, row in enumerate(rows):
            i = start + j
            for modality, column in self.modalities.items():
                if column not in row or row[column] is None:
                    continue
                if modality in self.special and modality not in self.rows_per_placeholder:
                    prefix[j] += self.enc_lengths.get(modality, 1)
                cell, kind = row[column], self.kinds[modality]
                if is_empty_list(cell):
                    raise SampleError(empty_list_problem(self._sample_name(i), column))
                several = isinstance(cell, (list, tuple))
                if kind == "image":
                    rule = self.rules[modality]
                    fixed = rule.patches_per_image if isinstance(rule, FixedPatches) else None
                    for k, obj in enumerate(images_in(cell)):
                        where = f"sample {i}, column {column!r}" + (f" image {k}" if several else "")
                        images[modality].append(ImageItem(j, obj, where, patches=fixed))
                elif kind == "audio":
                    found = audio_clips_in(cell)
                    for k, obj in enumerate(found):
                        where = f"sample {i}, column {column!r}" + (f" clip {k}" if len(found) > 1 or
                                                                    (several and found[0] is not cell) else "")
                        clips[modality].append(_Clip(j, obj, where))
                else:
                    found = _videos_in(cell)
                    for k, obj in enumerate(found):
                        where = f"sample {i}, column {column!r}" + (f" video {k}" if len(found) > 1 else "")
                        videos[modality].append((j, obj, where))
            text = row.get(self.text_column, "") if hasattr(row, "get") else ""
            if not isinstance(text, str):
                raise DeriveError(f"sample {i}: column {self.text_column!r} holds a {type(text).__name__}, "
                                  "not a string; MegatronMIMODataset tokenizes one string per sample")
            texts.append(text)
        columns: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        for modality in self.modalities:
            kind = self.kinds[modality]
            if kind == "image":
                read_sizes(images[modality], workers)
                rows_, sq, count, _ = per_sample_patches(n, images[modality], self.rules[modality])
            elif kind == "audio":
                rows_, sq, count = _audio_columns(n, clips[modality], self.rules[modality], workers)
            else:
                rows_, sq, count = _video_columns(n, videos[modality], self.rules[modality])
            columns[modality] = (count, rows_, sq)
            if modality in self.special and modality in self.rows_per_placeholder:
                prefix += rows_ // self.rows_per_placeholder[modality]
        lengths = np.asarray(token_lengths(self.tokenizer, texts, truncation=True, max_length=self.seq_length),
                             dtype=np.int64).reshape(-1)
        return Probed(_mimo_real_tokens(lengths, prefix, self.seq_length), columns)


def _rule_of(modality: str, proc: Any, enc_lengths: Mapping[str, int]) -> tuple[str, Any]:
    """(kind, rule) of one modality's processor; a processor mimo_accel cannot cost is refused."""
    if is_video(proc):
        return "video", qwen_video_rule(proc, f"MegatronMIMODataset modality {modality!r}")
    if is_audio(proc):
        return "audio", audio_rule(proc, f"MegatronMIMODataset modality {modality!r}")
    rule = qwen_resize_rule(proc)
    if rule is None and is_fixed_resolution(proc):
        rows = enc_lengths.get(modality)
        if rows is None:
            raise DeriveError(
                f"MegatronMIMODataset modality {modality!r}: a fixed-resolution {type(proc).__name__} "
                "but no encoder_seq_lengths entry to say how many rows an image becomes. " + WAYS_OUT)
        rule = FixedPatches(rows)
    if rule is None:
        raise DeriveError(
            f"MegatronMIMODataset modality {modality!r}: cannot tell how many encoder rows an image "
            f"becomes with a {type(proc).__name__} (neither a Qwen-VL resize rule nor a fixed "
            "resolution). " + WAYS_OUT)
    return "image", rule


class _Clip:
    __slots__ = ("sample", "obj", "where", "samples")

    def __init__(self, sample: int, obj: Any, where: str):
        self.sample, self.obj, self.where, self.samples = sample, obj, where, None


def _clip_length(args: tuple[_Clip, int]) -> int:
    clip, rate = args
    try:
        return audio_samples_of(clip.obj, rate, clip.where)
    except AudioSizeError as exc:
        raise DeriveError(str(exc) + (f" {WAYS_OUT}" if "URL" in str(exc) else "")) from None


def _is_audio_file(obj: Any) -> bool:
    if isinstance(obj, Mapping):
        return obj.get("bytes") is None and obj.get("array") is None and bool(obj.get("path"))
    return isinstance(obj, (str, os.PathLike))


def _audio_columns(n: int, clips: list[_Clip], rule: AudioRule,
                   workers: Optional[int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(Σ rows, Σ rows², clips) per sample of a chunk, each clip's length read from its header (also
    where the extractor pads every clip to one length: a clip that cannot be read is named here,
    not in the middle of training)."""
    rate = rule.sampling_rate
    files = [c for c in clips if _is_audio_file(c.obj)]
    for c, length in zip(files, map_reads(_clip_length, [(c, rate) for c in files], workers, "mimo-accel-probe")):
        c.samples = length
    lengths = [c.samples if c.samples is not None else _clip_length((c, rate)) for c in clips]
    per_clip = rule.rows_many(np.asarray(lengths, dtype=np.int64))
    return per_sample_sums(n, [c.sample for c in clips], per_clip)


# ------------------------------------------------------------------------------------- video


def _is_frame(obj: Any) -> bool:
    """One frame (an image) rather than a video."""
    shape = getattr(obj, "shape", None)
    if shape is not None:
        return len(shape) in (2, 3)
    return is_pil(obj) or isinstance(obj, (str, os.PathLike, bytes, bytearray, Mapping))


def _videos_in(cell: Any) -> list[Any]:
    """The videos a modality cell holds: an array of frames, or a list of frames, is one video; a
    list of those is several."""
    if cell is None:
        return []
    if isinstance(cell, (list, tuple)):
        items = [v for v in cell if v is not None]
        if items and all(_is_frame(v) for v in items):
            return [items]  # the frames of one video
        return items
    return [cell]


def _video_shape(video: Any, where: str) -> tuple[int, int, int]:
    """(frames, height, width) of one video, from its array's shape or its frames' headers."""
    shape = getattr(video, "shape", None)
    if shape is not None:
        shape = tuple(int(s) for s in shape)
        if len(shape) == 4 and shape[-1] in (1, 3, 4):
            return shape[0], shape[1], shape[2]
        if len(shape) == 4 and shape[1] in (1, 3, 4):
            return shape[0], shape[2], shape[3]
        raise DeriveError(f"{where}: a video array of shape {shape} is neither (T, H, W, C) nor (T, C, H, W)")
    if isinstance(video, (list, tuple)) and video:
        try:
            sizes = {image_size_of(f, f"{where} frame {k}") for k, f in enumerate(video)}
        except ImageSizeError as exc:
            raise DeriveError(str(exc)) from None
        if len(sizes) > 1:
            raise DeriveError(f"{where}: the frames of one video differ in size ({sorted(sizes)}); the video "
                              "processor stacks them, so give frames of one size")
        h, w = sizes.pop()
        return len(video), h, w
    if isinstance(video, (str, os.PathLike)):
        raise DeriveError(
            f"{where}: a video file ({os.fspath(video)!r}): its frames cannot be counted without decoding it "
            "here. Give the dataset the frames the processor encodes (an array (T, H, W, C) or a list of "
            "frames). " + WAYS_OUT)
    raise DeriveError(f"{where}: cannot read the frames of a video given as {type(video).__name__}; give an "
                      "array (T, H, W, C) or a list of frames. " + WAYS_OUT)


def _video_columns(n: int, videos: list[tuple[int, Any, str]],
                   rule: ResizeRule) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rows, sq = [], []
    for _, video, where in videos:
        frames, h, w = _video_shape(video, where)
        try:
            r, q = rule.video_rows(frames, h, w)
        except ValueError as exc:
            raise DeriveError(f"{where}: {exc}") from None
        rows.append(r)
        sq.append(q)
    return per_sample_sums(n, [v[0] for v in videos], rows, sq)


def _mimo_real_tokens(text: np.ndarray, prefix: np.ndarray, seq: int) -> np.ndarray:
    """``num_real_tokens`` of MegatronMIMODataset: text (already truncated to seq) cut to make room
    for the placeholders — ``ids[:seq - P]``, a Python slice, negative stops included — then
    the placeholders, all capped at seq."""
    room = seq - prefix
    kept = np.where(room >= 0, np.minimum(text, room), np.maximum(text + room, 0))
    return np.minimum(np.where(prefix > 0, kept + prefix, text), seq)


def looks_like_mimo_dataset(dataset: Any) -> bool:
    return all(hasattr(dataset, a) for a in ("examples", "processors", "tokenizer", "modality_columns",
                                             "seq_length", "encoder_seq_lengths"))
