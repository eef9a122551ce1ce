"""``make demo-reference``'s switch (:mod:`mimo_accel_dev.commands.layout_switch`): the reference run
saved at its half and continued on the checked layout, held against the uninterrupted run's samples
and losses and the advisor's prediction. Traces and profiles here are made up; the switch itself on
Bridge's loop: tests/test_resume_switch.py and ``make demo-reference``."""

from __future__ import annotations

import pytest
from rich.console import Console

from mimo_accel_dev.commands import layout_check as lc
from mimo_accel_dev.commands import layout_switch as switch
from mimo_accel_dev.rehearse.rehearsal import InvariantViolation
from tests.test_layout_check import advice  # noqa: F401  (the fixture: advice from a CPU profile)

GBS = 8


def _records(iterations, layout=((("vision", 0), 2), (("language", 0), 1), (("language", 1), 1)), shift=0):
    """A trace: each replica (module, dp_rank) of ``layout`` trains its share of each iteration's
    contiguous samples in micro-batches of 2 (``shift`` rotates them: the same samples elsewhere)."""
    out = []
    for it in iterations:
        ids = [(it - 1) * GBS + (i + shift) % GBS for i in range(GBS)]
        for module in ("vision", "language"):
            replicas = [(dp, n) for (m, dp), n in layout if m == module]
            share = len(ids) // len(replicas)
            for dp, _ in replicas:
                mine = ids[dp * share:(dp + 1) * share]
                out.append({"iteration": it, "module": module, "dp_rank": dp, "pp_rank": 0,
                            "ids": [mine[k:k + 2] for k in range(0, len(mine), 2)]})
    return out


def _steps(iterations, scale=1.0):
    return [{"loss_sum": 7.0 * 100 * scale / it, "tokens": 100.0} for it in iterations]


def test_the_switch_holds_the_samples_losses_and_prediction(advice, tmp_path, monkeypatch):  # noqa: F811
    checked = lc.to_check(advice)
    # each profile counts its steps from its own start: the resumed run's 0, 1 are iterations 3, 4
    replays = {(tmp_path / "ref", 0, 1): 1.0, (tmp_path / "ref", 2, 3): 1.02, (tmp_path / "sw", 0, 1): 0.5}
    monkeypatch.setattr(switch, "_replayed", lambda d, a, b: replays[(d, a, b)])
    reference, steps = _records(range(1, 5)), _steps(range(1, 5))
    # the switched layout holds the same samples a step elsewhere (another DP split, rotated)
    resumed = _records(range(3, 5), layout=((("vision", 0), 1), (("vision", 1), 1), (("language", 0), 2)), shift=3)
    check = switch.switch_check(advice, checked, 2, 4, tmp_path / "ref", reference, steps, tmp_path / "sw", resumed,
                                _steps(range(3, 5), 1 + 1e-6))
    assert check["sample_ids_equal"] and check["iterations"] == [3, 4] and check["to"] == checked.spec
    assert check["loss_max_rel_diff"] == pytest.approx(1e-6, rel=1e-3)
    assert check["replayed_step_s"] == {"before": 1.0, "after": 0.5, "reference_after": 1.02}
    assert check["predicted_error"] == pytest.approx(abs(checked.row.accelerated.step_time_s / 0.5 - 1))
    text = switch.verdict(check)
    assert "1.000 s before, 0.500 s after (x2.00)" in text and "each once" in text
    console = Console(width=250, record=True)
    console.print(switch.table(check))
    table = console.export_text()
    assert "The switch at iteration 2" in table and "(reference, uninterrupted)" in table and "0.500 s" in table


def test_a_switch_that_trains_other_samples_or_another_loss_fails_loudly(advice, tmp_path, monkeypatch):  # noqa: F811
    checked = lc.to_check(advice)
    monkeypatch.setattr(switch, "_replayed", lambda d, a, b: 1.0)
    reference, steps = _records(range(1, 5)), _steps(range(1, 5))
    skipped = [r for r in _records(range(3, 5)) if not (r["iteration"] == 4 and r["module"] == "language"
                                                          and r["dp_rank"] == 1)]
    with pytest.raises(InvariantViolation, match="iteration 4: other samples than the uninterrupted run"):
        switch.switch_check(advice, checked, 2, 4, tmp_path, reference, steps, tmp_path, skipped, _steps(range(3, 5)))
    with pytest.raises(InvariantViolation, match="trained iterations \\[4\\], not \\[3, 4\\]"):
        switch.switch_check(advice, checked, 2, 4, tmp_path, reference, steps, tmp_path, _records([4]),
                            _steps(range(3, 5)))
    with pytest.raises(InvariantViolation, match="past 1e-04"):
        switch.switch_check(advice, checked, 2, 4, tmp_path, reference, steps, tmp_path, _records(range(3, 5)),
                            _steps(range(3, 5), 1.001))


def test_the_resume_takes_the_fix_the_advisor_names_and_stops_where_it_says_none_will_do(tmp_path):
    from mimo_accel.carry_over import Barrier
    from mimo_accel.tools.layout.continuation import Continuation

    rng = Barrier("rng", "the checkpoint holds each rank's RNG state", "set checkpoint.load_rng=False")
    assert switch.resume_argv(tmp_path, Continuation("run", "x", "cmd")) == ["--load", str(tmp_path)]
    assert switch.resume_argv(tmp_path, Continuation("run", "x", barriers=(rng,))) == [
        "--load", str(tmp_path), "--no-load-rng"]
    optimizer = Barrier("optimizer", "saved 'dp_reshardable'", "save fully reshardable")
    with pytest.raises(InvariantViolation, match="cannot continue on x: saved 'dp_reshardable'"):
        switch.resume_argv(tmp_path, Continuation("run", "x", barriers=(rng, optimizer)))
    assert switch.save_argv(tmp_path, 20) == ["--save", str(tmp_path), "--save-interval", "10"]


def test_the_checkpoint_is_kept_as_a_job_that_died_after_it_leaves_it(tmp_path):
    ckpt = tmp_path / "ckpt"
    for it in (2, 4):
        (ckpt / f"iter_{it:07d}").mkdir(parents=True)
        (ckpt / f"iter_{it:07d}" / "run_config.yaml").write_text(f"iteration: {it}\n")
    (ckpt / "mimo_accel").mkdir()
    (ckpt / "mimo_accel" / "cost-models.json").write_text("{}")
    (ckpt / "latest_checkpointed_iteration.txt").write_text("4")
    kept = switch.interrupted_after(ckpt, 2)
    assert sorted(p.name for p in kept.iterdir()) == ["iter_0000002", "latest_checkpointed_iteration.txt",
                                                       "mimo_accel"]
    assert (kept / "latest_checkpointed_iteration.txt").read_text() == "2"
