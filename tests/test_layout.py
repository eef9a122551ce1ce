"""The layout advisor (mimo_accel.tools.layout): one request and one pricing path for every command
that prices a layout (``simulate --layout`` among them), the search's constraints, Megatron's
stages, the draws and the rule that keeps the current layout, the objective, the profile source,
the command's output and its one-line errors."""

from __future__ import annotations

import json
from itertools import product
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from tests._hypothesis import examples

from mimo_accel.modules import LANGUAGE, module
from mimo_accel.profiler.recorder import FORMAT
from mimo_accel.tools import simulate as sim
from mimo_accel.tools.layout import (ADVICE_FORMAT, DataRequest, MachineRequest, NoLayoutFits, Objective, Request,
                                     Search, advise, build, main, price)
from mimo_accel.tools.layout.advice import _ordered
from mimo_accel.tools.layout.memory import GIB
from mimo_accel.tools.layout.models import load_model, model_named
from mimo_accel.tools.layout.problem import DEFAULT_STEPS
from mimo_accel.tools.layout.search import Candidate, divisors, layouts, rank_offsets, splits
from mimo_accel.tools.layout.seconds import tp_efficiency
from mimo_accel.tools.layout.spec import LAYOUT_PRESETS, parse_layout, stage_layers

TINY = """
name: tiny
seq_length: 512
gbs: 8
modules:
  vision: {layers: 2, hidden: 128, ffn_hidden: 256, heads: 4, kv_channels: 32, merge: 2, out_hidden: 256}
  language: {layers: 4, hidden: 256, ffn_hidden: 512, heads: 8, query_groups: 4, vocab: 1024, gated: true}
"""
REFERENCE = LAYOUT_PRESETS["reference-27b"][0]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("model") / "tiny.yaml"
    path.write_text(TINY)
    return str(path)


def _tiny_problem(tiny, memory_gib=0.06, gpn=8, gbs=8, steps=1):
    return build(Request(model=tiny, machine=MachineRequest("custom", 100.0, memory_gib, gpn),
                         data=DataRequest("receipts", rehearsal=True, gbs=gbs, steps=steps)))


def _h100(**data):
    return build(Request(machine=MachineRequest("h100"), data=DataRequest(**{"steps": 1, **data})))


# -- the preset and model files ------------------------------------------------------------------


def test_the_preset_states_the_hybrid_language_models_flops_and_parameters():
    m = model_named("qwen35-vl-27b")
    lang, images = m.modules[LANGUAGE], m.modules["images"]
    assert lang.per_token == 51_549_831_168 and lang.per_sq_token == 196_608  # the docstring's derivation
    assert lang.output_per_token == 2 * 5120 * 248320 and lang.linear_layers == 48 and lang.linear_bytes == 109_248
    assert (lang.attention_bytes, lang.mlp_bytes) == (96_576, 6 * 17408)  # gated attention, q/k norms; SwiGLU
    assert 26.8e9 < lang.params.total < 27.0e9 and 0.45e9 < images.params.total < 0.47e9
    assert [t for t in (1, 2, 4, 8) if lang.tp_fits(t)] == [1, 2, 4]  # 4 query groups
    assert m.seq_length == 4096 and m.gbs == 32 and m.image_pixels == (200_704, 1_003_520)


