"""The layout advisor (mimo_accel.tools.layout): the search's constraints, the one pricing path it
shares with ``simulate --layout``, the objective, the profile source, the command's output and its
one-line errors."""

from __future__ import annotations

import json
from itertools import product
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from tests._hypothesis import examples

from mimo_accel.costs.memory import GIB
from mimo_accel.modules import LANGUAGE
from mimo_accel.profiler.recorder import FORMAT
from mimo_accel.tools import simulate as sim
from mimo_accel.tools.layout import ADVICE_FORMAT, NoLayoutFits, advise, build_problem, main, price
from mimo_accel.tools.layout.advice import _ordered
from mimo_accel.tools.layout.models import load_model, model_named
from mimo_accel.tools.layout.search import Candidate, divisors, layouts, rank_offsets
from mimo_accel.tools.layout.seconds import tp_efficiency
from mimo_accel.tools.layout.spec import PRESETS, parse_layout
from mimo_accel.workloads import load_profile

TINY = """
name: tiny
seq_length: 512
gbs: 8
modules:
  vision: {layers: 2, hidden: 128, ffn_hidden: 256, heads: 4, kv_channels: 32, merge: 2, out_hidden: 256}
  language: {layers: 4, hidden: 256, ffn_hidden: 512, heads: 8, query_groups: 4, vocab: 1024, gated: true}
"""


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("model") / "tiny.yaml"
    path.write_text(TINY)
    return str(path)


def _tiny_problem(tiny, memory_gib=0.06, gpn=8, gbs=8, steps=1):
    return build_problem(tiny, gpu="custom", peak_tflops=100.0, memory_gib=memory_gib, gpus_per_node=gpn,
                         workload=load_profile("receipts"), rehearsal=True, gbs=gbs, steps=steps)


# -- the preset ------------------------------------------------------------------------------------


def test_the_preset_states_the_hybrid_language_models_flops_and_parameters():
    m = model_named("qwen35-vl-27b")
    lang, images = m.modules[LANGUAGE], m.modules["images"]
    assert lang.per_token == 51_549_831_168 and lang.per_sq_token == 196_608  # the docstring's derivation
    assert 26.8e9 < lang.params.total < 27.0e9 and 0.45e9 < images.params.total < 0.47e9
    assert [t for t in (1, 2, 4, 8) if lang.tp_fits(t)] == [1, 2, 4]  # 4 query groups
    assert m.seq_length == 4096 and m.gbs == 32 and m.image_pixels == (200_704, 1_003_520)


def test_a_model_file_is_checked_key_by_key(tmp_path, tiny):
    assert list(load_model(tiny).modules) == ["vision", LANGUAGE]
    bad = tmp_path / "bad.yaml"
    bad.write_text("modules:\n  language: {layers: 2, hidden: 8, ffn_hidden: 8, heads: 2, vocab: 4, colour: 1}\n")
    with pytest.raises(ValueError, match="unknown keys \\['colour'\\]"):
        load_model(str(bad))
    bad.write_text("modules:\n  language: {layers: 2, hidden: 8, ffn_hidden: 8, heads: 2, vocab: 4}\n")
    with pytest.raises(ValueError, match="give the 'language' module and at least one encoder"):
        load_model(str(bad))


# -- the search: every layout obeys every constraint, and none is missed ---------------------------


def _brute_force(problem, budget, gbs, gpn):
    """Every layout that fits, from the constraints alone (not the search's code)."""
    model, mem, machine = problem.model, problem.memory, problem.machine
    usable = machine.memory_gib * (1 - machine.reserve) * GIB
    lang, vis = model.modules[LANGUAGE], model.modules["vision"]
    out = set()
    for b in divisors(gbs):
        for lt, lp, ld, vt, vd in product(divisors(gpn), divisors(lang.layers), divisors(b), divisors(gpn), divisors(b)):
            if lt * lp * ld + vt * vd > budget or not (lang.tp_fits(lt) and vis.tp_fits(vt)):
                continue
            w = gbs // b
            lm, vm = mem.memory(LANGUAGE, lt, lp, ld, b, w, lp), mem.memory("vision", vt, 1, vd, b, w, lp)
            if lm.total > usable or vm.total > usable:
                continue
            out.add(f"vision=tp{vt},pp1,dp{vd} language=tp{lt},pp{lp},dp{ld} mbs={b} gbs={gbs}")
    return out


