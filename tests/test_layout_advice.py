"""The advisor's answer (mimo_accel.tools.layout.advice, .change): a change from the current layout
only beyond what the model cannot know (its tie, more where costs are assumed, never by a term that
is the same on every draw), what the gain is made of, and advice that runs as printed: the launcher
lines for an uneven split applied to Bridge's own Qwen3.5-VL provider, the --component strings read
back as upstream's launcher reads them, and the best even split beside an uneven pick."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from tests._hypothesis import examples

from mimo_accel.modules import LANGUAGE
from mimo_accel.tools.layout import DataRequest, MachineRequest, Request, build, main, price
from mimo_accel.tools.layout.advice import BESIDE, Figures, Row
from mimo_accel.tools.layout.change import ASSUMED_EFFICIENCY_SPREAD, TIE, compare
from mimo_accel.tools.layout.console import settings_lines
from mimo_accel.tools.layout.pricing import PARTS
from mimo_accel.tools.layout.spec import LAYOUT_PRESETS, parse_layout, stage_layers

REFERENCE = LAYOUT_PRESETS["reference-27b"][0]


def _row(spec: str, draws, parts: dict) -> Row:
    """A row priced elsewhere: its draws and parts (the compute part made to sum to the mean)."""
    draws = list(map(float, draws))
    parts = {**dict.fromkeys(PARTS, 0.0), **parts}
    parts["compute"] = float(np.mean(draws)) - sum(v for k, v in parts.items() if k != "compute")
    layout = parse_layout(spec)
    figures = Figures(float(np.mean(draws)), draws, 0.0, 0.0, 0.0, {}, {}, LANGUAGE, parts)
    return Row(layout, {}, None, {"mimo_accel": figures})


NOW = "images=tp1,pp1,dp1 language=tp4,pp2,dp2 mbs=2 gbs=32"
THEN = "images=tp1,pp1,dp1 language=tp4,pp4,dp1 mbs=1 gbs=32"


def test_a_term_the_same_on_every_draw_is_no_reason_to_move():
    """The issue's case: the pick saves the current layout's DP gradient sync (a constant of the
    layout), and is as fast as it, draw by draw, on the rest: every draw is faster, the mean by
    more than the tie, and still it is no change."""
    data = np.array([1.00, 0.95, 1.10, 1.02])
    now = _row(NOW, data + 0.05, {"dp_sync": 0.05})
    then = _row(THEN, data + [0.001, -0.001, 0.001, -0.001], {})
    change = compare(now, then, per_gpu=False, measured=True)
    assert change.gain > TIE and all(a < b for a, b in zip(then.accelerated.step_time_s_draws,
                                                            now.accelerated.step_time_s_draws))
    assert change.data_better == 2 and not change.worth
    assert change.terms["dp_sync"] == pytest.approx(0.05 / then.step_time_s)
    # faster on every draw on the rest too: a change
    faster = _row(THEN, data * 0.9, {})
    assert compare(now, faster, per_gpu=False, measured=True).worth


def test_a_change_needs_the_tie_and_more_where_the_costs_are_assumed():
    data = np.array([1.0, 1.2, 0.9])
    now = _row(NOW, data, {"bubble": 0.1})
    for factor, measured, worth in ((1 / 1.05, True, True), (1 / 1.02, True, False), (1 / 1.05, False, False),
                                    (1 / (1.01 + TIE + ASSUMED_EFFICIENCY_SPREAD), False, True)):
        change = compare(now, _row(THEN, data * factor, {"bubble": 0.05}), per_gpu=False, measured=measured)
        assert change.data_better == 3 and change.worth is worth, (factor, measured)
        assert change.needed == (TIE if measured else TIE + ASSUMED_EFFICIENCY_SPREAD)
    # per GPU: a layout as fast on twice the GPUs is worse
    wide = _row("images=tp1,pp1,dp2 language=tp4,pp4,dp2 mbs=2 gbs=32", data * 0.6, {})
    assert compare(now, wide, per_gpu=True, measured=True).gain < 0
    assert compare(now, wide, per_gpu=False, measured=True).worth


@settings(max_examples=examples(100), deadline=None)
@given(st.lists(st.floats(0.0, 0.5), min_size=6, max_size=6), st.lists(st.floats(0.0, 0.5), min_size=6, max_size=6),
       st.booleans())
def test_the_gain_terms_sum_to_the_gain(a, b, per_gpu):
    keys = [k for k in PARTS if k != "compute"]
    now = _row(NOW, [3.0, 3.5], dict(zip(keys, a)))
    then = _row("images=tp1,pp1,dp2 language=tp4,pp4,dp2 mbs=2 gbs=32", [2.5, 3.2], dict(zip(keys, b)))
    change = compare(now, then, per_gpu=per_gpu, measured=False)
    assert set(change.terms) == set(PARTS)
    assert sum(change.terms.values()) == pytest.approx(change.gain, abs=1e-12)


def test_the_tutorials_layout_is_kept_at_17_gpus_and_the_answer_says_why(tmp_path):
    """The 27B preset at 17 H100s (FLOPs, the default): the best found saves the DP gradient sync
    and moves layers off the last stage, a gain inside what a model of assumed costs can tell:
    the tutorial's layout is kept, the best found and what its gain is made of said."""
    out = tmp_path / "a.json"
    console = Console(record=True, width=400)
    assert main(["--model", "qwen35-vl-27b", "--gpus", "17", "--gpu", "h100", "--current", "reference-27b",
                 "--steps", "4", "--top", "3", "--json", str(out)], console=console) == 0
    doc = json.loads(out.read_text())
    assert doc["format"] == "mimo-accel-layout/3" and doc["keep_current"] and doc["recommended"] == REFERENCE
    change = doc["change"]
    assert change["gain"] < change["needed"] == pytest.approx(TIE + ASSUMED_EFFICIENCY_SPREAD)
    assert not doc["costs"]["measured"] and doc["costs"]["efficiency_assumed"] == {"images": 0.4, LANGUAGE: 0.4}
    assert sum(change["gain_terms"].values()) == pytest.approx(change["gain"])
    for r in [*doc["rows"], doc["current"]]:
        assert sum(r["step_parts"].values()) == pytest.approx(r["step_time_s"]) and not r["mfu_measured"]
        assert (r["against_current"] is None) == (r["spec"] == REFERENCE)
    text = console.export_text()
    assert "Keep the current layout" in text and "made of" in text and "the DP gradient sync" in text
    assert "MFU, assumed" in text and "MFU here is assumed, not measured" in text


