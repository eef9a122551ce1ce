"""The cluster-scale simulation (mimo_accel.tools.simulate)."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
from rich.console import Console

from mimo_accel.tools import simulate as sim
from mimo_accel.balance import balanced_order
from mimo_accel.workloads import load_profile

DPS = [2, 4, 8, 16, 32]


@pytest.fixture(scope="module")
def receipts():
    return sim.simulate(load_profile("receipts"), DPS, steps=8, seed=0)


@pytest.fixture(scope="module")
def uniform():
    return sim.simulate(load_profile("uniform"), DPS, steps=3, seed=0)


def test_reads_sharded_flat_baseline_grows_with_dp(receipts):
    rows = receipts["rows"]
    k = receipts["samples_per_replica"]
    assert [r["dp"] for r in rows] == DPS
    for r in rows:
        rd, mbs = r["reads"], r["micro_batch_size"]
        assert mbs == r["dp"] * k
        # sharded: every vision rank reads its replica's share, whatever the DP
        assert rd["sharded"]["per_rank_samples"]["vision"] == k
        assert rd["sharded"]["per_rank_samples"]["language"] == mbs / r["language_dp"]
        # baseline: every data rank reads the whole micro-batch
        assert rd["baseline"]["per_rank_samples"] == mbs
        assert rd["baseline"]["cluster_samples"] == mbs * (rd["data_ranks"]["vision"] + rd["data_ranks"]["language"])
        assert rd["cluster_reduction"] == pytest.approx(rd["baseline"]["cluster_samples"] / rd["sharded"]["cluster_samples"])
    # per micro-batch sample: sharded is flat in DP, the baseline is proportional to it
    sharded = [r["reads"]["sharded"]["cluster_samples"] / r["micro_batch_size"] for r in rows]
    baseline = [r["reads"]["baseline"]["cluster_samples"] / r["micro_batch_size"] for r in rows]
    assert len(set(sharded)) == 1 and sharded[0] == 1 + 4  # vision tp 1 + language tp 4
    assert [b / r["dp"] for b, r in zip(baseline, rows)] == [baseline[0] / DPS[0]] * len(rows)
    assert [r["reads"]["sharded"]["amplification"] for r in rows] == sharded
    byte_ratio = [r["reads"]["sharded"]["cluster_bytes"] / r["reads"]["micro_batch_bytes"] for r in rows]
    assert byte_ratio == pytest.approx(sharded)


def test_planners_rank_as_expected_on_receipts(receipts):
    pytest.importorskip("scipy.optimize", reason="the matched exchange needs scipy (it comes with the Megatron runtime)")
    for r in receipts["rows"]:
        st = r["straggler"]
        assert st["balanced"]["p50"] <= st["lpt"]["p50"] + 1e-12
        assert st["lpt"]["p50"] <= st["contiguous"]["p50"]
        assert st["bound"]["p50"] <= st["balanced"]["p50"] + 1e-9
        assert st["contiguous"]["p50"] > 1.1  # there is something to balance
        sp = r["speedup"]
        assert sp["balanced_vs_contiguous"] > 1.0 and sp["balanced_vs_lpt"] >= 1.0 - 1e-12
        assert 0 < sp["time_saved"] < 1
        assert r["grid"] == r["dp"] and r["language_dp"] == max(1, r["dp"] // 2)  # receipts: 8 : 4
        assert r["exchange"]["plan_before_read_bytes"] == 0
        assert r["exchange"]["balanced"]["bytes_moved"] > 0 and r["exchange"]["balanced"]["samples_moved"] > 0
        matched = r["exchange"]["balanced_matched"]
        assert matched is not None and matched["bytes_moved"] <= r["exchange"]["balanced"]["bytes_moved"] + 1e-6
        assert r["plan_ms"]["balanced_p50"] > 0
    # the contiguous straggler grows with DP
    assert receipts["rows"][-1]["straggler"]["contiguous"]["p50"] > receipts["rows"][0]["straggler"]["contiguous"]["p50"]


def test_uniform_has_nothing_to_balance_or_move(uniform):
    for r in uniform["rows"]:
        for planner in (*sim.PLANNERS, "balanced_replicas", "bound"):
            st = r["straggler"][planner]
            assert st["p50"] == pytest.approx(1.0, abs=1e-12) and st["p99"] == pytest.approx(1.0, abs=1e-12)
        assert r["exchange"]["balanced"]["bytes_moved"] == 0
        assert r["exchange"]["balanced"]["samples_moved"] == 0
        assert r["speedup"]["balanced_vs_contiguous"] == pytest.approx(1.0)


def test_fan_out_reports_balancing_over_vision_replicas():
    doc = sim.simulate(load_profile("mixed_chat"), [4, 16], steps=4, seed=1)
    for r in doc["rows"]:
        assert r["language_dp"] == 2 * r["dp"] and r["grid"] == 2 * r["dp"]
        st = r["straggler"]
        assert st["balanced_replicas"]["p50"] <= st["balanced"]["p50"] + 1e-12
        assert st["bound"]["p50"] <= st["balanced_replicas"]["p50"] + 1e-9


def test_language_dp_rules_and_micro_batch_rounding():
    prof = load_profile("receipts")  # vision dp 8, language dp 4
    assert [sim.language_dp_for(prof, d) for d in (1, 2, 8, 64)] == [1, 1, 4, 32]
    assert sim.language_dp_for(prof, 64, "equal") == 64
    doc = sim.simulate(load_profile("mixed_chat"), [3], steps=1, samples_per_replica=1)  # language dp 6
    row = doc["rows"][0]
    assert row["grid"] == 6 and row["micro_batch_size"] == 6 and doc["notes"]
    with pytest.raises(ValueError, match="steps"):
        sim.simulate(prof, [2], steps=0)


def test_parse_dp_list():
    assert sim.parse_dp_list("2,4,8,...,512") == [2, 4, 8, 16, 32, 64, 128, 256, 512]
    assert sim.parse_dp_list("2,4,...,16") == [2, 4, 8, 16]
    assert sim.parse_dp_list("1,3,...,9") == [1, 3, 9]  # geometric when the second is a multiple
    assert sim.parse_dp_list("3,5,...,11") == [3, 5, 7, 9, 11]
    assert sim.parse_dp_list("8, 2,2") == [2, 8]
    for bad, msg in (("2,...,8", "two values before"), ("2,4,...,24", "not reached"), ("2,x", "not a whole"),
                     ("0,2", ">= 1"), ("", "at least one")):
        with pytest.raises(ValueError, match=msg):
            sim.parse_dp_list(bad)


JSON_ROW_KEYS = {"dp", "language_dp", "grid", "micro_batch_size", "straggler", "speedup", "reads", "exchange",
                 "plan_ms", "window", "modules"}
#: Names that said "vision" for the lead encoder: the JSON has only the per-module names.
VISION_KEYS = {"vision_only", "vision_only_p50", "joint_over_vision_only", "balanced_vision", "balanced_vision_p50",
               "vision_speedup", "balanced_vision_vs_contiguous", "vision_time_saved", "vision_per_rank_samples",
               "vision_per_rank_bytes", "vision_per_rank_bytes_max", "language_per_rank_samples",
               "language_per_rank_bytes"}


def _every_key(doc) -> set[str]:
    if isinstance(doc, dict):
        return set(doc).union(*(_every_key(v) for v in doc.values()))
    if isinstance(doc, list):
        return set().union(*(_every_key(v) for v in doc))
    return set()


def test_main_prints_tables_and_writes_json_and_png(tmp_path):
    out, png = tmp_path / "sim.json", tmp_path / "sim.png"
    console = Console(record=True, width=200)
    rc = sim.main(["--workload", "receipts", "--dp", "2,4,8", "--steps", "3", "--per-replica", "4",
                   "--json", str(out), "--png", str(png)], console=console)
    text = console.export_text()
    assert "straggler" in text and "Reads per step" in text and "plan-before-read" in text
    doc = json.loads(out.read_text())
    assert set(doc) == {"format", "profile", "cost_model", "steps", "window", "samples_per_replica", "seed",
                        "language_dp_rule", "layout", "rows", "notes", "elapsed_s", "lead", "modules", "kinds"}
    assert doc["lead"] == "vision" and doc["kinds"] == {"vision": "image", "language": "text"}
    assert doc["format"] == sim.SIMULATE_FORMAT and doc["samples_per_replica"] == 4
    assert doc["cost_model"]["source"] == "default"
    row = doc["rows"][0]
    assert set(row) == JSON_ROW_KEYS
    assert set(row["straggler"]) == {"contiguous", "lpt", "balanced", "balanced_replicas", "bound"}
    assert set(row["speedup"]) == {"balanced_vs_contiguous", "balanced_vs_lpt", "lpt_vs_contiguous",
                                   "balanced_replicas_vs_contiguous", "time_saved"}
    assert set(row["straggler"]["lpt"]) == {"p50", "p99", "mean"}
    assert set(row["reads"]) == {"data_ranks", "micro_batch_bytes", "baseline", "sharded", "cluster_reduction"}
    assert set(row["reads"]["sharded"]) == {"per_rank_samples", "per_rank_bytes", "per_rank_bytes_max",
                                            "cluster_samples", "cluster_bytes", "amplification"}
    assert set(row["exchange"]) == {"plan_before_read_bytes", "lpt", "balanced", "balanced_matched"}
    assert set(row["plan_ms"]) >= {"balanced_p50", "balanced_max", "lpt_p50", "lpt_max"}
    assert doc["window"] == 1 and row["window"] is None and "Global-batch window" not in text
    assert doc["modules"] == ["vision", "language"] and "Every module's replica spread" in text
    assert set(row["modules"]) == {"dps", "spread", "worst", "worst_over_bound", "plan_ms"}
    assert set(row["modules"]["spread"]["language"]) == {*sim.MODULE_PLANNERS, "bound"}
    assert set(row["modules"]["plan_ms"]) == {"encoder_only_p50", "joint_p50", "joint_max", "lpt_p50",
                                              "joint_over_encoder_only"}
    assert not _every_key(doc) & VISION_KEYS
    # matplotlib is a declared dependency (requirements/dev.txt): the chart must be written
    assert rc == 0 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 1000


def test_main_with_a_cost_file_and_bad_input(tmp_path, capsys):
    from mimo_accel.costs import CostModel

    cost = tmp_path / "cost.json"
    CostModel(a=2e-5, b=0.0).to_file(cost)
    out = tmp_path / "o.json"
    assert sim.main(["--workload", "documents", "--dp", "2", "--steps", "1", "--cost-model", str(cost),
                     "--json", str(out)], console=Console(file=io.StringIO())) == 0
    assert json.loads(out.read_text())["cost_model"] == {
        "a": 2e-5, "b": 0.0, "source": str(cost),
        "modules": {"vision": {"a": 2e-5, "b": 0.0, "k": 0.0}, "language": {"a": 1.0, "b": 1 / 8192, "k": 0.0}}}
    assert sim.main(["--workload", "nope"]) == 2
    assert "no such profile" in capsys.readouterr().err
    assert sim.main(["--dp", "2,...,8"]) == 2
    assert sim.main(["--steps", "0"]) == 2


# --------------------------------------------------------------------------------------------
# Global-batch window (--reorder-window W: the W micro-batches of a step planned together)
# --------------------------------------------------------------------------------------------

WINDOW = 8


@pytest.fixture(scope="module")
def receipts_window():
    return sim.simulate(load_profile("receipts"), [8, 64], steps=3, seed=0, reorder_window=WINDOW)


def test_window_removes_the_per_micro_batch_straggler_bound(receipts_window):
    for r in receipts_window["rows"]:
        w = r["window"]
        assert w["micro_batches"] == WINDOW
        st, ls, removed = w["straggler"], w["lockstep"], w["removed"]
        assert set(st) == {*sim.WINDOW_PLANS, "bound"} and set(ls) == set(removed) == set(sim.WINDOW_PLANS)
        assert w["bound_per_micro_batch"] == r["straggler"]["bound"]
        base = w["bound_per_micro_batch"]["p50"]
        for name in sim.WINDOW_PLANS:
            # the step bound holds for every plan; summing a step can only even replicas out
            assert st["bound"]["p50"] <= st[name]["p50"] + 1e-9
            assert ls[name]["p50"] >= st[name]["p50"] - 1e-12  # waiting every micro-batch is never faster
            assert removed[name] == pytest.approx((base - st[name]["p50"]) / (base - 1))
        # balancing the replicas' step totals reaches the step bound and removes the whole excess
        assert st["window_replica"]["p50"] <= st["bound"]["p50"] * 1.002
        assert removed["window_replica"] > 0.97
        assert st["window_replica"]["p50"] <= min(st["window"]["p50"], st["per_micro_batch"]["p50"])
        # heaviest samples share a micro-batch, so even in lockstep it beats per-micro-batch plans
        assert ls["window_replica"]["p50"] < ls["per_micro_batch"]["p50"]
        assert w["plan_ms"]["window_p50"] > 0
    dp64 = receipts_window["rows"][1]["window"]
    assert dp64["bound_per_micro_batch"]["p50"] > 1.25  # the largest image sets it (about 1.30)
    assert dp64["straggler"]["window_replica"]["p50"] < 1.01


def test_window_keeps_the_per_micro_batch_results(receipts_window):
    # steps x window micro-batches from one pool: the per-micro-batch part is a window-1 run of
    # steps * window steps, to the last figure (timings aside)
    plain = sim.simulate(load_profile("receipts"), [8, 64], steps=3 * WINDOW, seed=0)
    assert plain["window"] == 1
    for a, b in zip(receipts_window["rows"], plain["rows"]):
        assert b["window"] is None
        for key in ("straggler", "speedup", "reads", "exchange"):
            assert a[key] == b[key]


def test_replica_window_order_balances_replica_totals_and_deals_heaviest_first():
    rng = np.random.default_rng(4)
    d, window, per = 6, 4, 3
    costs = rng.lognormal(0, 1.5, d * window * per)
    order = sim.window.replica_window_order(costs, d, window)
    assert sorted(order.tolist()) == list(range(costs.size))
    slots = order.reshape(window, d, per)  # micro-batch, replica, sample
    totals = costs[slots].sum(axis=(0, 2))
    reference = np.sort(costs[np.asarray(balanced_order(costs, d))].reshape(d, -1).sum(axis=1))
    assert np.sort(totals) == pytest.approx(reference)  # the replicas' step totals: balanced_order's
    for r in range(d):
        mine = costs[slots[:, r]]  # (micro-batch, sample)
        # snake order: micro-batch j leads with the replica's (j+1)-th heaviest sample, so the
        # replicas' heaviest samples share micro-batch 0
        assert mine.max(axis=1).tolist() == np.sort(mine.ravel())[::-1][:window].tolist()


def test_window_on_the_command_line(tmp_path, capsys):
    from mimo_accel.tools import cli

    out = tmp_path / "w.json"
    console = Console(record=True, width=220)
    assert sim.main(["--workload", "receipts", "--dp", "4", "--steps", "2", "--reorder-window", "3", "--json",
                     str(out)], console=console) == 0
    text = console.export_text()
    assert "Global-batch window: 3 micro-batches per step" in text and "replica totals" in text
    assert "2 steps x 3 micro-batches" in text and "Reads per micro-batch" in text
    doc = json.loads(out.read_text())
    assert doc["window"] == 3 and doc["rows"][0]["window"]["micro_batches"] == 3
    assert set(doc["rows"][0]["window"]) == {"micro_batches", "straggler", "lockstep", "bound_per_micro_batch",
                                             "removed", "plan_ms"}
    capsys.readouterr()
    # the same through `mimo-accel simulate`
    out2 = tmp_path / "w2.json"
    assert cli.main(["simulate", "--dp", "4", "--steps", "2", "--reorder-window", "3", "--json", str(out2)]) == 0
    assert json.loads(out2.read_text())["rows"][0]["window"]["straggler"] == doc["rows"][0]["window"]["straggler"]
    assert capsys.readouterr().err == ""
    assert sim.main(["--reorder-window", "0"]) == 2
    assert "argument --reorder-window: must be a positive integer" in capsys.readouterr().err
    with pytest.raises(ValueError, match="window must be a positive integer"):
        sim.simulate(load_profile("receipts"), [2], steps=1, reorder_window=0)


# --------------------------------------------------------------------------------------------
# Every module: contiguous, LPT, vision-only and the joint plan side by side, any layout
# --------------------------------------------------------------------------------------------


def test_every_module_under_the_four_plans(receipts):
    for r in receipts["rows"]:
        mod = r["modules"]
        assert mod["dps"] == {"vision": r["dp"], "language": r["language_dp"]}
        for m, st in mod["spread"].items():
            for p in sim.MODULE_PLANNERS:
                assert st["bound"]["p50"] <= st[p]["p50"] + 1e-9, (r["dp"], m, p)
        v = mod["spread"]["vision"]
        # the vision-only plan is the shipped planner's: the vision straggler of the balanced plan
        assert v["encoder_only"] == r["straggler"]["balanced"] and v["lpt"] == r["straggler"]["lpt"]
        assert v["contiguous"] == r["straggler"]["contiguous"]
        # the joint plan's quality is balance_modules' (tests/test_balance.py, bench_balance.py gate
        # it); here: it is a plan for every module, far better than the contiguous split
        assert mod["worst"]["joint"]["p50"] < mod["worst"]["contiguous"]["p50"] or r["dp"] == 1
        assert mod["worst"]["encoder_only"]["p50"] >= mod["spread"]["language"]["encoder_only"]["p50"] - 1e-12
        assert mod["plan_ms"]["joint_p50"] > 0 and mod["plan_ms"]["joint_over_encoder_only"] > 0
    # receipts has a language straggler the vision-only plan does not touch
    row = receipts["rows"][2]
    assert row["modules"]["spread"]["language"]["encoder_only"]["p50"] > 1.05
    assert row["modules"]["spread"]["language"]["joint"]["p50"] < row["modules"]["spread"]["language"]["encoder_only"]["p50"]


AUDIO_PROFILE = (load_profile("receipts").path.read_text()
                 .replace("[layout]", """[audio]
