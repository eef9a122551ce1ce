"""``mimo-accel layout --from DIR`` prints how to continue the profiled run on the layout it recommends
(upstream's Qwen3.5-VL launcher resumed from the run's checkpoint directory), and says what cannot
carry over, with the setting that makes it. The profiles are the two-rank CPU profile of
tests/test_layout.py with the header record the profiler writes (``layout["run"]``)."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

from rich.console import Console

from mimo_accel.tools.layout.command import main
from mimo_accel.tools.layout.continuation import continuation
from mimo_accel.tools.layout.spec import parse_layout
from tests.test_layout import _profile

RUN = {"parallelism": {"vision": [1, 1, 1], "language": [1, 1, 1]}, "global_batch": 8, "micro_batch": 4,
       "format": "torch_dist", "optimizer_sharding": None, "dataloader_type": "single", "data_sharding": True,
       "canonical_reads": False, "save": "/ckpt/run", "load": None, "train_iters": 100, "save_rng": False}


def _run(directory: Path, **changes) -> Path:
    """The test profile, its headers recording the run's settings (``changes`` over :data:`RUN`; None:
    no record, as a profile made before the profiler wrote it)."""
    _profile(directory)
    for path in directory.glob("rank*.jsonl"):
        lines = path.read_text().splitlines()
        header = json.loads(lines[0])
        if changes.get("record", True) is not None:
            header["layout"]["run"] = {**RUN, **changes}
        path.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    return directory


def _ask(run: Path, *flags: str) -> tuple[str, dict]:
    console = Console(record=True, width=400)
    out = run / "advice.json"
    assert main(["--from", str(run), "--workload", "receipts", "--rehearsal", "--steps", "2", "--top", "2",
                 "--json", str(out), *flags], console=console) == 0
    return console.export_text(), json.loads(out.read_text())


def test_the_advice_prints_the_launcher_line_that_continues_the_run_on_the_new_layout(tmp_path):
    text, doc = _ask(_run(tmp_path), "--gpus", "4")
    way = doc["continue"]
    rec = next(r for r in doc["rows"] if r["spec"] == doc["recommended"])
    assert way["switch"] and way["layout"] == rec["spec"] != doc["current"]["spec"]
    assert way["checkpoint_dir"] == "/ckpt/run" and way["cannot_carry_over"] == []
    command = way["command"]
    assert command.startswith("examples/megatron_mimo/qwen35_vl/finetune_qwen35_vl.py --load-checkpoint /ckpt/run "
                              "--checkpoint-dir /ckpt/run")
    for component in rec["settings"]["components"]:
        assert f"--component {component}" in command
    assert "--global-batch-size 8" in command and "--train-iters 100" in command and "--dataloader-type single" in command
    assert len(way["carries_over"]) == 3 and "reshards across TP, PP and DP" in way["carries_over"][0]
    assert f"To continue the run in {tmp_path} on {rec['spec']}" in text and command in text


def test_a_budget_that_changes_the_global_batch_is_no_continuation(tmp_path):
    text, doc = _ask(_run(tmp_path), "--gpus", "4", "--gbs", "16")
    way = doc["continue"]
    assert way["command"] is None and [b["what"] for b in way["cannot_carry_over"]] == ["global batch"]
    assert "cannot carry over (global batch): the run trains global batches of 8 and this layout 16" in text
    assert "keep the global batch at 8 (--gbs 8)" in text and "What stops continuing the run" in text


def test_the_run_goes_on_where_the_advisor_keeps_its_layout(tmp_path):
    text, doc = _ask(_run(tmp_path), "--gpus", "2", "--mbs", "4")
    assert doc["keep_current"] and not doc["continue"]["switch"] and doc["continue"]["command"] is None
    assert "goes on as it is" in text


def _row(spec: str):
    layout = parse_layout(spec)
    return SimpleNamespace(spec=layout.spec, layout=layout)


def test_what_cannot_carry_over_is_said_with_the_setting_that_makes_it(tmp_path):
    run = _run(tmp_path, optimizer_sharding="dp_reshardable",
               parallelism={"vision": [1, 1, 1], "language": [2, 2, 2]})
    dp_only = continuation(str(run), _row("vision=tp1,pp1,dp2 language=tp2,pp2,dp1 mbs=4 gbs=8"))
    assert dp_only.command is not None and not dp_only.barriers
    assert "dp_reshardable reshards across DP" in dp_only.carried[1]
    way = continuation(str(run), _row("vision=tp1,pp1,dp2 language=tp1,pp2,dp2 mbs=4 gbs=8"))
    (b,) = way.barriers
    assert way.command is None and b.what == "optimizer" and "dist_ckpt_optim_fully_reshardable=True" in b.fix
    assert not any("optimizer" in line for line in way.carried)


def test_a_run_that_saves_no_checkpoint_or_records_none_says_so(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    row = _row("vision=tp1,pp1,dp2 language=tp1,pp1,dp2 mbs=2 gbs=8")
    unsaved = continuation(str(_run(tmp_path / "a", save=None)), row)
    assert unsaved.command is None and [b.what for b in unsaved.barriers] == ["checkpoint"]
    older = continuation(str(_run(tmp_path / "b", record=None)), row)
    assert older.command is None and "does not record the run's checkpoint settings" in older.notes[0]


def test_the_sample_order_under_cyclic_reads_is_said_or_stopped(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    row = _row("vision=tp1,pp1,dp2 language=tp1,pp1,dp2 mbs=2 gbs=8")
    flat = continuation(str(_run(tmp_path / "a", dataloader_type="cyclic")), row)
    assert flat.command is not None and "same remainder by 2 as by 4" in flat.notes[0]
    canonical = continuation(str(_run(tmp_path / "b", dataloader_type="cyclic", canonical_reads=True)), row)
    assert canonical.command is None and canonical.barriers[0].what == "order" and "G=1" in canonical.barriers[0].why
