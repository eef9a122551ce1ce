"""``mimo-accel rehearse --loop bridge --layout reference``: upstream's validated layout (images dp1 ->
language pp2 dp2, TP 2 for the tutorial's 4, 2-sample micro-batches, 32 a step) on 9 CPU gloo ranks
through Bridge's ``pretrain_megatron_mimo``, before (upstream as shipped) and after
(``reorder_window="step"``), the same samples and the same per-token losses."""

from __future__ import annotations

import json

import pytest

from mimo_accel_dev.commands import rehearse as rehearsing

from ._example import LANGUAGE_PP_DP


@pytest.mark.distributed
@LANGUAGE_PP_DP
def test_the_reference_layout_trains_upstreams_validated_shape_before_and_after(tmp_path):
    from rich.console import Console

    from mimo_accel_dev.commands.rehearse_reference import rehearse_reference

    console = Console(file=open(tmp_path / "out.txt", "w"), width=140)
    result = rehearse_reference(steps=2, workloads=("receipts",), out_dir=str(tmp_path / "runs"),
                                json_path=str(tmp_path / "r.json"), console=console)
    console.file.close()
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["layout"] == result["layout"] == "vision(tp1,pp1,dp1)->language(tp2,pp2,dp2)"
    assert "language TP 2 for the tutorial's TP 4" in doc["stand_in"] and doc["reorder_window"] == "step"
    # bridge_steps checked every sample of each 32-sample step once per module, counted once per replica
    before, after = doc["losses"]["baseline"], doc["losses"]["accelerated"]
    assert len(before) == len(after) == 2 and [b[1] for b in before] == [a[1] for a in after]
    assert all(b[0] / b[1] == pytest.approx(a[0] / a[1], rel=1e-2) for b, a in zip(before, after))
    # the language model's two replicas, each on its TP x PP = 4 ranks, timed in both runs
    for side in ("before", "after"):
        assert doc[side]["per_module"]["language"]["replicas"] == 2
    text = (tmp_path / "out.txt").read_text()
    assert "TP 2 stands in for the tutorial's TP 4" in text and "receipts: per-iteration global loss" in text
    # the report names the bound; two steps (one measured) are too few for the advisor to learn from,
    # which the layout check says rather than recommend from nothing (make demo-reference runs 20)
    assert doc["after"]["bound_module"] in ("vision", "language")
    assert doc["layout_check"]["skipped"].startswith("--from") and "too few steps" in doc["layout_check"]["skipped"]
    assert "no layout check:" in text


def test_the_reference_layout_fixes_its_shape_and_says_what_to_drop(capsys):
    assert rehearsing.main(["--layout", "reference"]) == 2
    assert "--layout applies to --loop bridge: add --loop bridge" in capsys.readouterr().err
    assert rehearsing.main(["--loop", "bridge", "--layout", "reference", "--language-dp", "4", "--peer",
                            "upstream"]) == 2
    assert "--layout reference fixes the layout and the example: drop --language-dp, --peer" in capsys.readouterr().err
