"""Plans identical on every node: every window's plan is agreed by every data-loading rank before
any of them trains it.

Every rank derives its plan alone from the same inputs (checked by digest before the first batch),
so nothing but the arithmetic could make two ranks plan differently, and then text would be
paired with another sample's encoder rows whenever the placeholder counts happen to match. The
planner thread of each rank agrees each window with the others through the job's store before
handing it to training (:mod:`mimo_accel.runtime.reading.plan_check`); a rank whose plan differs at any
window stops every rank before that window is read, naming the ranks on each side. Real gloo
ranks, Bridge's own loaders; Bridge's own training loop: tests/test_pretrain_loop.py.
"""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import pytest

from mimo_accel_dev.rehearse import stack as st
from mimo_accel_dev.rehearse.ranks import RankFailure, build_grids, layout_of, loader_config, run_ranks

BATCHES = 8
MBS = 4
DIFFER_FROM = 5  # the window (micro-batch) from which one rank plans differently


def _train_loader(layout, grids):
    """Bridge's own train loader over varied synthetic samples, built as its builders build it."""
    from megatron.bridge.data.megatron_mimo.loaders import build_megatron_mimo_data_loaders

    provider = st.build_provider(st.StackConfig(layout=layout))
    provider._grids = grids
    data = st.make_data_provider(lambda n: st.SyntheticVLMDataset(n, st.VariedSpec(), seq_length=64,
                                                                 patch_dim=24, vocab_size=256))
    train, _, _ = build_megatron_mimo_data_loaders(loader_config(provider, MBS),
                                                   SimpleNamespace(consumed_train_samples=0), data, 64, 0, 0)
    return train


def _read(rank, world, vision_dp, differ_on):
    import mimo_accel
    from mimo_accel import planner
    from mimo_accel.runtime.reading.plan_check import PlanMismatch

    layout = layout_of(vision_dp, 1)
    grids = build_grids(layout)
    if rank == differ_on:  # this node's arithmetic differs from window DIFFER_FROM on
        plan = planner.CostIndexPlanner.__call__

        def differing(self, idx, mb=1):
            order, spreads = plan(self, idx, mb)
            return (order[::-1] if min(idx) >= DIFFER_FROM * MBS else order), spreads

        planner.CostIndexPlanner.__call__ = differing
    mimo_accel.enable(sharded_reads=True, reorder=True)
    try:
        train = _train_loader(layout, grids)
        it = iter(train)
        ids, error = [], None
        try:
            for _ in range(BATCHES):
                ids.append(next(it)[st.SAMPLE_ID_KEY].tolist())
        except PlanMismatch as exc:
            error = str(exc)
        check = vars(train.batch_sampler).get("check")
        return ids, check.agreed if check is not None else None, error
    finally:
        mimo_accel.disable()


@pytest.mark.distributed
@pytest.mark.parametrize("vision_dp", [1, 2])  # 1:1 and fan-in
def test_plans_agree_at_every_window(vision_dp):
    out = run_ranks(_read, vision_dp + 1, vision_dp, None, deadline_s=180)
    language = out[vision_dp]
    for b in range(BATCHES):  # the vision replicas hold the language replica's samples
        assert sorted(i for o in out[:vision_dp] for i in o[0][b]) == sorted(language[0][b])
    # every window read was agreed first (the planner threads may have agreed further ahead)
    assert all(o[2] is None and o[1] >= BATCHES for o in out)


@pytest.mark.distributed
@pytest.mark.parametrize("vision_dp,differ_on,sides", [
    (1, 1, r"ranks \[0\] have plan \w+; ranks \[1\] have plan \w+"),
    (2, 2, r"ranks \[0, 1\] have plan \w+; ranks \[2\] have plan \w+"),
    (2, 0, r"ranks \[0\] have plan \w+; ranks \[1, 2\] have plan \w+")])
def test_a_rank_whose_plan_differs_stops_every_rank_before_that_window(vision_dp, differ_on, sides):
    out = run_ranks(_read, vision_dp + 1, vision_dp, differ_on, deadline_s=180)
    for ids, _, error in out:
        assert len(ids) == DIFFER_FROM  # windows 0-4 were read everywhere; window 5 nowhere
        assert error is not None and error.startswith(
            f"mimo_accel: the train loader's plans differ between ranks at window {DIFFER_FROM} of this pass (the "
            f"window from global sample {DIFFER_FROM * MBS}): ")
        assert re.search(sides, error), error


