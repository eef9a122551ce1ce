"""The harness on the real upstream code, unpatched.

Real gloo ranks, Bridge's own grids, Bridge's loaders and slicing, megatron-core's
BridgeCommunicator, and one real non-colocated training step. These pin down what upstream does
today, so the features can be checked against it.
"""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest
import torch

from mimo_accel_dev.rehearse import stack as st
from mimo_accel_dev.rehearse.ranks import LANGUAGE, VISION, build_grids, layout_of, loader_config, module_of_rank, run_ranks

DP_SIZES = (1, 2, 4)
LAYOUTS = [(v, l) for v, l in itertools.product(DP_SIZES, DP_SIZES)]
MICRO_BATCH = 8
WORLD = 8  # every layout here fits; ranks outside a layout's grids idle through it


def _dp_info(grids, module):
    pg = grids[module].get_pg(["dp"])
    return pg.rank(), pg.size()


def _tagged_rows(batch, rows_per_sample):
    """Encoder-output stand-in: one row per placeholder, tagged (sample id, row within sample)."""
    rows = [torch.tensor([[float(sid), float(j), 0.0, 0.0] for j in range(n)])
            for sid, n in zip(batch[st.SAMPLE_ID_KEY].tolist(), rows_per_sample)]
    return torch.cat(rows) if rows else torch.zeros(0, 4)


def _loaders_slice_and_bridge(rank, world, layouts, spec):
    from megatron.bridge.data.megatron_mimo.dp_utils import slice_batch_for_megatron_mimo
    from megatron.bridge.data.megatron_mimo.loaders import build_megatron_mimo_data_loaders
    from megatron.core.pipeline_parallel.bridge_communicator import BridgeCommunicator

    out = {}
    for vdp, ldp in layouts:
        layout = layout_of(vdp, ldp)
        grids = build_grids(layout)
        comm = BridgeCommunicator(grids[VISION], grids[LANGUAGE], dim_mapping={"s": 0, "b": 1, "h": 2},
                                  comm_dtype=torch.float32, src_module_name=VISION,
                                  dest_module_name=LANGUAGE, tensor_ndim=2)
        model_provider = st.build_provider(st.StackConfig(layout=layout))
        model_provider._grids = grids
        cfg = loader_config(model_provider, MICRO_BATCH)
        data = st.make_data_provider(lambda n: st.SyntheticVLMDataset(
            n, spec, seq_length=64, patch_dim=24, vocab_size=2048))
        train, _, _ = build_megatron_mimo_data_loaders(cfg, SimpleNamespace(consumed_train_samples=0),
                                                       data, 4 * MICRO_BATCH, 0, 0)
        module = module_of_rank(layout, rank)
        if module is None:
            assert train is None
            continue
        dp_rank, dp_size = _dp_info(grids, module)
        batch = next(iter(train))
        global_ids = batch[st.SAMPLE_ID_KEY].tolist()
        local = slice_batch_for_megatron_mimo(batch, dp_rank, dp_size)
        local_ids = local[st.SAMPLE_ID_KEY].tolist()
        rows = (local["input_ids"] == st.IMAGE_TOKEN_ID).sum(dim=1).tolist()
        received = None
        if module == VISION:
            vi = local["modality_inputs"][VISION][st.ENCODER_NAME]
            assert int(vi["grid_thw"].prod(dim=-1).sum()) == vi["hidden_states"].size(0)
            tensor = _tagged_rows(local, rows)
            if len(set(rows)) > 1:
                tensor._mimo_bridge_split_sizes = rows  # as MimoModel attaches it
            comm.send_forward(tensor)
        else:
            received = comm.recv_forward()[:, :2].long().tolist()
        out[(vdp, ldp)] = dict(module=module, dp_rank=dp_rank, dp_size=dp_size, global_ids=global_ids,
                               local_ids=local_ids, rows=rows, received=received)
    return out


def _expected_rows(local_ids, rows):
    return [[sid, j] for sid, n in zip(local_ids, rows) for j in range(n)]


@pytest.fixture(scope="module")
def baseline_results():
    # One image per sample: the only shape upstream's joint patch slicing supports for every dp.
    return run_ranks(_loaders_slice_and_bridge, WORLD, LAYOUTS, st.uniform_spec(), deadline_s=300)


