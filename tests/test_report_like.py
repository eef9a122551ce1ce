"""A report of like with like: each run's features on top, a one-line verdict, a warning naming why
where runs are not comparable (step counts, samples, a floor given as a run), no empty rows, the
floor marked as the floor, ``report A B C ...`` one feature at a time, and every table within the
80 columns of a batch log."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import pytest
from rich.console import Console

from mimo_accel.profiler.run import read_run
from mimo_accel.tools.report import main
from mimo_accel.tools.report.command import build_runs
from mimo_accel.tools.report.console import render_runs
from tests.test_report import write_run

LAYOUT = {"dp": {"vision": 2, "language": 2}}
# per step, the rows of each vision replica's images and the real tokens of each language replica's
# samples: the same samples every run (the sums per step), shared out differently by the features
ROWS = [(900, 300), (500, 700), (1000, 200), (400, 800), (850, 350), (600, 600), (950, 250), (300, 900)]
TOKENS = [(700, 300), (400, 600), (800, 200), (350, 650), (900, 100), (500, 500), (750, 250), (300, 700)]


def feature_run(directory: Path, features: list, *, steps: int = 8, balanced_rows: bool = False,
                balanced_tokens: bool = False, packed: bool = False, equal_work: bool = False,
                other_data: bool = False, refits: bool = False) -> Path:
    """A run of vision dp2 (ranks 0-1) and language dp2 (ranks 2-3) whose module times follow their
    work: vision 1 ms a row, language 1 ms a token (a third less where ``packed``); the reorder's
    runs share each step's rows (``balanced_rows``) and tokens (``balanced_tokens``) out evenly."""
    ranks = {r: {"module": "vision" if r < 2 else "language", "dp_rank": r % 2, "dp_size": 2, "steps": []}
             for r in range(4)}
    for s in range(steps):
        rows, tokens = ROWS[s % len(ROWS)], TOKENS[s % len(TOKENS)]
        if other_data:
            tokens = (tokens[0] + 40, tokens[1])
        if equal_work:
            rows, tokens = (500, 500), (450, 450)  # one block of samples on every replica
        if balanced_rows:
            rows = (sum(rows) / 2,) * 2
        if balanced_tokens:
            tokens = (sum(tokens) / 2,) * 2
        slowest = max(max(rows) * 1e-3, max(tokens) * 1e-3 * (2 / 3 if packed else 1))
        for r, spec in ranks.items():
            dp = r % 2
            line = {"step_time_s": 0.2 + slowest, "samples": 4}
            if r < 2:
                line.update(vision_fwd_s=rows[dp] * 1e-3 / 3, vision_bwd_s=rows[dp] * 2e-3 / 3, vision_rows=rows[dp],
                            timed_calls={"vision_fwd": 1, "vision_bwd": 1})
            else:
                t = tokens[dp] * 1e-3 * (2 / 3 if packed else 1)
                line.update(language_fwd_s=t / 3, language_bwd_s=2 * t / 3, tokens=tokens[dp],
                            timed_calls={"language_fwd": 1, "language_bwd": 1})
                if refits and r == 3 and s == steps - 1:
                    line["online_refits"] = [{"step": s, "module": "vision", "announced_for": s + 2,
                                              "coefficients": {"a": 1.234e-5, "b": 5.678e-9, "k": 1.5e-3},
                                              "held_out_error_before": 0.1234, "held_out_error_after": 0.0456}]
            spec["steps"].append(line)
    return write_run(directory, ranks, layout=LAYOUT, label=directory.name, features=features)


def _console(width: int = 80) -> Console:
    return Console(file=io.StringIO(), width=width, record=True)


def _text(console: Console) -> str:
    return console.export_text(clear=False)


def _doc(tmp_path, argv) -> dict:
    out = tmp_path / "r.json"
    assert main([*map(str, argv), "--json", str(out)], console=_console()) == 0
    return json.loads(out.read_text())


