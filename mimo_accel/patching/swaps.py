"""Attribute swaps that can be undone exactly.

The one primitive every patch in this project is built on: replace ``owner.name`` and remember
the original object, so that undoing restores the *identical* object (not a copy, not a
re-import), in reverse order.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

_MISSING = object()


@dataclass(frozen=True)
class Swap:
    owner: Any
    name: str
    original: Any  # _MISSING when the attribute did not exist before
    replacement: Any

    @property
    def where(self) -> str:
        if isinstance(self.owner, type):
            return f"{self.owner.__module__}.{self.owner.__qualname__}.{self.name}"
        return f"{getattr(self.owner, '__name__', type(self.owner).__name__)}.{self.name}"


class SwapSet:
    """An ordered, thread-safe set of attribute swaps with exact undo."""

    def __init__(self) -> None:
        self._swaps: list[Swap] = []
        self._lock = threading.RLock()

    def swap(self, owner: Any, name: str, replacement: Any, original: Any = _MISSING) -> Any:
        """Set ``owner.name = replacement``; return the original object.

        ``original`` names what undo restores when the current value is not it (a module that
        imported an already-replaced function by name holds the replacement, not the original).
        """
        with self._lock:
            if original is _MISSING:
                original = owner.__dict__.get(name, _MISSING) if hasattr(owner, "__dict__") else _MISSING
            if original is _MISSING:
                original = getattr(owner, name, _MISSING)
            setattr(owner, name, replacement)
            self._swaps.append(Swap(owner, name, original, replacement))
            return None if original is _MISSING else original

    def restore(self) -> list[Swap]:
        """Undo every swap, newest first. Returns what was undone."""
        with self._lock:
            undone = []
            while self._swaps:
                s = self._swaps.pop()
                if s.original is _MISSING:
                    if getattr(s.owner, s.name, _MISSING) is s.replacement:
                        delattr(s.owner, s.name)
                else:
                    setattr(s.owner, s.name, s.original)
                undone.append(s)
            return undone

    def __iter__(self):
        with self._lock:
            return iter(list(self._swaps))

    def __len__(self) -> int:
        return len(self._swaps)

    def __bool__(self) -> bool:
        return bool(self._swaps)
