"""The example training script (examples/train_mimo.py) as the tests load and run it on a rank."""

from __future__ import annotations

import os

import pytest

from tests._scripts import load_script


def bridge_source(path: str) -> str:
    """The text of ``megatron/bridge/<path>`` as installed ("" where it is not), read without
    importing Bridge: what a branch-only test asks of the installed upstream."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.find_spec("megatron.bridge")
    found = [Path(d) / path for d in (spec.submodule_search_locations or []) if (Path(d) / path).is_file()] if spec else []
    return found[0].read_text() if found else ""


def _language_pp_groups_deadlock() -> bool:
    """Whether this Bridge makes each rank build the embedding groups of its own PP group only
    (megatron_mimo_builder.populate_embedding_and_position_groups(pp_group), as at PR #4986's base):
    with more than one language PP group the ranks then create different groups and wait for each
    other for ever. Main fixed it (#4985, dc5bd147c: every rank builds every group in one order)."""
    text = bridge_source("models/megatron_mimo/megatron_mimo_builder.py")
    return "def populate_embedding_and_position_groups" in text and "pp_rank_groups" not in text


LANGUAGE_PP_DP = pytest.mark.skipif(_language_pp_groups_deadlock(), reason=(
    "this megatron-bridge deadlocks setting up a language model with PP > 1 and DP > 1 (it builds only its own "
    "PP group's embedding groups; fixed on main by #4985)"))


def load_example():
    """examples/train_mimo.py as a module (once per process)."""
    return load_script("examples/train_mimo.py", "mimo_accel_examples_train_mimo")


def run_example(argv, features: dict, env: dict) -> dict:
    """On one rank: the example's own main(argv), with mimo_accel enabled first when ``features``
    is not empty; returns ``mimo_accel.status()`` as the run left it, then disables."""
    import mimo_accel

    os.environ.update(env)
    if features:
        mimo_accel.enable(**features)
    try:
        load_example().main(argv)
        return mimo_accel.status()
    finally:
        mimo_accel.disable()


def train_rank(rank, world, argv, features: dict, env: dict) -> list:
    """One rank of ``run_ranks``: the example's own main(argv), with mimo_accel enabled first when
    ``features`` is not empty; returns the features that were active."""
    return run_example(argv, features, env)["active"]


def steps_from_trace(records: list) -> dict:
    """The example's --trace lines -> {iteration: {module name (every module that traced, "vision"
    and "language" always): sorted sample ids the module trained (counted on each replica's first
    pipeline stage and TP rank), "loss": the global per-token loss (the last stage's)}}."""
    out: dict = {}
    seen: set = set()
    for r in records:
        s = out.setdefault(r["iteration"], {"modules": {"vision": [], "language": []}, "sum": 0.0, "tokens": 0.0})
        stage = (r["module"], r["dp_rank"], r.get("pp_rank", 0), r["iteration"])
        if stage in seen:  # a replica's TP ranks train (and lose) the same samples alike
            continue
        seen.add(stage)
        if r.get("pp_rank", 0) == 0:  # every pipeline stage of a replica trains the same samples
            s["modules"].setdefault(r["module"], []).extend(i for micro in r["ids"] for i in micro)
        if r["loss_sum"] is not None:
            s["sum"] += r["loss_sum"]
            s["tokens"] += r["tokens"]
    return {it: {**{m: sorted(ids) for m, ids in s["modules"].items()}, "loss": s["sum"] / s["tokens"]}
            for it, s in sorted(out.items())}