count = { 0 = 0.5, 1 = 0.4, 3 = 0.1 }
seconds = { dist = "lognormal", median = 8, sigma = 0.8, min = 1, max = 60 }
rows_per_second = 50
rows_per_token = 8

[layout]""", 1)
                 .replace("seq_length = 8192", "seq_length = 16384", 1)
                 .replace("language = { tp = 4, pp = 1, dp = 4 }", "language = { tp = 4, pp = 1, dp = 4 }\naudio = { dp = 2 }", 1))


@pytest.mark.parametrize("rule", ["ratio", "1", "0.5", "2"])
def test_three_modules_in_any_layout(tmp_path, rule):
    path = tmp_path / "voice_receipts.toml"
    path.write_text(AUDIO_PROFILE)
    doc = sim.simulate(path, [4, 8], steps=3, seed=1, language_dp=rule, audio_dp=rule)
    assert doc["modules"] == ["vision", "audio", "language"] and doc["layout"]["audio"]["dp"] == 2
    for r in doc["rows"]:
        mod = r["modules"]
        want = {"ratio": (r["dp"] // 2, r["dp"] // 4), "1": (r["dp"],) * 2, "0.5": (r["dp"] // 2,) * 2,
                "2": (2 * r["dp"],) * 2}[rule]
        assert (r["language_dp"], r["audio_dp"]) == want
        assert mod["dps"] == {"vision": r["dp"], "audio": r["audio_dp"], "language": r["language_dp"]}
        assert r["grid"] == np.lcm.reduce(list(mod["dps"].values()))
        assert set(mod["spread"]) == {"vision", "audio", "language"}
        for st in mod["spread"].values():
            assert st["bound"]["p50"] <= st["joint"]["p50"] + 1e-9
        assert mod["worst"]["joint"]["p50"] <= mod["worst"]["contiguous"]["p50"] + 1e-9
    out = io.StringIO()
    sim.render(doc, Console(file=out, width=200))
    text = out.getvalue()
    assert "audio" in text and all(f"a{r['audio_dp']}" in text for r in doc["rows"])


def test_the_charts_show_every_module_of_the_layout(tmp_path):
    """The chart of every module plots, for each module of the layout (here vision, audio and
    language), its joint, vision-only and bound p50 per vision DP as the JSON gives them."""
    import matplotlib.pyplot as plt

    path = tmp_path / "voice_receipts.toml"
    path.write_text(AUDIO_PROFILE)
    doc = json.loads(json.dumps(sim.simulate(path, [4, 8], steps=2, seed=1)))  # as --json writes it
    fig = sim.figure(doc)
    try:
        assert len(fig.axes) == 3
        lines = {line.get_label(): list(line.get_ydata()) for line in fig.axes[1].get_lines()}
        assert doc["modules"] == ["vision", "audio", "language"]
        for name in doc["modules"]:
            spread = [r["modules"]["spread"][name] for r in doc["rows"]]
            assert lines[f"{name}: joint plan p50"] == [s["joint"]["p50"] for s in spread]
            assert lines[f"{name}: vision-only plan p50"] == [s["encoder_only"]["p50"] for s in spread]
            assert lines[f"{name}: bound p50"] == [s["bound"]["p50"] for s in spread]
        assert len(lines) == 3 * len(doc["modules"])
    finally:
        plt.close(fig)


def test_bad_dp_rules_are_refused(capsys):
    assert sim.main(["--dp", "2", "--steps", "1", "--language-dp", "-1"]) == 2
    assert "--language-dp -1: give ratio (the workload's), equal, or a positive number" in capsys.readouterr().err
    with pytest.raises(ValueError, match="language DP rule"):
        sim.language_dp_for(load_profile("receipts"), 4, "twice")
    assert sim.audio_dp_for(load_profile("receipts"), 4) is None


# --------------------------------------------------------------------------------------------
# One cost path: the simulation prices a sample as the job's planner does
# --------------------------------------------------------------------------------------------


def test_simulated_costs_are_the_planners_costs(tmp_path):
    """For an index and a cost model with per-module coefficients (a calibrated file's), the
    simulation's per-sample costs are CostIndexPlanner.costs of the same inputs, and its figures are
    those of the plans on those costs."""
    from mimo_accel.balance import module_spreads
    from mimo_accel.costs import CostModel, ModuleCost
    from mimo_accel.planner import CostIndexPlanner

    path = tmp_path / "voice_receipts.toml"
    path.write_text(AUDIO_PROFILE)
    prof = load_profile(path)
    model = CostModel(a=1.0, b=0.003, modules={"vision": ModuleCost(2.0, 0.0005, 30.0),
                                                       "audio": ModuleCost(0.25, 0.01),
                                                       "language": ModuleCost(3.0, 0.001)})
    index = prof.sample_table(96, seed=4).cost_index()
    planner = CostIndexPlanner(index, model, prof.modules)
    mine, theirs = sim.sample_costs(index, model, prof.modules), planner.costs(np.arange(len(index)))
    assert list(mine) == ["vision", "audio", "language"]
    for m in theirs:
        assert np.array_equal(mine[m], theirs[m]), m
    # the table's vision costs are the planner's: the model's own vision entry, items included
    assert np.array_equal(mine["vision"], prof.sample_table(96, seed=4).costs(model))

    # end to end: one micro-batch per row, its contiguous spreads are those of the planner's costs
    model.to_file(tmp_path / "cost.json")
    out = tmp_path / "sim.json"
    assert sim.main(["--workload", str(path), "--dp", "4", "--steps", "1", "--per-replica", "24", "--seed", "4",
                     "--cost-model", str(tmp_path / "cost.json"), "--json", str(out)],
                    console=Console(file=io.StringIO())) == 0
    doc = json.loads(out.read_text())
    assert doc["cost_model"]["modules"]["audio"] == {"a": 0.25, "b": 0.01, "k": 0.0}
    row = doc["rows"][0]
    n = row["micro_batch_size"]
    drawn = prof.sample_table(n, seed=4).cost_index()  # the pool of one micro-batch of n samples
    costs = CostIndexPlanner(drawn, CostModel.from_file(tmp_path / "cost.json"), prof.modules).costs(np.arange(n))
    want = module_spreads(costs, row["modules"]["dps"], np.arange(n))
    for m, v in want.items():
        assert row["modules"]["spread"][m]["contiguous"]["p50"] == pytest.approx(v, rel=1e-12), m


# --------------------------------------------------------------------------------------------
# --layout: the step a pipeline layout runs, per workload, under each planner
# --------------------------------------------------------------------------------------------


def test_layout_reference_reports_every_plan_per_workload(tmp_path):
    out = tmp_path / "step.json"
    console = Console(record=True, width=220)
    assert sim.main(["--layout", "reference-27b", "--steps", "2", "--json", str(out)], console=console) == 0
    doc = json.loads(out.read_text())
    assert doc["format"] == sim.LAYOUT_FORMAT
    assert doc["layout"] == {"spec": "images=tp1,pp1,dp1 language=tp4,pp2,dp2 mbs=2 gbs=32",
                             "modules": {"images": {"tp": 1, "pp": 1, "dp": 1},
                                         "language": {"tp": 4, "pp": 2, "dp": 2}},
                             "mbs": 2, "gbs": 32, "micro_batches": 16, "grid": 2, "frozen": [], "seq_length": 4096}
    assert [r["workload"] for r in doc["rows"]] == ["documents", "mixed_chat", "receipts", "uniform"]
    for r in doc["rows"]:
        st = r["step_time"]
        assert set(st) == {"padded", "original", "upstream", "pr4608", "mimo_accel", "bound"}
        assert r["samples"] == 64 and set(r["plan_ms"]) == {"upstream", "pr4608", "mimo_accel"}
        assert st["bound"] <= st["mimo_accel"] * (1 + 1e-9) and st["mimo_accel"] <= st["original"] * (1 + 1e-6)
        assert st["original"] <= st["padded"]  # packed real tokens never cost more than the padded sequence
    # the preset's own model prices it: seconds, said, not the built-in units
    assert doc["cost_model"]["units"] == "s"
    assert any("seconds from FLOPs of qwen35-vl-27b" in note for note in doc["notes"])
    assert not any("not calibrated" in note for note in doc["notes"])
    text = console.export_text()
    assert "Modelled step time, s" in text and "PR #4608" in text and "mixed_chat" in text and "padded" in text


def test_layout_spec_without_a_model_stays_in_cost_units():
    doc = sim.simulate_layout("images=tp1,pp1,dp1 language=tp4,pp2,dp2 mbs=2 gbs=32", ["receipts"], steps=1)
    assert doc["cost_model"]["units"] == "cost units"
    assert any("not calibrated" in note for note in doc["notes"])  # the built-in model's units, said
    priced = sim.simulate_layout("images=tp1,pp1,dp1 language=tp4,pp2,dp2 mbs=2 gbs=32 seq=2048", ["receipts"],
                                 steps=1, model="qwen35-vl-27b", gpu="h200")
    assert priced["cost_model"]["units"] == "s" and priced["layout"]["seq_length"] == 2048
    assert any("H200" in note for note in priced["notes"])


@pytest.mark.parametrize("args, words", [
    (["--layout", "reference-27b", "--cost-model", "x.json", "--model", "qwen35-vl-27b"], "give one or the other"),
    (["--layout", "images=tp1,pp1,dp1 language=tp4,pp2,dp2 mbs=2 gbs=32", "--gpu", "h100"], "give --model too"),
    (["--model", "qwen35-vl-27b"], "--model applies to --layout; drop --model"),
    (["--layout", "reference-27b", "--gpu", "tpu"], "--gpu tpu: unknown GPU"),
])
def test_layout_pricing_flags_are_checked(capsys, args, words):
    assert sim.main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("mimo-accel simulate: error: ") and words in err and "\n" not in err


def test_layout_spec_with_a_frozen_encoder_and_a_language_heavy_cost_model():
    from mimo_accel.costs import CostModel, ModuleCost

    # the language model priced well above the encoder: the pipeline's micro-batches decide the step
    model = CostModel(modules={"images": ModuleCost(1e-4, 0.0), "language": ModuleCost(1.0, 1 / 2048)})
    for frozen in ("", " frozen=images"):
        doc = sim.simulate_layout("images=tp1,pp1,dp1 language=tp4,pp2,dp2 mbs=2 gbs=32" + frozen, ["receipts"],
                                  steps=2, seed=1, cost_model=model)
        st = doc["rows"][0]["step_time"]
        assert st["mimo_accel"] < 0.95 * st["original"]
        assert st["mimo_accel"] < min(st["upstream"], st["pr4608"])  # per-micro-batch plans move nothing here
        assert st["bound"] < st["mimo_accel"]
        assert doc["layout"]["frozen"] == (["images"] if frozen else [])


@pytest.mark.parametrize("spec, words", [
    ("nope", "'nope': no such preset; give one of reference-27b"),
    ("images=tp1,pp1 language=tp4,pp2,dp2 mbs=2 gbs=32", "'images=tp1,pp1': give the module's sizes as tpT,ppP,dpD"),
    ("images=tp1,pp2,dp1 language=tp4,pp2,dp2 mbs=2 gbs=32", "'images=tp1,pp2,dp1': the step model takes an encoder"),
    ("images=tp1,pp1,dp1 language=tp4,pp2,dp2 mbs=3 gbs=32", "'mbs=3': the global micro-batch must be a multiple of G"),
    ("images=tp1,pp1,dp1 language=tp4,pp2,dp2 mbs=2 gbs=31", "'gbs=31': the global batch must be a whole number"),
    ("images=tp1,pp1,dp1 language=tp4,pp2,dp2 mbs=0 gbs=32", "'mbs=0': mbs must be a positive whole number"),
    ("images=tp1,pp1,dp1 language=tp4,pp2,dp2 mbs=2", "no gbs=N"),
    ("images=tp1,pp1,dp1 mbs=2 gbs=32", "no language=tpT,ppP,dpD"),
    ("images=tp1,pp1,dp1 language=tp4,pp2,dp2 mbs=2 gbs=32 frozen=language", "'frozen=language': 'language' is not"),
    ("images=tp1,pp1,dp1 language=tp4,pp2,dp2 mbs=2 gbs=32 frozen", "'frozen': give NAME=tpT,ppP,dpD"),
    ("images=tp1,pp1,dp1 images=tp1,pp1,dp1 language=tp4,pp2,dp2 mbs=2 gbs=32", "a module is given twice"),
])
def test_a_bad_layout_is_one_line_naming_the_bad_part_exit_2(capsys, spec, words):
    assert sim.main(["--layout", spec]) == 2
    out, err = capsys.readouterr()
    lines = err.rstrip("\n").split("\n")
    assert len(lines) == 1 and lines[0].startswith("mimo-accel simulate: error: --layout: "), err
    assert words in lines[0] and out == ""


@pytest.mark.parametrize("flag", [["--dp", "4"], ["--reorder-window", "2"], ["--png", "x.png"]])
def test_the_sweeps_own_flags_are_refused_with_layout(capsys, flag):
    assert sim.main(["--layout", "reference-27b", *flag]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"mimo-accel simulate: error: {flag[0]} applies to the DP sweep, not --layout; drop {flag[0]} "
                   "(the layout gives every module's DP and the step's micro-batches)")
