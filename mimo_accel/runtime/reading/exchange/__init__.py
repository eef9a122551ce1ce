"""Exchange mode: balance every module when sample costs are only known after decoding.

Each rank reads and decodes its canonical shard, prices its samples from what every module decodes
(:class:`DecodedModuleCosts`: each encoder's ``grid_thw``, the real tokens), then per global
micro-batch, over a gloo group of the module's DP ranks: one all-gather of a fixed-size status (a
failing cost stops every rank with its message before any byte moves), one all-gather of the costs
and sizes (every rank computes the same joint plan as plan-before-read, no broadcast), and ONE
ragged ``all_to_all_single`` of the samples whose owner changes (gloo's list ``all_to_all`` takes
equal sizes only; ``all_to_all_single`` takes per-peer splits, and NCCL has it too). With a
``check``, each micro-batch's plan is compared across the data-loading ranks before this rank
trains it. ``overlap`` exchanges the next micro-batch on a side thread over a group of its own;
refused under ``CUDA_DEVICE_MAX_CONNECTIONS=1`` (upstream's deadlock there).

Pure and testable without processes: the routes (:mod:`.routes`), the sample codec (:mod:`.wire`:
a pickled skeleton plus raw tensor bytes; peers are ranks of one job) and the costs (:mod:`.cost`);
:class:`ExchangeReorder` (:mod:`.reorder`) talks to ``torch.distributed``; :mod:`.loader` puts it
behind loaders.
"""

from __future__ import annotations

from mimo_accel.runtime.reading.exchange.cost import DecodedModuleCosts
from mimo_accel.runtime.reading.exchange.loader import ExchangeLoader, exchange_shard_loader
from mimo_accel.runtime.reading.exchange.routes import ExchangeRoutes, route_exchange
from mimo_accel.runtime.reading.exchange.reorder import OVERLAP_ENV, ExchangeError, ExchangeReorder, ExchangeStats
from mimo_accel.runtime.reading.exchange.wire import EncodedSample, decode_sample, encode_sample, serialized_size

__all__ = [
    "DecodedModuleCosts",
    "ExchangeError",
    "ExchangeLoader",
    "ExchangeRoutes",
    "ExchangeReorder",
    "ExchangeStats",
    "decode_sample",
    "encode_sample",
    "exchange_shard_loader",
    "route_exchange",
    "serialized_size",
]
