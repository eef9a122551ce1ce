"""The product's size as docs/design.md counts it (mimo_accel_dev/product_size.py): what enable()
can reach holds none of the offline tools, and the count follows lazy imports."""

from __future__ import annotations

from mimo_accel_dev import product_size


def test_enable_reaches_the_runtime_and_the_core_not_the_tools():
    modules = product_size.reachable()
    assert "mimo_accel.runtime.patches.setup" in modules  # named only as a registry import
    assert "mimo_accel.runtime.measuring.calibration" in modules  # imported lazily, inside a function
    assert not [m for m in modules if m.startswith(("mimo_accel.tools", "mimo_accel_dev"))]


def test_the_count_prints_one_line(capsys):
    assert product_size.main([]) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith("reachable from enable(): ") and "the wheel: " in line