@pytest.mark.parametrize("module, words", [
    ("{layers: 2, hidden: 8, ffn_hidden: 8, heads: 2, vocab: 4, colour: 1}", "unknown keys ['colour']"),
    ("{layers: 2.5, hidden: 8, ffn_hidden: 8, heads: 2, vocab: 4}", "modules.language.layers: 2.5 is not a whole number"),
    ("{layers: 2, hidden: 8, ffn_hidden: 8, heads: 2, vocab: 4, gated: 'false'}",
     "modules.language.gated: 'false' is not a boolean; write true or false, unquoted"),
    ("{layers: 2, hidden: 8, ffn_hidden: 8, heads: 4, query_groups: 3, vocab: 4}",
     "modules.language.query_groups: 3 does not divide heads (4)"),
    ("{layers: 2, hidden: 8, ffn_hidden: 8, heads: 2, vocab: 4, per_token_flops: -1}",
     "modules.language.per_token_flops: -1 is not a number >= 0"),
])
def test_a_model_file_is_checked_key_by_key(tmp_path, tiny, module, words):
    assert list(load_model(tiny).modules) == ["vision", LANGUAGE]
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"modules:\n  vision: {{layers: 1, hidden: 8, ffn_hidden: 8, heads: 2}}\n  language: {module}\n")
    with pytest.raises(ValueError) as e:
        load_model(str(bad))
    assert words in str(e.value) and str(bad) in str(e.value)


def test_a_quoted_boolean_does_not_freeze_an_encoder(tmp_path):
    bad = tmp_path / "m.yaml"
    bad.write_text("modules:\n  vision: {layers: 1, hidden: 8, ffn_hidden: 8, heads: 2, frozen: 'false'}\n"
                   "  language: {layers: 2, hidden: 8, ffn_hidden: 8, heads: 2, vocab: 4}\n")
    with pytest.raises(ValueError, match="modules.vision.frozen: 'false' is not a boolean"):
        load_model(str(bad))


# -- the search: every layout obeys every constraint, and none is missed ---------------------------


