"""How many examples the property tests draw: the quick loop's share, or all of them.

Each property test names the examples it draws for a thorough run (``examples(250)``). The
``dev`` profile (the default, ``pytest -m "not distributed"``) draws a share of them, at least
``FLOOR``; ``HYPOTHESIS_PROFILE=ci`` (``make test``) draws every one. A failure either profile
finds is kept in ``.hypothesis/`` and replayed first by the next run of either.
"""

from __future__ import annotations

import os

from hypothesis import settings

PROFILE_ENV = "HYPOTHESIS_PROFILE"
SHARES = {"dev": 0.4, "ci": 1.0}
FLOOR = 10

settings.register_profile("dev", deadline=None)
settings.register_profile("ci", deadline=None, print_blob=True)

PROFILE = os.environ.get(PROFILE_ENV, "dev")
if PROFILE not in SHARES:
    raise ValueError(f"{PROFILE_ENV}={PROFILE!r}: the profiles are {', '.join(SHARES)}")
settings.load_profile(PROFILE)


def examples(thorough: int) -> int:
    """The examples a test draws under the loaded profile: ``thorough`` under ``ci``."""
    return min(thorough, max(FLOOR, round(thorough * SHARES[PROFILE])))
