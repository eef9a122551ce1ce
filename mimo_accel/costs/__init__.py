"""Per-sample costs of every module: the Qwen-VL resize rule, audio clip rows, a cost model, and a
cost index.

Everything here is pure and deterministic, so every rank computes the same cost for the same
sample without talking to any other rank.

- :mod:`~mimo_accel.costs.images`: an image's (height, width) from its header, bytes, PIL image or array
- :mod:`~mimo_accel.costs.resize`: how many patches an image or video becomes (``ResizeRule``, ``FixedPatches``)
- :mod:`~mimo_accel.costs.audio`: how many encoder rows an audio clip becomes (``AudioRule``), a clip's length
  from its file header
- :mod:`~mimo_accel.costs.rules`: a rule back from its dict (``rule_from_dict``)
- :mod:`~mimo_accel.costs.model`: what a sample costs each module (``CostModel``, ``ModuleCost``, its JSON file)
- :mod:`~mimo_accel.costs.index`: a whole dataset's cost ingredients per module (``CostIndex`` and its ``.npz`` file)
- :mod:`~mimo_accel.costs.index_columns`: one encoder's columns in it, checked and bounded (``EncoderColumns``)
- :mod:`~mimo_accel.costs.index_format`: its file, format v4 (header and packed columns), written and read
- :mod:`~mimo_accel.costs.index_file`: that file's arrays, memory-mapped where they lie
- :mod:`~mimo_accel.costs.fit`: the one cost-model fitter (exact non-negative least squares) every calibration calls
- :mod:`~mimo_accel.costs.online`: each module's model learnt from the job's own step times (``OnlineCalibration``)
- :mod:`~mimo_accel.costs.flops`: a module's model FLOPs from its TransformerConfig (``FlopsShape``), the GPU
  peak table, and the per-step throughput figures (samples/s, tokens/s and TFLOP/s per GPU, MFU)
- :mod:`~mimo_accel.costs.prior`: the cost model a job starts from without one: each module's step FLOPs
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