@settings(max_examples=examples(30), deadline=None)
@given(budget=st.integers(2, 24), gpn=st.sampled_from([4, 8]), memory=st.sampled_from([0.03, 0.05, 0.2]))
def test_every_layout_obeys_the_constraints_and_none_is_missed(tiny, budget, gpn, memory):
    problem = _tiny_problem(tiny, memory_gib=memory, gpn=gpn)
    found = layouts(problem.model, problem.memory, budget=budget, gbs=8, mbs=divisors(8))
    usable = memory * 0.9 * GIB
    for c in found:
        lay = c.layout
        assert lay.gpus <= budget and 8 % lay.mbs == 0 and lay.mbs % lay.modules.grid == 0
        offsets = rank_offsets(lay.modules)
        for m in lay.modules:
            mm = problem.model.modules[m.name]
            assert gpn % m.tp == 0 and mm.heads % m.tp == 0 and mm.query_groups % m.tp == 0
            assert offsets[m.name] % m.tp == 0  # a TP group inside a node
            assert m.pp == 1 or (m.name == LANGUAGE and mm.layers % m.pp == 0)
            assert c.memory[m.name].total <= usable
        assert parse_layout(lay.spec).spec == lay.spec  # the grammar reads it back
    assert {c.layout.spec for c in found} == _brute_force(problem, budget, 8, gpn)


# -- one pricing path: simulate --layout and the advisor give the same numbers ----------------------


def test_simulate_layout_prices_the_preset_in_seconds_as_the_advisor_does():
    doc = sim.simulate_layout("reference-27b", ["receipts"], steps=2)
    row = doc["rows"][0]
    assert doc["cost_model"]["units"] == "s" and doc["layout"]["seq_length"] == 4096
    assert any("seconds from FLOPs of qwen35-vl-27b" in n for n in doc["notes"])
    priced = price(PRESETS["reference-27b"], "qwen35-vl-27b", gpu="h100", workload=load_profile("receipts"), steps=2)
    assert row["step_time"]["mimo_accel"] == pytest.approx(priced.step_time_s, rel=1e-12)
    assert row["step_time"]["padded"] == pytest.approx(priced.baseline.step_time_s, rel=1e-12)
    # packing and the plan: the padded step of upstream as shipped is far longer on receipts
    assert priced.step_time_s < 0.5 * priced.baseline.step_time_s
    assert row["step_time"]["bound"] <= row["step_time"]["mimo_accel"] * (1 + 1e-9)


# -- the objective ------------------------------------------------------------------------------------


def test_a_layout_idling_most_of_the_budget_is_not_recommended_for_throughput(tiny):
    problem = _tiny_problem(tiny)
    small = Candidate(parse_layout("vision=tp1,pp1,dp1 language=tp1,pp1,dp1 mbs=8 gbs=8"), {})
    big = Candidate(parse_layout("vision=tp1,pp1,dp2 language=tp1,pp4,dp2 mbs=8 gbs=8"), {})
    # the small one is a little faster and far better per GPU; on a budget of 16 it idles 14 GPUs
    entries = [(10.0, 10.0 / 2, small), (9.9, 9.9 / 10, big)]
    assert _ordered(entries, "throughput", 16, 0.03)[0][2] is big
    assert _ordered(entries, "per-gpu", 16, 0.03)[0][2] is small
    assert _ordered(entries, "throughput", 3, 0.03)[0][2] is small  # the budget's only layout using most of it
    advice = advise(problem, 12, top=2)
    assert advice.recommended.gpus > 6 and advice.recommended.fits
    assert all(r.gpus <= 12 and r.fits for r in advice.with_mimo_accel + advice.without)


