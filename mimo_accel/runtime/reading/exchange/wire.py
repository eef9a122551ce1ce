"""Sample codec: a pickled skeleton plus the raw tensor bytes (what the exchange sends)."""

from __future__ import annotations

import pickle
import struct
from typing import Any, Optional

import numpy as np
import torch

_SAMPLE_HEADER = struct.Struct("<Q")  # length of the pickled skeleton


class _TensorRef:
    """Stands in for a tensor inside a pickled skeleton."""

    __slots__ = ("index", "dtype", "shape", "nbytes")

    def __init__(self, index: int, dtype: torch.dtype, shape: tuple, nbytes: int):
        self.index, self.dtype, self.shape, self.nbytes = index, dtype, shape, nbytes

    def __reduce__(self):
        return (_TensorRef, (self.index, self.dtype, self.shape, self.nbytes))


def _flatten(obj: Any, tensors: list) -> Any:
    if isinstance(obj, torch.Tensor):
        if obj.layout != torch.strided:
            raise TypeError(f"exchange cannot serialise a {obj.layout} tensor; densify it in the dataset")
        t = obj.detach()
        if t.device.type != "cpu":
            t = t.cpu()
        t = t.contiguous()
        tensors.append(t)
        return _TensorRef(len(tensors) - 1, t.dtype, tuple(t.shape), t.numel() * t.element_size())
    if type(obj) is dict:
        return {k: _flatten(v, tensors) for k, v in obj.items()}
    if type(obj) is list:
        return [_flatten(v, tensors) for v in obj]
    if type(obj) is tuple:
        return tuple(_flatten(v, tensors) for v in obj)
    return obj  # anything else (ints, strings, numpy arrays, ...) is pickled as it is


class EncodedSample:
    """A sample ready to be written into a byte buffer: ``nbytes`` is exact before writing."""

    __slots__ = ("skeleton", "tensors", "nbytes")

    def __init__(self, sample: Any):
        tensors: list[torch.Tensor] = []
        self.skeleton = pickle.dumps(_flatten(sample, tensors), protocol=pickle.HIGHEST_PROTOCOL)
        self.tensors = tensors
        self.nbytes = (_SAMPLE_HEADER.size + len(self.skeleton)
                       + sum(t.numel() * t.element_size() for t in tensors))

    def write(self, out: np.ndarray, offset: int) -> int:
        """Write into the uint8 array ``out`` at ``offset``; return the offset after it."""
        head = _SAMPLE_HEADER.pack(len(self.skeleton)) + self.skeleton
        out[offset:offset + len(head)] = np.frombuffer(head, dtype=np.uint8)
        offset += len(head)
        for t in self.tensors:
            n = t.numel() * t.element_size()
            if n:
                out[offset:offset + n] = t.reshape(-1).view(torch.uint8).numpy()
            offset += n
        return offset


def _rebuild(obj: Any, tensors: list) -> Any:
    if isinstance(obj, _TensorRef):
        return tensors[obj.index]
    if type(obj) is dict:
        return {k: _rebuild(v, tensors) for k, v in obj.items()}
    if type(obj) is list:
        return [_rebuild(v, tensors) for v in obj]
    if type(obj) is tuple:
        return tuple(_rebuild(v, tensors) for v in obj)
    return obj


def _collect_refs(obj: Any, refs: list) -> None:
    if isinstance(obj, _TensorRef):
        refs.append(obj)
    elif type(obj) is dict:
        for v in obj.values():
            _collect_refs(v, refs)
    elif type(obj) in (list, tuple):
        for v in obj:
            _collect_refs(v, refs)


def encode_sample(sample: Any) -> bytes:
    """The bytes of one sample as the exchange sends it (for tests and tools)."""
    enc = EncodedSample(sample)
    out = np.empty(enc.nbytes, dtype=np.uint8)
    enc.write(out, 0)
    return out.tobytes()


def serialized_size(sample: Any) -> int:
    """Bytes one sample occupies in the exchange (what moves if its owner changes)."""
    return EncodedSample(sample).nbytes


def decode_sample(buf: Any, offset: int = 0) -> tuple[Any, int]:
    """``(sample, offset after it)`` from a uint8 buffer holding encoded samples back to back.

    Tensors come back as fresh CPU tensors (own storage, not views of ``buf``).
    """
    data = np.frombuffer(buf, dtype=np.uint8) if not isinstance(buf, np.ndarray) else buf
    (skel_len,) = _SAMPLE_HEADER.unpack_from(data, offset)
    offset += _SAMPLE_HEADER.size
    skeleton = pickle.loads(data[offset:offset + skel_len].tobytes())
    offset += skel_len
    refs: list[_TensorRef] = []
    _collect_refs(skeleton, refs)
    tensors: list[Optional[torch.Tensor]] = [None] * len(refs)
    for ref in sorted(refs, key=lambda r: r.index):  # written in index order
        t = torch.empty(ref.shape, dtype=ref.dtype)
        if ref.nbytes:
            t.reshape(-1).view(torch.uint8).numpy()[:] = data[offset:offset + ref.nbytes]
        tensors[ref.index] = t
        offset += ref.nbytes
    return _rebuild(skeleton, tensors), offset