@pytest.mark.distributed
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda l: f"v{l[0]}-l{l[1]}")
def test_upstream_loader_and_slice_give_contiguous_replica_shares(baseline_results, layout):
    per_rank = [r[layout] for r in baseline_results if layout in r]
    assert len(per_rank) == sum(layout)
    for r in per_rank:
        # Every data rank read the whole global micro-batch (the cost sharded reads removes) ...
        assert r["global_ids"] == list(range(MICRO_BATCH))
        # ... and kept the contiguous 1/dp share of it.
        share = MICRO_BATCH // r["dp_size"]
        assert r["local_ids"] == list(range(r["dp_rank"] * share, (r["dp_rank"] + 1) * share))
    for module in (VISION, LANGUAGE):
        ids = sorted(i for r in per_rank if r["module"] == module for i in r["local_ids"])
        assert ids == list(range(MICRO_BATCH)), f"{module}: samples lost or duplicated"


@pytest.mark.distributed
@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda l: f"v{l[0]}-l{l[1]}")
def test_bridge_communicator_delivers_the_rows_of_the_samples_each_language_replica_holds(
        baseline_results, layout):
    for r in (r[layout] for r in baseline_results if layout in r and r[layout]["module"] == LANGUAGE):
        assert r["received"] == _expected_rows(r["local_ids"], r["rows"])


def _varied_rows_fan_out(rank, world):
    # Samples with 0..3 images of varied sizes; fan-out (vision dp1 -> language dp2) carries the
    # per-sample split sizes, so each language replica must still get exactly its samples' rows.
    return _loaders_slice_and_bridge(rank, world, [(1, 2)], st.VariedSpec())


@pytest.mark.distributed
def test_bridge_fan_out_with_uneven_rows_uses_split_sizes():
    results = run_ranks(_varied_rows_fan_out, 3, deadline_s=180)
    lang = [r[(1, 2)] for r in results if r[(1, 2)]["module"] == LANGUAGE]
    assert len(lang) == 2
    assert len({tuple(r["rows"]) for r in lang}) > 1 or len(set(lang[0]["rows"])) > 1  # uneven data
    for r in lang:
        assert r["received"] == _expected_rows(r["local_ids"], r["rows"])


def _one_training_step(rank, world, vdp, ldp):
    layout = layout_of(vdp, ldp)
    cfg = st.StackConfig(layout=layout)
    stack = st.build_stack(cfg)
    ds = st.SyntheticVLMDataset(64, st.uniform_spec(), seq_length=cfg.seq_length,
                                patch_dim=cfg.patch_dim, vocab_size=cfg.vocab_size)
    mbs = 4
    batches = (st.collate([ds[j] for j in range(i, i + mbs)]) for i in itertools.count(0, mbs))
    losses, grad_norm = stack.train_step(st.model_batches(batches), num_microbatches=2,
                                         micro_batch_size=mbs)
    with_grad, total = st.module_parameters_with_grad(stack)
    from megatron.core.utils import get_model_config

    config = get_model_config(stack.model)
    return dict(module=module_of_rank(layout, rank), grad_norm=float(grad_norm),
                losses=[[float(x) for x in l["lm loss"]] for l in losses], with_grad=with_grad, total=total,
                grad_sync=(config.no_sync_func is not None, config.grad_sync_func))


@pytest.mark.distributed
@pytest.mark.parametrize("vdp,ldp", [(2, 2), (2, 1)], ids=["one-to-one", "fan-in"])
def test_one_real_non_colocated_training_step(vdp, ldp):
    results = run_ranks(_one_training_step, vdp + ldp, vdp, ldp, deadline_s=240)
    for r in results:
        assert r["total"] > 0 and r["with_grad"] == r["total"], f"{r['module']}: params without grad"
        assert torch.isfinite(torch.tensor(r["grad_norm"])) and r["grad_norm"] > 0
    lang = [r for r in results if r["module"] == LANGUAGE]
    # The last language stage reports (loss sum, tokens) per micro-batch; all finite.
    assert all(len(r["losses"]) == 2 for r in lang)
    assert all(torch.isfinite(torch.tensor(l)).all() for r in lang for l in r["losses"])
    # Every rank agrees on the global gradient norm (MimoOptimizer reduces it across modules).
    assert len({round(r["grad_norm"], 5) for r in results}) == 1
    # Bridge's MIMO setup holds gradient sync back between micro-batches but sets no grad_sync_func,
    # so megatron-core's 1F1B syncs every stage from its last backward on, whichever PP stage it is
    # (Megatron-LM main's #6606 changes only what a grad_sync_func does): the step model's end
    # (docs/design.md, "The step's end") rests on this.
    assert all(r["grad_sync"] == (True, None) for r in results)