def test_a_floor_given_as_a_run_with_other_step_counts_is_called_so(tmp_path, capsys):
    """``report baseline floor``: an equal-work run of 7 steps against a run of 23 — the change is no
    gain, and the warnings say why, naming the fix."""
    baseline = feature_run(tmp_path / "baseline", [], steps=24)
    floor = feature_run(tmp_path / "floor", ["sharded_reads", "packing"], steps=8, equal_work=True)
    c = _console()
    assert main([str(baseline), str(floor)], console=c) == 0
    err = capsys.readouterr().err
    assert f"after is an equal-work run (every replica computed the same work each step): the machine's floor, not a " \
           f"run to compare; give it as --floor {floor}" in err
    assert "before counted 23 steps and after 7: their figures cover different spans of training" in err
    text = " ".join(_text(c).split())
    assert "verdict: not like with like (a floor given as a run, different step counts): the changes below are no " \
           "gain" in text


def test_runs_over_other_samples_are_called_so(tmp_path, capsys):
    a = feature_run(tmp_path / "a", [])
    b = feature_run(tmp_path / "b", ["sharded_reads"], other_data=True)
    doc = _doc(tmp_path, [a, b])
    assert any("before and after did not train the same samples (language real tokens of step 1: 1,000 against "
               "1,040): another dataset, seed or order" in w for w in doc["warnings"])
    assert doc["verdict"].startswith("not like with like (different samples)")
    assert doc["gains"][0]["comparable"] is False


def test_each_runs_features_on_top_and_a_verdict_that_names_the_gain(tmp_path):
    before = feature_run(tmp_path / "baseline", [])
    after = feature_run(tmp_path / "all", ["sharded_reads", "reorder", "packing"], balanced_rows=True,
                        balanced_tokens=True, packed=True)
    c = _console()
    doc = build_runs([read_run(before), read_run(after)])
    render_runs([doc["before"], doc["after"]], c, said=doc["warnings"])
    text = _text(c)
    runs = {ln.split("│")[1].strip(): [x.strip() for x in ln.split("│")[2:-1]] for ln in text.splitlines()
            if ln.startswith("│ before") or ln.startswith("│ after")}
    assert runs["before"][:2] == ["baseline", "none"] and runs["after"][0] == "all"
    assert "sharded_reads, reorder, packing" in " ".join(text.split())
    assert doc["warnings"] == []
    assert doc["verdict"] == (
        f"after (sharded_reads, reorder, packing) is faster than before (none): step time p50 "
        f"{_change(doc, 'step_time_p50')}, throughput {_change(doc, 'samples_per_s')}; 3 features changed at once "
        "(report A B C ...: one a run splits the gain)")
    assert "verdict: after (sharded_reads, reorder, packing) is faster" in " ".join(text.split())
    assert "after against before: +sharded_reads +reorder +packing" in text


def _change(doc, key) -> str:
    r = doc["change"][key]
    return f"×{r:.2f} ({(r - 1) * 100:+.0f}%)"


def test_one_feature_at_a_time(tmp_path):
    """``report A B C D``: baseline, +sharded reads, +reorder, +packing; each column's gain over the
    one before it and over the first, and each gain told by the feature that made it."""
    a = feature_run(tmp_path / "baseline", [])
    b = feature_run(tmp_path / "reads", ["sharded_reads"])
    c = feature_run(tmp_path / "reorder", ["sharded_reads", "reorder"], balanced_rows=True, balanced_tokens=True)
    d = feature_run(tmp_path / "packing", ["sharded_reads", "reorder", "packing"], balanced_rows=True,
                    balanced_tokens=True, packed=True)
    console = _console()
    out, html = tmp_path / "r.json", tmp_path / "r.html"
    assert main([str(a), str(b), str(c), str(d), "--json", str(out), "--html", str(html)], console=console) == 0
    doc = json.loads(out.read_text())
    page = html.read_text(encoding="utf-8")  # the page has the same blocks
    assert "<caption>Gain of each run over the one before it (over the first)</caption>" in page
    assert '<th class="num">C +reorder</th>' in page and '<p class="verdict">verdict: D (' in page
    assert [s["label"] for s in doc["runs"]] == ["baseline", "reads", "reorder", "packing"]
    assert doc["before"]["label"] == "baseline" and doc["after"]["label"] == "packing"
    assert [(g["run"], g["adds"], g["feature"]) for g in doc["gains"]] == [
        ("B", "+sharded_reads", "sharded_reads"), ("C", "+reorder", "reorder"), ("D", "+packing", "packing")]
    reorder, packing = doc["gains"][1], doc["gains"][2]
    assert reorder["over_previous"]["vision_max_over_mean_p50"] < 0.8  # the reorder cuts the vision straggler
    assert packing["over_previous"]["language_max_mean"] == pytest.approx(2 / 3)  # packing cuts the LM's time
    assert packing["over_previous"]["vision_max_over_mean_p50"] == pytest.approx(1.0)
    assert packing["over_first"]["step_time_p50"] == pytest.approx(
        doc["runs"][3]["step_time_p50"] / doc["runs"][0]["step_time_p50"])
    text = _text(console)
    flat = " ".join(text.split())
    assert "Gain of each run over the one before it (over the first)" in flat
    row = next(ln for ln in text.splitlines() if ln.startswith("│ language slowest replica"))
    cells = [x.strip() for x in row.split("│")[2:-1]]
    assert cells[2] == f"×0.67 (×{packing['over_first']['language_max_mean']:.2f})"
    assert "by feature: reorder (C over the run before): step time" in flat
    assert re.search(r"by feature: packing \(D over the run before\): step time ×\d\.\d\d \([-+]\d+%\), language "
                     r"slowest replica ×0\.67 \(-33%\)", flat)
    assert "verdict: D (sharded_reads, reorder, packing) is faster than A (none)" in flat


