"""Which probe reads a dataset: :func:`source_for`."""

from __future__ import annotations

from typing import Any

from mimo_accel.datasets.direct_sft import ConversationSource, looks_like_direct_sft
from mimo_accel.datasets.megatron_mimo import MimoDatasetSource, looks_like_mimo_dataset
from mimo_accel.datasets.sources import WAYS_OUT, DeriveError, SampleSource

__all__ = ["source_for"]


def source_for(dataset: Any) -> SampleSource:
    """The probe for ``dataset``; a :class:`DeriveError` naming the three ways out for anything else."""
    if looks_like_mimo_dataset(dataset):
        return MimoDatasetSource(dataset)
    if looks_like_direct_sft(dataset):
        return ConversationSource(dataset)
    raise DeriveError(
        f"mimo_accel cannot derive per-sample costs from a {type(dataset).__module__}.{type(dataset).__qualname__}: "
        "it understands Bridge's MegatronMIMODataset and DirectSFTDataset (HF SFT conversations), and "
        "datasets carrying a `mimo_accel_cost_index`. " + WAYS_OUT)
