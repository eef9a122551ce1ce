"""The rule that gives an encoder's rows, back from its ``to_dict()`` (what index files store), and in
words."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mimo_accel.costs.audio import AudioRule
from mimo_accel.costs.resize import FixedPatches, ResizeRule

__all__ = ["Rule", "rule_from_dict", "rule_text"]

Rule = ResizeRule | FixedPatches | AudioRule  # images and videos; fixed-resolution images; audio clips


def rule_from_dict(doc: Mapping[str, Any]) -> Rule:
    """The rule a ``to_dict()`` describes (:class:`ResizeRule`, :class:`FixedPatches` or
    :class:`~mimo_accel.costs.audio.AudioRule`)."""
    if not isinstance(doc, Mapping):
        raise ValueError(f"a resize rule must be a mapping, got {type(doc).__name__}")
    if "audio" in doc:
        if set(doc) != {"audio"} or not isinstance(doc["audio"], Mapping):
            raise ValueError(f"an audio rule is {{\"audio\": {{...}}}}, got keys {sorted(doc)}")
        return AudioRule(**doc["audio"])
    if "fixed_patches" in doc:
        if set(doc) != {"fixed_patches"}:
            raise ValueError(f"a fixed-patches rule has only \"fixed_patches\", got keys {sorted(doc)}")
        return FixedPatches(doc["fixed_patches"])
    return ResizeRule(**doc)


def rule_text(rule: Rule | Mapping[str, Any]) -> str:
    """A rule (or its ``to_dict()``) in words, for summaries and messages."""
    r = rule.to_dict() if not isinstance(rule, Mapping) else rule
    if "fixed_patches" in r:
        return f"fixed resolution: {r['fixed_patches']:,} rows per image"
    if "audio" in r:
        a = r["audio"]
        length = (f"every clip padded to {a['max_samples'] / a['sampling_rate']:g} s" if a["pad"] else
                  "each clip's own length" + (f", cut at {a['max_samples'] / a['sampling_rate']:g} s"
                                               if a["max_samples"] else ""))
        return (f"audio at {a['sampling_rate']:,} Hz, hop {a['hop_length']}, {a['frames_per_row']} frames per row; "
                f"{length}")
    video = ", frames in the pixel budget" if r.get("frames_in_budget") else ""
    return (f"patch {r['patch_size']}, merge {r['merge_size']}, pixels [{r['min_pixels']:,}, "
            f"{r['max_pixels']:,}]{video}")
