"""A Bridge with its own intra-microbatch reorder never runs with mimo_accel's reorder on as well.

#4608's MegatronMIMOFeatureConfig on ConfigContainer.mimo: mimo_accel's steps aside, once, with a
notice. PR #4608's reorder buffer (settings on cfg.dataset): mimo_accel's replaces it (the flag
set off before the script builds its iterators), once, with a notice; without mimo_accel's reorder,
upstream's runs and mimo_accel leaves the train loader untagged.

The feature config is fabricated (its fields and defaults copied from #4608's training/config.py at
984a8a538): no installable Bridge has it. It reaches mimo_accel as Bridge hands it over, through
the patched setup_megatron_mimo and build_megatron_mimo_data_loaders of the installed 0.6.2.
"""

from __future__ import annotations

import dataclasses
import logging
import types

import pytest

import mimo_accel
from mimo_accel.patching import engine
from mimo_accel.runtime.patches import loader_scope, setup
from mimo_accel.runtime.upstream_reorder import (BUFFER_CLASS, BUFFER_MODULE, BUFFER_REORDERS, STEPPED_ASIDE,
                                                 buffer_reorder, upstream_reorder)


@dataclasses.dataclass
class MegatronMIMOFeatureConfig:  # #4608's fields that decide whether upstream reorders
    pack_sequences_in_batch: bool = False
    scalable_dp: bool = False
    intra_microbatch_reorder: bool = True
    overlap_intra_microbatch_reorder: bool = True
    reorder_window_size: int = 1
    cost_linear_vit: float = 1.0
    cost_linear_lm: float = 0.0
    pad_token_id: int = 0


@dataclasses.dataclass
class SplitFeatureConfig:  # a later split with the reorder knobs and no scalable_dp field
    intra_microbatch_reorder: bool = True
    reorder_window_size: int = 1
    cost_linear_vit: float = 1.0
    cost_linear_lm: float = 0.0


def _container(mimo=None):
    return types.SimpleNamespace(model=None, mimo=mimo)


@pytest.fixture
def enabled(monkeypatch):
    mimo_accel.disable()
    monkeypatch.setattr(engine, "installed_versions", lambda: ("0.6.2", "0.19.2"))

    def enable(**features):
        mimo_accel.enable(**features)
        return engine._state.runtime

    yield enable
    mimo_accel.disable()


def _setup_with(cfg):
    """Bridge's setup_megatron_mimo as pretrain_megatron_mimo calls it, patched, with a stand-in for
    what it does after mimo_accel's checks (it would build the model and the loaders)."""
    def setup_megatron_mimo(state, build_data_iterators_fn=None):
        return build_data_iterators_fn()

    return setup.wrap_setup(setup_megatron_mimo, engine._state.runtime)(
        types.SimpleNamespace(cfg=cfg), build_data_iterators_fn=lambda: engine._state.runtime.reorders)


@pytest.mark.parametrize("mimo, reorders", [
    (None, False),  # 0.6.2, main, #5525: no such config
    (MegatronMIMOFeatureConfig(), False),  # #4608's default: the reorder acts only on scalable_dp reads
    (MegatronMIMOFeatureConfig(scalable_dp=True), True),
    (MegatronMIMOFeatureConfig(scalable_dp=True, intra_microbatch_reorder=False), False),
    (SplitFeatureConfig(), True),
    (SplitFeatureConfig(intra_microbatch_reorder=False), False),
])
def test_what_counts_as_upstream_reordering(mimo, reorders):
    assert (upstream_reorder(_container(mimo)) is not None) == reorders


def test_mimo_accel_reorder_steps_aside_with_one_notice(enabled, caplog):
    runtime = enabled(reorder=True, packing=True)
    cfg = _container(MegatronMIMOFeatureConfig(scalable_dp=True))
    with caplog.at_level(logging.WARNING, logger="mimo_accel"):
        assert _setup_with(cfg) is False  # the loaders are built with mimo_accel's reorder off
        loader_scope.wrap_loader_builder(lambda cfg, megatron_mimo_provider: runtime.reorders, runtime)(
            cfg, types.SimpleNamespace())
    assert runtime.reorders is False and runtime.features() == ["sharded_reads", "packing"]
    assert runtime.config.reorder and runtime.config is mimo_accel.status()["config"]  # the config is never replaced
    assert not runtime.calibrates_online  # its cost model is not learnt either
    notices = [r.getMessage() for r in caplog.records if "steps aside" in r.getMessage()]
    assert len(notices) == 1 and "cfg.mimo.intra_microbatch_reorder=True with cfg.mimo.scalable_dp=True" in notices[0]
    assert "intra_microbatch_reorder=False" in notices[0]  # how to get mimo_accel's reorder instead
    st = mimo_accel.status()
    assert st["active"] == ["sharded_reads", "packing"] and notices[0] in st["notes"]


def test_mimo_accel_reorder_stays_where_upstream_does_not_reorder(enabled):
    runtime = enabled(reorder=True)
    assert _setup_with(_container(MegatronMIMOFeatureConfig(scalable_dp=False))) is True
    assert runtime.reorders and STEPPED_ASIDE not in runtime.notices()


def test_nothing_is_said_without_mimo_accel_reorder(enabled):
    runtime = enabled(sharded_reads=True)
    _setup_with(_container(MegatronMIMOFeatureConfig(scalable_dp=True)))
    assert STEPPED_ASIDE not in runtime.notices() and runtime.config.sharded_reads


def _bridges_own_feature_config():
    from megatron.bridge.training import config

    return getattr(config, "MegatronMIMOFeatureConfig", None)