def test_no_layout_fits_names_the_smallest_budget_that_would(tiny):
    problem = _tiny_problem(tiny, memory_gib=0.03)
    with pytest.raises(NoLayoutFits, match=r"the smallest budget a layout fits is (\d+) GPUs: give --gpus \1"):
        advise(problem, 2)


# -- a CPU profile as the source ---------------------------------------------------------------------


def _flops(language_ranks: int) -> dict:
    """A profile header's module configs: a tiny encoder and language model."""
    shape = {"layers": 2, "hidden": 64, "ffn_hidden": 128, "heads": 4, "query_groups": 4, "kv_channels": 16,
             "vocab": 0, "causal": False, "merge": 2, "out_hidden": 64}
    return {"device_name": None, "modules": {
        "vision": {"ranks": 1, "trained": True, "shape": shape},
        LANGUAGE: {"ranks": language_ranks, "trained": True,
                   "shape": {**shape, "vocab": 512, "causal": True, "merge": 0, "out_hidden": 0}}}}


def _profile(directory: Path) -> Path:
    flops = _flops(1)
    for rank, name in enumerate(("vision", LANGUAGE)):
        header = {"kind": "header", "format": FORMAT, "rank": rank, "world_size": 2, "module": name, "dp_rank": 0,
                  "dp_size": 1, "layout": {"dp": {"vision": 1, LANGUAGE: 1}, "pp": {"vision": 1, LANGUAGE: 1},
                                           "flops": flops}, "device": "cpu"}
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


def test_a_cpu_profile_prices_with_what_the_run_learnt(tmp_path):
    run = _profile(tmp_path)
    problem = build_problem(str(run), workload=load_profile("receipts"), rehearsal=True, steps=1)
    assert problem.machine.name == "cpu" and problem.gbs == 8 and problem.gpus == 2
    assert problem.profiled.spec == "vision=tp1,pp1,dp1 language=tp1,pp1,dp1 mbs=4 gbs=8"
    at_tp1 = problem.seconds.cost_model(problem.profiled)
    assert (at_tp1.of("vision").a, at_tp1.of("vision").b) == (1e-4, 1e-7)  # communication 0 on CPU ranks
    at_tp2 = problem.seconds.cost_model(parse_layout("vision=tp2,pp1,dp1 language=tp1,pp1,dp1 mbs=4 gbs=8"))
    scale = 0.5 * tp_efficiency(64, 1) / tp_efficiency(64, 2)
    assert at_tp2.of("vision").a == pytest.approx(1e-4 * scale) and at_tp2.of(LANGUAGE).a == 2e-4
    row = price(problem.profiled, problem)
    assert row.fits and row.step_time_s > 0 and row.accelerated.mfu == {"vision": None, LANGUAGE: None}
    advice = advise(problem, top=2)  # the run's own GPUs, its layout priced beside
    assert advice.budget == 2 and advice.current.spec == problem.profiled.spec


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
    problem = build_problem(str(_pp_profile(tmp_path)), workload=load_profile("receipts"), rehearsal=True, steps=1)
    seconds = problem.seconds
    assert seconds.overheads[LANGUAGE] == pytest.approx(3 * 0.004, rel=1e-6)  # stage 0's 4 ms + stage 1's 8 ms
    language = seconds.learnt.of(LANGUAGE)
    assert (language.a, language.b) == (pytest.approx(3 * 2e-5, rel=1e-6), pytest.approx(3e-8, rel=1e-4))
    few = price("vision=tp1,pp1,dp1 language=tp1,pp1,dp2 mbs=4 gbs=8", problem)
    many = price("vision=tp1,pp1,dp1 language=tp1,pp1,dp2 mbs=2 gbs=8", problem)
    # the same samples in twice the micro-batches: 2 more a replica, each 12 ms whatever its size (at
    # the scale that makes the run's own layout's modelled step its replayed one)
    assert many.step_time_s - few.step_time_s == pytest.approx(seconds.scale * 2 * 3 * 0.004, rel=0.05)
    # the stages: the last holds what stage 1 measured beyond stage 0 (twice its time here)
    assert seconds.stage_shares(2, 100.0, 1e4) == pytest.approx([1 / 3, 2 / 3])
    assert seconds.stage_shares(4, 100.0, 1e4) == pytest.approx([1 / 6, 1 / 6, 1 / 6, 1 / 2])  # half a layer each
    # the run's own layout, priced as it ran (upstream's padded batches: its header names no reorder),
    # is the step its measured times replay
    assert price(problem.profiled, problem).baseline.step_time_s == pytest.approx(_replayed_p50(tmp_path), rel=1e-6)
    (tmp_path / "older").mkdir()
    older = build_problem(str(_pp_profile(tmp_path / "older", micro_tokens=False)), workload=load_profile("receipts"),
                          rehearsal=True, steps=1)
    assert older.seconds.overheads == {} and older.seconds.learnt.of(LANGUAGE).a == 1e-4
    assert any("no per-micro-batch tokens" in n for n in older.notes)


