"""The patch engine: enable/disable as a lifecycle, like OpenTelemetry's BaseInstrumentor.

- The installed megatron-bridge *and* megatron-core versions are checked against the declared
  shapes (targets.py) *before* anything is patched: a newer patch release of a shape's releases, or
  a source build of its versions at another commit, is accepted with one notice (its targets are
  checked as every shape's are); any other pair outside
  every shape is refused unless ``MIMO_ACCEL_ALLOW_UNTESTED=1``, which picks the nearest shape and
  warns once. Every target of a
  site is then validated before that site is patched, tested shape or not, and so is every
  private upstream name the enabled features read (``targets.INTERNALS``).
- What to patch comes from one table, :mod:`mimo_accel.patching.registry`; each replacement is
  made once per original object with the :class:`~mimo_accel.runtime.state.Runtime` of this
  enable, which holds all of the features' state.
- Sites already imported are patched at ``enable()``; the others when they are imported
  (wrapt post-import hooks), so the order of ``import megatron.bridge`` and ``enable()`` does not
  matter. A site that fails validation when it is imported undoes everything (all-or-nothing).
- ``disable()`` restores every patched attribute to the identical original object.
"""

from __future__ import annotations

import inspect
import logging
import os
import re
import sys
import threading
from collections import defaultdict
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any, Callable, Optional

import wrapt

from mimo_accel.config import AccelConfig
from mimo_accel.config import allow_untested as config_allow_untested
from mimo_accel.notices import Notices, own_lines
from mimo_accel.patching import registry
from mimo_accel.patching import targets as T
from mimo_accel.patching.swaps import SwapSet
from mimo_accel.runtime.state import Runtime


class PatchError(RuntimeError):
    """The installed upstream does not have the shape mimo_accel patches; nothing was patched."""


@dataclass
class _State:
    config: AccelConfig = field(default_factory=AccelConfig)
    shape: Optional[T.Shape] = None
    match: Optional[T.Match] = None
    runtime: Optional[Runtime] = None  # the features' state while enabled
    generation: int = 0
    by_site: dict = field(default_factory=dict)  # site -> [(Target, Patch)] still to patch or patched
    internals: dict = field(default_factory=dict)  # module -> [Internal] to check when it is imported
    patched_sites: list = field(default_factory=list)
    replacements: dict = field(default_factory=dict)  # id(original) -> replacement
    originals: dict = field(default_factory=dict)  # id(replacement) -> original
    notes: list = field(default_factory=list)


# Patches are process-wide (upstream's module attributes exist once per process), so the engine
# that owns them, and the Runtime of the enable in force, is one per process:
_lock = threading.RLock()  # enable(), disable() and the import hooks may run on any thread
_swaps = SwapSet()  # every patched attribute with its original, for disable()'s exact undo
_state = _State()  # the enable in force, its Runtime included
logger = logging.getLogger("mimo_accel")
# Said once per process whatever enable()/disable() come between (a Runtime lives one enable): a
# (bridge, core) pair untested or a newer patch release, an unknown MIMO_ACCEL* name
_said = Notices(logger)
SPARSE_NOTE = ("sharded_reads: this Bridge's slice keeps each modality's samples where some lack it (PR #4986, "
               "_mimo_sample_indices); every replica reads and collates its own share, which upstream's slice "
               "takes as one replica's whole batch (DP 1): the indices come off, the rows stay")


def installed_versions() -> tuple[Optional[str], Optional[str]]:
    """(megatron-bridge, megatron-core) versions as installed, None where absent.

    The one place the engine (and ``mimo-accel doctor``) reads them; tests substitute it.
    """
    found = []
    for dist in ("megatron-bridge", "megatron-core"):
        try:
            found.append(metadata.version(dist))
        except metadata.PackageNotFoundError:
            found.append(None)
    return found[0], found[1]


def allow_untested(environ=None) -> bool:
    """``MIMO_ACCEL_ALLOW_UNTESTED``: "1" allows an untested upstream; unset, "" or "0" do not."""
    return config_allow_untested(environ)