def test_against_this_bridges_own_feature_config(enabled):
    """Where the installed Bridge has the feature config (#4608's tree, #6306), its own class and
    defaults, through the installed Bridge's patched targets."""
    own = _bridges_own_feature_config()
    if own is None:
        pytest.skip("this Bridge has no MegatronMIMOFeatureConfig (0.6.2, main and #5525 have none)")
    runtime = enabled(reorder=True)
    assert _setup_with(_container(own())) is True  # upstream's default: reorder only on scalable_dp reads
    assert _setup_with(_container(own(scalable_dp=True))) is False
    assert runtime.reorders is False and STEPPED_ASIDE in runtime.notices()


def test_stepping_aside_does_not_warn_about_reorder_options(enabled, caplog):
    """Reorder's options lose their effect when mimo_accel's reorder steps aside, but the step-aside
    notice already says why: no "has no effect" warning on top (enable() warns those, for the config
    it is given)."""
    with caplog.at_level(logging.WARNING, logger="mimo_accel"):
        runtime = enabled(reorder=True, reorder_window=4, strict_gradients=True, calibrate_online=False)
        assert _setup_with(_container(MegatronMIMOFeatureConfig(scalable_dp=True))) is False
    said = [r.getMessage() for r in caplog.records]
    assert STEPPED_ASIDE in runtime.notices() and any("steps aside" in m for m in said)
    assert runtime.config.reorder_window == 4 and runtime.reorders is False  # the options stay, reorder acts not
    assert not [m for m in said if "has no effect" in m]


# PR #4608's reorder buffer: settings on cfg.dataset (DirectHFSFTDatasetConfig) ---------------

@dataclasses.dataclass
class BufferDatasetConfig:  # the reorder buffer's fields and defaults (docs/training/mimo-intra-microbatch-reorder.md)
    megatron_mimo_scalable_dp: bool = False
    megatron_mimo_intra_microbatch_reorder: bool = False
    megatron_mimo_reorder_encoder_cost_weight: float = 1.0
    megatron_mimo_reorder_language_cost_weight: float = 0.0
    megatron_mimo_reorder_overlap: bool = True
    megatron_mimo_reorder_window_size: int = 1


def _buffered(scalable=True, reorder=True):
    return types.SimpleNamespace(model=None, mimo=None, dataset=BufferDatasetConfig(scalable, reorder))


def _setup_reading_the_flag(cfg):
    """setup_megatron_mimo as pretrain_megatron_mimo calls it, with a build_data_iterators that
    decides as upstream's example does, from cfg.dataset when it runs."""
    def setup_megatron_mimo(state, build_data_iterators_fn=None):
        return build_data_iterators_fn()

    def build_data_iterators():
        data = cfg.dataset
        return data.megatron_mimo_scalable_dp and data.megatron_mimo_intra_microbatch_reorder

    return setup.wrap_setup(setup_megatron_mimo, engine._state.runtime)(
        types.SimpleNamespace(cfg=cfg), build_data_iterators_fn=build_data_iterators)


@pytest.mark.parametrize("scalable, reorder, reorders", [
    (False, False, False), (True, False, False),
    (False, True, False),  # upstream's buffer acts on its scalable reads only
    (True, True, True),
])
def test_what_counts_as_4608s_reorder_buffer(scalable, reorder, reorders):
    assert (buffer_reorder(_buffered(scalable, reorder)) is not None) == reorders


def test_mimo_accel_reorder_replaces_bridges_with_one_notice(enabled, caplog):
    runtime = enabled(reorder=True, packing=True)
    cfg = _buffered()
    with caplog.at_level(logging.WARNING, logger="mimo_accel"):
        assert _setup_reading_the_flag(cfg) is False  # the script builds no buffer
        loader_scope.wrap_loader_builder(lambda cfg, megatron_mimo_provider: None, runtime)(cfg, types.SimpleNamespace())
    assert cfg.dataset.megatron_mimo_intra_microbatch_reorder is False and cfg.dataset.megatron_mimo_scalable_dp
    assert runtime.reorders and runtime.upstream_moves_samples is None
    said = [r.getMessage() for r in caplog.records if "replaces PR #4608's reorder buffer" in r.getMessage()]
    assert len(said) == 1 and "megatron_mimo_intra_microbatch_reorder" in said[0] and "reorder=False" in said[0]
    assert said[0] in mimo_accel.status()["notes"] and "reorder" in mimo_accel.status()["active"]


def test_without_mimo_accel_reorder_bridges_runs_and_the_loader_is_left_untagged(enabled):
    from mimo_accel.runtime.patches import loaders

    runtime = enabled(sharded_reads=True, packing=True)
    cfg = _buffered()
    assert _setup_reading_the_flag(cfg) is True  # upstream's buffer is built
    assert runtime.upstream_moves_samples is not None and BUFFER_REORDERS in runtime.notices()
    upstream_loader = object()
    assert loaders._canonical_share(upstream_loader, None, None, "train", None, runtime, None) is upstream_loader


def test_a_script_that_wraps_bridges_buffer_anyway_is_refused_before_the_first_batch(enabled):
    runtime = enabled(reorder=True)
    buffer = type(BUFFER_CLASS, (), {"__module__": BUFFER_MODULE})()

    def setup_megatron_mimo(state, build_data_iterators_fn=None):
        return build_data_iterators_fn()

    wrapped = setup.wrap_setup(setup_megatron_mimo, runtime)
    with pytest.raises(RuntimeError, match="two reorders must not run on one micro-batch"):
        wrapped(types.SimpleNamespace(cfg=_buffered(reorder=False)), build_data_iterators_fn=lambda: (buffer, None))
    # the same object is no concern where mimo_accel does not reorder
    runtime.reorder_stepped_aside = "cfg.mimo.intra_microbatch_reorder=True"
    assert wrapped(types.SimpleNamespace(cfg=None), build_data_iterators_fn=lambda: (buffer, None))[0] is buffer
