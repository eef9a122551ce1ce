"""Workload profile files: a small TOML file, read and checked key by key into a :class:`Profile`.

A profile describes the samples of a workload (images per sample, image sizes, text tokens), the
model's image resize rule, the default parallel layout, and a scaled-down ``[rehearsal]``
version small enough to run on CPUs. The shipped profiles are this package's data
(``mimo_accel/workloads/*.toml``: ``receipts``, ``documents``, ``mixed_chat``, ``uniform``);
:func:`load_profile` takes either such a name or a path. Pure: numpy and the standard library
only (``tomllib``).

File layout (every key is checked; an unknown key is an error)::

    [profile]                         # optional
    name = "receipts"                 # default: the file name
    description = "..."

    [images]
    count = { 0 = 0.6, 1 = 0.3, 4 = 0.1 }   # images per sample -> probability (sums to 1)
    height = DIST                      # pixels, drawn per image ...
    width = DIST                       # ... independently of the height
    # or instead of height/width:  size = [896, 896]  or  size = { dist = "choice",
    #                                 values = [[896, 896], [1080, 1920]], p = [0.5, 0.5] }
    bytes_per_pixel = 0.3              # encoded bytes per original pixel (JPEG ~0.3)

    [text]
    tokens = DIST                      # text tokens per sample (image placeholders come on top)
    bytes_per_token = 4                # optional, default 4

    [resize]                           # the model's image processor (mimo_accel.costs.ResizeRule)
    patch_size = 16
    merge_size = 2
    temporal_patch_size = 2            # optional, default 2
    min_pixels = 200704
    max_pixels = 4194304

    [audio]                            # optional: a second encoder (Whisper-like), on its own grid
    count = { 0 = 0.5, 1 = 0.4, 2 = 0.1 }   # audio clips per sample -> probability
    seconds = DIST                     # clip duration in whole seconds, drawn per clip
    rows_per_second = 50               # encoder rows per second of audio (Whisper: 1500 rows per 30 s)
    pad_to_seconds = 30                # optional: the feature extractor pads (and cuts) every clip to
                                       # this length (Whisper's 30 s), so every clip costs the same
    rows_per_token = 1                 # optional, default 1: encoder rows per placeholder token
    bytes_per_second = 32000           # optional, default 32000 (16 kHz 16-bit PCM)

    [video]                            # optional: a video encoder (Qwen-VL-like), on its own grid
    count = { 0 = 0.7, 1 = 0.3 }       # videos per sample -> probability
    frames = DIST                      # frames per video
    height = DIST                      # pixels of a frame, each frame resized by [resize] ...
    width = DIST
    bytes_per_pixel = 0.02             # optional, default 0.02: encoded bytes per frame pixel

    [layout]
    micro_batch_size = 64              # global micro-batch, a multiple of lcm(module dps)
    seq_length = 8192                  # must hold the largest possible sample
    vision = { tp = 1, pp = 1, dp = 8 }
    language = { tp = 4, pp = 1, dp = 4 }
    audio = { tp = 1, pp = 1, dp = 2 } # required with [audio], refused without it
    video = { tp = 1, pp = 1, dp = 2 } # required with [video], refused without it

    [rehearsal]                        # the same shape, scaled down for a CPU rehearsal
    steps = 4
    micro_batch_size = 8
    seq_length = 256                   # <= 256
    merge_size = 2                     # sides are rounded up to a multiple of this
    vision = { tp = 1, pp = 1, dp = 4 }
    language = { tp = 1, pp = 1, dp = 2 }
    [rehearsal.images]                 # sides in PATCHES; <= 1024 patches per image, <= 4 images
    count = { 1 = 1.0 }                # optional: default the main [images] count
    height = DIST
    width = DIST
    [rehearsal.text]
    tokens = DIST

``DIST`` is a number (fixed) or a table: ``{ dist = "fixed", value = V }``, ``{ dist = "uniform",
min = A, max = B }`` (integers, both inclusive), ``{ dist = "lognormal", median = M, sigma = S,
min = A, max = B }`` (clamped to [A, B], rounded), or ``{ dist = "choice", values = [...], p =
[...] }``.

What a sample costs:

* image tokens of an image = patches / merge_size² (the encoder's merged rows, one placeholder each);
* audio rows of a clip = seconds × rows_per_second (pad_to_seconds × rows_per_second when the
  extractor pads); its placeholder tokens = ⌈rows / rows_per_token⌉;
* video rows of a video = t × patches of one frame (t = ⌈frames / temporal_patch_size⌉ temporal
  patches, :meth:`~mimo_accel.costs.ResizeRule.video_rows`), its attention term t × patches²; its
  placeholder tokens = rows / merge_size²;
* a sample's real language tokens (``SampleShape.tokens``) = every encoder's placeholder tokens +
  its text tokens, the text cut so the sample fits ``seq_length`` (validation guarantees the
  images, clips and videos always fit);
* bytes of a sample = Σ original pixels × ``bytes_per_pixel`` + Σ clip seconds × ``bytes_per_second``
  + Σ frame pixels × the video's ``bytes_per_pixel`` + text tokens × ``bytes_per_token``.

The layout is a :class:`mimo_accel.modules.Modules`: ``vision`` (kind ``image``), ``audio`` (kind
``audio``) and ``video`` (kind ``video``) where the profile has them, and ``language``. What each module costs per sample is what
the planner prices at run time: :meth:`SampleTable.cost_index` holds every encoder's columns (the
same :class:`~mimo_accel.costs.CostIndex` a dataset's index is) and
:meth:`~mimo_accel.costs.CostIndex.module_costs` prices them with a cost model.
"""