def check_versions(m: T.Match) -> T.Shape:
    """The shape to patch for an installed version pair, or PatchError (nothing is patched)."""
    allowed = allow_untested()  # a bad value is an error whatever the versions
    if m.status == "missing":
        raise PatchError(f"mimo_accel.enable(): {'; '.join(m.problems)}. Install a tested pair "
                         f"({T.SUPPORTED}) or leave mimo_accel disabled; nothing was patched.")
    if m.status == "untested":
        if not allowed:
            raise PatchError(
                f"mimo_accel.enable(): installed {m.installed} is not a tested combination "
                f"({'; '.join(m.problems)}). Tested: {T.SUPPORTED}. Nothing was patched. Install a tested "
                f"pair, or set {T.ALLOW_UNTESTED_ENV}=1 to patch it anyway as the nearest shape "
                f"('{m.shape.name}'); every patch target is still checked before anything is patched.")
        _said.say_once((m.bridge, m.core), (
            f"mimo_accel: {m.installed} is untested ({'; '.join(m.problems)}); {T.ALLOW_UNTESTED_ENV}=1 is set, "
            f"so patching it as the nearest shape '{m.shape.name}'. Tested: {T.SUPPORTED}"))
    return m.shape


def _say_patch_release_once(m: T.Match) -> None:
    """A newer patch release or another source build whose imported targets were all checked: one
    notice per process."""
    if m.status not in ("patch", "build"):
        return
    _said.say_once((m.bridge, m.core), (
        f"mimo_accel: {m.installed}: {'; '.join(m.problems)}; accepted as shape '{m.shape.name}' "
        f"({m.shape.support}, not this release) because every target mimo_accel patches has that shape, each "
        "checked before it is patched (a site imported later is checked at its import). mimo-accel doctor "
        "lists the targets."))


def find_attribute(site_module, name: str):
    """(owner, attribute, current object) for ``name`` ('func' or 'Class.method') in a module."""
    owner = site_module
    parts = name.split(".")
    for part in parts[:-1]:
        owner = getattr(owner, part)
    attr = parts[-1]
    obj = owner.__dict__.get(attr) if isinstance(owner, type) else getattr(owner, attr)
    return owner, attr, obj


