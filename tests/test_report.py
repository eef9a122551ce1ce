"""The before/after report, on profile directories generated here."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from mimo_accel.profiler import FORMAT
from mimo_accel.profiler.run import read_run
from mimo_accel.tools.report import STABLE_KEYS, build, main, render, summarize, write_json

LAYOUT = {"vision": {"tp": 1, "pp": 1, "dp": 2}, "language": {"tp": 1, "pp": 1, "dp": 2}}


def write_run(
    directory: Path,
    ranks: dict[int, dict],
    *,
    world_size: int | None = None,
    layout: dict | None = None,
    label: str = "baseline",
    fmt: str = FORMAT,
    run_id: str | None = "",
    features: list | None = None,
) -> Path:
    """Write ``rank<N>.jsonl`` files. ``ranks[r]`` = {module, dp_rank, dp_size, steps: [dict(...)]};
    each step dict holds step fields; missing ones get defaults (vision_fwd_s / vision_bwd_s null
    in every line). ``run_id``: every header's (default: one made of the directory's path; None:
    none, as files written before the recorder had one); ``features``: the header's config."""
    directory.mkdir(parents=True, exist_ok=True)
    world_size = world_size if world_size is not None else len(ranks)
    run_id = f"run-{abs(hash(str(directory))) % 10**8:08d}" if run_id == "" else run_id
    for rank, spec in ranks.items():
        header = {
            "kind": "header", "format": fmt, "rank": rank, "world_size": world_size,
            "module": spec["module"], "dp_rank": spec.get("dp_rank", 0), "dp_size": spec.get("dp_size", 1),
            "layout": LAYOUT if layout is None else layout, "versions": {},
            "config": {} if features is None else {"features": list(features)}, "device": "cpu",
            "label": label, "clock": {"step": "wall", "regions": "thread_cpu"},
        }
        if run_id is not None:
            header["run_id"] = run_id
        lines = [header]
        for i, st in enumerate(spec["steps"]):
            rec = {
                "kind": "step", "step": i, "step_time_s": 1.0, "step_cpu_s": None, "vision_fwd_s": None,
                "vision_bwd_s": None, "samples": 0, "tokens": 0, "samples_read": 0,
                "bytes_read": 0, "bytes_exchanged": 0, "predicted_spread": None,
            }
            rec.update(st)
            lines.append(rec)
        (directory / f"rank{rank}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return directory


def two_by_two(directory: Path, *, slow: float = 2.0, read: int = 8, label: str = "baseline",
               step_times=(5.0, 1.0, 1.0, 2.0, 1.0), layout: dict | None = None) -> Path:
    """Ranks 0,1 = vision dp 0,1; ranks 2,3 = language dp 0,1. Vision rank 1 is ``slow``× rank 0.
    Each language replica processes 4 samples per step (global 8); every rank reads ``read``."""
    ranks = {}
    for rank in range(4):
        vision = rank < 2
        steps = []
        for t in step_times:
            st = {"step_time_s": t, "samples": 4, "samples_read": read, "bytes_read": read * 1000,
                  "bytes_exchanged": 2048 if vision else 0}
            if vision:
                f = slow if rank == 1 else 1.0
                st.update(vision_fwd_s=0.1 * f, vision_bwd_s=0.2 * f)
            else:
                st.update(language_fwd_s=0.3, language_bwd_s=0.6)
            steps.append(st)
        ranks[rank] = {"module": "vision" if vision else "language", "dp_rank": rank % 2, "dp_size": 2, "steps": steps}
    return write_run(directory, ranks, label=label, layout=layout)


def _console() -> Console:
    return Console(file=io.StringIO(), width=160, record=True)


# -------------------------------------------------------------------------------------- values


def test_hand_made_case_values(tmp_path):
    s = summarize(read_run(two_by_two(tmp_path / "b")), warmup=1)
    assert s["warmup_skipped"] == [0] and s["steps_counted"] == 4
    # 0.3 s and 0.6 s: max / mean = 0.6 / 0.45
    assert s["vision_max_over_mean_p50"] == pytest.approx(4 / 3)
    assert s["vision_max_over_mean_p99"] == pytest.approx(4 / 3)
    vision = s["per_module"]["vision"]
    assert vision["per_rank"]["0"]["mean"] == pytest.approx(0.3)
    assert vision["per_rank"]["1"]["p99"] == pytest.approx(0.6)
    assert vision["per_rank"]["1"]["fwd_mean"] == pytest.approx(0.2)
    assert s["vision_time_mean"] == pytest.approx(0.45)
    assert s["vision_max_mean"] == pytest.approx(0.6)
    assert vision["slowest"]["rank"] == 1 and vision["slowest"]["fraction"] == 1.0 and vision["slowest"]["steps"] == 4
    # counted step times 1, 1, 2, 1 (the 5 s warm-up step is excluded)
    assert s["step_time_p50"] == pytest.approx(1.0)
    assert s["step_time_p90"] == pytest.approx(1.7)  # linear interpolation, as numpy
    assert s["step_time_mean"] == pytest.approx(1.25)
    assert s["samples_per_step"] == 8 and s["samples_module"] == "language"
    assert s["samples_per_s"] == pytest.approx(8 * 4 / 5.0)
    assert s["samples_read_per_rank"] == {"0": 8, "1": 8, "2": 8, "3": 8}
    assert s["samples_read_per_step"] == 32
    assert s["bytes_exchanged_per_rank"]["0"] == 2048 and s["bytes_exchanged_per_step"] == 4096
    assert s["warnings"] == []


def test_percentiles_match_numpy(tmp_path):
    import numpy as np
    times = [0.5 + (i * 37 % 11) / 7 for i in range(40)]
    write_run(tmp_path, {0: {"module": "language", "steps": [{"step_time_s": t, "samples": 2} for t in times]}})
    s = summarize(read_run(tmp_path), warmup=0)
    for q in (50, 90, 99):
        assert s[f"step_time_p{q}"] == pytest.approx(float(np.percentile(times, q)))


def test_golden_json_keys_and_change(tmp_path):
    before = two_by_two(tmp_path / "before", slow=2.0, read=8)
    after = two_by_two(tmp_path / "after", slow=1.0, read=4, label="accelerated", step_times=(5.0, 0.8, 0.8, 0.8, 0.8))
    out = tmp_path / "report.json"
    assert main([str(before), str(after), "--json", str(out)], console=_console()) == 0
    doc = json.loads(out.read_text())
    assert set(doc) == {"format", "before", "after", "change", "verdict", "gains", "warnings"}
    required = {
        "vision_max_over_mean_p50", "vision_max_over_mean_p99", "step_time_p50", "step_time_p99",
        "samples_per_s", "samples_read_per_rank", "per_module", "module_order", "warnings", "label",
    }
    assert required <= set(doc["before"]) and required <= set(doc["after"])
    # no key of another name for a module's figures beside its own
    assert not {"vision_per_rank", "slowest", "vision_replicas", "vision_module"} & set(doc["before"])
    assert doc["after"]["vision_max_over_mean_p50"] == pytest.approx(1.0)
    assert doc["after"]["per_module"]["vision"]["slowest"] is None  # all replicas tied
    assert doc["change"]["vision_max_over_mean_p50"] == pytest.approx(0.75)
    assert doc["change"]["step_time_p50"] == pytest.approx(0.8)
    assert doc["change"]["samples_per_s"] == pytest.approx((32 / 3.2) / (32 / 5.0))
    assert doc["change"]["samples_read_per_step"] == pytest.approx(0.5)
    assert doc["warnings"] == []


# ------------------------------------------------------------------------------------ rendering


def _text(console: Console) -> str:
    return console.export_text(clear=False)


def test_render_two_sided_shows_change_and_slowest(tmp_path):
    b = summarize(read_run(two_by_two(tmp_path / "b")))
    a = summarize(read_run(two_by_two(tmp_path / "a", slow=1.0)))
    c = _console()
    render(b, a, console=c)
    text = _text(c)
    assert "after/before" in text and "×0.75 (-25%)" in text
    assert "slowest vision: before DP replica 1 (rank 1) in 100% of 4 steps; after none (tied, or not timed)" in text
    assert "Vision encoder time per rank" in text and "Samples read per rank" in text


def test_render_one_rank_one_sided(tmp_path):
    write_run(tmp_path, {0: {"module": "vision", "steps": [{"vision_fwd_s": 0.1, "samples": 1}] * 3}})
    c = _console()
    rc = main([str(tmp_path)], console=c)
    assert rc == 0
    text = _text(c)
    assert "slowest vision: none (one replica)" in text and "after/before" not in text


def test_render_64_ranks(tmp_path):
    ranks = {}
    for r in range(64):
        vision = r < 32
        steps = [{"vision_fwd_s": 0.01 * (1 + r % 5) if vision else None, "samples": 2, "samples_read": 2}] * 4
        ranks[r] = {"module": "vision" if vision else "language", "dp_rank": r % 32, "dp_size": 32, "steps": steps}
    write_run(tmp_path, ranks, layout={"vision": {"dp": 32}, "language": {"dp": 32}})
    s = summarize(read_run(tmp_path))
    assert s["samples_per_step"] == 64
    times = [0.01 * (1 + r % 5) for r in range(32)]
    assert s["vision_max_over_mean_p50"] == pytest.approx(max(times) / (sum(times) / 32))
    c = _console()
    render(s, s, console=c)
    assert "63" in _text(c)


def test_missing_rank_partial_line_and_empty_file_are_reported(tmp_path, capsys):
    d = two_by_two(tmp_path / "b")
    (d / "rank3.jsonl").unlink()
    (d / "rank2.jsonl").write_text("")
    with open(d / "rank1.jsonl", "a") as f:
        f.write('{"kind": "step", "st')
    out = tmp_path / "r.json"
    c = _console()
    assert main([str(d), "--json", str(out)], console=c) == 0
    err = capsys.readouterr().err
    doc = json.loads(out.read_text())
    joined = "\n".join(doc["warnings"])
    needles = (
        "rank 2: rank2.jsonl is empty",
        "ranks 2, 3 of world 4 missing",
        "rank 1: last line of rank1.jsonl is incomplete",
    )
    for needle in needles:
        assert needle in joined
        assert needle in err
        assert needle in " ".join(_text(c).split())
    # still reports what it can: vision is intact; throughput falls back to the vision module
    assert doc["before"]["vision_max_over_mean_p50"] == pytest.approx(4 / 3)
    assert doc["before"]["samples_module"] == "vision" and doc["before"]["samples_per_s"] == pytest.approx(8 / 1.25)


def test_missing_language_replica_estimates_global_samples(tmp_path):
    d = two_by_two(tmp_path / "b")
    (d / "rank3.jsonl").unlink()
    s = summarize(read_run(d))
    assert s["samples_per_step"] == 8
    # one count of the replicas for the straggler and the global samples alike
    assert [w for w in s["warnings"] if "replica" in w] == [
        "only 1 of 2 language DP replicas have data (missing: replica 1); its straggler ratio covers those present "
        "and its global samples are scaled up from them"]


def test_one_count_of_replicas_in_every_message(tmp_path):
    """A run short of a language replica: its own warning and the comparison's give the same count
    (replicas with data, of the DP size), never a count of rank files beside one of replicas."""
    before, after = two_by_two(tmp_path / "b"), two_by_two(tmp_path / "a", label="accelerated")
    (after / "rank3.jsonl").unlink()
    doc = build(read_run(before), read_run(after))
    said = [w for w in doc["warnings"] if "replica" in w]
    assert said == ["after: only 1 of 2 language DP replicas have data (missing: replica 1); its straggler ratio "
                    "covers those present and its global samples are scaled up from them",
                    "DP replicas with data differ: before vision 2 of 2, language 2 of 2; after vision 2 of 2, "
                    "language 1 of 2"]


def test_mismatched_layouts_warn(tmp_path, capsys):
    b = two_by_two(tmp_path / "b")
    other = {"vision": {"tp": 1, "pp": 1, "dp": 1}, "language": {"tp": 1, "pp": 1, "dp": 2}}
    a = two_by_two(tmp_path / "a", layout=other)
    c = _console()
    assert main([str(b), str(a)], console=c) == 0
    err = capsys.readouterr().err
    assert "different layouts" in err and "not like for like" in err
    assert "different layouts" in _text(c)


class _Page:
    """What an HTML page holds: its tables (caption -> rows of cell texts, the header first), its
    images' sources, and whether any <pre> is in it (stdlib html.parser)."""

    def __init__(self, text: str):
        from html.parser import HTMLParser

        page = self
        self.tables: dict = {}
        self.images: list = []
        self.pre = False

        class Parser(HTMLParser):
            def __init__(self):
                super().__init__()
                self.caption = self.row = self.cell = None

            def handle_starttag(self, tag, attrs):
                if tag == "pre":
                    page.pre = True
                elif tag == "img":
                    page.images.append(dict(attrs))
                elif tag == "caption":
                    self.caption = ""
                elif tag == "tr":
                    self.row = []
                elif tag in ("td", "th"):
                    self.cell = ""

            def handle_endtag(self, tag):
                if tag == "caption":
                    page.tables[self.caption] = self.rows = []
                    self.caption = None
                elif tag in ("td", "th"):
                    self.row.append(self.cell)
                    self.cell = None
                elif tag == "tr":
                    self.rows.append(self.row)

            def handle_data(self, data):
                if self.caption is not None:
                    self.caption += data
                elif self.cell is not None:
                    self.cell += data

        Parser().feed(text)

    def rows(self, caption: str) -> dict:
        """first cell -> the row's other cells."""
        return {r[0]: r[1:] for r in self.tables[caption][1:]}


def test_the_html_has_real_tables_and_its_charts_embedded(tmp_path):
    import base64

    from PIL import Image

    b = two_by_two(tmp_path / "b")
    a = two_by_two(tmp_path / "a", slow=1.0)
    html = tmp_path / "r.html"
    assert main([str(b), str(a), "--html", str(html)], console=_console()) == 0
    page = _Page(html.read_text(encoding="utf-8"))
    assert not page.pre  # not the terminal text
    assert {"Runs", "Summary", "Vision encoder time per rank (fwd + bwd per step)",
            "Samples read per rank (mean per step)"} <= set(page.tables)
    summary = page.rows("Summary")
    assert page.tables["Summary"][0] == ["metric", "before", "after", "after/before"]
    assert summary["vision straggler max/mean p50"] == ["1.333", "1.000", "×0.75 (-25%)"]
    assert summary["samples read per step, all ranks"][:2] == ["32", "32"]
    assert page.rows("Vision encoder time per rank (fwd + bwd per step)")["1"][:2] == ["1", "600.00 ms"]
    assert len(page.images) == 2  # module time + step-time CDF; the straggler per step per module
    for img in page.images:
        head, _, data = img["src"].partition(",")
        assert head == "data:image/png;base64"
        png = tmp_path / "chart.png"
        png.write_bytes(base64.b64decode(data))
        with Image.open(png) as im:
            assert im.format == "PNG" and im.size[0] > 500
    assert "straggler" in page.images[1]["alt"].lower()


def test_the_straggler_chart_draws_every_module_per_step(tmp_path):
    from mimo_accel.tools.report.charts import chart_figures, pyplot

    before = build(read_run(three_modules(tmp_path / "b", slow={"images": 2.0, "audios": 1.5, "language": 3.0})),
                   read_run(three_modules(tmp_path / "a", slow={}, label="accelerated")))
    figures = chart_figures([("before", before["before"]), ("after", before["after"])])
    caption, fig = figures[1]
    assert "per step" in caption
    axes = fig.axes
    assert [ax.get_title() for ax in axes] == [f"{m} straggler per step" for m in ("images", "audios", "language")]
    for ax, ratio in zip(axes, (4 / 3, 1.2, 1.5)):
        before_line, after_line = ax.get_lines()[:2]
        assert list(before_line.get_xdata()) == [1, 2, 3, 4]  # step 0 is warm-up
        assert list(before_line.get_ydata()) == pytest.approx([ratio] * 4)
        assert list(after_line.get_ydata()) == pytest.approx([1.0] * 4)
    for _, f in figures:
        pyplot().close(f)


def test_the_html_without_matplotlib_keeps_its_tables_and_says_so(tmp_path, monkeypatch, capsys):
    from mimo_accel.tools.report import charts

    def no_matplotlib():
        raise RuntimeError("charts need matplotlib: pip install matplotlib (or mimo-accel[charts])")

    monkeypatch.setattr(charts, "pyplot", no_matplotlib)
    html = tmp_path / "r.html"
    assert main([str(two_by_two(tmp_path / "b")), "--html", str(html)], console=_console()) == 0
    page = _Page(html.read_text(encoding="utf-8"))
    assert "Summary" in page.tables and not page.images
    assert "the HTML has no charts: charts need matplotlib" in capsys.readouterr().err


def test_html_and_png_are_written(tmp_path):
    b = two_by_two(tmp_path / "b")
    a = two_by_two(tmp_path / "a", slow=1.0)
    import matplotlib  # noqa: F401  -- a declared dependency (requirements/dev.txt): must be there
    png = tmp_path / "r.png"
    assert main([str(b), str(a), "--png", str(png)], console=_console()) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    png1 = tmp_path / "one.png"
    assert main([str(b), "--png", str(png1)], console=_console()) == 0 and png1.stat().st_size > 0


@pytest.mark.parametrize("which", ["before", "after"])
def test_no_readable_data_exits_2_naming_the_directory(tmp_path, capsys, which):
    good = two_by_two(tmp_path / "good")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "rank0.jsonl").write_text("")
    argv = [str(bad)] if which == "before" else [str(good), str(bad)]
    assert main(argv, console=_console()) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "rank0.jsonl is empty" in err and "error" in err