from __future__ import annotations

from __future__ import annotations

import math
import os
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mimo_accel.costs import ResizeRule
from mimo_accel.modules import LANGUAGE, Module, Modules, module
from mimo_accel.workloads.dist import Dist
from mimo_accel.workloads.profile import (AUDIO, VIDEO, VISION, AudioProfile, Profile, Rehearsal, VideoProfile,
                                          max_patches)

#: The shipped profiles: ``*.toml`` of this package (package data).
PROFILES_DIR = Path(__file__).resolve().parent

#: Limits of a ``[rehearsal]``: the CPU rehearsal's ViT costs ~ (h·w)² per image (1024 patches: ~0.2 s
#: forward+backward on one core), and an image's rows (patches / merge²) must fit the sequence.
REHEARSAL_MAX_PATCHES = 1024
REHEARSAL_MAX_IMAGES = 4
REHEARSAL_MAX_SEQ_LENGTH = 256

_MAX_ASPECT = 200  # the Qwen-VL processor refuses images with a longer side over 200x the shorter
_PROB_TOL = 1e-6


class ProfileError(ValueError):
    """A profile that cannot be loaded; the message names the file, the key and the fix."""




def list_profiles() -> list[str]:
    """Names of the shipped profiles (``mimo_accel/workloads/*.toml``), sorted."""
    return sorted(p.stem for p in PROFILES_DIR.glob("*.toml")) if PROFILES_DIR.is_dir() else []


def load_profile(path_or_name: str | os.PathLike[str]) -> Profile:
    """Load and validate a profile: a path to a TOML file, or the name of a shipped profile."""
    text = os.fspath(path_or_name)
    looks_like_path = isinstance(path_or_name, Path) or text.endswith(".toml") or os.sep in text or "/" in text
    path = Path(text) if looks_like_path else PROFILES_DIR / f"{text}.toml"
    if not path.is_file():
        known = ", ".join(list_profiles()) or "none"
        raise ProfileError(
            f"{path}: no such profile file; pass a path to a .toml profile or one of the shipped"
            f" profiles ({known})"
        )
    try:
        with open(path, "rb") as f:
            doc = tomllib.load(f)
    except tomllib.TOMLDecodeError as exc:
        raise ProfileError(f"{path}: not valid TOML ({exc}); fix the syntax") from None
    return parse_profile(doc, path=path)


