"""Module-local gradient scaling under the per-token loss (Megatron-Bridge #5555, on main).

With the language model's ``calculate_per_token_loss=True`` and an encoder left at megatron-core's
default (False), the encoder's DDP averages its gradients over its replicas, and Bridge's
``finalize_model_grads_multimodule`` scales that back by the encoder's DP size before it divides
by the global token count: the encoder's gradient is its replicas' sum over the global tokens,
whichever replica holds which sample. mimo_accel's reorder moves samples between encoder replicas
and relies on exactly that; its packing keeps each micro-batch's real tokens (the count the loss
returns and the finalize divides by). So the first step's gradient norm (every module's, reduced
by ``MimoOptimizer``) with sharded reads, reorder and packing on two encoder replicas equals
upstream's on one replica of each module, where no DP average is taken.

Megatron-Bridge 0.6.2 (and PR #4986's base) leave the encoder's DDP average unscaled; there the
encoder's gradient depends on its DP size, so the test runs only where #5555 is in.
"""

from __future__ import annotations

from functools import partial

import pytest

from mimo_accel_dev.rehearse import stack as st
from mimo_accel_dev.rehearse.ranks import LANGUAGE, VISION, layout_of, loader_config, module_of_rank, run_ranks

from ._example import bridge_source

SCALES_BACK = "ddp_mean_correction" in bridge_source("training/megatron_mimo_parallel_utils.py")
pytestmark = [pytest.mark.distributed,
              pytest.mark.skipif(not SCALES_BACK, reason="this megatron-bridge leaves an encoder's DDP average "
                                                         "unscaled under the per-token loss (#5555 is on main)")]

MICRO_BATCH, MICRO_BATCHES = 8, 2


def _first_step(rank, world, vdp, ldp, features):
    from types import SimpleNamespace

    from megatron.bridge.training.megatron_mimo_step import forward_step  # by value, before enable

    import mimo_accel

    real = st.build_provider

    def per_token_language(cfg):  # the encoders keep megatron-core's default (False)
        provider = real(cfg)
        provider.language_model_spec.params["config"].calculate_per_token_loss = True
        return provider

    st.build_provider = per_token_language
    if features:
        mimo_accel.enable(**features)
    try:
        from megatron.bridge.data.megatron_mimo.loaders import build_megatron_mimo_data_loaders

        layout = layout_of(vdp, ldp)
        cfg = st.StackConfig(layout=layout, seq_length=96)
        stack = st.build_stack(cfg)
        data = st.make_data_provider(lambda n: st.SyntheticVLMDataset(
            n, st.VariedSpec(), seq_length=cfg.seq_length, patch_dim=cfg.patch_dim, vocab_size=cfg.vocab_size))
        stack.provider._grids = stack.infra.module_to_grid_map
        train, _, _ = build_megatron_mimo_data_loaders(loader_config(stack.provider, MICRO_BATCH),
                                                       SimpleNamespace(consumed_train_samples=0), data,
                                                       4 * MICRO_BATCH * MICRO_BATCHES, 0, 0)
        seen: list = []
        batches = st.model_batches(iter(train), keep_attention_mask=bool(features.get("packing")), seen_ids=seen)
        out, grad_norm = stack.train_step(batches, MICRO_BATCHES, MICRO_BATCH, partial(forward_step, st.step_state()))
        return dict(module=module_of_rank(layout, rank), grad_norm=float(grad_norm), seen=seen,
                    tokens=[float(o["lm loss"][1]) for o in out])
    finally:
        mimo_accel.disable()
        st.build_provider = real


def test_two_encoder_replicas_under_mimo_accel_take_the_gradient_of_one():
    reference = run_ranks(_first_step, 2, 1, 1, {}, deadline_s=240)
    accel = run_ranks(_first_step, 4, 2, 2, dict(sharded_reads=True, reorder=True, packing=True), deadline_s=240)
    want = reference[0]["grad_norm"]
    assert want > 0 and all(r["grad_norm"] == pytest.approx(want, rel=1e-4) for r in accel)
    # the same real tokens, packed or not, and the plan moved samples between the encoder replicas
    assert sum(sum(r["tokens"]) for r in accel if r["module"] == LANGUAGE) == sum(reference[1]["tokens"])
    vision = [r["seen"] for r in accel if r["module"] == VISION]
    assert sorted(i for seen in vision for micro in seen for i in micro) == list(range(MICRO_BATCH * MICRO_BATCHES))
    assert any(micro != list(range(lo, lo + len(micro))) for seen in vision for micro in seen for lo in [micro[0]])
