"""``mimo-accel simulate --layout SPEC``: what a layout's job will do, the spelling kept for
``mimo-accel layout --current SPEC``, which prices it the same way (one request, one problem, one
pricing path: the same seconds by construction). The planners' DP sweep it once ran is measured by
``benchmarks/bench_balance.py`` (every module's spread under each planner, up to 512 groups)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Optional

from rich.console import Console

from mimo_accel.tools.arguments import fail

PROG = "mimo-accel simulate"


def main(argv: Optional[Sequence[str]] = None, *, console: Optional[Console] = None) -> int:
    from mimo_accel.tools.layout.command import main as layout_main

    argv = list(sys.argv[1:] if argv is None else argv)
    asked = [a for a in argv if a == "--layout" or a.startswith("--layout=")]
    if not asked and not {"-h", "--help"} & set(argv):
        return fail(PROG, "give --layout SPEC (what that layout's job will do; the same as mimo-accel layout --current "
                          "SPEC); the planners' DP sweep is python benchmarks/bench_balance.py")
    return layout_main(argv, console=console, prog=PROG, current_flag="--layout")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
