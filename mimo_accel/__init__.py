"""mimo_accel: sharded reads, balanced vision load and THD packing for Megatron Bridge's MegatronMIMO.

    import mimo_accel
    mimo_accel.enable(sharded_reads=True, reorder=True, packing=True)
    # or from a YAML file's `mimo_accel:` section, with key=value overrides:
    mimo_accel.enable(config=mimo_accel.load_config("run.yaml", overrides=["pad_multiple=2"]))

or, with no code change, ``MIMO_ACCEL=all`` in the job's environment: the startup hook an install
puts in site-packages (``mimo_accel.pth``) enables it in every Python process at its start
(``mimo-accel env`` prints the variables of a config; ``mimo-accel run --config run.yaml -- ...``
sets them for a command). Importing this package patches nothing; every feature is off until
enabled.
"""

from __future__ import annotations

from typing import Optional

from mimo_accel.config import AccelConfig, ConfigError

from mimo_accel._version import __version__
__all__ = ["AccelConfig", "ConfigError", "enable", "disable", "status", "load_config", "__version__"]


def enable(config: Optional[AccelConfig] = None, **overrides) -> AccelConfig:
    """Turn on the features ``config`` (default: the ``MIMO_ACCEL*`` environment) selects.

    Keyword overrides win over the config/environment, e.g. ``enable(packing=True)``. Works
    whether megatron.bridge is imported before or after; calling it again with the same config
    is a no-op, with another config it re-patches. Raises :class:`ConfigError` (nothing patched)
    for a bad option: a switch that is not a bool, a count that is not a positive int, a
    ``cost_model`` / ``cost_index`` file that does not exist, a ``profile`` (or
    ``MIMO_ACCEL_CACHE_DIR``) directory that cannot be made and written. Relative paths are made
    absolute against this process's current directory. Returns the active config.
    """
    from mimo_accel.config import resolve
    from mimo_accel.patching import engine

    if config is not None and not isinstance(config, AccelConfig):
        raise ConfigError(f"enable(config=...) takes an AccelConfig (e.g. mimo_accel.load_config('run.yaml')), "
                          f"got {type(config).__name__}")
    cfg = resolve(config, overrides)
    cfg.check_paths()
    return engine.enable(cfg.absolute())


def load_config(path=None, overrides=(), *, base: Optional[AccelConfig] = None) -> AccelConfig:
    """The AccelConfig of a YAML file's ``mimo_accel:`` section with ``key=value`` overrides on top
    (OmegaConf, as Bridge reads its config); see :mod:`mimo_accel.config_file`."""
    from mimo_accel.config_file import load_config as _load

    return _load(path, overrides, base=base)


def disable() -> None:
    """Restore every patched upstream attribute to the identical original object."""
    from mimo_accel.patching import engine

    engine.disable()


def status() -> dict:
    """What is active, what was patched where, which upstream version and shape."""
    from mimo_accel.patching import engine

    return engine.status()