def test_nonexistent_directory_exits_2(tmp_path, capsys):
    assert main([str(tmp_path / "nope")], console=_console()) == 2
    assert "rank<N>.jsonl" in capsys.readouterr().err


def test_write_json_puts_extra_fields_beside_the_report_keys(tmp_path):
    doc = build(read_run(two_by_two(tmp_path / "b")), read_run(two_by_two(tmp_path / "a", label="accelerated")))
    out = tmp_path / "r.json"
    write_json(out, doc, profile="uniform", losses={"before": [[float("nan"), 8.0]]})
    got = json.loads(out.read_text())
    assert set(got) == {"format", "before", "after", "change", "verdict", "gains", "warnings", "profile", "losses"}
    assert set(STABLE_KEYS) <= set(got["before"]) and set(STABLE_KEYS) <= set(got["after"])
    assert got["losses"]["before"] == [[None, 8.0]]  # strict JSON: non-finite -> null
    with pytest.raises(ValueError, match="before"):
        write_json(out, doc, before={})


def test_build_one_sided_has_null_after(tmp_path):
    doc = build(read_run(two_by_two(tmp_path / "b")))
    assert doc["after"] is None and doc["change"] is None
    json.dumps(doc, allow_nan=False)


def test_no_vision_timing_and_no_samples(tmp_path):
    write_run(tmp_path, {0: {"module": "language", "steps": [{}] * 3}})
    s = summarize(read_run(tmp_path))
    assert s["language_max_over_mean_p50"] is None and s["samples_per_s"] is None
    assert any("throughput unavailable" in w for w in s["warnings"])
    render(s, console=_console())


