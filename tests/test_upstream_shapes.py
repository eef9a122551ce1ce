"""Every one of the 16 patches against fabricated upstreams: one whose function has an extra trailing
parameter (passed positionally and by keyword) works unchanged and carries it to upstream; one that
renamed a parameter mimo_accel reads is refused at enable(), naming the target and the parameter.

The stand-ins have exactly the parameters mimo_accel declares it reads (patching/targets.py) plus
the extra one, so a replacement that read an undeclared parameter would fail here too. They replace
the installed megatron 0.6.2 functions in their real modules (and, for the names only upstream main
and #5525 have, modules grafted in): fakes, because no upstream with such signatures exists to run.
"""

from __future__ import annotations

import contextlib
import inspect
import math
import sys
import types

import pytest
import torch
from torch.utils.data import DataLoader

import mimo_accel
from mimo_accel.patching import engine, registry
from mimo_accel.patching import targets as T
from mimo_accel.patching.engine import PatchError
from mimo_accel.runtime.patches import fanin
from mimo_accel.runtime.reading import scope
from mimo_accel.runtime.context import ShardContext, StepRole
from mimo_accel.runtime.reading.shard import SHARD_TAG_KEY

EXTRA = "extra"
MARK = "upstream-only value"
SCALABLE = ("0.7.0+958575f", "0.20.0+24bad8e")  # the shape that has all 16 patches


def _stand_in(target: T.Target, params: tuple[str, ...], result):
    """An upstream function with ``params`` and a trailing ``extra=None``; it records what it got."""
    signature = inspect.Signature(
        [inspect.Parameter(p, inspect.Parameter.POSITIONAL_OR_KEYWORD) for p in params]
        + [inspect.Parameter(EXTRA, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None)])
    calls = []

    def upstream(*args, **kwargs):
        got = signature.bind(*args, **kwargs).arguments
        calls.append(dict(got))
        return result(got)

    upstream.__signature__ = signature
    upstream.__name__ = upstream.__qualname__ = target.name.split(".")[-1]
    upstream.__module__ = target.origin
    upstream.calls = calls
    return upstream


def _install(monkeypatch, patch: registry.Patch, result, renamed: tuple = ()):
    """The patch's stand-in at every site of each of its targets (one object per name, as upstream
    binds one function everywhere); ``renamed``: (target, parameter) to spell differently."""
    made = {}
    for t in patch.targets:
        if (t.origin, t.name) not in made:
            params = tuple(f"{p}_v2" if (t, p) == renamed else p for p in t.params)
            made[(t.origin, t.name)] = _stand_in(t, params, result)
        *path, attr = t.name.split(".")
        for module in {t.site, t.origin}:  # the defining module holds the same object
            owner = sys.modules[module]
            for part in path:
                owner = getattr(owner, part)
            monkeypatch.setattr(owner, attr, made[(t.origin, t.name)], raising=False)
    return made


class _Bridge:  # what the fan-in replacements read of a BridgeCommunicator (weak-referenceable)
    _batch_dim = 0
    dest_grid = None

    def is_current_rank_in_grid(self, grid):
        return True


class _LanguageModel:  # what _get_module_dp_info's replacement reads of a MimoModel (weak-referenceable)
    role = types.SimpleNamespace(has_language_module=True, has_modality_modules=False,
                                 is_first_stage=lambda name: True, is_last_stage=lambda name: True)
    mimo_config = types.SimpleNamespace(module_to_grid_map=None)


def _language_model():
    return _LanguageModel()


def _samples(n: int = 8):
    return [{"input_ids": torch.tensor([i, i])} for i in range(n)]


CTX = ShardContext(module="vision", dp_rank=1, dp_size=2, grid=2, dp_sizes={"vision": 2, "language": 2})


@contextlib.contextmanager
def _loaders_being_built(runtime, needed: bool):
    """A loader scope that knows this rank's place (what the sampling-info lookup records), or nothing."""
    if not needed:
        yield None
        return
    with scope.loader_scope(runtime) as open_scope:
        open_scope.context, open_scope._resolved = CTX, True
        yield open_scope


