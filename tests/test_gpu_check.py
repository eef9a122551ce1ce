"""`mimo-accel gpu-check`: its CPU stand-in (``--device cpu --size tiny``) runs every check's logic
on real megatron-core / megatron-bridge modules; without CUDA the CUDA default is one line, exit 2.

No GPU is here: the CUDA paths (Transformer Engine attention, CUDA events, NVTX) are not run by
this suite; the CPU stand-ins are the ones each check names in its row.
"""

from __future__ import annotations

import io
import json

import pytest
from rich.console import Console

from mimo_accel.tools import cli
from mimo_accel_dev.commands import gpu_check as gc

ERROR = "mimo-accel gpu-check: error:"
# the checks run in an in-process 1-rank gloo world on real megatron-core
DISTRIBUTED = pytest.mark.distributed


def _run(out, *extra):
    text = io.StringIO()
    code = gc.main(["--device", "cpu", "--size", "tiny", "--out", str(out), *extra],
                   console=Console(file=text, width=200, color_system=None))
    doc = json.loads((out / "gpu-check.json").read_text()) if (out / "gpu-check.json").exists() else None
    return code, doc, text.getvalue()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu-check")
    return (out, *_run(out))


def _check(doc, key):
    [check] = [c for c in doc["checks"] if c["check"] == key]
    return check


@DISTRIBUTED
def test_every_check_runs_on_the_cpu_and_names_its_stand_in(tiny):
    out, code, doc, text = tiny
    assert code == 0, text
    assert doc["format"] == gc.FORMAT and doc["passed"] and doc["device"]["kind"] == "cpu"
    assert [c["check"] for c in doc["checks"]] == ["a", "b", "c", "d", "e"]
    assert {c["check"]: c["status"] for c in doc["checks"]} == {"a": "pass", "b": "pass", "c": "ran", "d": "ran",
                                                               "e": "pass"}
    for c in doc["checks"]:
        assert c["stand_in"] and c["result"], c
    assert "CPU stand-in" in text and "no check failed" in text
    assert (out / "cost-model.json").is_file() and (out / "gpu-check.log").is_file()


@DISTRIBUTED
def test_packing_parity_holds_and_a_leaky_pack_is_caught(tiny):
    _, _, doc, _ = tiny
    f = _check(doc, "a")["figures"]
    for k in (1, 8):
        layout = f[f"pad_multiple_{k}"]
        assert layout["dtype"] == "int32"
        assert max(layout["per_token_loss"], layout["mean_loss"], layout["gradient"]) <= f["gate"] == 1e-4
    assert f["pad_multiple_8"]["pad_between_seqs"] and not f["pad_multiple_1"]["pad_between_seqs"]
    assert f["leaky_pack"] > 100 * f["gate"]


@DISTRIBUTED
def test_the_timer_agrees_with_wall_time(tiny):
    _, _, doc, _ = tiny
    f = _check(doc, "b")["figures"]
    assert f["repeats"] == gc._TIMER_REPEATS
    assert abs(f["median_ratio"] - 1) <= 0.05
    assert all(0 < m <= w * 1.05 for m, w in zip(f["module_s"], f["wall_s"]))


@DISTRIBUTED
def test_calibrate_gpu_fits_both_modules(tiny):
    out, _, doc, _ = tiny
    f = _check(doc, "c")["figures"]
    assert set(f) >= {"vision", "language"}
    assert f["vision"]["n"] == 9 and f["language"]["n"] == 8
    assert str(out / "cost-model.json") in _check(doc, "c")["result"]


@DISTRIBUTED
def test_online_calibration_ran_on_real_module_times(tiny):
    _, _, doc, _ = tiny
    f = _check(doc, "d")["figures"]
    assert f["layout"] == {"vision": 4, "language": 2}
    per = f["per_module"]
    assert len(per["vision"]["spread"]) == f["steps"] - f["warmup"]
    assert all(s >= 1.0 for s in per["vision"]["spread"] + per["language"]["spread"])
    assert f["attempts"] >= 2  # from min_steps on, every two steps
    for refit in f["refits"]:
        assert refit["held_out_error_after"] < refit["held_out_error_before"]
        assert all(v >= 0 for v in refit["coefficients"].values())


@DISTRIBUTED
def test_every_nvtx_range_is_named_and_closed(tiny):
    _, _, doc, _ = tiny
    f = _check(doc, "e")["figures"]
    assert f["ranges"] == list(gc.EXPECTED_RANGES) and f["unclosed"] == 0


@DISTRIBUTED
def test_a_broken_pack_fails_check_a(tmp_path, monkeypatch):
    """The check can fail: a packer that pairs each token with its neighbour's label (labels one
    position off in the pack) is caught by the parity comparison; exit 1."""
    import torch

    from mimo_accel import packing

    real = packing.pack_language_shard

    def off_by_one(batch, *args, **kwargs):
        packed, kw = real(batch, *args, **kwargs)
        return {**packed, "labels": torch.roll(packed["labels"], 1, dims=1)}, kw

    monkeypatch.setattr(packing, "pack_language_shard", off_by_one)
    code, doc, text = _run(tmp_path, "--only", "a")
    assert code == 1
    check = _check(doc, "a")
    assert check["status"] == "fail" and "per token loss differs by" in check["result"]
    assert "failed: a" in " ".join(text.split())


@DISTRIBUTED
def test_a_check_that_raises_is_its_failure_in_one_line(tmp_path, monkeypatch):
    def broken(setup):
        raise RuntimeError("the device fell over")

    monkeypatch.setattr(gc, "CHECKS", (("e", "NVTX ranges", broken),))
    code, doc, _ = _run(tmp_path, "--only", "e")
    assert code == 1
    result = _check(doc, "e")["result"]
    assert result.startswith("RuntimeError: the device fell over") and "gpu-check.log" in result
    assert "Traceback" in (tmp_path / "gpu-check.log").read_text()


# ---------------------------------------------------------------------- cannot start: exit 2


def _one_error_line(capsys, *words):
    err = capsys.readouterr().err.strip().splitlines()
    assert err and err[-1].startswith(ERROR), err
    assert "Traceback" not in "\n".join(err)
    for w in words:
        assert w in err[-1], err[-1]


@pytest.mark.parametrize("argv, words", [
    (["--out", "{d}/g"], ["CUDA is not available here", "--device cpu --size tiny"]),
    (["--device", "cpu", "--size", "real", "--out", "{d}/g"], ["--size real on cpu", "--size tiny"]),
    (["--device", "cpu", "--only", "a,z", "--out", "{d}/g"], ["--only a,z", "the checks are a, b, c, d, e"]),
    (["--device", "cpu", "--budget-s", "0", "--out", "{d}/g"], ["--budget-s must be a positive number"]),
    (["--device", "cpu", "--out", "{d}/file"], ["is a file, not a directory"]),
    (["--device", "cpu"], ["the following arguments are required: --out"]),
])
def test_what_cannot_start_is_one_error_line_and_exit_2(tmp_path, capsys, monkeypatch, argv, words):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    (tmp_path / "file").write_text("")
    assert cli.main(["gpu-check", *[a.replace("{d}", str(tmp_path)) for a in argv]]) == 2
    _one_error_line(capsys, *words)
    assert not (tmp_path / "g").exists()