def test_one_layout_priced_from_flops_says_its_mfu_is_assumed(tmp_path):
    out = tmp_path / "a.json"
    console = Console(record=True, width=400)
    assert main(["--current", "reference-27b", "--steps", "1", "--json", str(out)], console=console) == 0
    row = json.loads(out.read_text())["current"]
    assert not row["mfu_measured"] and row["mfu"][LANGUAGE] > 0
    assert sum(row["step_parts"].values()) == pytest.approx(row["step_time_s"])
    text = console.export_text()
    assert "MFU, assumed" in text and "MFU here is assumed, not measured" in text


def test_an_uneven_pick_comes_with_its_launcher_lines_and_the_best_even_split(tmp_path):
    """Without a current layout the best is recommended: at 17 H100s an uneven split, printed with
    the lines that build it in upstream's launcher, and beside it the best even split, which runs
    with the launcher as it is, priced."""
    out = tmp_path / "a.json"
    console = Console(record=True, width=400)
    assert main(["--gpus", "17", "--gpu", "h100", "--steps", "2", "--top", "3", "--json", str(out)], console=console) == 0
    doc = json.loads(out.read_text())
    rows = {r["spec"]: r for r in doc["rows"]}
    rec, even = rows[doc["recommended"]], rows[doc["even_alternative"]]
    assert rec["pipeline_split"] and not rec["settings"]["runs_as_is"]
    assert rec["settings"]["launcher_lines"] == [f"standard_provider.{k} = {v}" for k, v in rec["pipeline_split"].items()]
    assert even["pipeline_split"] is None and even["settings"]["runs_as_is"] and even["step_time_s"] > 0
    assert even["step_time_s"] >= min(r["step_time_s"] for r in rows.values() if r["pipeline_split"] is None)
    text = console.export_text()
    assert f"beside `{BESIDE}`" in text and "runs with the launcher as it is" in text
    assert text.count("standard_provider.num_layers_in_") == len(rec["pipeline_split"])


