"""A stand-in for the wiring of Megatron-Bridge PR #4608's reorder buffer (on #4608's branch only: not
on Bridge main, in no release), for the rehearsal script (``--bridge-reorder``).

#4608 (``src/megatron/bridge/data/megatron_mimo/reorder_buffer.py``, wired by the Qwen3.5-VL
example's ``_build_data_iterators``) wraps the train iterator in a ``ReorderingBuffer`` when
``cfg.dataset.megatron_mimo_scalable_dp`` and ``megatron_mimo_intra_microbatch_reorder`` are on and
lcm(module DPs) > 1, reading both when the iterators are built. Per micro-batch it prices each sample
(image placeholders × merge² as patches; real tokens from ``attention_mask``), all-gathers the costs
over the module's DP group, plans with equal-size LPT over G groups
(:func:`mimo_accel.balance.peers.reorder_buffer_order`) and exchanges samples so that every rank
holds its planned groups in canonical order.

This stand-in is written from that behaviour for the installed Bridge. Without scalable reads,
every rank reads the whole global micro-batch and the step slices it contiguously, so the exchange
reduces to laying the micro-batch out in the planned order (each replica's contiguous slice is then
its planned groups); the costs are still all-gathered over the module's DP group and must agree.
With scalable reads (Megatron-Bridge #5525 reads the flag too) each rank reads only its contiguous
share and the step slices nothing, so the shares are all-gathered into the micro-batch and each
rank keeps its planned groups: the exchange. A micro-batch already sharded by mimo_accel (its tag)
is refused: upstream's buffer acts on upstream's reads only.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from mimo_accel.balance.peers import reorder_buffer_costs, reorder_buffer_order
from mimo_accel_dev.rehearse import stack


def wanted(cfg, dp_sizes) -> bool:
    """Upstream's wiring condition, read from ``cfg.dataset`` as the script builds its iterators."""
    import math

    data = cfg.dataset
    return (bool(getattr(data, "megatron_mimo_scalable_dp", False))
            and bool(getattr(data, "megatron_mimo_intra_microbatch_reorder", False))
            and math.lcm(*dp_sizes) > 1)


def _images_per_sample(placeholders: list[int], grid_thw: torch.Tensor, merge: int) -> list[int]:
    """How many of the patch-packed images (in sample order) each sample owns: its placeholders are
    the rows of its images, ``t·h·w / merge²`` each."""
    rows = (grid_thw.prod(dim=-1) // (merge * merge)).tolist()
    counts, k = [], 0
    for need in placeholders:
        start = k
        while need > 0:
            need -= rows[k]
            k += 1
        if need != 0:
            raise ValueError("bridge-reorder stand-in: a sample's placeholders do not match its images' rows")
        counts.append(k - start)
    if k != len(rows):
        raise ValueError("bridge-reorder stand-in: images left over after every sample's placeholders")
    return counts


def _permuted(batch: dict, order: list[int], merge: int) -> dict:
    """The samples ``order`` names (all of them, or one replica's planned share), in that order."""
    idx = torch.as_tensor(order, dtype=torch.long)
    samples = batch["input_ids"].size(0)
    placeholders = (batch["input_ids"] == stack.IMAGE_TOKEN_ID).sum(dim=1).tolist()
    out = {}
    for key, value in batch.items():
        if isinstance(value, torch.Tensor) and value.dim() >= 1 and value.size(0) == samples:
            out[key] = value.index_select(0, idx)
        elif key == "modality_inputs":
            out[key] = {}
            for modality, encoders in value.items():
                out[key][modality] = {}
                for name, inputs in encoders.items():
                    grid, hidden = inputs["grid_thw"], inputs["hidden_states"]
                    counts = _images_per_sample(placeholders, grid, merge)
                    first = [sum(counts[:s]) for s in range(len(counts))]
                    patches = grid.prod(dim=-1).tolist()
                    starts = [sum(patches[:i]) for i in range(len(patches))]
                    images = [i for s in order for i in range(first[s], first[s] + counts[s])]
                    rows = [r for i in images for r in range(starts[i], starts[i] + patches[i])]
                    out[key][modality][name] = dict(
                        inputs, grid_thw=grid[images] if images else grid[:0],
                        hidden_states=hidden[torch.as_tensor(rows, dtype=torch.long)] if rows else hidden[:0])
        else:
            out[key] = value
    return out


def _joined(shares: list[dict]) -> dict:
    """The replicas' contiguous shares (in DP order) as the one micro-batch they were read from."""
    first = shares[0]
    samples = first["input_ids"].size(0)
    out = {}
    for key, value in first.items():
        if isinstance(value, torch.Tensor) and value.dim() >= 1 and value.size(0) == samples:
            out[key] = torch.cat([share[key] for share in shares])
        elif key == "modality_inputs":
            out[key] = {
                modality: {
                    name: dict(inputs,
                               grid_thw=torch.cat([share[key][modality][name]["grid_thw"] for share in shares]),
                               hidden_states=torch.cat([share[key][modality][name]["hidden_states"]
                                                        for share in shares]))
                    for name, inputs in encoders.items()}
                for modality, encoders in value.items()}
        else:
            out[key] = value
    return out


class ReorderBufferStandIn:
    """Iterator over ``batches`` laid out in the reorder buffer's plan: whole global micro-batches,
    or with ``shared_reads`` each replica's share of one (upstream's scalable reads), exchanged."""

    def __init__(self, batches, *, grid: int, dp_group, merge: int = 2, shared_reads: bool = False):
        self.batches = batches
        self.grid = grid
        self.dp_group = dp_group
        self.merge = merge
        self.shared_reads = shared_reads

    def __iter__(self):
        return self

    def __next__(self) -> dict:
        from mimo_accel.runtime.reading.shard import SHARD_TAG_KEY

        batch = next(self.batches)
        if SHARD_TAG_KEY in batch:
            raise RuntimeError("bridge-reorder stand-in: this micro-batch is already sharded by mimo_accel; "
                               "Bridge's reorder acts on its own reads only")
        replicas = dist.get_world_size(self.dp_group)
        if self.shared_reads:
            shares = [None] * replicas
            dist.all_gather_object(shares, batch, group=self.dp_group)
            batch = _joined(shares)
        patches = (batch["input_ids"] == stack.IMAGE_TOKEN_ID).sum(dim=1) * self.merge * self.merge
        tokens = batch["attention_mask"].sum(dim=1)
        costs = reorder_buffer_costs(patches.tolist(), tokens.tolist()).tolist()
        gathered = [None] * replicas
        dist.all_gather_object(gathered, costs, group=self.dp_group)
        if any(c != costs for c in gathered):
            raise RuntimeError("bridge-reorder stand-in: the replicas priced one micro-batch differently")
        order = reorder_buffer_order(costs, self.grid)
        if self.shared_reads:
            share = len(order) // replicas
            replica = dist.get_rank(self.dp_group)
            order = order[replica * share:(replica + 1) * share]
        return _permuted(batch, order, self.merge)
