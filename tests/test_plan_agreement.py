"""Plans identical on every node: the plans themselves are compared across the data-loading ranks.

Every rank derives its plan alone from the same inputs (checked by digest before the first batch),
so nothing but the arithmetic could make two ranks plan differently, and then text would be
paired with another sample's encoder rows whenever the placeholder counts happen to match. The
sharded loader compares a digest of each checked window's plan (the first windows of a pass, then
every ``PLAN_CHECK_EVERY``) with the lowest data-loading rank's, one window later; a rank that
differs stops the job naming the ranks on each side. Real gloo ranks, Bridge's own loaders.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from mimo_accel.rehearse import stack as st
from mimo_accel.rehearse.ranks import MimoLayout, RankFailure, build_grids, loader_config, run_ranks

BATCHES = 5


def _read(rank, world, differ_on):
    import mimo_accel
    from mimo_accel import planner

    layout = MimoLayout.from_dp(2, 1)
    grids = build_grids(layout)
    if rank == differ_on:  # this node's arithmetic differs: its plans come out in another order
        plan = planner.CostIndexPlanner.__call__
        planner.CostIndexPlanner.__call__ = lambda self, idx, mb=1: (lambda o: (o[0][::-1], o[1]))(plan(self, idx, mb))
    mimo_accel.enable(sharded_reads=True, reorder=True)
    try:
        from megatron.bridge.data.megatron_mimo.loaders import build_megatron_mimo_data_loaders

        provider = st.build_provider(st.StackConfig(layout=layout))
        provider._grids = grids
        data = st.make_data_provider(lambda n: st.SyntheticVLMDataset(n, st.VariedSpec(), seq_length=64,
                                                                     patch_dim=24, vocab_size=256))
        train, _, _ = build_megatron_mimo_data_loaders(loader_config(provider, 4),
                                                       SimpleNamespace(consumed_train_samples=0), data, 64, 0, 0)
        it = iter(train)
        ids = [next(it)[st.SAMPLE_ID_KEY].tolist() for _ in range(BATCHES)]
        check = vars(train.batch_sampler).get("check")
        return ids, check.compared if check is not None else None
    finally:
        mimo_accel.disable()


@pytest.mark.distributed
def test_plans_agree_and_are_compared_at_the_first_windows():
    out = run_ranks(_read, 3, None, deadline_s=180)
    for b in range(BATCHES):  # vision replicas 0 + 1 hold the language replica's samples
        assert sorted(out[0][0][b] + out[1][0][b]) == sorted(out[2][0][b])
    # windows 0, 1, 2 are checked (PLAN_CHECK_FIRST), each compared when the next one is planned;
    # the reference rank 0 compares with nobody
    assert [o[1] for o in out] == [0, 3, 3]


@pytest.mark.distributed
@pytest.mark.parametrize("differ_on,sides", [(2, r"ranks \[0, 1\] have plan \w+; ranks \[2\] have plan \w+"),
                                             (0, r"ranks \[0\] have plan \w+; ranks \[1, 2\] have plan \w+")])
def test_a_rank_whose_plan_differs_stops_the_job_naming_the_ranks(differ_on, sides):
    with pytest.raises(RankFailure, match=r"the train loader's plans differ between ranks at window 0 of this pass "
                                          rf"\(the window from global sample 0\): {sides}"):
        run_ranks(_read, 3, differ_on, deadline_s=180)
