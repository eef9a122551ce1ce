"""The training script's ``--trace`` record and its ``TRAIN_MIMO_KILL`` switch
(:mod:`mimo_accel_dev.rehearse.bridge_script`'s docstring describes both)."""

from __future__ import annotations

import json
import os
import signal
from typing import Optional

import torch.distributed as dist

KILL_ENV = "TRAIN_MIMO_KILL"


class _Trace:
    """Per-rank record of what each training iteration trained (see --trace)."""

    def __init__(self, path: Optional[str]):
        self.path = path
        self.where: dict = {}
        self.train_iterator = None
        self.pending_ids: list = []  # filled by the train iterator, drained by the forward step
        self.current: Optional[dict] = None

    def begin(self, iteration: int) -> None:
        if self.current is not None and self.current["iteration"] != iteration:
            self.flush()
        if self.current is None:
            self.current = dict(self.where, iteration=iteration, ids=[], loss_sum=None, tokens=None, loss=None)

    def take_ids(self) -> None:
        self.current["ids"].extend(self.pending_ids)
        self.pending_ids.clear()

    def add_loss(self, loss_sum: float, tokens: float) -> None:
        rec = self.current
        rec["loss_sum"] = (rec["loss_sum"] or 0.0) + loss_sum
        rec["tokens"] = (rec["tokens"] or 0.0) + tokens
        rec["loss"] = rec["loss_sum"] / rec["tokens"] if rec["tokens"] else None

    def flush(self) -> None:
        if self.current is None:
            return
        if self.path:
            line = (json.dumps(self.current) + "\n").encode()
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, line)  # one append per line: ranks can share the file
            finally:
                os.close(fd)
        self.current = None


class TracedForwardStep:
    """Bridge's MIMO forward step, plus the --trace record and the TRAIN_MIMO_KILL switch."""

    def __init__(self, forward_step, trace: _Trace, kill: Optional[tuple[int, int]]):
        self.forward_step = forward_step
        self.trace = trace
        self.kill = kill

    def __call__(self, state, data_iterator, model):
        training = data_iterator is self.trace.train_iterator and data_iterator is not None
        if not training:  # evaluation: nothing to record
            return self.forward_step(state, data_iterator, model)
        iteration = state.train_state.step + 1
        if self.kill is not None and self.kill == (dist.get_rank(), iteration):
            self.trace.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        self.trace.begin(iteration)
        if "layer_numbers" not in self.trace.where:
            self.trace.where["layer_numbers"] = self.trace.current["layer_numbers"] = built_layer_numbers(model)
        output, loss_func = self.forward_step(state, data_iterator, model)
        self.trace.take_ids()
        if loss_func is None:
            return output, None

        def traced_loss(output_tensor):
            total, tokens, report = loss_func(output_tensor)
            loss_sum, n = (float(x) for x in report["lm loss"].view(-1).tolist())
            self.trace.add_loss(loss_sum, n)
            return total, tokens, report

        return output, traced_loss


def built_layer_numbers(model) -> list[int]:
    """The numbers, in the whole model, of the megatron-core transformer layers this rank built (its
    pipeline stage's share of its module: what a PP split decided)."""
    from megatron.core.transformer.transformer_layer import TransformerLayer

    return sorted(int(m.layer_number) for m in model.modules() if isinstance(m, TransformerLayer))


def _kill_switch() -> Optional[tuple[int, int]]:
    raw = os.environ.get(KILL_ENV)
    if not raw:
        return None
    try:
        rank, iteration = (int(x) for x in raw.split(":"))
    except ValueError:
        raise SystemExit(f"{KILL_ENV}={raw!r}: expected RANK:ITERATION, e.g. 1:5") from None
    return rank, iteration
