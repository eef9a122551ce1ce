"""``python -m mimo_accel ...``: the ``mimo-accel`` command."""

import sys

from mimo_accel.tools.cli import main

if __name__ == "__main__":
    sys.exit(main())
