"""The rule that gives an encoder's rows, back from its ``to_dict()`` (what index files store)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mimo_accel.costs.audio import AudioRule
from mimo_accel.costs.resize import FixedPatches, ResizeRule

__all__ = ["Rule", "rule_from_dict"]

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
