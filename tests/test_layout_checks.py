"""The misconfigurations users make, refused (or said) where Bridge hands over its provider.

- A module whose ``TransformerConfig`` TP/PP size disagrees with its grid in
  ``MegatronMIMOParallelismConfig``: megatron-core builds the layers from the config's sizes
  (``get_num_layers_to_build`` reads its PP size: every stage builds every layer) and the process
  groups from the grid; a torch_dist checkpoint then holds two stages' layers under the same keys.
  With any feature on it is refused, before the model is built (``setup_megatron_mimo``) and when
  the loaders are built, naming the module and both values.
- Reorder under megatron's per-replica loss normalisation (``calculate_per_token_loss=False``):
  said once (``status()["notes"]``), or refused with ``strict_gradients``.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

import mimo_accel
from mimo_accel.config import AccelConfig, ConfigError
from mimo_accel_dev.rehearse import stack as st
from mimo_accel_dev.rehearse.ranks import LANGUAGE, VISION, Modules, loader_config, module


def _provider(layout=Modules.of(module(VISION, 1), module(LANGUAGE, 1, pp=2)), encoder="native"):
    return st.build_provider(st.StackConfig(layout=layout, encoder=encoder, language_layers=2))


@pytest.fixture
def enabled():
    def enable(**features):
        mimo_accel.enable(**features)
        return mimo_accel

    yield enable
    mimo_accel.disable()


def _setup(provider):
    from megatron.bridge.training import pretrain_megatron_mimo as pretrain

    return pretrain.setup_megatron_mimo(SimpleNamespace(cfg=SimpleNamespace(model=provider)), None)


def _loaders(provider):
    from megatron.bridge.data.megatron_mimo.loaders import build_megatron_mimo_data_loaders

    return build_megatron_mimo_data_loaders(loader_config(provider, 4), SimpleNamespace(consumed_train_samples=0),
                                            None, 8, 0, 0)


PP_MISMATCH = (r"module 'language' \(the language model, spec param 'config'\): "
               r"TransformerConfig.pipeline_model_parallel_size = 1, but MegatronMIMOParallelismConfig"
               r".module_parallelisms\['language'\].pipeline_model_parallel_size = 2")


@pytest.mark.parametrize("entry", [_setup, _loaders], ids=["model build", "loader build"])
def test_a_pp_size_that_differs_from_the_grid_is_refused(enabled, entry):
    provider = _provider()
    provider.language_model_spec.params["config"].pipeline_model_parallel_size = 1  # the foot-gun
    enabled(sharded_reads=True)
    with pytest.raises(ValueError, match=rf"(?s)disagrees with its grid.*every stage builds every layer.*{PP_MISMATCH}"):
        entry(provider)


def test_tp_of_the_language_model_and_of_a_config_encoder_is_checked(enabled):
    provider = _provider(Modules.of(module(VISION, 1, tp=2), module(LANGUAGE, 1, tp=2)))
    provider.language_model_spec.params["config"].tensor_model_parallel_size = 1
    st.encoder_transformer_config(provider).tensor_model_parallel_size = 1
    enabled(packing=True)
    with pytest.raises(ValueError) as err:
        _setup(provider)
    lines = str(err.value).splitlines()[1:]
    assert [line.strip() for line in lines] == [
        "module 'language' (the language model, spec param 'config'): TransformerConfig.tensor_model_parallel_size "
        "= 1, but MegatronMIMOParallelismConfig.module_parallelisms['language'].tensor_model_parallel_size = 2",
        "module 'vision' (encoder 'vit', spec param 'config'): TransformerConfig.tensor_model_parallel_size = 1, "
        "but MegatronMIMOParallelismConfig.module_parallelisms['vision'].tensor_model_parallel_size = 2"]


def test_bridge_sets_a_transformer_config_encoders_tp_itself_so_only_its_pp_is_checked():
    from mimo_accel.runtime import preflight

    provider = _provider(Modules.of(module(VISION, 1, tp=2), module(LANGUAGE, 1)), encoder="qwen3vl")
    config = st.encoder_transformer_config(provider)
    assert "transformer_config" in provider.modality_submodules_spec["vision"].submodules["encoders"]["vit"].params
    config.tensor_model_parallel_size = 1  # Bridge's _inject_pg_collection_into_modality_spec sets it to 2
    assert preflight.size_mismatches(provider) == []
    config.pipeline_model_parallel_size = 2
    assert preflight.size_mismatches(provider) == [
        "module 'vision' (encoder 'vit', spec param 'transformer_config'): TransformerConfig."
        "pipeline_model_parallel_size = 2, but MegatronMIMOParallelismConfig.module_parallelisms['vision']."
        "pipeline_model_parallel_size = 1"]


def test_matching_sizes_and_no_features_pass():
    from mimo_accel.runtime import preflight
    from mimo_accel.runtime.state import Runtime

    provider = _provider(Modules.of(module(VISION, 1, tp=2), module(LANGUAGE, 1, tp=2, pp=2)))
    assert preflight.size_mismatches(provider) == []
    provider.language_model_spec.params["config"].pipeline_model_parallel_size = 1
    preflight.check_provider(provider, Runtime(AccelConfig()))  # nothing on: upstream's behaviour


# ---------------------------------------------------------------- loss normalisation


def _reorder_provider(language_dp=2, per_token=False):
    provider = _provider(Modules.of(module(VISION, 2), module(LANGUAGE, language_dp)))
    provider.language_model_spec.params["config"].calculate_per_token_loss = per_token
    return provider


def _check(provider, **features):
    from mimo_accel.runtime import preflight
    from mimo_accel.runtime.state import Runtime

    runtime = Runtime(AccelConfig(**features))
    preflight.check_provider(provider, runtime)
    return runtime.notices()


def test_reorder_under_a_per_replica_loss_is_said_once_in_status(enabled):
    enabled(sharded_reads=True, reorder=True)
    provider = _reorder_provider()
    for _ in range(2):
        with pytest.raises(Exception) as err:  # said before upstream's own checks stop the fake state
            _setup(provider)
        assert "per-replica" not in str(err.value)
    notes = mimo_accel.status()["notes"]
    said = [n for n in notes if "calculate_per_token_loss=False" in str(n)]
    assert len(said) == 1, notes
    assert ("each language replica's loss is the mean over its own tokens" in str(said[0])
            and "strict_gradients=True (MIMO_ACCEL_STRICT_GRADIENTS=1) makes this an error" in str(said[0]))


def test_strict_gradients_refuses_it_naming_the_fix(enabled, monkeypatch):
    monkeypatch.setenv("MIMO_ACCEL_STRICT_GRADIENTS", "1")
    assert AccelConfig.from_env().strict_gradients is True
    monkeypatch.setenv("MIMO_ACCEL_STRICT_GRADIENTS", "maybe")
    with pytest.raises(ConfigError, match="MIMO_ACCEL_STRICT_GRADIENTS='maybe': expected 1 or 0"):
        AccelConfig.from_env()
    monkeypatch.delenv("MIMO_ACCEL_STRICT_GRADIENTS")
    enabled(sharded_reads=True, reorder=True, strict_gradients=True)
    with pytest.raises(ValueError, match=r"mimo_accel reorder with strict_gradients: .*calculate_per_token_loss="
                                         r"False.*Set calculate_per_token_loss=True on the language model's "
                                         r"TransformerConfig \(the per-token loss\), or turn reorder off"):
        _setup(_reorder_provider())


def test_nothing_is_said_where_reorder_keeps_the_gradient():
    assert _check(_reorder_provider(per_token=True), reorder=True) == {}
    assert _check(_reorder_provider(), sharded_reads=True, packing=True) == {}  # no reorder: upstream's split
    assert _check(_reorder_provider(language_dp=1), reorder=True) == {}  # one replica, one micro-batch
    assert len(_check(_reorder_provider(language_dp=1), reorder=True, reorder_window=2)) == 1  # across micro-batches
    assert _check(_reorder_provider(per_token=True), reorder=True, strict_gradients=True) == {}


# ---------------------------------------------------------------- on Bridge's loop


def _train(rank, world, argv, features):
    from ._example import run_example

    return run_example(argv, features, {})["notes"]


_LOOP = ["--cpu", "--vision-dp", "2", "--language-dp", "2", "--mbs", "4", "--gbs", "4", "--train-iters", "1",
         "--eval-interval", "0", "--no-per-token-loss"]


@pytest.mark.distributed
def test_on_bridges_loop_the_note_reaches_status_and_the_profilers_step_line(tmp_path):
    from mimo_accel.profiler.run import read_run
    from mimo_accel_dev.rehearse.ranks import run_ranks

    notes = run_ranks(_train, 4, _LOOP, dict(sharded_reads=True, reorder=True, profile=str(tmp_path)),
                      deadline_s=150)
    assert all(sum("calculate_per_token_loss=False" in n for n in rank_notes) == 1 for rank_notes in notes)
    run = read_run(tmp_path)
    assert sorted(run.ranks) == [0, 1, 2, 3]
    for rank, log in run.ranks.items():
        said = [n for s in log.steps for n in s.get("notes", []) if "calculate_per_token_loss=False" in n]
        assert len(said) == 1, (rank, [s.get("notes") for s in log.steps])


@pytest.mark.distributed
def test_on_bridges_loop_strict_gradients_stops_before_the_model_is_built():
    from mimo_accel_dev.rehearse.ranks import RankFailure, run_ranks

    with pytest.raises(RankFailure, match=r"(?s)in setup_megatron_mimo.*mimo_accel reorder with strict_gradients"):
        run_ranks(_train, 4, _LOOP, dict(sharded_reads=True, reorder=True, strict_gradients=True), deadline_s=150)