def test_a_profile_is_scaled_to_its_replay_only_on_data_like_its_own(tmp_path):
    """The scale that makes the run's own layout take its replayed step is fitted at the run's own
    batch, whatever --gbs asks, and not applied where it says the data priced is not the run's; a
    profile's seconds are its device's: another --gpu is refused."""
    run = str(_pp_profile(tmp_path))
    at = [build_problem(run, workload=load_profile("receipts"), rehearsal=True, steps=1, gbs=g).seconds.scale
          for g in (8, 16)]
    assert at[0] == at[1] != 1.0
    far = build_problem(run, workload=load_profile("receipts"), rehearsal=True, steps=1, seq_length=100000)
    assert far.seconds.scale == 1.0
    assert any(n.startswith("costs not scaled to the run's replayed step") and "--index" in n for n in far.notes)
    with pytest.raises(ValueError, match="--gpu h100: the profile was measured on cpu"):
        build_problem(run, workload=load_profile("receipts"), rehearsal=True, steps=1, gpu="h100")


def test_on_cpu_ranks_a_profile_holds_each_modules_tp(tmp_path):
    """How TP scales on CPU ranks is not modelled (gloo's collectives are in the measured times):
    every layout searched keeps the profiled TP, and one that changes it is refused in one line."""
    problem = build_problem(str(_profile(tmp_path)), workload=load_profile("receipts"), rehearsal=True, steps=1)
    assert problem.tp_held == {"vision": 1, LANGUAGE: 1}
    advice = advise(problem, 4, top=3)
    assert all(m.tp == 1 for r in advice.with_mimo_accel for m in r.layout.modules)
    assert any(r.gpus > 2 for r in advice.with_mimo_accel)  # DP and PP are still searched
    with pytest.raises(ValueError, match="on CPU ranks a profile prices its module at the TP it ran"):
        price("vision=tp2,pp1,dp1 language=tp1,pp1,dp1 mbs=4 gbs=8", problem)


# -- the command -------------------------------------------------------------------------------------


def test_the_17_gpu_preset_run_and_its_json(tmp_path):
    out = tmp_path / "x.json"
    console = Console(record=True, width=240)
    assert main(["--model", "qwen35-vl-27b", "--gpus", "17", "--gpu", "h100", "--steps", "1", "--top", "2",
                 "--current", "reference-27b", "--json", str(out)], console=console) == 0
    doc = json.loads(out.read_text())
    assert doc["format"] == ADVICE_FORMAT and doc["budget"] == 17
    for r in [*doc["rows"], doc["current"]]:
        assert {"spec", "gpus", "step_time_s", "tokens_per_s_per_gpu", "samples_per_s_per_gpu", "memory_gib_per_gpu",
                "bound_module", "busy_share", "fits", "why_not"} <= set(r)
        assert r["gpus"] <= 17 and set(r["memory_gib_per_gpu"]) == {"images", LANGUAGE}
        assert r["without"]["step_time_s"] > r["step_time_s"] > 0
    assert doc["current"]["spec"] == PRESETS["reference-27b"] and doc["current"]["fits"]
    assert doc["recommended"] in {r["spec"] for r in doc["rows"]}
    rec = next(r for r in doc["rows"] if r["spec"] == doc["recommended"])
    assert rec["settings"]["components"][0].startswith("language=tp=") and rec["rank"]["with"] == 1
    text = console.export_text()
    for words in ("With mimo_accel", "Without mimo_accel", "MegatronMIMOParallelismConfig", "--component language=",
                  "0.40 of the peak on one GPU, a stated default"):
        assert words in text


