"""Per-sample costs of every module, pure and deterministic, so every rank computes the same cost for
the same sample alone: the resize rules (``images``, ``resize``, ``audio``, ``rules``), the cost
model (``model``), the cost index and its file (``index``, ``index_columns``, ``index_format``,
``index_file``, ``packed``, ``contents``), the one fitter (``fit``) and the online refit
(``online``, ``observations``, ``share_error``), FLOPs (``flops``, ``prior``) and memory (``memory``).
"""

from mimo_accel.costs.audio import AudioRule
from mimo_accel.costs.images import image_size_from_bytes, image_size_from_header
from mimo_accel.costs.index import CostIndex, IndexModulesError, SampleShape
from mimo_accel.costs.index_columns import EncoderColumns
from mimo_accel.costs.model import CostModel, ModuleCost
from mimo_accel.costs.resize import FixedPatches, ResizeRule
from mimo_accel.costs.rules import rule_from_dict

__all__ = [
    "AudioRule",
    "CostIndex",
    "CostModel",
    "EncoderColumns",
    "FixedPatches",
    "IndexModulesError",
    "ModuleCost",
    "ResizeRule",
    "SampleShape",
    "image_size_from_bytes",
    "image_size_from_header",
    "rule_from_dict",
]
