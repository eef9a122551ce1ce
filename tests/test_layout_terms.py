"""The advisor's terms as megatron-core runs them: the loss over the vocabulary on the language model's
last stage (FLOPs mode), and the activations each layer kind keeps for its backward, counted on a
CPU forward of megatron-core's own layers (torch.autograd.graph.saved_tensors_hooks) against the
memory model."""

from __future__ import annotations

from dataclasses import replace

import pytest

from mimo_accel.modules import LANGUAGE
from mimo_accel.tools.layout import DataRequest, MachineRequest, Request, build
from mimo_accel.tools.layout.seconds import LOSS_BYTES_PER_LOGIT, FlopsSeconds
from mimo_accel.tools.layout.spec import parse_layout


def _h100():
    return build(Request(machine=MachineRequest("h100"), data=DataRequest(steps=1)))


def test_the_loss_over_the_vocabulary_is_priced_on_the_last_stage_at_the_memory_bandwidth():
    """The fused cross-entropy reads and writes LOSS_BYTES_PER_LOGIT bytes per logit of a TP rank's
    V/tp, at the GPU's HBM bandwidth: on the 27B preset's 248k vocabulary at tp4 on an H100, half a
    microsecond a token, on the last stage alone; a GPU of twice the bandwidth pays half."""
    problem = _h100()
    seconds, lang = problem.seconds, problem.model.modules[LANGUAGE]
    expected = LOSS_BYTES_PER_LOGIT * 248_320 / 4 / 3350e9
    assert seconds.loss_per_token(lang, 4) == pytest.approx(expected) and 4e-7 < expected < 6e-7
    layout = parse_layout("images=tp1,pp1,dp1 language=tp4,pp4,dp1 mbs=1 gbs=32")
    work = seconds._stage_work(seconds.layers(layout), 4)
    per_flop = seconds._per_flop(LANGUAGE, 4, True)
    assert work[-1, 1] - work[0, 1] == pytest.approx(lang.output_per_token * per_flop + expected)
    a = seconds.cost_model(layout).of(LANGUAGE).a
    faster = FlopsSeconds(problem.model, replace(problem.machine, memory_gbps=6700.0))
    assert a - faster.cost_model(layout).of(LANGUAGE).a == pytest.approx(expected / 2)
    assert "the loss at 3350 GB/s HBM" in seconds.describe() and "assumed, not measured" in seconds.describe()
