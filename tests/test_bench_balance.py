"""benchmarks/bench_balance.py's every-module part: generated workloads, four planners, the gates."""

from __future__ import annotations

import numpy as np
import pytest

from tests._scripts import load_script


@pytest.fixture(scope="module")
def bench():
    return load_script("benchmarks/bench_balance.py", "bench_balance")


def test_generated_workloads_are_what_the_benchmark_says(bench):
    for name in bench.MODULE_WORKLOADS:
        pool = bench.module_pool(name, 4000, seed=1)
        assert set(pool) == {"vision", "audio", "language", "language_with_audio"}
        assert all(c.shape == (4000,) and (c >= 0).all() for c in pool.values())
        assert (pool["language_with_audio"] >= pool["language"]).all()
        # half the samples carry voice clips; the others cost the audio encoder nothing
        assert 0.45 < (pool["audio"] > 0).mean() < 0.55
    chat = bench.gen_chat45(np.random.default_rng(0), 20000)
    assert abs((chat["images"] == 0).mean() - 0.45) < 0.01 and (chat["patches"][chat["images"] == 0] == 0).all()
    docs = bench.gen_documents(np.random.default_rng(0), 2000)
    assert docs["images"].min() == 1 and docs["images"].max() == 12
    # the language cost is L + L²/8192 with L = text + patches / 4
    rng = np.random.default_rng([3, 0xB41])
    s = bench.gen_receipts(rng, 50)
    L = s["text"] + s["patches"] // 4
    assert np.allclose(bench.module_pool("receipts", 50, seed=3)["language"], L + L.astype(float) ** 2 / 8192)


def test_every_module_rows_hold_four_planners_bounds_and_times(bench, capsys):
    rows = bench.module_rows(2, seed=0, sizes=((64, 8),))
    assert [(r["workload"], r["layout"]) for r in rows] == [
        (w, lay) for w in bench.MODULE_WORKLOADS for lay in bench.MODULE_LAYOUTS]
    for r in rows:
        assert r["dps"] == bench.MODULE_LAYOUTS[r["layout"]](8)
        for m in r["dps"]:
            assert set(r["spread"][m]) == set(bench.MODULE_PLANNERS)
            for p in bench.MODULE_PLANNERS:
                assert len(r["spread"][m][p]) == 2
                assert all(s >= b - 1e-9 for s, b in zip(r["spread"][m][p], r["bound"][m]))
        assert all(len(v) == 2 and min(v) >= 0 for v in r["ms"].values())
        g = bench.module_gates(r)
        assert g["worst_module"] in r["dps"] and g["worst_over_bound"] >= -1e-9 and g["time_ratio"] > 0
    three = next(r for r in rows if r["layout"] == "three")
    assert three["dps"] == {"vision": 8, "audio": 4, "language": 2}
    bench.print_module_table(rows, 2)
    out = capsys.readouterr().out
    assert "joint/vision-only time" in out and "gate: the worst module's joint spread" in out
    assert "gate: vision's joint spread" in out
