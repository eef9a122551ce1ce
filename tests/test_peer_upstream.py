"""The peers of the rehearsal (``mimo-accel rehearse --peer reorder-buffer|4608``; ``upstream`` is the old
name of ``reorder-buffer``): installed in a rank's
planner, they plan exactly as their pure planners do; the rehearsal's JSON carries the peer as
``peer`` with ``peer.name``, and its console says whether the peer leaves the language model
worse than mimo_accel's plan."""

from __future__ import annotations

import io

import numpy as np
import pytest
from rich.console import Console

from mimo_accel import planner
from mimo_accel.balance import lpt_order
from mimo_accel.balance.peers import reorder_buffer_costs, reorder_buffer_order
from mimo_accel.costs import CostIndex, CostModel, ResizeRule
from mimo_accel.modules import Modules
from mimo_accel_dev.rehearse import peers
from mimo_accel.tools.report import sides

N = 64


def _columns(rng, n: int):
    """(items, rows, sq_rows) of one image encoder: 0 or 1 image a sample."""
    rows = np.where(rng.random(n) < 0.8, rng.integers(4, 900, n), 0)
    return (rows > 0).astype(np.int64), rows, rows * rows


def _index(encoders=("vision",), seed: int = 0) -> CostIndex:
    rng = np.random.default_rng(seed)
    return CostIndex(rng.integers(20, 2000, N),
                                  {name: (*_columns(rng, N), ResizeRule()) for name in encoders})


@pytest.fixture
def restored(monkeypatch):
    """The planner's own ``__call__`` back after the test (installing a peer replaces it)."""
    monkeypatch.setattr(planner.CostIndexPlanner, "__call__", planner.CostIndexPlanner.__call__)
    monkeypatch.delenv(peers.ENV, raising=False)
    return monkeypatch


LAYOUTS = {"1:1": {"vision": 4, "language": 4}, "fan-in": {"vision": 4, "language": 2},
           "fan-out": {"vision": 2, "language": 4}}


@pytest.mark.parametrize("micro_batches", [1, 2])
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_the_reorder_buffer_peer_plans_as_its_pure_planner(restored, layout, micro_batches):
    index, modules = _index(), Modules.from_dp_sizes(LAYOUTS[layout])
    indices = np.random.default_rng(1).permutation(N)[:32]
    peers.install("reorder-buffer")
    planned, predicted = planner.CostIndexPlanner(index, CostModel(), modules)(indices, micro_batches)
    spreads = predicted.spreads
    costs = reorder_buffer_costs(index.rows("vision", indices), index.tokens(indices))
    want = reorder_buffer_order(costs, modules.grid, micro_batches)
    assert planned == [int(indices[p]) for p in want]
    # the predicted spreads are still every module's, under the run's cost model
    assert set(spreads) == {"vision", "language"} and all(s >= 1.0 for s in spreads.values())
    assert {m: v.shape for m, v in predicted.loads.items()} == {m: (micro_batches, dp)
                                                                for m, dp in LAYOUTS[layout].items()}


def test_with_two_encoders_the_reorder_buffer_peer_prices_every_encoders_rows(restored):
    index = _index(("vision", "images2"), seed=2)
    modules = Modules.from_dp_sizes({"vision": 2, "images2": 2, "language": 2}, kinds={"images2": "image"})
    indices = np.arange(16)
    peers.install("reorder-buffer")
    planned, _ = planner.CostIndexPlanner(index, CostModel(), modules)(indices)
    patches = index.rows("vision", indices) + index.rows("images2", indices)
    assert planned == reorder_buffer_order(reorder_buffer_costs(patches, index.tokens(indices)), 2)


def test_the_4608_peer_stays_lpt_over_the_largest_dp(restored):
    index, modules = _index(seed=3), Modules.from_dp_sizes({"vision": 2, "language": 4})
    indices = np.arange(8, 40)
    restored.setenv(peers.ENV, "4608")
    peers.install_from_env()
    planned, _ = planner.CostIndexPlanner(index, CostModel(), modules)(indices, 2)
    rows = index.rows("vision", indices).astype(float)
    want = [j * 16 + p for j in range(2) for p in lpt_order(rows[j * 16:(j + 1) * 16], 4)]
    assert planned == [int(indices[p]) for p in want]


def test_an_unknown_peer_is_refused_naming_the_known_ones(restored):
    with pytest.raises(ValueError, match=r"'nope'.*\['4608', 'reorder-buffer'\]"):
        peers.install("nope")


def test_the_old_name_upstream_still_names_the_reorder_buffer_and_says_so():
    assert peers.resolve("upstream") == peers.resolve("reorder-buffer") == "reorder-buffer"
    assert peers.alias_note("reorder-buffer") is None and peers.alias_note("4608") is None
    note = peers.alias_note("upstream")
    assert note.startswith("--peer upstream is the old name of --peer reorder-buffer: #4608's reorder_buffer")
    assert "not on Bridge main" in note


def test_every_peer_is_named_by_where_its_code_is():
    """A PR and a commit, never a release that does not hold it."""
    for label in peers.LABELS.values():
        assert "#4608" in label and any(c in label for c in ("984a8a53", "ce55b79f"))
        assert "0.7" not in label and "merged" not in label


def _side(vision: float, language: float) -> dict:
    return {"module_order": ["vision", "language"], "step_time_p50": 2.0,
            "per_module": {"vision": {"max_over_mean_p50": vision}, "language": {"max_over_mean_p50": language}}}


@pytest.mark.parametrize("peer_language, worse", [(1.04, True), (1.01, False)])
def test_the_table_names_the_three_runs_and_one_line_judges_the_language_model(peer_language, worse):
    peer = dict(name=peers.LABELS["reorder-buffer"], **_side(1.08, peer_language))
    after = _side(1.02, 1.02)
    out = io.StringIO()
    Console(file=out, width=160).print(sides.table(_side(1.3, 1.005), peer, after))
    text = out.getvalue()
    assert all(s in text for s in ("upstream as shipped", "#4608's reorder_buffer (ce55b79f)", "mimo_accel",
                                   "vision straggler p50", "language straggler p50", "2.00 s"))
    verdict, line = sides.language_verdict(peer, after)
    assert verdict is worse
    assert line == (f"#4608's reorder_buffer (ce55b79f) {'leaves' if worse else 'does not leave'} the language model worse than "
                    f"mimo_accel's plan: language straggler p50 {peer_language:.3f} against 1.020")
    assert sides.language_verdict(peer, {"per_module": {}})[0] is None