def test_report_reads_recorder_output(tmp_path):
    from mimo_accel.profiler import Recorder

    for rank in range(2):
        rec = Recorder(tmp_path, rank=rank, world_size=2, module="vision", dp_rank=rank, dp_size=2,
                       layout=LAYOUT, label="rec", device="cpu", clock="wall")
        for _ in range(3):
            with rec.time("vision_fwd"):
                pass
            rec.add(samples=2, samples_read=4)
            rec.end_step()
        rec.close()
    s = summarize(read_run(tmp_path))
    assert s["steps_counted"] == 2 and s["samples_per_step"] == 4 and s["per_module"]["vision"]["replicas"] == 2


def test_notices_reach_the_step_lines_once_and_the_report_shows_them(tmp_path):
    """What a feature said once (e.g. which length source packing used) is written into the next
    step line by the profiler hook, once per process, and the report lists it."""
    from mimo_accel.config import AccelConfig
    from mimo_accel.profiler import Recorder
    from mimo_accel.runtime.measuring.profiling import Profiling
    from mimo_accel.runtime.state import Runtime

    runtime = Runtime(AccelConfig(packing=True, profile=str(tmp_path)))
    profiling = Profiling(runtime)
    try:
        rec = Recorder(tmp_path, rank=0, world_size=1, module="language", dp_rank=0, dp_size=1,
                       layout=LAYOUT, label="notes", device="cpu", clock="wall")
        lines = []
        for step in range(3):
            if step == 1:
                runtime.say_once("packing:length-source", "lengths come from loss_mask")
                runtime.say_once("packing:length-source", "lengths come from loss_mask")
            rec.add(samples=1)
            profiling._attach_new_notes(rec)
            lines.append(rec.end_step())
        rec.close()
    finally:
        profiling.close()
    assert [ln.get("notes") for ln in lines] == [None, ["lengths come from loss_mask"], None]
    doc = build(read_run(tmp_path), warmup=0)
    assert doc["before"]["notes"] == ["lengths come from loss_mask"]
    out = io.StringIO()
    render(doc["before"], console=Console(file=out, width=120))
    assert "note: lengths come from loss_mask" in out.getvalue()