@pytest.mark.parametrize("args, words", [
    (["--model", "qwen35-vl-27b", "--gpus", "17", "--gpu", "tpu"], ["--gpu tpu: unknown GPU; give one of h100, h200"]),
    (["--model", "qwen35-vl-27b", "--gpus", "17", "--current", "images=tp1 language=tp4,pp2,dp2 mbs=2 gbs=32"],
     ["--current: 'images=tp1': give the module's sizes as tpT,ppP,dpD"]),
    (["--model", "qwen35-vl-27b", "--gpus", "17", "--current", "images=tp1,pp1,dp3 language=tp4,pp2,dp2 mbs=2 gbs=32"],
     ["'mbs=2': the global micro-batch must be a multiple of G = lcm(DPs) = 6"]),
    (["--model", "qwen35-vl-27b", "--gpus", "17", "--current", "images=tp1,pp1,dp1 language=tp8,pp2,dp2 mbs=2 gbs=32"],
     ["language=tp8: TP must divide the module's heads (24) and query groups (4)"]),
    (["--model", "qwen35-vl-27b", "--gpus", "17", "--mbs", "3"], ["--mbs 3: the global batch 32 is not a whole number"]),
    (["--model", "qwen35-vl-27b", "--gpus", "17", "--gbs", "30", "--current", "reference-27b"],
     ["--gbs 30 and --current's gbs=32 differ"]),
])
def test_bad_input_is_one_line_naming_the_fix(capsys, args, words):
    assert main(args) == 2
    out, err = capsys.readouterr()
    lines = err.rstrip("\n").split("\n")
    assert len(lines) == 1 and lines[0].startswith("mimo-accel layout: error: "), err
    for w in words:
        assert w in lines[0], lines[0]


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
    problem = build_problem("qwen35-vl-27b", gpu="h100", workload=load_profile("uniform"), steps=1)
    spec = "images=tp1,pp1,dp2 language=tp4,pp2,dp2 mbs=2 gbs=32"
    trained, frozen = parse_layout(spec), parse_layout(spec + " frozen=images")
    t, f = (problem.seconds.cost_model(x).of("images") for x in (trained, frozen))
    assert f.b == pytest.approx(t.b / 3) and f.a < t.a / 2  # forward only; its transfer one way
    assert problem.seconds.step_end(frozen) == problem.seconds.step_end(parse_layout(
        "images=tp1,pp1,dp1 language=tp4,pp2,dp2 mbs=2 gbs=32"))  # the frozen encoder's DP syncs no gradient


def test_the_current_layout_is_priced_even_where_it_does_not_fit():
    problem = build_problem("qwen35-vl-27b", gpu="h100", workload=load_profile("uniform"), steps=1)
    row = price("images=tp1,pp1,dp1 language=tp4,pp1,dp1 mbs=1 gbs=32", problem)
    assert not row.fits and "language needs" in row.why_not and row.step_time_s > 0
    wide = price("images=tp1,pp1,dp1 language=tp4,pp2,dp2 mbs=2 gbs=32", build_problem(
        "qwen35-vl-27b", gpu="h100", gpus_per_node=2, workload=load_profile("uniform"), steps=1))
    assert wide.why_not == "a TP group would straddle a node of 2 GPUs"
