"""What the step plan learns of the pipeline, and where: each module's PP stages from Bridge's MIMO
parallelism config (into the rank's ShardContext), the frozen encoders from the provider at setup;
both are plan inputs every data rank compares."""

from __future__ import annotations

import types

import mimo_accel
from mimo_accel.costs import CostModel
from mimo_accel.patching import engine
from mimo_accel.planner import CostIndexPlanner
from mimo_accel.runtime.patches import setup
from mimo_accel.runtime.provider import frozen_encoders
from mimo_accel.runtime.context import ShardContext

from .test_planner import _index


def test_a_rank_context_carries_every_modules_stages():
    ctx = ShardContext("images", 0, 1, 2, {"images": 1, "language": 2}, stages={"images": 1, "language": 2})
    assert {m.name: m.pp for m in ctx.modules} == {"images": 1, "language": 2}
    assert {m.name: m.pp for m in ShardContext("vision", 0, 2, 2, {"vision": 2, "language": 2}).modules} == \
        {"vision": 1, "language": 1}


def test_frozen_encoders_come_from_the_provider():
    provider = types.SimpleNamespace(freeze_modality_encoders={"images": True, "audios": False})
    assert frozen_encoders(provider) == ("images",)
    assert frozen_encoders(types.SimpleNamespace()) == () and frozen_encoders(None) == ()


def test_setup_reads_the_frozen_encoders(monkeypatch):
    mimo_accel.disable()
    monkeypatch.setattr(engine, "installed_versions", lambda: ("0.6.2", "0.19.2"))
    mimo_accel.enable(reorder=True, calibrate_online=False)
    try:
        runtime = engine._state.runtime
        cfg = types.SimpleNamespace(model=types.SimpleNamespace(freeze_modality_encoders={"images": True}),
                                    mimo=None, dataset=None)

        def setup_megatron_mimo(state, build_data_iterators_fn=None):
            return build_data_iterators_fn()

        got = setup.wrap_setup(setup_megatron_mimo, runtime)(types.SimpleNamespace(cfg=cfg),
                                                             build_data_iterators_fn=lambda: runtime.frozen)
        assert got == ("images",)
    finally:
        mimo_accel.disable()


def test_the_planner_plans_a_window_for_its_stages_and_frozen_encoders():
    n = 32
    index = _index(n, 3)
    ctx = ShardContext("vision", 0, 1, 2, {"vision": 1, "language": 2}, stages={"vision": 1, "language": 2})
    trained = CostIndexPlanner(index, CostModel(), ctx.modules)
    frozen = CostIndexPlanner(index, CostModel(), ctx.modules, frozen=("vision",))
    assert trained.stages == {"vision": 1, "language": 2} and frozen.frozen == ("vision",)
    for planner in (trained, frozen):
        order, _ = planner(list(range(n)), micro_batches=16)
        assert sorted(order) == list(range(n))
