"""The example training script (examples/train_mimo.py) as the tests load and run it on a rank."""

from __future__ import annotations

import os

from tests._scripts import load_script


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
