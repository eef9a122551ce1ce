"""Imported once by the test/rehearsal forkserver so forked ranks start with megatron loaded.

Only imports; patches nothing beyond what ``mimo_accel.cpu.prepare_imports`` needs to import
megatron.bridge here (the 3.11 back-port and, without Transformer Engine, its stand-in).
"""

import torch  # noqa: F401

from mimo_accel import cpu

cpu.prepare_imports()

import megatron.bridge.data.megatron_mimo  # noqa: E402,F401
import megatron.bridge.models.megatron_mimo.megatron_mimo_builder  # noqa: E402,F401
import megatron.bridge.training.megatron_mimo_step  # noqa: E402,F401
import megatron.core.models.mimo  # noqa: E402,F401
import megatron.core.pipeline_parallel.bridge_communicator  # noqa: E402,F401
