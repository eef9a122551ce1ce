"""Put the development kit on this interpreter's path: a ``mimo_accel_dev.pth`` in its site-packages
naming this checkout. ``make setup`` runs it after ``pip install -e .``, whose editable install maps
``mimo_accel`` only (the wheel's package list, pyproject.toml)."""

from __future__ import annotations

import sysconfig
from pathlib import Path

PTH = "mimo_accel_dev.pth"


def main() -> Path:
    checkout = Path(__file__).resolve().parents[1]
    pth = Path(sysconfig.get_paths()["purelib"]) / PTH
    pth.write_text(f"{checkout}\n", encoding="utf-8")
    return pth


if __name__ == "__main__":
    print(f"mimo_accel_dev on the path: {main()}")