def _component(raw: str):
    """A --component string read as upstream's launcher reads it (examples/megatron_mimo/qwen35_vl/
    finetune_qwen35_vl.py, _parse_component_spec: name=key=N,... into Bridge's ModuleParallelismConfig)."""
    from megatron.bridge.models.megatron_mimo.megatron_mimo_config import ModuleParallelismConfig

    fields = {"tp": "tensor_model_parallel_size", "pp": "pipeline_model_parallel_size", "dp": "data_parallel_size",
              "cp": "context_parallel_size", "etp": "expert_tensor_parallel_size", "rank_offset": "rank_offset"}
    name, _, payload = raw.partition("=")
    parsed = {}
    for item in payload.split(","):
        key, _, value = item.partition("=")
        parsed[fields[key]] = int(value)
    return name, ModuleParallelismConfig(**parsed)


@pytest.mark.parametrize("spec", [
    "images=tp1,pp1,dp1 language=tp4,pp4,dp1 mbs=1 gbs=32 first=17 last=13",
    "images=tp2,pp1,dp2 language=tp4,pp6,dp2 mbs=2 gbs=32 first=12 last=8",
    "images=tp1,pp1,dp2 language=tp2,pp5,dp2 mbs=2 gbs=32 first=12 last=10",
    REFERENCE,
])
def test_what_is_printed_builds_the_priced_layout(spec):
    """The printed lines, run on Bridge's own Qwen3.5-VL provider (the language model's
    TransformerConfig in the launcher) and finalized as the MIMO provider finalizes it, give the
    priced stages on every PP rank (megatron-core's get_num_layers_to_build); the printed
    --component strings, read as the launcher reads them, give the priced sizes, rank offsets
    and world size (Bridge's MegatronMIMOParallelismConfig.finalize)."""
    from megatron.bridge.models.megatron_mimo.megatron_mimo_config import MegatronMIMOParallelismConfig
    from megatron.bridge.models.qwen_vl.qwen35_vl_provider import Qwen35VLModelProvider
    from megatron.core.transformer.transformer_block import get_num_layers_to_build

    problem = build(Request(machine=MachineRequest("h100"), data=DataRequest(steps=1)))
    layout = parse_layout(spec)
    printed = settings_lines(price(layout, problem))
    command = next(line for line in printed if "finetune_qwen35_vl.py" in line)
    lines = [line.strip() for line in printed if line.startswith("    standard_provider.")]
    assert bool(lines) == (layout.split is not None)
    pp = layout.language.pp
    # the 27B preset's language model, narrowed (its layer count and PP are what the split reads)
    provider = Qwen35VLModelProvider(num_layers=64, hidden_size=256, num_attention_heads=8, num_query_groups=4,
                                     kv_channels=32, ffn_hidden_size=512, vocab_size=1024, linear_num_key_heads=4,
                                     linear_num_value_heads=8, pipeline_model_parallel_size=pp)
    exec("\n".join(lines), {}, {"standard_provider": provider})  # noqa: S102 - the printed lines, as pasted
    provider.finalize()
    built = tuple(get_num_layers_to_build(provider, pp_rank=r) for r in range(pp))
    assert built == stage_layers(64, pp, layout.first, layout.last) == problem.seconds.layers(layout)
    flags = dict(re.findall(r"(--[a-z-]+) (\S+)", command))
    assert (int(flags["--micro-batch-size"]), int(flags["--global-batch-size"])) == (layout.mbs, layout.gbs)
    parsed = dict(_component(c) for c in re.findall(r"--component (\S+)", command))
    config = MegatronMIMOParallelismConfig(module_parallelisms=parsed)
    config.finalize(layout.gpus)
    for m in layout.modules:
        p = parsed[m.name]
        assert (p.tensor_model_parallel_size, p.pipeline_model_parallel_size, p.data_parallel_size) == (m.tp, m.pp, m.dp)
    assert max(p.rank_offset + p.total_ranks for p in parsed.values()) == layout.gpus