def _train_differing(rank, world, argv, differ_on):
    """One rank of Bridge's own loop (examples/train_mimo.py); rank ``differ_on`` plans differently
    from window DIFFER_FROM on."""
    from mimo_accel import planner

    from ._example import run_example

    if rank == differ_on:
        plan = planner.CostIndexPlanner.__call__

        def differing(self, idx, mb=1, *model):
            order, spreads = plan(self, idx, mb, *model)
            return (order[::-1] if min(idx) >= DIFFER_FROM * MBS else order), spreads

        planner.CostIndexPlanner.__call__ = differing
    return run_example(argv, dict(sharded_reads=True, reorder=True, packing=True), {})["active"]


@pytest.mark.distributed
@pytest.mark.parametrize("vision_dp,differ_on", [(1, 0), (2, 1)])  # 1:1 and fan-in
def test_on_bridges_loop_a_differing_plan_stops_the_job_before_its_iteration_trains(tmp_path, vision_dp, differ_on):
    trace = tmp_path / "trace.jsonl"
    argv = ["--cpu", "--vision-dp", str(vision_dp), "--language-dp", "1", "--mbs", str(MBS), "--gbs", str(2 * MBS),
            "--train-iters", "5", "--eval-interval", "2", "--eval-iters", "1", "--varied", "--trace", str(trace)]
    with pytest.raises(RankFailure, match=rf"the train loader's plans differ between ranks at window {DIFFER_FROM} of "
                                          rf"this pass \(the window from global sample {DIFFER_FROM * MBS}\): ranks"):
        run_ranks(_train_differing, vision_dp + 1, argv, differ_on, deadline_s=180)
    records = [json.loads(line) for line in trace.read_text().splitlines()]
    # micro-batches 0-3 are iterations 1-2; iteration 3 holds window 5's micro-batch and never completes
    assert sorted({r["iteration"] for r in records}) == [1, 2]
    for it in (1, 2):
        trained = {m: sorted(i for r in records if r["iteration"] == it and r["module"] == m for mb in r["ids"] for i in mb)
                   for m in ("vision", "language")}
        assert trained["vision"] == trained["language"] == list(range((it - 1) * 2 * MBS, it * 2 * MBS))


def _read_exchanged(rank, world, differ_on):
    """Exchange mode's loaders (Bridge's builders, vision dp2 -> language dp1); rank ``differ_on``
    plans micro-batches DIFFER_FROM and later differently."""
    import dataclasses

    import mimo_accel
    from mimo_accel.runtime.reading.exchange import reorder
    from mimo_accel.runtime.reading.plan_check import PlanMismatch

    layout = layout_of(2, 1)
    grids = build_grids(layout)
    if rank == differ_on:
        plan, calls = reorder.route_exchange, []

        def differing(*args, **kwargs):
            calls.append(1)
            p = plan(*args, **kwargs)
            return dataclasses.replace(p, order=p.order[::-1]) if len(calls) > DIFFER_FROM else p

        reorder.route_exchange = differing
    mimo_accel.enable(sharded_reads=True, reorder=True, reorder_mode="exchange")
    try:
        train = _train_loader(layout, grids)
        ids, error = [], None
        try:
            for batch in train:
                ids.append(batch[st.SAMPLE_ID_KEY].tolist())
                if len(ids) == BATCHES:
                    break
        except PlanMismatch as exc:
            error = str(exc)
        return ids, error
    finally:
        mimo_accel.disable()


@pytest.mark.distributed
def test_exchange_mode_stops_the_rank_whose_plan_differs_before_it_trains_it():
    agreed = run_ranks(_read_exchanged, 3, None, deadline_s=180)
    assert all(error is None and len(ids) == BATCHES for ids, error in agreed)
    out = run_ranks(_read_exchanged, 3, 2, deadline_s=180)
    # whichever rank planned micro-batch 5 first, a rank on the other side of it stops there, before
    # handing it on: the language rank 2 (its plan differs), or the vision ranks if rank 2 was first
    stopped = [rank for rank, (_, error) in enumerate(out) if error is not None]
    assert stopped in ([2], [0, 1]), out
    for rank in stopped:
        ids, error = out[rank]
        assert ids == agreed[rank][0][:DIFFER_FROM]  # micro-batches 0-4 as agreed; micro-batch 5 never handed on
        assert re.search(rf"the train loader's exchange plans differ at micro-batch {DIFFER_FROM}: rank {rank} has "
                         r"plan \w+, rank \d \(the first to plan it\) has \w+", error)
        assert (rank == 2) != ("rank 2 (the first" in error)  # the two sides: rank 2 against the vision ranks
