"""Per-sample vision cost: the Qwen-VL resize rule, a cost model, and a cost index.

Everything here is pure and deterministic, so every rank computes the same cost for the same
sample without talking to any other rank.

- :mod:`~mimo_accel.costs.images`: an image's (height, width) from its header, bytes, PIL image or array
- :mod:`~mimo_accel.costs.resize`: how many patches an image becomes (``ResizeRule``, ``FixedPatches``)
- :mod:`~mimo_accel.costs.model`: what a sample costs (``CostModel`` and its JSON file)
- :mod:`~mimo_accel.costs.index`: a whole dataset's cost ingredients (``CostIndex`` and its ``.npz`` file)
"""

from mimo_accel.costs.images import image_size_from_bytes, image_size_from_header
from mimo_accel.costs.index import CostIndex, SampleShape
from mimo_accel.costs.model import CostModel
from mimo_accel.costs.resize import FixedPatches, ResizeRule, rule_from_dict

__all__ = [
    "CostIndex",
    "CostModel",
    "FixedPatches",
    "ResizeRule",
    "SampleShape",
    "image_size_from_bytes",
    "image_size_from_header",
    "rule_from_dict",
]
