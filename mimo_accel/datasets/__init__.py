"""Per-sample cost ingredients read from the datasets Bridge builds, with no pixel decoded: each
sample's items, their sizes from file headers (or a PIL image's ``.size``), the processor's own
resize rule, and the real language tokens, as :class:`mimo_accel.costs.CostIndex` holds them.
Bridge's ``MegatronMIMODataset`` (``megatron_mimo``) and ``DirectSFTDataset`` (``direct_sft``) are
read (``dispatch``), over what every probe shares (``sources``, ``processors``, ``fingerprints``);
``shared_index`` derives and caches an index across ranks, ``split_index`` picks a split's. Any
other dataset is a :class:`DeriveError` naming the three ways out.
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