def test_the_report_shows_the_planned_spread_beside_the_measured_one(tmp_path):
    from mimo_accel.profiler import Recorder

    for rank in range(2):
        rec = Recorder(tmp_path, rank=rank, world_size=2, module="vision", dp_rank=rank, dp_size=2,
                       layout=LAYOUT, label="plan", device="cpu", clock="wall")
        for step in range(3):
            with rec.time("vision_fwd"):
                pass
            rec.add(samples=2)
            rec.set(predicted_spread=1.0 + 0.1 * step)
            rec.end_step()
        rec.close()
    doc = build(read_run(tmp_path), warmup=0)
    assert doc["before"]["predicted_spread_mean"] == pytest.approx(1.1)
    out = io.StringIO()
    render(doc["before"], console=Console(file=out, width=140))
    row = next(ln for ln in out.getvalue().splitlines() if "the plan predicted" in ln)
    assert "1.100" in row, row


# ---------------------------------------------------------------------------- every module


MODULES3 = {"dp": {"images": 2, "audios": 2, "language": 2}}


def three_modules(directory: Path, *, slow: dict, label: str = "baseline", tokens=(100, 100), plan_wait=None) -> Path:
    """Format-2 files of a run with two encoders and a language model, 2 replicas each (ranks
    0-1 images, 2-3 audios, 4-5 language). ``slow[m]``: how much slower replica 1 of module m is."""
    ranks = {}
    for rank in range(6):
        m = ("images", "audios", "language")[rank // 2]
        dp = rank % 2
        f = slow.get(m, 1.0) if dp == 1 else 1.0
        steps = []
        for step in range(5):
            st = {f"{m}_fwd_s": 0.1 * f, f"{m}_bwd_s": 0.2 * f, "samples": 4,
                  "predicted_spreads": {"images": 1.01, "audios": 1.02, "language": 1.03 + 0.01 * step},
                  "predicted_spread": 1.03 + 0.01 * step,
                  "timed_calls": {f"{m}_fwd": 1, f"{m}_bwd": 1}}
            if m == "language":
                st["tokens"] = tokens[dp]
            if plan_wait is not None:  # the training thread's wait for this step's plans
                st["plan_wait_s"] = plan_wait(rank, step)
            steps.append(st)
        ranks[rank] = {"module": m, "dp_rank": dp, "dp_size": 2, "steps": steps}
    return write_run(directory, ranks, label=label, layout=MODULES3, fmt=FORMAT)


def test_the_wait_for_plans_made_ahead_is_a_row_of_its_own(tmp_path):
    before = three_modules(tmp_path / "b", slow={"images": 2.0})
    after = three_modules(tmp_path / "a", slow={}, label="accelerated",
                          plan_wait=lambda rank, step: 0.5 if (rank, step) == (3, 4) else 0.001 * rank)
    out = tmp_path / "r.json"
    c = _console()
    assert main([str(before), str(after), "--json", str(out)], console=c) == 0
    doc = json.loads(out.read_text())
    assert doc["before"]["plan_wait_max"] is None  # no plan, no wait
    # per step the slowest rank's wait (rank 5: 0.005 s), step 0 left out as warm-up; step 4: 0.5 s
    assert doc["after"]["plan_wait_p50"] == pytest.approx(0.005) and doc["after"]["plan_wait_max"] == 0.5
    row = next(ln for ln in _text(c).splitlines() if "wait for the plan per step, slowest rank, max" in ln)
    assert "500.00 ms" in row


def test_a_run_with_two_encoders_and_a_language_model_has_a_straggler_row_each(tmp_path):
    before = three_modules(tmp_path / "b", slow={"images": 2.0, "audios": 1.5, "language": 3.0}, tokens=(100, 300))
    after = three_modules(tmp_path / "a", slow={}, label="accelerated", tokens=(200, 200))
    out = tmp_path / "r.json"
    c = _console()
    assert main([str(before), str(after), "--json", str(out)], console=c) == 0
    doc = json.loads(out.read_text())
    b, a = doc["before"], doc["after"]
    assert doc["warnings"] == []
    for m, ratio in (("images", 4 / 3), ("audios", 1.2), ("language", 1.5)):
        assert b[f"{m}_max_over_mean_p50"] == pytest.approx(ratio) and a[f"{m}_max_over_mean_p50"] == pytest.approx(1.0)
        assert doc["change"][f"{m}_max_over_mean_p50"] == pytest.approx(1 / ratio)
        assert b["per_module"][m]["replicas"] == 2
    assert b["module_order"] == ["images", "audios", "language"]
    assert b["per_module"]["language"]["slowest"]["dp_rank"] == 1
    # no module named vision: no vision figure at all
    assert set(STABLE_KEYS) <= set(b) and not any(k.startswith("vision") for k in b)
    assert b["predicted_spreads_mean"] == pytest.approx({"images": 1.01, "audios": 1.02, "language": 1.055})
    assert b["predicted_spread_mean"] == pytest.approx(1.055)
    assert b["language_tokens_per_replica"] == {"0": 100, "1": 300}
    assert b["language_tokens_max_over_mean_p50"] == pytest.approx(1.5)
    assert a["language_tokens_max_over_mean_p50"] == pytest.approx(1.0)
    text = _text(c)
    rows = [ln for ln in text.splitlines() if "straggler max/mean p50" in ln]
    assert [ln.split("│")[1].split()[0] for ln in rows] == ["images", "audios", "language"]
    assert "1.500" in rows[-1] and "×0.67" in rows[-1]
    planned = next(ln for ln in text.splitlines() if "language straggler the plan predicted" in ln)
    assert "1.055" in planned
    assert "worst module's straggler the plan predicted" in text
    assert "Language model time per rank" in text and "Audios encoder time per rank" in text
    # every module's headline alike: its straggler p50 / p99 / mean, its time per rank and of its slowest replica
    for m in ("images", "audios", "language"):
        assert b[f"{m}_time_mean"] == b["per_module"][m]["time_mean"] and b[f"{m}_max_mean"] == b["per_module"][m]["max_mean"]
        for label in ("straggler max/mean, mean", "time per rank, mean", "time of slowest replica, mean"):
            assert sum(ln.split("│")[1].strip() == f"{m} {label}" for ln in text.splitlines() if "│" in ln) == 1
    assert "slowest language: before DP replica 1 (rank 5) in 100% of 4 steps" in text
    assert "Language real tokens per replica per step" in " ".join(text.split())
    assert "slowest vision" not in text and "no slowest vision" not in text


def test_the_report_of_recorder_files_with_every_module_timed(tmp_path):
    """Real Recorder files: each rank times its own module with a real module timer, on work of
    different sizes per replica."""
    import torch

    from mimo_accel.profiler import Recorder, attach_module_timer, module_regions

    for rank in range(6):
        m = ("vision", "audios", "language")[rank // 2]
        rec = Recorder(tmp_path, rank=rank, world_size=6, module=m, dp_rank=rank % 2, dp_size=2,
                       layout={"dp": {"vision": 2, "audios": 2, "language": 2}}, label="rec", device="cpu",
                       regions=module_regions(m), run_id="r1")
        torch.manual_seed(rank)
        net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
        attach_module_timer(net, rec, name=m)
        for _ in range(3):
            net(torch.randn(64 * (1 + 3 * (rank % 2)), 64)).sum().backward()
            rec.add(samples=2, tokens=10 * (1 + rank % 2) if m == "language" else 0)
            rec.end_step()
        rec.close()
    s = summarize(read_run(tmp_path), warmup=0)
    assert s["warnings"] == [] and s["module_order"] == ["vision", "audios", "language"]
    for m in ("vision", "audios", "language"):
        assert s[f"{m}_max_over_mean_p50"] >= 1.0 and s["per_module"][m]["steps"] == 3
    assert s["vision_max_over_mean_p50"] == s["per_module"]["vision"]["max_over_mean_p50"]
    assert s["language_tokens_per_replica"] == {"0": 10, "1": 20}
    c = _console()
    render(s, console=c)
    rows = [ln for ln in _text(c).splitlines() if "straggler max/mean p50" in ln]
    assert len(rows) == 3


def test_an_encoder_timed_as_vision_reports_under_its_own_name(tmp_path):
    """A module the recorder could not name is timed as "vision": upstream's naming (images) still
    reports its time, under the module's own name."""
    ranks = {r: {"module": "images" if r < 2 else "language", "dp_rank": r % 2, "dp_size": 2,
                 "steps": [{"vision_fwd_s": 0.1 * (1 + (r == 1)), "vision_bwd_s": 0.0, "samples": 4,
                            "timed_calls": {"vision_fwd": 1, "vision_bwd": 1}}] * 3}
             for r in range(4)}
    for r in (2, 3):
        ranks[r]["steps"] = [{"samples": 4}] * 3
    s = summarize(read_run(write_run(tmp_path, ranks, layout={"images": {"dp": 2}, "language": {"dp": 2}})))
    assert s["images_max_over_mean_p50"] == pytest.approx(2 / 1.5)
    assert not any(k.startswith("vision") for k in s)
    assert s["language_max_over_mean_p50"] is None
    assert any("language ranks recorded no" in w for w in s["warnings"])


def test_png_of_every_module(tmp_path):
    b = three_modules(tmp_path / "b", slow={"language": 2.0})
    png = tmp_path / "r.png"
    assert main([str(b), str(b), "--png", str(png)], console=_console()) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_machines_floor_stands_beside_each_modules_straggler(tmp_path):
    """An equal-work run's straggler (``--floor``): in the JSON at the top and in each side's
    module table, and a row of the summary, so noise can be told from imbalance."""
    before, after = two_by_two(tmp_path / "b", slow=2.0), two_by_two(tmp_path / "a", slow=1.2, label="accelerated")
    floor = two_by_two(tmp_path / "floor", slow=1.1, label="floor")
    out = tmp_path / "r.json"
    assert main([str(before), str(after), "--floor", str(floor), "--json", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["floor"]["modules"]["vision"] == pytest.approx(0.33 / 0.315)  # 1.1x on one of two replicas
    assert doc["floor"]["steps"] == 4 and doc["floor"]["profile"] == str(floor)
    assert doc["after"]["per_module"]["vision"]["floor"] == doc["before"]["per_module"]["vision"]["floor"]
    console = _console()
    with_floor = build(read_run(before), read_run(after), floor=read_run(floor))
    render(with_floor["before"], with_floor["after"], console=console)
    assert "vision straggler of equal work (the machine's floor), p50" in _text(console)
    assert "floor" not in build(read_run(before), read_run(after))  # no equal-work run: no floor