class _Checker:
    """Builds error messages that name the file and the key."""

    def __init__(self, path: Path | None):
        self.where = str(path) if path is not None else "<profile>"

    def fail(self, key: str, problem: str, fix: str) -> ProfileError:
        return ProfileError(f"{self.where}: {key}: {problem}; {fix}")

    def table(self, doc: Any, key: str, allowed: set[str], required: set[str] = frozenset()) -> dict[str, Any]:
        if not isinstance(doc, dict):
            raise self.fail(key, f"expected a table, got {_show(doc)}", f"write it as [{key}] or {{ ... }}")
        unknown = sorted(set(doc) - allowed)
        if unknown:
            raise self.fail(
                f"{key}.{unknown[0]}" if key else unknown[0], "unknown key",
                f"remove it or use one of: {', '.join(sorted(allowed))}",
            )
        missing = sorted(required - set(doc))
        if missing:
            raise self.fail(f"{key}.{missing[0]}" if key else missing[0], "missing",
                            "add it (see the shipped profiles, mimo_accel/workloads/*.toml)")
        return doc

    def integer(self, value: Any, key: str, minimum: int = 0) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.fail(key, f"expected an integer, got {_show(value)}", "write a whole number")
        if value < minimum:
            what = "negative" if value < 0 else "too small"
            raise self.fail(key, f"{what} ({value})", f"use a value >= {minimum}")
        return value

    def number(self, value: Any, key: str, positive: bool = True) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise self.fail(key, f"expected a finite number, got {_show(value)}", "write a number")
        if value < 0 or (positive and value == 0):
            raise self.fail(key, f"{'negative' if value < 0 else 'zero'} ({value})", "use a value > 0")
        return float(value)

    def probabilities(self, values: Any, key: str) -> tuple[float, ...]:
        p = tuple(self.number(v, f"{key}[{i}]", positive=False) for i, v in enumerate(values))
        if any(x > 1 for x in p):
            raise self.fail(key, "a probability is above 1", "give probabilities in [0, 1] that sum to 1")
        total = sum(p)
        if abs(total - 1.0) > _PROB_TOL:
            raise self.fail(key, f"probabilities sum to {total:.6g}, not 1", "rescale them so they sum to 1")
        return p

    def dist(self, value: Any, key: str, minimum: int = 0, pairs: bool = False) -> Dist:
        if not isinstance(value, dict):
            return Dist("fixed", (self._value(value, key, minimum, pairs),), (1.0,))
        kind = value.get("dist")
        allowed = {"fixed": {"value"}, "uniform": {"min", "max"}, "lognormal": {"median", "sigma", "min", "max"},
                   "choice": {"values", "p"}}
        if pairs:
            allowed = {k: v for k, v in allowed.items() if k in ("fixed", "choice")}
        if kind not in allowed:
            raise self.fail(
                f"{key}.dist", f"unknown distribution {_show(kind)}",
                f"use dist = one of {', '.join(repr(k) for k in allowed)}",
            )
        self.table(value, key, allowed[kind] | {"dist"}, allowed[kind])
        if kind == "fixed":
            return Dist("fixed", (self._value(value["value"], f"{key}.value", minimum, pairs),), (1.0,))
        if kind == "choice":
            values, p = value["values"], value["p"]
            if not isinstance(values, list) or not values:
                raise self.fail(f"{key}.values", "expected a non-empty list", "list the possible values")
            if not isinstance(p, list) or len(p) != len(values):
                raise self.fail(f"{key}.p", f"expected a list of {len(values)} probabilities, one per value",
                                "give one probability per value")
            vals = tuple(self._value(v, f"{key}.values[{i}]", minimum, pairs) for i, v in enumerate(values))
            return Dist("choice", vals, self.probabilities(p, f"{key}.p"))
        lo = self.integer(value["min"], f"{key}.min", minimum)
        hi = self.integer(value["max"], f"{key}.max", minimum)
        if lo > hi:
            raise self.fail(key, f"min ({lo}) > max ({hi})", "swap them")
        if kind == "uniform":
            return Dist("uniform", low=lo, high=hi)
        median = self.number(value["median"], f"{key}.median")
        sigma = self.number(value["sigma"], f"{key}.sigma", positive=False)
        if not lo <= median <= hi:
            raise self.fail(f"{key}.median", f"{median:g} lies outside [min, max] = [{lo}, {hi}]",
                            "choose a median between min and max")
        return Dist("lognormal", low=lo, high=hi, median=median, sigma=sigma)

    def _value(self, value: Any, key: str, minimum: int, pairs: bool) -> Any:
        if not pairs:
            return self.integer(value, key, minimum)
        if not isinstance(value, list) or len(value) != 2:
            raise self.fail(key, f"expected [height, width], got {_show(value)}", "write a pair like [896, 896]")
        return (self.integer(value[0], f"{key}[0]", minimum), self.integer(value[1], f"{key}[1]", minimum))

    def counts(self, value: Any, key: str, what: str = "image counts") -> Dist:
        if not isinstance(value, dict) or not value:
            raise self.fail(key, f"expected a table of count = probability, got {_show(value)}",
                            "write e.g. { 0 = 0.6, 1 = 0.3, 4 = 0.1 }")
        counts = []
        for k in value:
            try:
                c = int(k)
            except ValueError:
                c = -1
            if c < 0 or str(c) != k.strip():
                raise self.fail(f"{key}.{k}", f"{what} must be whole numbers >= 0", "use keys like 0, 1, 4")
            counts.append(c)
        p = self.probabilities(list(value.values()), key)
        order = sorted(range(len(counts)), key=counts.__getitem__)
        return Dist("choice", tuple(counts[i] for i in order), tuple(p[i] for i in order))

    def module(self, name: str, value: Any, key: str) -> Module:
        t = self.table(value, key, {"tp", "pp", "dp"}, {"dp"})
        tp, pp, dp = (self.integer(t.get(k, 1), f"{key}.{k}", 1) for k in ("tp", "pp", "dp"))
        return module(name, dp, tp=tp, pp=pp)

    def layout(self, t: dict[str, Any], key: str) -> tuple[Modules, int, int]:
        """The layout's modules (vision, audio and video where given, language), micro-batch and
        sequence length."""
        modules = Modules(tuple(self.module(name, t[name], f"{key}.{name}")
                                for name in (VISION, AUDIO, VIDEO, LANGUAGE) if name in t))
        mbs = self.integer(t["micro_batch_size"], f"{key}.micro_batch_size", 1)
        seq = self.integer(t["seq_length"], f"{key}.seq_length", 1)
        grid = modules.grid
        if mbs % grid:
            lower, upper = (mbs // grid) * grid, (mbs // grid + 1) * grid
            nearest = " or ".join(str(x) for x in (lower, upper) if x >= grid)
            dps = ", ".join(f"{m.name} dp {m.dp}" for m in modules)
            raise self.fail(
                f"{key}.micro_batch_size",
                f"{mbs} is not divisible by lcm({dps}) = {grid}"
                " (every module cuts the micro-batch into the same canonical groups)",
                f"use a multiple of {grid}, e.g. {nearest}",
            )
        return modules, mbs, seq


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def parse_profile(doc: Mapping[str, Any], *, path: Path | None = None, name: str | None = None) -> Profile:
    """Validate a parsed TOML document and build the :class:`Profile`."""
    ck = _Checker(path)
    doc = ck.table(dict(doc), "", {"profile", "images", "text", "resize", "layout", "rehearsal", "audio", "video"},
                   {"images", "text", "resize", "layout", "rehearsal"})
    meta = ck.table(doc.get("profile", {}), "profile", {"name", "description"})
    name = str(meta.get("name") or name or (path.stem if path is not None else "profile"))
    description = str(meta.get("description", ""))

    # [resize]
    rz = ck.table(doc["resize"], "resize",
                  {"patch_size", "merge_size", "temporal_patch_size", "min_pixels", "max_pixels"},
                  {"patch_size", "merge_size", "min_pixels", "max_pixels"})
    ints = {k: ck.integer(v, f"resize.{k}", 1) for k, v in rz.items()}
    try:
        rule = ResizeRule(**ints)
    except ValueError as exc:
        raise ck.fail("resize", str(exc), "fix the [resize] values") from None

    # [images]
    im = ck.table(doc["images"], "images", {"count", "height", "width", "size", "bytes_per_pixel"},
                  {"count", "bytes_per_pixel"})
    image_count = ck.counts(im["count"], "images.count")
    bytes_per_pixel = ck.number(im["bytes_per_pixel"], "images.bytes_per_pixel")
    height = width = size = None
    if "size" in im:
        if "height" in im or "width" in im:
            raise ck.fail("images.size", "given together with height/width",
                          "give either size (joint) or height and width (independent)")
        size = ck.dist(im["size"], "images.size", minimum=1, pairs=True)
        worst = max(max(h, w) / min(h, w) for h, w in size.values)
    elif "height" in im and "width" in im:
        height = ck.dist(im["height"], "images.height", minimum=1)
        width = ck.dist(im["width"], "images.width", minimum=1)
        worst = max(height.max / width.min, width.max / height.min)
    elif image_count.max > 0:
        raise ck.fail("images", "no image size", "add height and width (or size) to [images]")
    else:
        worst = 1.0
    if worst > _MAX_ASPECT:
        raise ck.fail("images", f"an image could have an aspect ratio of {worst:.0f} (> {_MAX_ASPECT}),"
                      " which the Qwen-VL processor rejects", "narrow the height/width ranges")

    # [text]
    tx = ck.table(doc["text"], "text", {"tokens", "bytes_per_token"}, {"tokens"})
    text_tokens = ck.dist(tx["tokens"], "text.tokens", minimum=0)
    bytes_per_token = ck.number(tx.get("bytes_per_token", 4), "text.bytes_per_token")

    # [audio], [video]
    audio = _parse_audio(ck, doc["audio"]) if "audio" in doc else None
    video = _parse_video(ck, doc["video"]) if "video" in doc else None

    # [layout]
    lt = ck.table(doc["layout"], "layout",
                  {"micro_batch_size", "seq_length", VISION, LANGUAGE, AUDIO, VIDEO},
                  {"micro_batch_size", "seq_length", VISION, LANGUAGE})
    _check_module(ck, lt, AUDIO, audio is not None, "the clips")
    _check_module(ck, lt, VIDEO, video is not None, "the videos")
    modules, micro_batch_size, seq_length = ck.layout(lt, "layout")
    worst_tokens = image_count.max * max_patches(rule, size, height, width) // rule.merge_size**2
    others = [(n, what, tokens) for n, what, tokens in
              (("audio", "the audio clips", audio.max_tokens if audio is not None else None),
               ("video", "the videos", video.max_tokens(rule) if video is not None else None)) if tokens is not None]
    worst = worst_tokens + sum(tokens for *_, tokens in others) + text_tokens.min
    if worst > seq_length:
        raise ck.fail(
            "layout.seq_length",
            f"{seq_length} cannot hold the largest sample ({image_count.max} images of up to"
            f" {worst_tokens // max(image_count.max, 1)} image tokens"
            + "".join(f" + {tokens} {n} tokens" for n, _, tokens in others) + f" + {text_tokens.min} text tokens)",
            f"raise it to at least {worst}, or lower resize.max_pixels or the image count"
            + "".join(f" or {what}" for _, what, _ in others),
        )

    rehearsal = _parse_rehearsal(ck, doc["rehearsal"], image_count)
    return Profile(
        name=name, description=description, path=path, image_count=image_count, height=height,
        width=width, size=size, bytes_per_pixel=bytes_per_pixel, text_tokens=text_tokens,
        bytes_per_token=bytes_per_token, rule=rule, modules=modules, micro_batch_size=micro_batch_size,
        seq_length=seq_length, rehearsal=rehearsal, raw=doc, audio=audio, video=video,
    )


def _check_module(ck: _Checker, layout: dict[str, Any], name: str, described: bool, items: str) -> None:
    """``layout.<name>`` is given exactly when the profile has its ``[<name>]`` table."""
    article = "an" if name[0] in "aeiou" else "a"
    if described and name not in layout:
        raise ck.fail(f"layout.{name}", f"missing (the profile has {article} [{name}] encoder)",
                      f"add {name} = {{ tp = 1, pp = 1, dp = ... }} to [layout]")
    if not described and name in layout:
        raise ck.fail(f"layout.{name}", f"{article} {name} module without an [{name}] table",
                      f"add an [{name}] table describing {items}, or remove layout.{name}")


def _parse_video(ck: _Checker, value: Any) -> VideoProfile:
    key = "video"
    t = ck.table(value, key, {"count", "frames", "height", "width", "bytes_per_pixel"},
                 {"count", "frames", "height", "width"})
    height = ck.dist(t["height"], f"{key}.height", minimum=1)
    width = ck.dist(t["width"], f"{key}.width", minimum=1)
    if max(height.max / width.min, width.max / height.min) > _MAX_ASPECT:
        raise ck.fail(key, f"a frame could have an aspect ratio above {_MAX_ASPECT}, which the Qwen-VL processor "
                      "rejects", "narrow the height/width ranges")
    return VideoProfile(count=ck.counts(t["count"], f"{key}.count", what="video counts"),
                        frames=ck.dist(t["frames"], f"{key}.frames", minimum=1), height=height, width=width,
                        bytes_per_pixel=ck.number(t.get("bytes_per_pixel", 0.02), f"{key}.bytes_per_pixel"))


def _parse_audio(ck: _Checker, value: Any) -> AudioProfile:
    key = "audio"
    t = ck.table(value, key, {"count", "seconds", "rows_per_second", "pad_to_seconds", "rows_per_token",
                              "bytes_per_second"}, {"count", "seconds", "rows_per_second"})
    count = ck.counts(t["count"], f"{key}.count", what="clip counts")
    seconds = ck.dist(t["seconds"], f"{key}.seconds", minimum=1)
    rows_per_second = ck.integer(t["rows_per_second"], f"{key}.rows_per_second", 1)
    pad = ck.integer(t["pad_to_seconds"], f"{key}.pad_to_seconds", 1) if "pad_to_seconds" in t else None
    rows_per_token = ck.integer(t.get("rows_per_token", 1), f"{key}.rows_per_token", 1)
    bytes_per_second = ck.number(t.get("bytes_per_second", 32000), f"{key}.bytes_per_second")
    if pad is not None and seconds.max > pad:
        raise ck.fail(f"{key}.seconds", f"clips of up to {seconds.max} s are longer than pad_to_seconds = {pad}"
                      " (the feature extractor would cut them)", f"keep seconds.max <= {pad}")
    return AudioProfile(count=count, seconds=seconds, rows_per_second=rows_per_second, pad_to_seconds=pad,
                        rows_per_token=rows_per_token, bytes_per_second=bytes_per_second)


def _parse_rehearsal(ck: _Checker, value: Any, main_count: Dist) -> Rehearsal:
    key = "rehearsal"
    t = ck.table(value, key, {"steps", "micro_batch_size", "seq_length", "merge_size", VISION, LANGUAGE,
                              "images", "text"},
                 {"steps", "micro_batch_size", "seq_length", VISION, LANGUAGE, "text"})
    steps = ck.integer(t["steps"], f"{key}.steps", 1)
    modules, micro_batch_size, seq_length = ck.layout(t, key)
    if seq_length > REHEARSAL_MAX_SEQ_LENGTH:
        raise ck.fail(f"{key}.seq_length", f"{seq_length} is too long for a CPU rehearsal",
                      f"use at most {REHEARSAL_MAX_SEQ_LENGTH}")
    merge = ck.integer(t.get("merge_size", 2), f"{key}.merge_size", 1)
    im = ck.table(t.get("images", {}), f"{key}.images", {"count", "height", "width"})
    count = ck.counts(im["count"], f"{key}.images.count") if "count" in im else main_count
    if count.max > REHEARSAL_MAX_IMAGES:
        where = f"{key}.images.count" if "count" in im else "images.count"
        raise ck.fail(where, f"up to {count.max} images per sample is too many for a CPU rehearsal",
                      f"give [{key}.images] a count with at most {REHEARSAL_MAX_IMAGES} images")
    if count.max > 0:
        if "height" not in im or "width" not in im:
            raise ck.fail(f"{key}.images", "no image size", "add height and width (in patches)")
        height = ck.dist(im["height"], f"{key}.images.height", minimum=1)
        width = ck.dist(im["width"], f"{key}.images.width", minimum=1)
    else:
        height = width = Dist("fixed", (merge,), (1.0,))
    hmax, wmax = -(-height.max // merge) * merge, -(-width.max // merge) * merge
    if hmax * wmax > REHEARSAL_MAX_PATCHES:
        raise ck.fail(f"{key}.images", f"an image could be {hmax}x{wmax} = {hmax * wmax} patches"
                      f" (sides rounded up to multiples of merge_size {merge})",
                      f"keep height.max x width.max <= {REHEARSAL_MAX_PATCHES} patches")
    tx = ck.table(t["text"], f"{key}.text", {"tokens"}, {"tokens"})
    text_tokens = ck.dist(tx["tokens"], f"{key}.text.tokens", minimum=0)
    worst = count.max * hmax * wmax // (merge * merge) + text_tokens.min
    if worst > seq_length:
        raise ck.fail(f"{key}.seq_length", f"{seq_length} cannot hold the largest rehearsal sample"
                      f" ({worst} tokens)", f"raise it to {worst} or shrink the images")
    return Rehearsal(steps=steps, modules=modules, micro_batch_size=micro_batch_size, seq_length=seq_length,
                     merge_size=merge, image_count=count, height=height,
                     width=width, text_tokens=text_tokens)