# patch name -> (the declared arguments of one call, what the stand-in returns, the check of what the
# patched name returned; the check also gets the runtime). Arguments are made per call (iterators).
def _cases(runtime):
    bridge = _Bridge()
    return {
        "loader builder": (lambda: dict(cfg=types.SimpleNamespace(model=None),
                                        megatron_mimo_provider=types.SimpleNamespace()),
                           lambda got: scope.current() is not None,
                           lambda out: out is True),  # upstream's builder ran inside a loader scope
        "setup": (lambda: dict(state=types.SimpleNamespace(cfg=types.SimpleNamespace(model=None)),
                               build_data_iterators_fn=lambda: scope.current() is not None),
                  lambda got: got["build_data_iterators_fn"](),
                  lambda out: out is True),  # the script's builder runs inside a loader scope
        "sampling info": (lambda: dict(megatron_mimo_cfg="cfg", grids={}), lambda got: (0, 1, True),
                          lambda out: out == (0, 1, True)),
        "pretraining loader": (
            lambda: dict(dataset=_samples(), consumed_samples=0, dataloader_type="single", micro_batch_size=4,
                         data_parallel_size=1, drop_last=True, data_sharding=True),
            lambda got: DataLoader(got["dataset"], batch_size=got["micro_batch_size"]),
            # replica 1 of 2 reads the second half of each global micro-batch of 4
            lambda out: next(iter(out))["input_ids"][:, 0].tolist() == [2, 3]),
        "canonical loader": (
            lambda: dict(dataset=_samples(), consumed_samples=0, dataloader_type="single", micro_batch_size=2,
                         module_dp_sizes=[2, 2], dp_rank=1, dp_size=2, drop_last=True, data_sharding=True),
            lambda got: DataLoader(got["dataset"], batch_size=got["micro_batch_size"]),
            lambda out: next(iter(out))[SHARD_TAG_KEY].sliced_in_step is False),  # upstream's shard, tagged
        "module dp info": (lambda: dict(megatron_mimo_model=_language_model()), lambda got: (1, 2),
                           # upstream's values; the step learns the model's role
                           lambda out: out == (1, 2) and runtime.step_role.is_language),
        "slice": (lambda: dict(batch={"input_ids": torch.zeros(2, 3)}, dp_rank=0, dp_size=1),
                  lambda got: got["batch"], lambda out: tuple(out["input_ids"].shape) == (2, 3)),
        "get batch": (lambda: dict(data_iterator=iter([{"input_ids": torch.ones(1, 2)}])),
                      lambda got: next(got["data_iterator"]), lambda out: set(out) == {"input_ids"}),
        "attach split sizes": (
            lambda: dict(self=types.SimpleNamespace(mimo_config=types.SimpleNamespace(module_to_grid_map=None)),
                         encoder_name="vision"),
            lambda got: "attached", lambda out: out == "attached"),
        "communicate shapes": (lambda: dict(self=bridge, recv_prev=True), lambda got: ([(3, 8), (5, 8)], []),
                               lambda out: out == ([(3, 8), (5, 8)], []) and fanin.pending(runtime)[bridge] > 0),
        "split at batch dim": (
            lambda: (fanin._queue(runtime, bridge).append([3, 5]),
                     dict(self=bridge, aggregated_tensor=torch.zeros(8, 2), num_splits=2))[1],
            lambda got: got["aggregated_tensor"]._mimo_bridge_split_sizes,
            lambda out: out == [3, 5]),  # the gradient splits as the forward's rows came
        "pack language shard": (  # next in a language rank's step, after _get_module_dp_info
            lambda: (setattr(runtime, "step_role", StepRole(True, True, True, 1)),
                     dict(data_batch=_language_batch(), lengths=torch.tensor([2, 3])))[1],
            lambda got: pytest.fail("mimo_accel's packer replaces upstream's: upstream's is never called"),
            lambda out: out[1]["cu_seqlens_q"].tolist() == [0, 2, 5]),
        "resolve step packing": (lambda: dict(dataset_cfg=types.SimpleNamespace()), lambda got: False,
                                 lambda out: out is True),
        "encode": (lambda: dict(self=types.SimpleNamespace(encoders={}), encoders_data_batch={"x": torch.ones(1)}),
                   lambda got: ["encoded"], lambda out: out == ["encoded"]),
        "optimizer step": (lambda: dict(self=object()), lambda got: (True, 1.0, 0), lambda out: out == (True, 1.0, 0)),
        "train entry": (lambda: dict(global_state=None, model=None), lambda got: "trained", lambda out: out == "trained"),
    }


