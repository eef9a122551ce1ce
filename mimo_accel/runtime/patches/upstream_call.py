"""One call of an upstream function, bound through that function's own signature.

A replacement never restates upstream's parameter list. :func:`replacing` gives it a function with
the upstream function's name, docstring and signature (``functools.wraps``) that binds every call
with ``inspect.Signature.bind`` and hands the bound :class:`UpstreamCall` to the replacement's body,
which reads parameters by name, changes them by name and passes the call on whole. So a parameter
upstream adds later (positional or keyword) reaches upstream unchanged, and the names a body reads
are the ones ``mimo_accel/patching/targets.py`` declares, which ``enable()`` checks before patching.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, Iterable


class UpstreamCall:
    """The arguments of one call, by the upstream function's parameter names."""

    __slots__ = ("_bound",)

    def __init__(self, bound: inspect.BoundArguments):
        self._bound = bound

    @classmethod
    def bind(cls, signature: inspect.Signature, args, kwargs) -> "UpstreamCall":
        return cls(signature.bind(*args, **kwargs))

    def __getitem__(self, name: str) -> Any:
        """The argument ``name`` as passed, else its default."""
        if name in self._bound.arguments:
            return self._bound.arguments[name]
        param = self._bound.signature.parameters.get(name)
        if param is None or param.default is inspect.Parameter.empty:
            # enable() checked every declared name: reaching this is a read targets.py does not declare
            raise RuntimeError(f"mimo_accel reads the parameter {name!r}, which this upstream function does not "
                               f"have {self._bound.signature}; declare it in mimo_accel/patching/targets.py")
        return param.default

    def get(self, name: str) -> Any:
        """A parameter some upstream versions lack (``optional`` in targets.py): its argument, its
        default, or None where this function has no such parameter."""
        if name not in self._bound.signature.parameters:
            return None
        return self[name]

    def passed(self) -> tuple[str, ...]:
        """The names of the arguments the caller passed (defaults left out)."""
        return tuple(self._bound.arguments)

    def but(self, **changes) -> "UpstreamCall":
        """The same call with some arguments replaced by name."""
        arguments = dict(self._bound.arguments)
        arguments.update(changes)
        return UpstreamCall(inspect.BoundArguments(self._bound.signature, arguments))

    def to(self, function: Callable) -> Any:
        """Call ``function`` (the upstream original) with every argument of this call."""
        return function(*self._bound.args, **self._bound.kwargs)


def replacing(original: Callable) -> Callable[[Callable[[UpstreamCall], Any]], Callable]:
    """Decorator: ``@replacing(original)`` over ``body(call)`` makes the replacement of
    ``original``, a function that looks like it and binds each call through its signature."""
    signature = inspect.signature(original)

    def decorate(body: Callable[[UpstreamCall], Any]) -> Callable:
        @functools.wraps(original)
        def replacement(*args, **kwargs):
            return body(UpstreamCall.bind(signature, args, kwargs))

        return replacement

    return decorate


def unknown(call: UpstreamCall, known: Iterable[str]) -> tuple[str, ...]:
    """Arguments a caller passed that a full replacement (one that does not call upstream) does not
    use: said once, never dropped silently."""
    known = set(known)
    return tuple(name for name in call.passed() if name not in known)
