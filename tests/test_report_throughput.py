"""Each module's throughput in the report (mimo_accel.tools.report.throughput): samples/s, tokens/s
per GPU, model TFLOP/s per GPU and MFU from profile files and their header's FLOPs shapes, in the
JSON, the tables and the HTML page; ``--peak-tflops`` on the commands that report it."""

from __future__ import annotations

import json

import pytest

from mimo_accel.costs.flops import FlopsShape
from mimo_accel.profiler import FORMAT
from mimo_accel.profiler.run import read_run
from mimo_accel.tools.report import build, main, summarize, write_html

from .test_report import LAYOUT, write_run

LM = FlopsShape(layers=4, hidden=128, ffn_hidden=512, heads=4, query_groups=4, kv_channels=32, vocab=2048)
VIT = FlopsShape(layers=2, hidden=64, ffn_hidden=256, heads=4, query_groups=4, kv_channels=16, causal=False)
STEP_TIMES = (5.0, 1.0, 2.0, 4.0)  # the first is warm-up: the p50 is the 2-second step's


def _flops(device_name=None, vision_trained=True) -> dict:
    return {"device_name": device_name,
            "modules": {"vision": {"ranks": 2, "trained": vision_trained, "shape": VIT.to_dict()},
                        "language": {"ranks": 4, "trained": True, "shape": LM.to_dict()}}}


def _run(directory, flops=None):
    """vision dp2 (ranks 0, 1: 64 and 32 rows a step); language dp2 (ranks 2, 3: 300 and 100 real
    tokens), 4 samples on every replica."""
    ranks = {}
    for rank in range(4):
        vision = rank < 2
        work = ({"vision_rows": (64, 32)[rank], "vision_sq_rows": (64**2, 2 * 16**2)[rank],
                 "vision_fwd_s": 0.1, "vision_bwd_s": 0.2} if vision else
                {"tokens": (300, 100)[rank - 2], "sq_tokens": (300**2, 2 * 50**2)[rank - 2],
                 "language_fwd_s": 0.2, "language_bwd_s": 0.4})
        ranks[rank] = {"module": "vision" if vision else "language", "dp_rank": rank % 2, "dp_size": 2,
                       "steps": [{"step_time_s": t, "samples": 4, **work} for t in STEP_TIMES]}
    layout = {**LAYOUT, **({"flops": flops} if flops is not None else {})}
    return read_run(write_run(directory, ranks, layout=layout, fmt=FORMAT))


def test_each_modules_throughput_is_its_work_over_the_step_and_its_gpus(tmp_path):
    s = summarize(_run(tmp_path / "run", _flops()))
    language, vision = s["per_module"]["language"], s["per_module"]["vision"]
    # the 2-second step: 8 samples; 400 real tokens over 4 language GPUs; 96 rows over 2 vision GPUs
    assert language["samples_per_s_p50"] == vision["samples_per_s_p50"] == 8 / 2.0
    assert language["tokens_per_s_per_gpu_p50"] == 400 / (2.0 * 4)
    assert vision["tokens_per_s_per_gpu_p50"] == 96 / (2.0 * 2)
    lm = 3 * LM.forward(400, 300**2 + 2 * 50**2) / (2.0 * 4) / 1e12
    vit = 3 * VIT.forward(96, 64**2 + 2 * 16**2) / (2.0 * 2) / 1e12
    assert language["tflops_per_gpu_p50"] == pytest.approx(lm)
    assert vision["tflops_per_gpu_p50"] == pytest.approx(vit)
    # a CPU run: the peak is unknown, MFU null
    assert language["mfu_p50"] is None and s["peak_tflops"] is None and s["peak_source"] is None
    assert (language["gpus"], language["trained"], language["flops_shape"]) == (4, True, LM.to_dict())


def test_mfu_is_over_the_device_tables_peak_or_the_one_given(tmp_path):
    run = _run(tmp_path / "h100", _flops("NVIDIA H100 80GB HBM3", vision_trained=False))
    s = summarize(run)
    assert (s["peak_tflops"], s["peak_source"]) == (989.0, "H100 SXM, dense BF16 (device table)")
    language, vision = s["per_module"]["language"], s["per_module"]["vision"]
    assert language["mfu_p50"] == pytest.approx(language["tflops_per_gpu_p50"] / 989.0)
    # a frozen encoder computes its forward only
    assert vision["tflops_per_gpu_p50"] == pytest.approx(VIT.forward(96, 64**2 + 2 * 16**2) / (2.0 * 2) / 1e12)
    given = summarize(run, peak_tflops=500.0)
    assert (given["peak_tflops"], given["peak_source"]) == (500.0, "--peak-tflops")
    assert given["per_module"]["language"]["mfu_p50"] == pytest.approx(language["tflops_per_gpu_p50"] / 500.0)


def test_a_profile_without_flops_shapes_still_has_samples_and_tokens_per_second(tmp_path):
    language = summarize(_run(tmp_path / "old"))["per_module"]["language"]
    assert language["tokens_per_s_per_gpu_p50"] == 400 / (2.0 * 2)  # per GPU: the ranks whose files name it
    assert language["tflops_per_gpu_p50"] is None and language["mfu_p50"] is None
    assert language["flops_note"] == "no FLOPs shape in the profile header"


def test_the_json_tables_and_html_carry_the_figures(tmp_path, capsys):
    before, after = _run(tmp_path / "b", _flops()), _run(tmp_path / "a", _flops())
    out = tmp_path / "report.json"
    assert main([str(before.directory), str(after.directory), "--json", str(out), "--peak-tflops", "100"]) == 0
    doc = json.loads(out.read_text())
    for side in ("before", "after"):
        language = doc[side]["per_module"]["language"]
        assert language["mfu_p50"] == pytest.approx(language["tflops_per_gpu_p50"] / 100.0)
        for key in ("samples_per_s_p50", "tokens_per_s_per_gpu_p50", "tflops_per_gpu_p50", "mfu_p50"):
            assert doc[side]["per_module"]["vision"][key] is not None
    text = capsys.readouterr().out
    for row in ("language real tokens/s per GPU p50", "vision rows/s per GPU p50", "language model TFLOP/s per GPU p50",
                "language MFU p50", "Model FLOPs per module"):
        assert row in text
    html = tmp_path / "report.html"
    write_html(build(before, after), html)
    page = html.read_text()
    assert "language model TFLOP/s per GPU p50" in page and "Model FLOPs per module" in page
    assert "language MFU p50" not in page  # no peak known on either side: no MFU row


@pytest.mark.parametrize("command", ["report", "rehearse"])
@pytest.mark.parametrize("value", ["0", "-5", "nan", "x"])
def test_a_peak_that_is_not_positive_is_refused_naming_the_fix(tmp_path, capsys, command, value):
    if command == "report":
        run = _run(tmp_path / "run", _flops())
        code = main([str(run.directory), f"--peak-tflops={value}"])
    else:
        from mimo_accel_dev.commands.rehearse import main as rehearse

        code = rehearse([f"--peak-tflops={value}"])
    assert code == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert len(errors) == 1 and "--peak-tflops" in errors[0] and "device table" in errors[0], errors