def test_rows_no_run_has_are_left_out_and_the_floor_is_marked_as_the_floor(tmp_path):
    before, after = feature_run(tmp_path / "b", []), feature_run(tmp_path / "a", ["reorder"], balanced_rows=True)
    floor = feature_run(tmp_path / "floor", ["sharded_reads"], equal_work=True)
    c = _console()
    assert main([str(before), str(after), "--floor", str(floor)], console=c) == 0
    text = _text(c)
    assert "step time replayed" not in text and "predicted by the plan" not in text  # no run has them
    assert not any(re.search(r"│\s+—\s+│\s+—\s+│", ln) for ln in text.splitlines())
    floor_rows = [ln for ln in text.splitlines() if "floor" in ln and "1.000" in ln]  # a row's line with its values
    assert floor_rows and all(ln.rstrip().endswith("the floor │") and "×" not in ln for ln in floor_rows)


def test_a_floor_that_is_not_equal_work_is_said(tmp_path, capsys):
    run, other = feature_run(tmp_path / "b", []), feature_run(tmp_path / "o", [])
    assert main([str(run), "--floor", str(other)], console=_console()) == 0
    assert f"--floor {other}: its replicas did not compute the same work each step" in capsys.readouterr().err


@pytest.mark.parametrize("runs", [1, 2, 4])
def test_every_table_fits_80_columns_with_no_header_cut(tmp_path, runs):
    """The width of a batch log: every line within 80 columns, no cell or header cut short (rich's
    ellipsis), every header's words whole."""
    from mimo_accel.tools.report.console import doc_sides, gains_table, runs_table, summary_table
    from mimo_accel.tools.report.details import detail_tables

    feats = [[], ["sharded_reads"], ["sharded_reads", "reorder"], ["sharded_reads", "reorder", "packing"]]
    dirs = [feature_run(tmp_path / f"run-with-a-long-name-{i}", feats[i * (3 // max(1, runs - 1))] if runs > 1
                        else feats[3], balanced_rows=i > 0, refits=True) for i in range(runs)]
    floor = feature_run(tmp_path / "floor", ["sharded_reads"], equal_work=True)
    c = _console(80)
    out = tmp_path / "r.json"
    assert main([*map(str, dirs), "--floor", str(floor), "--json", str(out)], console=c) == 0
    text = _text(c)
    assert max(len(ln) for ln in text.splitlines()) <= 80
    assert "…" not in text
    doc = json.loads(out.read_text())
    sides = doc_sides(doc)
    tables = [runs_table(sides), summary_table(sides), *filter(None, [gains_table(sides)]), *detail_tables(sides)]
    assert any(t.title.startswith("Online calibration") for t in tables)
    words = set(text.split())
    for t in tables:
        for header, _ in t.columns:
            assert set(header.split()) <= words, (t.title, header)
