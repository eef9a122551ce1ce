"""Exchange mode: balance vision load when sample costs are only known after decoding.

The fallback to plan-before-read (:mod:`mimo_accel.planner`), and upstream's approach. Each rank
reads and decodes its canonical shard (sharded reads: contiguous groups of the global
micro-batch), costs its samples from what it decoded, and then, per global micro-batch:

1. **status** — one all-gather of a fixed-size header (ok flag, sample count, error text) over the
   module DP group. A ``cost_fn`` that raises or returns NaN/inf/negative fails *every* rank with
   the failing rank's message, before any sample byte moves: no rank is left waiting in a
   collective the others skipped.
2. **costs and sizes** — one all-gather of each rank's per-sample costs (float64) and serialised
   sizes (int64). The global costs, concatenated in DP-rank order, are the global micro-batch in
   canonical order; every rank computes the same joint plan of every module as plan-before-read
   does (:func:`~mimo_accel.planner.plan_costs`, no plan broadcast) and, from the sizes, every send
   and receive split.
3. **samples** — ONE ragged ``all_to_all_single`` of uint8 bytes. Only samples whose owner changes
   are serialised; a sample that stays is handed on as the same object.

Why ``all_to_all_single``: gloo's list form ``dist.all_to_all`` only accepts equal-size tensors
(``ProcessGroupGloo::alltoall: invalid tensor size``), so it cannot carry ragged samples; gloo's
``all_to_all_single`` takes per-peer split sizes (alltoallv, zero-size splits included), which is
exactly a ragged exchange in one collective, and NCCL has it too. ``batch_isend_irecv`` would need
one message per peer pair and its own completion handling for the same result.

Every module must end up with the same samples in the same order per canonical group, so the
costs must be computed from what every module decodes: the default :class:`DecodedModuleCosts`
prices each encoder from its images' ``grid_thw`` and the language model from the real-token
count, which encoder and language ranks all see. With a ``check``, each micro-batch's plan is
compared across every data-loading rank before this rank trains it
(:class:`~mimo_accel.runtime.reading.plan_check.FirstPlanCheck`).

Layering: the planning (:mod:`~mimo_accel.runtime.reading.exchange.routes`: :func:`route_exchange`,
:class:`ExchangeRoutes`), the sample codec (:mod:`~mimo_accel.runtime.reading.exchange.wire`: :func:`encode_sample`,
:func:`decode_sample`) and the cost of a decoded sample (:mod:`~mimo_accel.runtime.reading.exchange.cost`) are pure
and testable without processes; only :class:`ExchangeReorder` (:mod:`~mimo_accel.runtime.reading.exchange.reorder`)
talks to ``torch.distributed``, and :mod:`~mimo_accel.runtime.reading.exchange.loader` puts it behind loaders.
Sample bytes are host memory and travel over a gloo group (the module's DP group when it is gloo,
else a dedicated gloo group over the same ranks); the codec uses pickle for the non-tensor skeleton
of a sample, as torch.distributed's object collectives do — peers are ranks of the same job.

Overlap (``overlap=True``): a side thread reads, exchanges and collates the next micro-batch while
the current one trains. Its collectives use a dedicated process group made at construction, so
they never interleave with the training's own collectives on the DP group. Refused when
``CUDA_DEVICE_MAX_CONNECTIONS=1`` (upstream reproduced a deadlock with a side-thread exchange
there).
"""

from __future__ import annotations

from mimo_accel.runtime.reading.exchange.cost import DecodedModuleCosts
from mimo_accel.runtime.reading.exchange.loader import ExchangeLoader, exchange_loader, exchange_shard_loader
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
    "exchange_loader",
    "exchange_shard_loader",
    "route_exchange",
    "serialized_size",
]
