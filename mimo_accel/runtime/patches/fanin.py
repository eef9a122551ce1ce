"""Fan-in (vision DP > language DP) with uneven encoder rows per sample, forward and backward.

Upstream (megatron-core 0.19, megatron/core/models/mimo/model/base.py
``_attach_modality_split_sizes``) asserts encoder DP <= language DP when per-sample encoder rows
differ, because the bridge has no way to split the *gradient* back: the language leader
concatenates k vision replicas' rows in the forward, and BridgeCommunicator's
``_split_tensor_at_batch_dim`` splits the gradient into k equal parts in the backward — wrong as
soon as images differ in size.

The receiving leader already knows the right split: in the forward it learns each peer's row
count from the shape exchange (``BridgeCommunicator._communicate_shapes(recv_prev=True)``) before
it receives the rows. So:
- vision side: in fan-in a replica sends its whole output to one peer, so the split metadata is
  not needed — skip the attach (and its assertion);
- language side: where (and only where) the bridge will split a gradient — the receiving leader
  of a fan-in bridge, one record per bridge, so one per encoder — remember the per-peer row counts
  of every forward that will have a backward (grad mode on: Bridge's ``evaluate`` runs its
  forward-only passes under ``torch.no_grad``, so evaluation leaves nothing behind), and attach
  them to the gradient when it is split back.
Micro-batches are consumed first-in first-out (the pipeline schedules run backwards in forward
order), and every pop is checked against the gradient's rows.
"""

from __future__ import annotations

import collections
from typing import Callable

from mimo_accel.modules import LANGUAGE
from mimo_accel.runtime.state import Runtime
from mimo_accel.runtime.patches.upstream_call import UpstreamCall, replacing


def _queue(runtime: Runtime, bridge) -> collections.deque:
    """The FIFO of per-peer row counts of one BridgeCommunicator (one bridge per encoder)."""
    with runtime.lock:
        q = runtime.fan_in_rows.get(bridge)
        if q is None:
            q = runtime.fan_in_rows[bridge] = collections.deque()
        return q


def pending(runtime: Runtime) -> dict:
    """Row-count records waiting for a backward, per bridge (for tests and diagnostics)."""
    with runtime.lock:
        return {bridge: len(q) for bridge, q in runtime.fan_in_rows.items() if q}


def _is_fan_in(mimo_model, encoder_name: str) -> bool:
    grids = getattr(mimo_model.mimo_config, "module_to_grid_map", None) or {}
    enc, lang = grids.get(encoder_name), grids.get(LANGUAGE)
    if enc is None or lang is None:
        return False
    dp = lambda g: g.shape[g.dim_names.index("dp")]  # noqa: E731
    return dp(enc) > dp(lang)


def wrap_attach_split_sizes(original: Callable, runtime: Runtime) -> Callable:
    @replacing(original)
    def _attach_modality_split_sizes(call: UpstreamCall):
        if _is_fan_in(call["self"], call["encoder_name"]):
            return None  # one peer receives the whole tensor: no split, nothing to assert
        return call.to(original)

    return _attach_modality_split_sizes


def wrap_communicate_shapes(original: Callable, runtime: Runtime) -> Callable:
    import torch

    @replacing(original)
    def _communicate_shapes(call: UpstreamCall):
        forward_shapes, grad_shapes = call.to(original)
        # Only a receiving leader gets shapes back; a fan-in leader gets more than one.
        if call["recv_prev"] and len(forward_shapes) > 1 and torch.is_grad_enabled():
            bridge = call["self"]
            dim = bridge._batch_dim
            _queue(runtime, bridge).append([int(shape[dim]) for shape in forward_shapes])
        return forward_shapes, grad_shapes

    return _communicate_shapes


def wrap_split_at_batch_dim(original: Callable, runtime: Runtime) -> Callable:
    @replacing(original)
    def _split_tensor_at_batch_dim(call: UpstreamCall):
        self, aggregated_tensor, num_splits = call["self"], call["aggregated_tensor"], call["num_splits"]
        if (num_splits > 1 and getattr(aggregated_tensor, "_mimo_bridge_split_sizes", None) is None
                and self.is_current_rank_in_grid(self.dest_grid)):
            q = _queue(runtime, self)
            if not q:
                raise RuntimeError(
                    "mimo_accel fan-in: a gradient is being split back to the vision replicas but no "
                    "forward with gradients recorded its row counts on this bridge; refusing an equal "
                    "split that could mis-assign gradients between samples")
            rows = q.popleft()
            total = int(aggregated_tensor.shape[self._batch_dim])
            if sum(rows) != total or len(rows) != num_splits:
                raise RuntimeError(
                    f"mimo_accel fan-in: the forward received rows {rows} (sum {sum(rows)}) from "
                    f"{len(rows)} vision replicas, but the gradient has {total} rows for {num_splits} "
                    "replicas: backward and forward are out of step")
            aggregated_tensor._mimo_bridge_split_sizes = rows
        return call.to(original)

    return _split_tensor_at_batch_dim