def signature_problem(obj, target: T.Target) -> Optional[str]:
    """Why ``obj`` lacks a parameter the target's replacement reads, by name (None: it has them all).

    The replacements bind every call through upstream's own signature and pass it on whole, so
    parameter order and parameters mimo_accel does not read are upstream's business."""
    try:
        params = inspect.signature(obj).parameters
    except (TypeError, ValueError):
        return "its signature cannot be read"
    variadic = (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
    named = {name for name, p in params.items() if p.kind not in variadic}
    missing = [name for name in target.params if name not in named]
    missing += [name for name in target.optional if name in params and params[name].kind in variadic]
    if not missing:
        return None
    return (f"it has no parameter {', '.join(repr(n) for n in missing)} (mimo_accel reads {', '.join(target.params)}; "
            f"found ({', '.join(params)}))")


def target_problem(target: T.Target, module) -> Optional[str]:
    """Why a target in an imported site module is not the shape mimo_accel patches (None: it is)."""
    try:
        _, _, obj = find_attribute(module, target.name)
    except AttributeError:
        obj = None
    if obj is None:
        return "it does not exist"
    origin = sys.modules.get(target.origin)
    if origin is not None and origin is not module:
        try:
            _, _, defined = find_attribute(origin, target.name)
        except AttributeError:
            defined = None
        if obj is not defined:
            return f"it is not the function {target.origin} defines (something else replaced it)"
    return signature_problem(obj, target)


def _validate(site: str, targets: list[T.Target], installed: str) -> None:
    module = sys.modules[site]
    for t in targets:
        problem = target_problem(t, module)
        if problem is not None:
            raise PatchError(f"mimo_accel cannot patch {site}.{t.name}: {problem}, in {installed}. "
                             f"Supported: {T.SUPPORTED}. Install a supported release or turn the feature off. "
                             "Nothing was patched.")


def internal_problem(internal: T.Internal) -> Optional[str]:
    """Why a declared private upstream name is not what mimo_accel reads (None: it is)."""
    module = sys.modules.get(internal.module)
    if module is None:
        try:
            import importlib

            module = importlib.import_module(internal.module)
        except Exception as exc:  # a diagnosis: report, don't crash
            return f"{internal.module} does not import ({type(exc).__name__}: {exc})"
    parts = internal.name.split(".")
    owner = module
    for part in parts[:-1] if internal.instance else parts:
        if not hasattr(owner, part):  # the value itself may be None (a calculator not set up yet)
            return f"{internal.where} does not exist"
        owner = getattr(owner, part)
    if internal.instance:
        try:
            source = inspect.getsource(owner.__init__)
        except (OSError, TypeError):
            return f"the source of {internal.module}.{'.'.join(parts[:-1])}.__init__ cannot be read"
        if not re.search(rf"\b{re.escape(parts[-1])}\b", source):
            return f"{internal.module}.{'.'.join(parts[:-1])}.__init__ no longer names {parts[-1]}"
    return None


def _check_internals(internals: list[T.Internal], installed: str) -> None:
    for internal in internals:
        problem = internal_problem(internal)
        if problem is not None:
            raise PatchError(f"mimo_accel cannot run on {installed}: it reads the private upstream name "
                             f"{internal.where} for {internal.used_for}, but {problem}. Supported: "
                             f"{T.SUPPORTED}. Nothing was patched.")


def _apply(site: str, entries: list) -> None:
    module = sys.modules[site]
    for t, patch in entries:
        owner, attr, current = find_attribute(module, t.name)
        # A site that imported the name after its origin was patched already holds our replacement.
        original = _state.originals.get(id(current), current)
        replacement = _state.replacements.get(id(original))
        if replacement is None:
            replacement = patch.replace(original, _state.runtime)
            _state.replacements[id(original)] = replacement
            _state.originals[id(replacement)] = original
        _swaps.swap(owner, attr, replacement, original=original)
    _state.patched_sites.append(site)


def _targets(entries: list) -> list[T.Target]:
    return [t for t, _ in entries]


def _on_import(site: str, generation: int) -> Callable[[Any], None]:
    def hook(module) -> None:
        with _lock:
            if generation != _state.generation:
                return
            try:
                _check_internals(_state.internals.pop(site, []), _state.match.installed)
                if site in _state.by_site and site not in _state.patched_sites:
                    _validate(site, _targets(_state.by_site[site]), _state.match.installed)
                    _apply(site, _state.by_site[site])
            except Exception:
                _disable_locked()  # all-or-nothing: a site that does not fit undoes the others
                raise

    return hook


def _warn_unknown_variables() -> None:
    """A mistyped MIMO_ACCEL* name would be ignored: said once per name and process."""
    from mimo_accel.config import unknown_variables

    for line in unknown_variables(os.environ):
        name = line.split(" ", 1)[0]
        _said.say_once(("variable", name), f"mimo_accel: {line}; it is ignored")


def _warn_changes(previous: AccelConfig, cfg: AccelConfig) -> None:
    """What a new config silently drops or cannot use: the features an earlier enable() turned on
    that this one turns off, and options whose feature is off."""
    if _state.runtime is not None:
        off = [name for name in previous.features() if name not in cfg.features()]
        if off:
            logger.warning("mimo_accel: this enable() turns off %s, which an earlier enable() turned on (each "
                           "call replaces the whole config): pass %s again to keep %s, or call "
                           "mimo_accel.disable() first", ", ".join(off),
                           ", ".join(f"{name}=True" if name != "profile" else "profile=DIR" for name in off),
                           "it" if len(off) == 1 else "them")
    for line in cfg.without_effect():
        logger.warning("mimo_accel: %s", line)


def enable(cfg: AccelConfig) -> AccelConfig:
    own_lines()
    with _lock:
        _warn_unknown_variables()
        if cfg == _state.config and (_state.generation or not cfg.any_feature):
            return cfg
        _warn_changes(_state.config, cfg)
        _disable_locked()
        if not cfg.any_feature:
            _state.config = cfg
            return cfg
        m = T.match(*installed_versions())
        shape = check_versions(m)  # before anything is patched
        by_site: dict = defaultdict(list)
        for patch in registry.patches_for(cfg, shape):
            for t in patch.targets:
                by_site[t.site].append((t, patch))
        internals: dict = defaultdict(list)
        for internal in registry.internals_for(cfg):
            internals[internal.module].append(internal)
        now = [s for s in by_site if s in sys.modules]
        # validate everything importable before patching anything
        _check_internals([i for mod, found in internals.items() if mod in sys.modules for i in found], m.installed)
        for site in now:
            _validate(site, _targets(by_site[site]), m.installed)
        _say_patch_release_once(m)
        runtime = registry.runtime_for(cfg, shape)
        _state.config, _state.shape, _state.match, _state.runtime = cfg, shape, m, runtime
        _state.by_site = dict(by_site)
        _state.internals = {mod: found for mod, found in internals.items() if mod not in sys.modules}
        _state.generation += 1
        _state.notes = []
        if m.status != "tested":
            _state.notes.append(f"{m.installed}: {m.status} — shape '{shape.name}', {shape.support}: "
                                f"{shape.evidence}")
        if cfg.packing and shape.native_packing:
            _state.notes.append("packing: upstream's step packs (sequence_pack); mimo_accel's packer replaces "
                                "its pack_language_shard and turns step packing on (resolve_step_packing)")
        if cfg.sharded_reads and shape.sparse_modalities:
            runtime.say_once("sharded_reads:sparse-modalities", SPARSE_NOTE)
        try:
            for site in now:
                _apply(site, by_site[site])
        except Exception:
            _disable_locked()
            raise
        for site in set(by_site) | set(_state.internals):
            if site not in now:
                wrapt.register_post_import_hook(_on_import(site, _state.generation), site)
        _announce(cfg, shape, m)
        return cfg


def enabled_line(cfg: AccelConfig, shape: T.Shape, m: T.Match) -> str:
    """What the log says at enable(): the features, the upstream pair, its shape and support."""
    names = []
    for name in cfg.features():
        if name == "reorder" and cfg.reorder_mode != "plan":
            name = f"reorder ({cfg.reorder_mode})"
        elif name == "profile":
            name = f"profile ({cfg.profile})"
        names.append(name)
    return (f"enabled {', '.join(names)} on megatron-bridge {m.bridge} / megatron-core {m.core} "
            f"(shape {shape.name}, {m.status})")


def _announce(cfg: AccelConfig, shape: T.Shape, m: T.Match) -> None:
    """One INFO line, the level of Bridge's own milestones ("Starting MegatronMIMO pretraining"),
    through mimo_accel's own handler (:func:`mimo_accel.notices.own_lines`): shown whatever the job's
    logging set-up, with one prefix."""
    logger.info(enabled_line(cfg, shape, m))


def _disable_locked() -> None:
    _swaps.restore()
    _state.generation += 1  # pending post-import hooks of the old generation become no-ops
    runtime, _state.runtime = _state.runtime, None
    if runtime is not None:
        runtime.close()
    _state.config = AccelConfig()
    _state.shape = None
    _state.match = None
    _state.by_site = {}
    _state.internals = {}
    _state.patched_sites = []
    _state.replacements = {}
    _state.originals = {}
    _state.notes = []


def disable() -> None:
    with _lock:
        _disable_locked()


def status() -> dict:
    with _lock:
        patched = [s.where for s in _swaps]
        pending = sorted(s for s in _state.by_site if s not in _state.patched_sites)
        m = _state.match or T.match(*installed_versions())
        runtime = _state.runtime
        return {
            # a feature that stepped aside for upstream's own is off here, not in "config"
            "active": runtime.features() if runtime is not None else _state.config.features(),
            "config": _state.config,
            "megatron_bridge": m.bridge,
            "megatron_core": m.core,
            "shape": _state.shape.name if _state.shape else None,
            "support": m.status,
            "patched": patched,
            "waiting_for_import": pending,
            "notes": list(_state.notes) + (list(runtime.notices().values()) if runtime is not None else []),
        }
