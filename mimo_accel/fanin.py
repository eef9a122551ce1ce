"""Fan-in (vision DP > language DP) with uneven encoder rows per sample, forward and backward.

Upstream (megatron-core 0.19, megatron/core/models/mimo/model/base.py
``_attach_modality_split_sizes``) asserts encoder DP <= language DP when per-sample encoder rows
differ, because the bridge has no way to split the *gradient* back: the language replica
concatenates k vision replicas' rows in the forward, and BridgeCommunicator's
``_split_tensor_at_batch_dim`` splits the gradient into k equal parts in the backward — wrong as
soon as images differ in size.

Every language replica knows, from its own ``input_ids``, how many placeholder rows each of its
samples has, and its samples are the k vision replicas' samples in order (canonical grid). So:
- vision side: in fan-in a replica sends its whole output to one peer, so the split metadata is
  not needed — skip the attach (and its assertion);
- language side: record the per-sample row counts of each micro-batch (first language stage),
  and when the gradient is split back into k parts, attach them, so the bridge's own
  sample-aligned split is used (it sums per-sample sizes into k peers).
Micro-batches are consumed first-in first-out (1F1B keeps the order).
"""

from __future__ import annotations

import collections
import functools
import threading
from typing import Callable

_local = threading.local()


def _queue() -> collections.deque:
    q = getattr(_local, "rows", None)
    if q is None:
        q = _local.rows = collections.deque()
    return q


def record_language_rows(batch: dict, token_ids) -> None:
    """Remember this language micro-batch's per-sample encoder-row counts (before any packing)."""
    ids = batch.get("input_ids")
    if ids is None or ids.dim() != 2 or not token_ids:
        return
    # Kept on the device: read back only when the gradient is split (the bridge syncs there anyway).
    _queue().append(sum((ids == t).sum(dim=1) for t in token_ids))


def clear() -> None:
    _queue().clear()


def _is_fan_in(mimo_model, encoder_name: str) -> bool:
    grids = getattr(mimo_model.mimo_config, "module_to_grid_map", None) or {}
    enc, lang = grids.get(encoder_name), grids.get("language")
    if enc is None or lang is None:
        return False
    dp = lambda g: g.shape[g.dim_names.index("dp")]  # noqa: E731
    return dp(enc) > dp(lang)


def wrap_attach_split_sizes(original: Callable) -> Callable:
    @functools.wraps(original)
    def _attach_modality_split_sizes(self, output, input_ids, encoder_name):
        if _is_fan_in(self, encoder_name):
            return None  # one peer receives the whole tensor: no split, nothing to assert
        return original(self, output, input_ids, encoder_name)

    return _attach_modality_split_sizes


def wrap_split_at_batch_dim(original: Callable) -> Callable:
    @functools.wraps(original)
    def _split_tensor_at_batch_dim(self, aggregated_tensor, num_splits):
        if (num_splits > 1 and getattr(aggregated_tensor, "_mimo_bridge_split_sizes", None) is None
                and self.is_current_rank_in_grid(self.dest_grid)):
            q = _queue()
            if not q:
                raise RuntimeError(
                    "mimo_accel fan-in: a gradient is being split back to the vision replicas but no "
                    "language micro-batch row counts were recorded; refusing an equal split that could "
                    "mis-assign gradients between samples")
            rows = [int(c) for c in q.popleft().tolist()]
            if sum(rows) != aggregated_tensor.shape[self._batch_dim] or len(rows) % num_splits:
                raise RuntimeError(
                    f"mimo_accel fan-in: recorded rows {rows} (sum {sum(rows)}) do not match the gradient's "
                    f"{aggregated_tensor.shape[self._batch_dim]} rows for {num_splits} vision replicas")
            aggregated_tensor._mimo_bridge_split_sizes = rows
        return original(self, aggregated_tensor, num_splits)

    return _split_tensor_at_batch_dim