def _brute_force(problem, budget, gbs, gpn):
    """Every evenly split layout that fits, from the constraints alone (not the search's code)."""
    model, mem = problem.model, problem.memory
    lang, vis = model.modules[LANGUAGE], model.modules["vision"]
    out = set()
    for b in divisors(gbs):
        for lt, lp, ld, vt, vd in product(divisors(gpn), divisors(lang.layers), divisors(b), divisors(gpn), divisors(b)):
            if lt * lp * ld + vt * vd > budget or not (lang.tp_fits(lt) and vis.tp_fits(vt)):
                continue
            w = gbs // b
            foot = {LANGUAGE: mem.language(module(LANGUAGE, ld, tp=lt, pp=lp), b, w, (lang.layers // lp,) * lp),
                    "vision": mem.encoder(module("vision", vd, tp=vt), b, w, lp)}
            if mem.why_not(foot) is None:
                out.add(f"vision=tp{vt},pp1,dp{vd} language=tp{lt},pp{lp},dp{ld} mbs={b} gbs={gbs}")
    return out


@settings(max_examples=examples(30), deadline=None)
@given(budget=st.integers(2, 24), gpn=st.sampled_from([4, 8]), memory=st.sampled_from([0.03, 0.05, 0.2]))
def test_every_layout_obeys_the_constraints_and_none_is_missed(tiny, budget, gpn, memory):
    problem = _tiny_problem(tiny, memory_gib=memory, gpn=gpn)
    found = layouts(problem, budget=budget, mbs=divisors(8))
    usable = memory * 0.9 * GIB
    for c in found:
        lay = c.layout
        assert lay.gpus <= budget and 8 % lay.mbs == 0 and lay.mbs % lay.modules.grid == 0
        offsets = rank_offsets(lay.modules)
        for m in lay.modules:
            mm = problem.model.modules[m.name]
            assert gpn % m.tp == 0 and mm.heads % m.tp == 0 and mm.query_groups % m.tp == 0
            assert offsets[m.name] % m.tp == 0  # a TP group inside a node
            assert c.memory[m.name].total <= usable
        # megatron-core builds these stages: even, or its first/last counts with the stages between even
        assert sum(stage_layers(4, lay.language.pp, lay.first, lay.last)) == 4
        assert parse_layout(lay.spec).spec == lay.spec  # the grammar reads it back
    assert {c.layout.spec for c in found if c.layout.first is None} == _brute_force(problem, budget, 8, gpn)


def test_megatrons_stages_the_output_layer_on_the_last():
    """From FLOPs, the last stage holds the output layer (2·h·V a token: on the 27B preset about 3
    layers' worth), so a pp8 split evenly is slower than the stage model's balanced split, and an
    even split's last stage is its busiest."""
    problem = _h100()
    even = parse_layout("images=tp1,pp1,dp1 language=tp2,pp8,dp1 mbs=1 gbs=32")
    shares = problem.seconds.stage_shares(even, 2000.0, 2000.0 ** 2)
    assert shares[-1] == max(shares) and shares[-1] > 1.3 * shares[0]
    first, last = splits(problem, 8)[-1]
    layers = stage_layers(64, 8, first, last)
    assert last < 8 and max(layers) > 8  # the balanced split moves layers off the last stage
    assert problem.seconds.stage_token_work(layers) < problem.seconds.stage_token_work((8,) * 8)
    balanced = parse_layout(even.spec + f" first={first} last={last}")
    assert price(balanced, problem).step_time_s < price(even, problem).step_time_s
    # Bridge's settings for it: megatron-core's TransformerConfig fields, printed to paste
    assert price(balanced, problem).to_doc()["pipeline_split"] == {"num_layers_in_first_pipeline_stage": first,
                                                                    "num_layers_in_last_pipeline_stage": last}


# -- one request, one pricing path: simulate --layout and layout --current give the same seconds --------


def test_simulate_layout_and_layout_current_price_the_same_seconds(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    assert sim.main(["--layout", "reference-27b", "--json", str(a)], console=Console(width=200)) == 0
    assert main(["--current", "reference-27b", "--json", str(b)], console=Console(width=200)) == 0
    x, y = (json.loads(p.read_text())["current"] for p in (a, b))
    assert x["step_time_s"] == y["step_time_s"] > 0 and x["without"]["step_time_s"] == y["without"]["step_time_s"]
    assert len(x["step_time_s_draws"]) == DEFAULT_STEPS  # one default draw count for both
    assert x["upstream_packed"]["step_time_s"] < x["without"]["step_time_s"]  # upstream's own packing helps
    assert x["step_time_s"] < x["upstream_packed"]["step_time_s"]  # and the plan more


# -- the objective and the recommendation ---------------------------------------------------------------


def test_a_layout_idling_most_of_the_budget_is_not_recommended_for_throughput(tiny):
    problem = _tiny_problem(tiny)
    small = Candidate(parse_layout("vision=tp1,pp1,dp1 language=tp1,pp1,dp1 mbs=8 gbs=8"), {})
    big = Candidate(parse_layout("vision=tp1,pp1,dp2 language=tp1,pp4,dp2 mbs=8 gbs=8"), {})
    # the small one is a little faster and far better per GPU; on a budget of 16 it idles 14 GPUs
    entries = [(10.0, 10.0 / 2, small), (9.9, 9.9 / 10, big)]
    assert _ordered(entries, Objective.THROUGHPUT, 16, 0.03)[0][2] is big
    assert _ordered(entries, Objective.PER_GPU, 16, 0.03)[0][2] is small
    assert _ordered(entries, Objective.THROUGHPUT, 3, 0.03)[0][2] is small  # the budget's only layout using most
    advice = advise(problem, Search(12, top=2))
    assert advice.recommended.gpus > 6 and advice.recommended.fits
    assert all(r.gpus <= 12 and r.fits for rows in advice.ranked.values() for r in rows)


def test_no_layout_fits_names_the_smallest_budget_that_would(tiny):
    problem = _tiny_problem(tiny, memory_gib=0.03)
    with pytest.raises(NoLayoutFits, match=r"the smallest budget a layout fits is (\d+) GPUs: give --gpus \1"):
        advise(problem, Search(2))


# -- a CPU profile as the source ---------------------------------------------------------------------


def _flops(language_ranks: int) -> dict:
    """A profile header's module configs: a tiny encoder and language model."""
    shape = {"layers": 2, "hidden": 64, "ffn_hidden": 128, "heads": 4, "query_groups": 4, "kv_channels": 16,
             "vocab": 0, "causal": False, "merge": 2, "out_hidden": 64}
    return {"device_name": None, "modules": {
        "vision": {"ranks": 1, "trained": True, "shape": shape},
        LANGUAGE: {"ranks": language_ranks, "trained": True,
                   "shape": {**shape, "vocab": 512, "causal": True, "merge": 0, "out_hidden": 0}}}}


def _profile(directory: Path, bridge: str = "0.7.0") -> Path:
    flops = _flops(1)
    for rank, name in enumerate(("vision", LANGUAGE)):
        header = {"kind": "header", "format": FORMAT, "rank": rank, "world_size": 2, "module": name, "dp_rank": 0,
                  "dp_size": 1, "layout": {"dp": {"vision": 1, LANGUAGE: 1}, "pp": {"vision": 1, LANGUAGE: 1},
                                           "flops": flops}, "device": "cpu", "versions": {"megatron-bridge": bridge}}
        lines = [header]
        for s in range(4):
            line = {"kind": "step", "step": s, "step_time_s": 1.0, "samples": 8,
                    "timed_calls": {f"{name}_fwd": 2}}
            if name == LANGUAGE and s == 3:
                line["online_refits"] = [
                    {"step": 3, "module": "vision", "coefficients": {"a": 1e-4, "b": 1e-7, "k": 0.0}, "accepted": True},
                    {"step": 3, "module": LANGUAGE, "coefficients": {"a": 2e-4, "b": 1e-7, "k": 0.0}, "accepted": True}]
            lines.append(line)
        (directory / f"rank{rank}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return directory


def _from(run, **data) -> Request:
    return Request(profile=str(run), data=DataRequest(**{"workload": "receipts", "rehearsal": True, "steps": 1,
                                                         **data}))


def test_a_cpu_profile_prices_with_what_the_run_learnt(tmp_path):
    problem = build(_from(_profile(tmp_path)))
    assert problem.machine.name == "cpu" and problem.gbs == 8 and problem.gpus == 2
    assert problem.profiled.spec == "vision=tp1,pp1,dp1 language=tp1,pp1,dp1 mbs=4 gbs=8"
    at_tp1 = problem.seconds.cost_model(problem.profiled)
    assert (at_tp1.of("vision").a, at_tp1.of("vision").b) == (1e-4, 1e-7)  # communication 0 on CPU ranks
    at_tp2 = problem.seconds.cost_model(parse_layout("vision=tp2,pp1,dp1 language=tp1,pp1,dp1 mbs=4 gbs=8"))
    scale = 0.5 * tp_efficiency(64, 1) / tp_efficiency(64, 2)
    assert at_tp2.of("vision").a == pytest.approx(1e-4 * scale) and at_tp2.of(LANGUAGE).a == 2e-4
    row = price(problem.profiled, problem)
    assert row.fits and row.step_time_s > 0 and row.accelerated.mfu == {"vision": None, LANGUAGE: None}
    advice = advise(problem, Search(top=2))  # the run's own GPUs, its layout priced beside
    assert advice.budget == 2 and advice.current.spec == problem.profiled.spec
    assert advice.to_doc()["costs"]["encoder_measured"]


def test_upstream_packing_is_priced_only_where_the_profiled_bridge_has_it(tmp_path):
    old = build(_from(_profile(tmp_path, bridge="0.6.2")))
    assert not old.upstream_packing and price(old.profiled, old).to_doc()["upstream_packed"] is None


def _pp_profile(directory: Path, *, micro_tokens: bool = True) -> Path:
    """vision dp1 -> language pp2 dp2 (5 ranks), 6 steps of 4 micro-batches; each language stage's
    micro-batch takes ``C + A·Σ L + B·Σ L²`` seconds (stage 1 twice stage 0's), its tokens varied."""
    layout = {"dp": {"vision": 1, LANGUAGE: 2}, "pp": {"vision": 1, LANGUAGE: 2}, "flops": _flops(4)}
    # Bridge's grids order dp before pp: ranks 1, 2 are stage 0 of replicas 0, 1; ranks 3, 4 stage 1
    places = [("vision", 0, 0), (LANGUAGE, 0, 0), (LANGUAGE, 1, 0), (LANGUAGE, 0, 1), (LANGUAGE, 1, 1)]
    for rank, (name, replica, stage) in enumerate(places):
        header = {"kind": "header", "format": FORMAT, "rank": rank, "world_size": 5, "module": name,
                  "dp_rank": replica, "dp_size": 2 if name == LANGUAGE else 1, "layout": layout, "device": "cpu"}
        lines = [header]
        for s in range(6):
            tokens = [40 + 37 * ((s + j + replica) % 5) for j in range(4)]
            sq = [t * t for t in tokens]
            line = {"kind": "step", "step": s, "step_time_s": 1.0, "samples": 4, "timed_calls": {f"{name}_fwd": 4},
                    "micro": {f"{name}_fwd": [0.01] * 4, f"{name}_bwd": [0.02] * 4}}
            if name == LANGUAGE:
                seconds = [(1 + stage) * (0.004 + 2e-5 * t + 1e-8 * q) for t, q in zip(tokens, sq)]
                line["micro"] = {f"{name}_fwd": [x / 3 for x in seconds], f"{name}_bwd": [2 * x / 3 for x in seconds],
                                 **({"tokens": tokens, "sq_tokens": sq} if micro_tokens else {})}
                line["tokens"], line["sq_tokens"] = sum(tokens), sum(sq)
                if s == 5 and rank == 4:
                    line["online_refits"] = [{"step": 5, "module": m, "accepted": True,  # the encoder cheap
                                              "coefficients": {"a": a, "b": 1e-10, "k": 0.0}}
                                             for m, a in (("vision", 1e-7), (LANGUAGE, 1e-4))]
            lines.append(line)
        (directory / f"rank{rank}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return directory


def _replayed_p50(directory: Path) -> float:
    from mimo_accel.profiler.run import read_run
    from mimo_accel.tools.report.summary import summarize

    return summarize(read_run(directory))["step_time_replayed_p50"]


def test_a_profile_prices_what_a_micro_batch_costs_whatever_its_size(tmp_path):
    """The language model's cost is read off its micro-batches (each stage's time against the
    micro-batch's real tokens): a per-token and per-token² cost, and what a micro-batch costs a
    replica whatever its size, summed over its stages; a layout with half the micro-batches pays
    it half as often."""
    problem = build(_from(_pp_profile(tmp_path)))
    seconds = problem.seconds
    assert seconds.overheads[LANGUAGE] == pytest.approx(3 * 0.004, rel=1e-6)  # stage 0's 4 ms + stage 1's 8 ms
    language = seconds.learnt.of(LANGUAGE)
    assert (language.a, language.b) == (pytest.approx(3 * 2e-5, rel=1e-6), pytest.approx(3e-8, rel=1e-4))
    few = price(parse_layout("vision=tp1,pp1,dp1 language=tp1,pp1,dp2 mbs=4 gbs=8"), problem)
    many = price(parse_layout("vision=tp1,pp1,dp1 language=tp1,pp1,dp2 mbs=2 gbs=8"), problem)
    # the same samples in twice the micro-batches: 2 more a replica, each 12 ms whatever its size (at
    # the scale that makes the run's own layout's modelled step its replayed one)
    assert many.step_time_s - few.step_time_s == pytest.approx(seconds.scale * 2 * 3 * 0.004, rel=0.05)
    # the stages: the last holds what stage 1 measured beyond stage 0 (twice its time here)
    two = parse_layout("vision=tp1,pp1,dp1 language=tp1,pp2,dp1 mbs=1 gbs=8")
    assert seconds.stage_shares(two, 100.0, 1e4) == pytest.approx([1 / 3, 2 / 3])
    # the run's own layout, priced as it ran (upstream's padded batches: its header names no reorder),
    # is the step its measured times replay
    padded = price(problem.profiled, problem).figures["padded"].step_time_s
    assert padded == pytest.approx(_replayed_p50(tmp_path), rel=1e-6)
    (tmp_path / "older").mkdir()
    older = build(_from(_pp_profile(tmp_path / "older", micro_tokens=False)))
    assert older.seconds.overheads == {} and older.seconds.learnt.of(LANGUAGE).a == 1e-4
    assert any("no per-micro-batch tokens" in n for n in older.notes)


def test_a_profile_is_scaled_to_its_replay_only_on_data_like_its_own(tmp_path):
    """The scale that makes the run's own layout take its replayed step is fitted at the run's own
    batch, whatever --gbs asks, and not applied where it says the data priced is not the run's; a
    profile's seconds are its device's: another --gpu is refused."""
    run = _pp_profile(tmp_path)
    at = [build(_from(run, gbs=g)).seconds.scale for g in (8, 16)]
    assert at[0] == at[1] != 1.0
    far = build(_from(run, seq_length=100000))
    assert far.seconds.scale == 1.0
    assert any(n.startswith("costs not scaled to the run's replayed step") and "--index" in n for n in far.notes)
    with pytest.raises(ValueError, match="--gpu h100: the profile was measured on cpu"):
        build(Request(profile=str(run), machine=MachineRequest("h100"), data=DataRequest("receipts", steps=1)))


def test_on_cpu_ranks_a_profile_holds_each_modules_tp(tmp_path):
    """How TP scales on CPU ranks is not modelled (gloo's collectives are in the measured times):
    every layout searched keeps the profiled TP, and one that changes it is refused in one line."""
    problem = build(_from(_profile(tmp_path)))
    assert problem.tp_held == {"vision": 1, LANGUAGE: 1}
    advice = advise(problem, Search(4, top=3))
    assert all(m.tp == 1 for r in advice.ranked["mimo_accel"] for m in r.layout.modules)
    assert any(r.gpus > 2 for r in advice.ranked["mimo_accel"])  # DP and PP are still searched
    with pytest.raises(ValueError, match="on CPU ranks a profile prices its module at the TP it ran"):
        price(parse_layout("vision=tp2,pp1,dp1 language=tp1,pp1,dp1 mbs=4 gbs=8"), problem)


# -- the command -------------------------------------------------------------------------------------


def test_the_17_gpu_preset_run_and_its_json(tmp_path):
    out = tmp_path / "x.json"
    console = Console(record=True, width=240)
    assert main(["--model", "qwen35-vl-27b", "--gpus", "17", "--gpu", "h100", "--steps", "2", "--top", "2",
                 "--current", "reference-27b", "--json", str(out)], console=console) == 0
    doc = json.loads(out.read_text())
    assert doc["format"] == ADVICE_FORMAT and doc["budget"] == 17
    assert doc["assumptions"] == {"sequence_parallel": False, "recompute": "none", "distributed_optimizer": True,
                                  "precision": "bf16", "source": doc["assumptions"]["source"]}
    assert "finetune_qwen35_vl.py" in doc["assumptions"]["source"] and not doc["costs"]["encoder_measured"]
    for r in [*doc["rows"], doc["current"]]:
        assert {"spec", "gpus", "step_time_s", "step_time_s_draws", "tokens_per_s_per_gpu", "samples_per_s_per_gpu",
                "memory_gib_per_gpu", "bound_module", "busy_share", "fits", "why_not", "upstream_packed",
                "pipeline_split"} <= set(r)
        assert r["gpus"] <= 17 and set(r["memory_gib_per_gpu"]) == {"images", LANGUAGE}
        assert r["without"]["step_time_s"] > r["upstream_packed"]["step_time_s"] > r["step_time_s"] > 0
        assert len(r["step_time_s_draws"]) == 2
    assert doc["current"]["spec"] == REFERENCE and doc["current"]["fits"]
    assert doc["recommended"] in {r["spec"] for r in doc["rows"]} | {REFERENCE}
    current = doc["current"]["step_time_s_draws"]
    rec = next(r for r in [*doc["rows"], doc["current"]] if r["spec"] == doc["recommended"])
    # a change only where it is faster on every draw (the throughput objective: equal GPUs here)
    assert doc["keep_current"] or all(a < b for a, b in zip(rec["step_time_s_draws"], current))
    assert doc["gain"]["over_padded"] > doc["gain"]["over_upstream_packed"] > 1
    assert rec["settings"]["components"][0].startswith("language=tp=")
    text = console.export_text()
    for words in ("With mimo_accel", "Without mimo_accel", "upstream's own packing", "MegatronMIMOParallelismConfig",
                  "--component language=", "sequence parallelism off", "the encoder's GPU cost is its FLOPs at a "
                  "stated efficiency, not measured", "layout --from DIR"):
        assert words in text


@pytest.mark.parametrize("args, words", [
    (["--model", "qwen35-vl-27b", "--gpus", "17", "--gpu", "tpu"], ["--gpu tpu: unknown GPU; give one of h100, h200"]),
    (["--model", "qwen35-vl-27b", "--gpus", "17", "--current", "images=tp1 language=tp4,pp2,dp2 mbs=2 gbs=32"],
     ["--current: 'images=tp1': give the module's sizes as tpT,ppP,dpD"]),
    (["--model", "qwen35-vl-27b", "--gpus", "17", "--current", "images=tp1,pp1,dp3 language=tp4,pp2,dp2 mbs=2 gbs=32"],
     ["'mbs=2': the global micro-batch must be a multiple of G = lcm(DPs) = 6"]),
    (["--model", "qwen35-vl-27b", "--gpus", "17", "--current", "images=tp1,pp1,dp1 language=tp8,pp2,dp2 mbs=2 gbs=32"],
     ["language=tp8: TP must divide the module's heads (24) and query groups (4)"]),
    (["--current", "images=tp1,pp1,dp1 language=tp4,pp3,dp2 mbs=2 gbs=32"],
     ["language=pp3: 64 layers do not split evenly over 3 stages", "first=N / last=N"]),
    (["--current", "images=tp1,pp1,dp1 language=tp4,pp4,dp2 mbs=2 gbs=32 first=21 last=20"],
     ["first=21 last=20: 64 layers over 4 stages leave 23 for the 2 between"]),
    (["--model", "qwen35-vl-27b", "--gpus", "17", "--mbs", "3"], ["--mbs 3: the global batch 32 is not a whole number"]),
    (["--model", "qwen35-vl-27b", "--gpus", "17", "--gbs", "30", "--current", "reference-27b"],
     ["--gbs 30 and --current's gbs=32 differ"]),
    (["--gpus", "17", "--steps", "100000"], ["argument --steps: 100000 is more than 1024 draws"]),
    (["--gpus", "100000"], ["argument --gpus: 100000 is more than 4096 GPUs"]),
    (["--model", "qwen35-vl-27b"], ["give --gpus N (the GPU budget: search), or --current SPEC"]),
])
def test_bad_input_is_one_line_naming_the_fix(capsys, args, words):
    assert main(args) == 2
    out, err = capsys.readouterr()
    lines = err.rstrip("\n").split("\n")
    assert lines[-1].startswith("mimo-accel layout: error: ") or "error: argument" in lines[-1], err
    for w in words:
        assert w in lines[-1], lines[-1]


@pytest.mark.parametrize("spec, words", [
    ("nope", "'nope': no such preset; give one of reference-27b"),
    ("images=tp1,pp2,dp1 language=tp4,pp2,dp2 mbs=2 gbs=32", "'images=tp1,pp2,dp1': the step model takes an encoder"),
    ("images=tp1,pp1,dp1 language=tp4,pp2,dp2 mbs=2 gbs=31", "'gbs=31': the global batch must be a whole number"),
    ("images=tp1,pp1,dp1 language=tp4,pp2,dp2 mbs=0 gbs=32", "'mbs=0': mbs must be a positive whole number"),
    ("images=tp1,pp1,dp1 mbs=2 gbs=32", "no language=tpT,ppP,dpD"),
    ("images=tp1,pp1,dp1 language=tp4,pp2,dp2 mbs=2 gbs=32 frozen=language", "'frozen=language': 'language' is not"),
    ("images=tp1,pp1,dp1 language=tp4,pp1,dp2 mbs=2 gbs=32 first=3", "'first=/last=': they split the language"),
    ("images=tp1,pp1,dp1 images=tp1,pp1,dp1 language=tp4,pp2,dp2 mbs=2 gbs=32", "a module is given twice"),
])
def test_simulate_keeps_its_spelling_and_a_bad_layout_is_one_line(capsys, spec, words):
    assert sim.main(["--layout", spec]) == 2
    out, err = capsys.readouterr()
    lines = err.rstrip("\n").split("\n")
    assert len(lines) == 1 and lines[0].startswith("mimo-accel simulate: error: --layout: "), err
    assert words in lines[0] and out == ""
    assert sim.main(["--workload", "receipts"]) == 2
    assert "give --layout SPEC" in capsys.readouterr().err


def test_a_profile_without_module_configs_is_one_line(tmp_path, capsys):
    run = _profile(tmp_path)
    for f in run.iterdir():
        lines = f.read_text().splitlines()
        header = json.loads(lines[0])
        del header["layout"]["flops"]
        f.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    assert main(["--from", str(run), "--rehearsal"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("mimo-accel layout: error: --from ") and "give --model FILE" in err and "\n" not in err


def test_a_budget_no_layout_fits_is_one_line(tiny, capsys):
    assert main(["--model", tiny, "--gpus", "2", "--gpu", "custom", "--peak-tflops", "100", "--memory-gib", "0.03",
                 "--workload", "receipts", "--rehearsal", "--steps", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert "no layout of tiny fits 2 GPUs" in err and "give --gpus" in err and "\n" not in err


def test_a_frozen_encoder_costs_its_forward_only_and_syncs_nothing():
    problem = _h100(workload="uniform")
    spec = "images=tp1,pp1,dp2 language=tp4,pp2,dp2 mbs=2 gbs=32"
    trained, frozen = parse_layout(spec), parse_layout(spec + " frozen=images")
    t, f = (problem.seconds.cost_model(x).of("images") for x in (trained, frozen))
    assert f.b == pytest.approx(t.b / 3) and f.a < t.a / 2  # forward only; its transfer one way
    assert problem.seconds.step_end(frozen) == problem.seconds.step_end(parse_layout(
        "images=tp1,pp1,dp1 language=tp4,pp2,dp2 mbs=2 gbs=32"))  # the frozen encoder's DP syncs no gradient
    assert frozen.spec == spec + " frozen=images" and frozen.spec != trained.spec  # the text says what is priced


def test_the_current_layout_is_priced_even_where_it_does_not_fit():
    problem = _h100(workload="uniform")
    row = price(parse_layout("images=tp1,pp1,dp1 language=tp4,pp1,dp1 mbs=1 gbs=32"), problem)
    assert not row.fits and "language needs" in row.why_not and row.step_time_s > 0
    wide = price(parse_layout(REFERENCE), build(Request(machine=MachineRequest("h100", gpus_per_node=2),
                                                        data=DataRequest("uniform", steps=1))))
    assert wide.why_not == "a TP group would straddle a node of 2 GPUs"


def test_every_layout_is_priced_on_the_same_draws():
    problem = _h100(steps=3)
    rows = [price(parse_layout(s), problem) for s in (REFERENCE, "images=tp1,pp1,dp1 language=tp4,pp4,dp1 mbs=1 gbs=32")]
    for r in rows:
        d = r.accelerated.step_time_s_draws
        assert len(d) == 3 and r.step_time_s == pytest.approx(np.mean(d))
    assert problem.draws.steps == 3