def _language_batch():
    mask = torch.tensor([[1, 1, 0], [1, 1, 1]])
    return {"input_ids": torch.arange(6).view(2, 3), "labels": torch.arange(6).view(2, 3),
            "loss_mask": mask.float(), "attention_mask": mask, "position_ids": None, "modality_inputs": None}


@pytest.fixture
def scalable_shape(monkeypatch, tmp_path):
    """Upstream #5525's versions and the modules only it (and main) has, so one enable() with every
    feature patches all 16; a clean engine around the test."""
    mimo_accel.disable()
    monkeypatch.delenv(T.ALLOW_UNTESTED_ENV, raising=False)
    monkeypatch.setattr(engine, "installed_versions", lambda: SCALABLE)
    for name in (T.SEQUENCE_PACK, T.CANONICAL):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    sys.modules[T.CANONICAL].canonical_grid_size = lambda sizes: math.lcm(*sizes)
    for module in (T.DP_UTILS, T.LOADERS, T.DATA_PKG, T.SAMPLERS, T.STEP, T.PRETRAIN, T.SETUP, T.TRAIN,
                   T.MIMO_SUBMODULES, T.MIMO_OPTIMIZER, T.MIMO_MODEL, T.BRIDGE_COMM):
        __import__(module)
    for patch in registry.PATCHES.values():  # the test replaces the one it is about
        _install(monkeypatch, patch, lambda got: None)
    yield dict(sharded_reads=True, packing=True, profile=str(tmp_path / "profile"))
    mimo_accel.disable()


def test_the_cases_cover_every_patch():
    assert set(_cases(None)) == set(registry.PATCHES) and len(registry.PATCHES) == 16


@pytest.mark.parametrize("name", list(registry.PATCHES))
def test_an_extra_trailing_parameter_reaches_upstream_unchanged(scalable_shape, monkeypatch, name):
    patch = registry.PATCHES[name]
    cases = None

    def result(got):
        return cases[name][1](got)

    made = _install(monkeypatch, patch, result)
    mimo_accel.enable(**scalable_shape)
    runtime = engine._state.runtime
    cases = _cases(runtime)
    arguments, _, check = cases[name]
    patched = [s.where for s in engine._swaps]
    for t in patch.targets:
        assert any(w.endswith(f".{t.name.split('.')[-1]}") for w in patched), t
    t = patch.targets[0]
    replacement = engine.find_attribute(sys.modules[t.site], t.name)[2]
    assert replacement is not made[(t.origin, t.name)]
    stand_in = made[(t.origin, t.name)]
    needs_scope = name in ("pretraining loader", "canonical loader", "sampling info")
    for how in ("positional", "keyword"):
        args = arguments()
        with _loaders_being_built(runtime, needs_scope) as open_scope:
            if how == "positional":
                out = replacement(*args.values(), MARK)
            else:
                out = replacement(*args.values(), **{EXTRA: MARK})
            assert check(out), (how, out)
            if name == "sampling info":  # the layout is recorded for the loaders built next
                assert open_scope.layout == ("cfg", {})
    if name == "pack language shard":  # a full replacement: the argument it cannot use is said, once
        assert stand_in.calls == []
        notes = [n for n in mimo_accel.status()["notes"] if "does not use" in n]
        assert len(notes) == 1 and EXTRA in notes[0]
    else:
        assert [c[EXTRA] for c in stand_in.calls] == [MARK, MARK]
        assert all(set(c) == set(t.params) | {EXTRA} for c in stand_in.calls)


def _renames():
    return [(name, t, p) for name, patch in registry.PATCHES.items() for t in patch.targets[:1] for p in t.params]


@pytest.mark.parametrize("name, target, param", _renames(), ids=lambda v: v if isinstance(v, str) else "")
def test_a_renamed_parameter_is_refused_at_enable_naming_target_and_parameter(scalable_shape, monkeypatch,
                                                                               name, target, param):
    patch = registry.PATCHES[name]
    _install(monkeypatch, patch, lambda got: None, renamed=(target, param))
    with pytest.raises(PatchError) as err:
        mimo_accel.enable(**scalable_shape)
    message = str(err.value)
    # the first of the name's binding sites that enable() checks: any of them names the target
    assert any(f"{t.site}.{t.name}: it has no parameter '{param}'" in message for t in patch.targets), message
    assert f"{param}_v2" in message and "Nothing was patched" in message
    assert mimo_accel.status()["patched"] == []
