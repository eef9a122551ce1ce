"""The cost model a job starts from without one (mimo_accel.costs.prior, and the runtime's choice in
mimo_accel.runtime.measuring.model_flops.start_cost_model): each module's step FLOPs from its Megatron config,
a module whose FLOPs are not counted at the default coefficients (said), a configured file first."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from mimo_accel.costs import CostModel, ModuleCost
from mimo_accel.costs.flops import FlopsShape
from mimo_accel.costs.prior import UNIT, flops_prior

# a plain ViT (no merger) and a small GPT, as their TransformerConfigs give them
VIT = FlopsShape(layers=4, hidden=64, ffn_hidden=256, heads=4, query_groups=4, kv_channels=16, causal=False)
GPT = FlopsShape(layers=3, hidden=256, ffn_hidden=512, heads=4, query_groups=4, kv_channels=64, vocab=2048)


def test_a_modules_start_coefficients_are_its_step_flops():
    model, unpriced = flops_prior({"vision": VIT, "language": GPT}, {"vision": False, "language": True})
    assert unpriced == ()
    # a trained module's step is forward + backward (3x forward), a frozen one's its forward
    assert model.of("language") == ModuleCost(3 * GPT.per_token / UNIT, 3 * GPT.per_sq_token / UNIT)
    assert model.of("vision") == ModuleCost(VIT.per_token / UNIT, VIT.per_sq_token / UNIT)
    assert model.fit["start"] == "flops"


def test_a_plain_vit_weighs_its_attention_at_one_over_six_times_its_width():
    # per layer and row: QKV and output projections 8h², MLP 16h² (FFN 4h); per row²: QKᵀ and A·V 4h
    model, _ = flops_prior({"vision": VIT}, {})
    cost = model.of("vision")
    assert cost.b / cost.a == pytest.approx(1 / (6 * 64), rel=1e-12)
    assert CostModel().b / CostModel().a == pytest.approx(9e-4)  # the fixed default: a ViT near h = 185


def test_a_module_without_a_flops_shape_keeps_the_default_coefficients():
    model, unpriced = flops_prior({"vision": None, "language": GPT}, {})
    assert unpriced == ("vision",) and model.fit["unpriced"] == ["vision"]
    assert model.of("vision") == CostModel().of("vision") and model.of("language") != CostModel().of("language")


def _config(layers, hidden, ffn):
    from megatron.core.transformer.transformer_config import TransformerConfig

    return TransformerConfig(num_layers=layers, hidden_size=hidden, num_attention_heads=4, ffn_hidden_size=ffn,
                             use_cpu_initialization=True)


def _provider(*encoder_configs):
    grids = {m: SimpleNamespace(tensor_model_parallel_size=1, pipeline_model_parallel_size=1,
                                context_parallel_size=1, data_parallel_size=2) for m in ("vision", "language")}
    encoders = {f"vit{i}": SimpleNamespace(params={"transformer_config": c}) for i, c in enumerate(encoder_configs)}
    return SimpleNamespace(
        language_model_spec=SimpleNamespace(params={"config": _config(3, 256, 512), "vocab_size": 2048}),
        modality_submodules_spec={"vision": SimpleNamespace(submodules={"encoders": encoders})},
        megatron_mimo_parallelism_config=SimpleNamespace(module_parallelisms=grids),
        freeze_language_model=False, freeze_modality_encoders={})


def test_the_runtime_starts_from_a_file_then_the_providers_flops_then_the_defaults(tmp_path):
    from mimo_accel.runtime.measuring.model_flops import start_cost_model

    said = {}
    vit = _config(4, 64, 256)
    model = start_cost_model(None, _provider(vit), lambda k, m: said.setdefault(k, m))
    assert model.of("vision").b / model.of("vision").a == pytest.approx(1 / (6 * 64)) and not said
    assert model.of("language").a == pytest.approx(3 * GPT.per_token / UNIT)

    # two encoders of different widths in one module: no one FLOPs shape prices its samples
    model = start_cost_model(None, _provider(vit, _config(2, 128, 512)), lambda k, m: said.setdefault(k, m))
    assert model.of("vision") == CostModel().of("vision")
    assert "vision start(s) from the default cost coefficients" in said["cost-model:unpriced"]
    assert "encoders of different configs" in said["cost-model:unpriced"]

    measured = CostModel(modules={"vision": ModuleCost(2e-5, 1e-7)})
    measured.to_file(tmp_path / "m.json")
    assert start_cost_model(str(tmp_path / "m.json"), _provider(vit), print).of("vision") == ModuleCost(2e-5, 1e-7)
    assert start_cost_model(None, SimpleNamespace(), print) == CostModel()  # no MIMO provider
