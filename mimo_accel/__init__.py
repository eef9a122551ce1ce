"""mimo_accel: sharded reads, balanced vision load and THD packing for Megatron Bridge's MegatronMIMO.

    import mimo_accel
    mimo_accel.enable(sharded_reads=True, reorder=True, packing=True)

or, with no code change, ``MIMO_ACCEL=all mimo-accel run -- torchrun ... train.py``.
Importing this package patches nothing; every feature is off until enabled.
"""

from __future__ import annotations

from typing import Optional

from mimo_accel.config import AccelConfig, ConfigError

from mimo_accel._version import __version__
__all__ = ["AccelConfig", "ConfigError", "enable", "disable", "status"]


def enable(config: Optional[AccelConfig] = None, **overrides) -> AccelConfig:
    """Turn on the features ``config`` (default: the ``MIMO_ACCEL*`` environment) selects.

    Keyword overrides win over the config/environment, e.g. ``enable(packing=True)``. Works
    whether megatron.bridge is imported before or after; calling it again with the same config
    is a no-op, with another config it re-patches. Returns the active config.
    """
    from mimo_accel.config import resolve
    from mimo_accel.patching import engine

    return engine.enable(resolve(config, overrides))


def disable() -> None:
    """Restore every patched upstream attribute to the identical original object."""
    from mimo_accel.patching import engine

    engine.disable()


def status() -> dict:
    """What is active, what was patched where, which upstream version and shape."""
    from mimo_accel.patching import engine

    return engine.status()
