#!/usr/bin/env python3
"""A complete MegatronMIMO training script on Megatron Bridge's own entry point.

The script's body is mimo_accel_dev.rehearse.bridge_script (its docstring: the data, the vision
encoders, the flags); this file is what a user runs.

GPUs (NCCL), with or without mimo_accel:
    torchrun --nproc-per-node 8 examples/train_mimo.py --vision-dp 4 --language-dp 4
    MIMO_ACCEL=all mimo-accel run -- torchrun --nproc-per-node 8 examples/train_mimo.py ...
CPU rehearsal (gloo ranks through mimo_accel_dev.rehearse.cpu; no GPU needed):
    MIMO_ACCEL=all mimo-accel run -- torchrun --nproc-per-node 4 examples/train_mimo.py \\
        --cpu --vision-dp 2 --language-dp 2
    MIMO_ACCEL=all mimo-accel run -- torchrun --nproc-per-node 3 examples/train_mimo.py \\
        --cpu --vision-dp 2 --language-dp 1 --dataset images
The language model on two pipeline stages (megatron-core's multi-module 1F1B schedule; vision on
rank 0, language tp1 pp2 dp2 on ranks 1-4; encoders take no PP):
    MIMO_ACCEL=all mimo-accel run -- torchrun --nproc-per-node 5 examples/train_mimo.py \\
        --cpu --vision-dp 1 --language-dp 2 --language-pp 2 --mbs 2 --gbs 8
Two encoders, each on its own grid (vision on ranks 0-1, audio on rank 2, language on rank 3),
over real image and WAV files:
    MIMO_ACCEL=all mimo-accel run -- torchrun --nproc-per-node 4 examples/train_mimo.py \\
        --cpu --modalities vision,audio --vision-dp 2 --audio-dp 1 --language-dp 1
"""

import sys

from mimo_accel_dev.rehearse import cpu as _cpu

_cpu.prepare_imports_if_cpu(sys.argv[1:])  # --cpu: before anything imports megatron.bridge

from mimo_accel_dev.rehearse.bridge_script import main, parse_args  # noqa: E402,F401  (parse_args: in-process use)

if __name__ == "__main__":
    sys.exit(main())
