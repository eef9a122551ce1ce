"""One thin file per upstream site: each binds an upstream call (through its own signature,
:mod:`.upstream_call`) to the runtime's services. The table of which feature installs which lives
in :mod:`mimo_accel.patching.registry`."""
