"""Per-sample cost ingredients read from the datasets Bridge builds, with no pixel decoded.

For each sample: how many images (0, 1 or N), each image's size from its file or bytes header (or
a PIL image's ``.size``), the vision processor's own resize rule, and the real language tokens —
what :class:`mimo_accel.costs.CostIndex` holds. Anything else raises :class:`DeriveError` naming
the three ways out.

- :mod:`~mimo_accel.datasets.sources`: what every probe shares (``SampleSource``, ``Probed``, ``DeriveError``)
- :mod:`~mimo_accel.datasets.processors`: the resize rules of HF processors
- :mod:`~mimo_accel.datasets.fingerprints`: what a derived index depends on, hashed
- :mod:`~mimo_accel.datasets.megatron_mimo`: Bridge's ``MegatronMIMODataset``
- :mod:`~mimo_accel.datasets.direct_sft`: Bridge's ``DirectSFTDataset`` (HF SFT conversations)
- :mod:`~mimo_accel.datasets.dispatch`: which of the two reads a dataset (``source_for``)
- :mod:`~mimo_accel.datasets.shared_index`: ``derive_cost_index``: every rank probes a share, all
  gather, cached on disk
- :mod:`~mimo_accel.datasets.split_index`: which index a split plans from (``cost_index_for``)
"""

from mimo_accel.datasets.dispatch import source_for
from mimo_accel.datasets.megatron_mimo import MimoDatasetSource
from mimo_accel.datasets.processors import QwenFetchResize, qwen_resize_rule
from mimo_accel.datasets.shared_index import (
    ENV_CACHE_DIR,
    cache_key,
    cache_path,
    dataset_identity,
    default_cache_dir,
    derive_cost_index,
    share,
)
from mimo_accel.datasets.sources import DeriveError, Probed

__all__ = [
    "ENV_CACHE_DIR",
    "DeriveError",
    "MimoDatasetSource",
    "Probed",
    "QwenFetchResize",
    "cache_key",
    "cache_path",
    "dataset_identity",
    "default_cache_dir",
    "derive_cost_index",
    "qwen_resize_rule",
    "share",
    "source_for",
]
