"""The machine a layout runs on: each GPU's dense BF16 peak and memory, the GPUs of a node, and the
interconnect the communication terms are priced over.

Peaks are :data:`mimo_accel.costs.flops.PEAK_BF16_TFLOPS`' (NVIDIA's datasheets, dense). Memory is
the datasheet's per-GPU HBM, and its bandwidth (what a memory-bound kernel, the loss over the
vocabulary, is priced at: a peak, as the links'). Bandwidths are per GPU and per direction, as the ring collectives
and point-to-point sends use them: inside a node half the datasheet's NVLink figure (which counts
both directions), between nodes the GPU's own NIC in NVIDIA's DGX systems (one ConnectX per GPU).
They are peaks: achieved bandwidth is lower, so the communication terms are optimistic (said in
docs/design.md). ``cpu`` stands for the CPU rehearsal's gloo ranks: memory unbounded, no peak
(no MFU), every communication term 0 (ranks that share a machine's memory; what gloo costs there
is in the measured times already).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Optional

from mimo_accel.costs.flops import peak_tflops_of

__all__ = ["GPUS", "Machine", "machine_for"]

#: name -> (the peak table's name, memory GiB, NVLink GB/s per direction, NIC GB/s, HBM GB/s, source)
GPUS: dict[str, tuple[str, float, float, float, float, str]] = {
    "h100": ("H100 SXM", 80.0, 450.0, 50.0, 3350.0,
             "nvidia.com/en-us/data-center/h100/: 80 GB HBM3 at 3.35 TB/s, NVLink 900 GB/s; DGX H100: ConnectX-7 "
             "400 Gb/s per GPU"),
    "h200": ("H200 SXM", 141.0, 450.0, 50.0, 4800.0,
             "nvidia.com/en-us/data-center/h200/: 141 GB HBM3e at 4.8 TB/s, NVLink 900 GB/s; DGX H200: ConnectX-7 "
             "400 Gb/s per GPU"),
    "a100": ("A100", 80.0, 300.0, 25.0, 2039.0,
             "nvidia.com/en-us/data-center/a100/: 80 GB HBM2e at 2,039 GB/s, NVLink 600 GB/s; DGX A100: HDR 200 Gb/s "
             "per GPU"),
    "a100-40": ("A100", 40.0, 300.0, 25.0, 1555.0,
                "nvidia.com/en-us/data-center/a100/: 40 GB HBM2 at 1,555 GB/s, NVLink 600 GB/s; DGX A100: HDR 200 "
                "Gb/s per GPU"),
    "b200": ("B200", 180.0, 900.0, 50.0, 8000.0,
             "nvidia.com/en-us/data-center/dgx-b200/: 180 GB HBM3e per GPU (64 TB/s over 8), NVLink 1.8 TB/s; "
             "ConnectX-7 400 Gb/s per GPU"),
}
CPU, CUSTOM = "cpu", "custom"
MEMORY_RESERVE = 0.10  # each GPU's share kept free: allocator, CUDA context, NCCL buffers, workspaces


@dataclass(frozen=True)
class Machine:
    """One kind of device, ``gpus_per_node`` of them per node: ``peak_tflops`` (None: no MFU),
    ``memory_gib`` (inf: unbounded), bandwidths in GB/s per GPU and direction (``memory_gbps`` its
    HBM's), ``communication``
    False where every communication term is 0 (CPU ranks), ``reserve`` the share of memory kept free."""

    name: str
    peak_tflops: Optional[float]
    memory_gib: float
    gpus_per_node: int = 8
    intra_node_gbps: float = 0.0
    inter_node_gbps: float = 0.0
    communication: bool = True
    reserve: float = MEMORY_RESERVE
    source: str = ""
    memory_gbps: float = 0.0

    def bandwidth(self, within_node: bool) -> float:
        """Bytes per second per GPU over NVLink (``within_node``) or the network."""
        return 1e9 * (self.intra_node_gbps if within_node else self.inter_node_gbps)

    def describe(self) -> str:
        peak = f"{self.peak_tflops:g} TFLOP/s" if self.peak_tflops else "no peak"
        mem = "memory unbounded" if math.isinf(self.memory_gib) else f"{self.memory_gib:g} GiB ({self.reserve:.0%} kept free)"
        mem += f" at {self.memory_gbps:g} GB/s" if self.memory_gbps else ""
        if not self.communication:
            comm = "communication 0 (CPU ranks)"
        else:
            comm = (f"{self.gpus_per_node} a node, NVLink {self.intra_node_gbps:g} GB/s, network "
                    f"{self.inter_node_gbps:g} GB/s per GPU")
        return f"{self.name}: {peak}, {mem}, {comm}"


def machine_for(gpu: str, *, peak_tflops: Optional[float] = None, memory_gib: Optional[float] = None,
                gpus_per_node: int = 8, intra_node_gbps: Optional[float] = None,
                inter_node_gbps: Optional[float] = None, reserve: Optional[float] = None) -> Machine:
    """The machine of ``gpu`` (a :data:`GPUS` name or ``cpu``), each figure the flags give replacing
    the table's; ValueError naming the known GPUs for another name."""
    name = str(gpu).strip().lower()
    if name == CPU:
        m = Machine(CPU, None, math.inf, gpus_per_node, communication=False, reserve=0.0,
                    source="CPU ranks (the rehearsal): memory unbounded, communication 0")
    elif name == CUSTOM:
        if peak_tflops is None or memory_gib is None:
            raise ValueError("a GPU outside the table needs --peak-tflops and --memory-gib (and optionally "
                             f"--intra-node-gbps / --inter-node-gbps); or give --gpu, one of {', '.join([*GPUS, CPU])}")
        _, _, intra, inter, hbm, _ = GPUS["h100"]
        m = Machine(CUSTOM, peak_tflops, memory_gib, gpus_per_node, intra, inter,
                    source="given figures; bandwidths H100's unless given", memory_gbps=hbm)
    elif name in GPUS:
        label, mem, intra, inter, hbm, source = GPUS[name]
        found = peak_tflops_of(label)
        m = Machine(label, found[1] if found else None, mem, gpus_per_node, intra, inter, source=source,
                    memory_gbps=hbm)
    else:
        raise ValueError(f"--gpu {gpu}: unknown GPU; give one of {', '.join([*GPUS, CPU])} (mimo-accel layout also "
                         "takes its figures: --peak-tflops and --memory-gib)")
    changes = {k: v for k, v in (("peak_tflops", peak_tflops), ("memory_gib", memory_gib),
                                 ("intra_node_gbps", intra_node_gbps), ("inter_node_gbps", inter_node_gbps),
                                 ("reserve", reserve)) if v is not None}
    if gpus_per_node < 1:
        raise ValueError(f"--gpus-per-node {gpus_per_node}: give a positive number of GPUs per node")
    return replace(m, gpus_per_node=int(gpus_per_node), **changes)
