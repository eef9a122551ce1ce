"""Sample codec: a pickled skeleton plus the raw tensor bytes (what the exchange sends)."""

from __future__ import annotations

import pickle
import struct
from typing import Any

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


def _walk(obj: Any, leaf) -> Any:
    """``obj`` rebuilt through its plain dicts, lists and tuples, each other value as ``leaf(value)``
    (in the same order every time: the tensors' order on the wire)."""
    if type(obj) is dict:
        return {k: _walk(v, leaf) for k, v in obj.items()}
    if type(obj) is list:
        return [_walk(v, leaf) for v in obj]
    if type(obj) is tuple:
        return tuple(_walk(v, leaf) for v in obj)
    return leaf(obj)


def _flatten(obj: Any, tensors: list) -> Any:
    """The skeleton of ``obj``: each tensor (appended to ``tensors``) as a :class:`_TensorRef`, anything
    else (ints, strings, numpy arrays, ...) pickled as it is."""

    def ref(value):
        if not isinstance(value, torch.Tensor):
            return value
        if value.layout != torch.strided:
            raise TypeError(f"exchange cannot serialise a {value.layout} tensor; densify it in the dataset")
        t = value.detach().cpu().contiguous()
        tensors.append(t)
        return _TensorRef(len(tensors) - 1, t.dtype, tuple(t.shape), t.numel() * t.element_size())

    return _walk(obj, ref)


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

    def read(value):  # the tensors follow the skeleton in the order the walk meets their refs
        nonlocal offset
        if not isinstance(value, _TensorRef):
            return value
        t = torch.empty(value.shape, dtype=value.dtype)
        if value.nbytes:
            t.reshape(-1).view(torch.uint8).numpy()[:] = data[offset:offset + value.nbytes]
        offset += value.nbytes
        return t

    sample = _walk(skeleton, read)
    return sample, offset
