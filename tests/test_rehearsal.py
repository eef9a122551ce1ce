"""`mimo-accel rehearse` on every shipped profile, small: real non-colocated MegatronMIMO training
on CPU ranks, baseline (upstream as shipped, or sharded-only where upstream cannot run the data)
vs accelerated, with the invariant checks and the report."""

from __future__ import annotations

import json
import os

import pytest
from rich.console import Console

from mimo_accel_dev.commands import rehearse as rehearsing
from mimo_accel.workloads import list_profiles
from mimo_accel.tools.report import REPORT_FORMAT, STABLE_KEYS


@pytest.mark.distributed
@pytest.mark.parametrize("profile", sorted(list_profiles()))
def test_rehearsal_of_each_profile(profile, tmp_path):
    console = Console(file=open(tmp_path / "out.txt", "w"), width=120)
    result = rehearsing.rehearse(profile, steps=2, out_dir=str(tmp_path / "runs"),
                                 json_path=str(tmp_path / "r.json"), console=console)
    doc = json.loads((tmp_path / "r.json").read_text())
    assert doc["profile"] == profile
    # the report's keys at the top level (as `mimo-accel report --json` writes them), the
    # rehearsal's own fields beside them, nothing nested twice
    assert doc["format"] == REPORT_FORMAT and "report" not in doc
    assert {"before", "after", "change", "warnings", "losses", "before_label", "log"} <= set(doc) == set(result)
    for side in ("before", "after"):
        s = doc[side]
        for key in STABLE_KEYS:
            assert key in s
    # the same per-step token counts and (to float tolerance) losses: checked inside rehearse();
    # here: both runs trained every step
    assert len(result["losses"]["before"]) == len(result["losses"]["after"]) == 2
    # every rank ran on the one CPU the rehearsal pins them to (comparable thread-CPU times)
    assert doc["rank_cpus"] == doc["pinned_cpus"] == [min(os.sched_getaffinity(0))]
    reads_before = doc["before"]["samples_read_per_rank"]
    reads_after = doc["after"]["samples_read_per_rank"]
    total = lambda reads: sum(reads.values()) if isinstance(reads, dict) else sum(reads)  # noqa: E731
    if result["before_label"] == "baseline":
        # sharded reads read less than upstream, in samples and in bytes
        assert total(reads_after) < total(reads_before)
        assert doc["after"]["bytes_read_per_step"] < doc["before"]["bytes_read_per_step"]
    else:
        # upstream 0.6.2 cannot run this data at this layout; the message says why
        assert "upstream cannot run" in result["before_note"]
    text = (tmp_path / "out.txt").read_text()
    assert "Per-step language loss" in text and "vision straggler" in text
    assert f"rank logs: {tmp_path / 'runs' / 'rehearsal.log'}" in text  # named once, on one line
    assert text.count("rehearsal.log") == 1
