"""Imported once by the test/rehearsal forkserver so forked ranks start with megatron loaded.

Only imports; patches nothing beyond what ``mimo_accel_dev.rehearse.cpu.prepare_imports`` needs to import
megatron.bridge here (the 3.11 back-port and, without Transformer Engine, its stand-in).
When the parent names a log file in ``MIMO_ACCEL_IMPORT_LOG`` (``run_ranks(log_file=...)``),
what these imports print (TE/Apex/modelopt warnings, megatron.bridge's INFO tracebacks) goes
there instead of the parent's console.
"""

import os

from mimo_accel.tools import quiet

# The logging handlers these imports add on stdout/stderr stay there: each forked rank points
# fds 1/2 at its own log, and they follow.
with quiet.output_to(os.environ.get(quiet.IMPORT_LOG_ENV) or None, repoint_handlers=False):
    import torch  # noqa: F401

    from mimo_accel_dev.rehearse import cpu

    cpu.prepare_imports()

    import megatron.bridge.data.megatron_mimo  # noqa: F401
    import megatron.bridge.models.megatron_mimo.megatron_mimo_builder  # noqa: F401
    import megatron.bridge.training.megatron_mimo_step  # noqa: F401
    import megatron.core.models.mimo  # noqa: F401
    import megatron.core.pipeline_parallel.bridge_communicator  # noqa: F401
