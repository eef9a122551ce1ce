"""How to continue a profiled run on the layout ``mimo-accel layout --from DIR`` recommends.

The run's profile header records what its checkpoint depends on (``layout["run"]``, written by
:func:`mimo_accel.runtime.resume.run_record`: each module's sizes, the batch, the checkpoint
directory and format, the distributed optimizer's sharding, the sampler). The way on is upstream's
Qwen3.5-VL launcher (Megatron-Bridge ``examples/megatron_mimo/qwen35_vl/finetune_qwen35_vl.py``:
``--load-checkpoint`` sets ``checkpoint.load``, ``--checkpoint-dir`` ``checkpoint.save``; it refuses
``--pretrained-checkpoint`` beside ``--load-checkpoint``) resumed from the run's checkpoint directory
with the new ``--component`` strings, the same global batch and the same ``--train-iters``; what the
checkpoint carries over, and what it cannot with the setting that makes it, is
:mod:`mimo_accel.carry_over`'s.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from rich.console import Console
from rich.markup import escape

from mimo_accel.carry_over import Barrier, RunSettings, batch_barrier, carried, load_barriers, order_barriers

LAUNCHER = "examples/megatron_mimo/qwen35_vl/finetune_qwen35_vl.py"
_RANK_FILE = re.compile(r"^rank(\d+)\.jsonl$")


@dataclass(frozen=True)
class Continuation:
    """How to continue the run in ``run_dir`` on ``layout`` (a spec): the launcher's line (None
    where nothing can continue), what carries over, what cannot (each with its fix), and notes."""

    run_dir: str
    layout: str
    command: Optional[str] = None
    checkpoint_dir: Optional[str] = None
    carried: tuple[str, ...] = ()
    barriers: tuple[Barrier, ...] = ()
    notes: tuple[str, ...] = ()
    switch: bool = True  # False: the recommendation is the run's own layout

    def to_doc(self) -> dict[str, Any]:
        return {"run": self.run_dir, "layout": self.layout, "switch": self.switch, "command": self.command,
                "checkpoint_dir": self.checkpoint_dir, "carries_over": list(self.carried),
                "cannot_carry_over": [dataclasses.asdict(b) for b in self.barriers], "notes": list(self.notes)}


def run_record(directory: str) -> Optional[dict]:
    """The ``layout["run"]`` record of the lowest rank's header in a profile directory (None: none)."""
    files = sorted((int(m.group(1)), p) for p in Path(directory).iterdir() if (m := _RANK_FILE.match(p.name)))
    for _, path in files:
        with open(path, encoding="utf-8") as f:
            try:
                header = json.loads(f.readline() or "{}")
            except json.JSONDecodeError:
                continue
        record = (header.get("layout") or {}).get("run") if isinstance(header, dict) else None
        if isinstance(record, dict):
            return record
    return None


def _command(row, saved: RunSettings, checkpoint: str) -> str:
    from mimo_accel.tools.layout.advice import settings

    s = settings(row.layout)
    flags = [f"--load-checkpoint {checkpoint}", f"--checkpoint-dir {checkpoint}",
             *(f"{k} {v}" for k, v in s["launcher"].items() if k.startswith("--"))]
    if saved.train_iters:
        flags.append(f"--train-iters {saved.train_iters}")
    flags.append(f"--dataloader-type {saved.dataloader_type}")
    split = " and the language model's split above (the launcher has no flag for it)" if s["language_config"] else ""
    return (f"{LAUNCHER} {' '.join(flags)} {' '.join(f'--component {c}' for c in s['components'])}  "
            f"(world size {s['launcher']['world_size']}; the run's other flags as they were, without "
            f"--pretrained-checkpoint{split})")


def _order_notes(saved: RunSettings, now: RunSettings) -> tuple[list[Barrier], list[str]]:
    """What the advisor can tell of the sample order without the dataset's length: a change of the
    canonical grid or micro-batch under scalable cyclic reads stops it; a micro-batch change under
    flat cyclic reads depends on the length (checked by the run)."""
    both = math.lcm(saved.micro_batch, now.micro_batch) * 1024  # a length that leaves no remainder by either
    stops = order_barriers(saved, now, samples=both, consumed=0)
    notes = []
    if saved.dataloader_type == "cyclic" and not saved.canonical_reads and saved.micro_batch != now.micro_batch:
        notes.append(f"the run reads in cyclic order: micro-batches of {now.micro_batch} keep its order only where the "
                     f"dataset's length leaves the same remainder by {now.micro_batch} as by {saved.micro_batch} (any "
                     "length divisible by both does); mimo_accel checks it when the train loader is built and stops "
                     "before the first step otherwise")
    return stops, notes


def continuation(run_dir: str, row, current=None) -> Continuation:
    """How to continue the run profiled in ``run_dir`` on ``row`` (the recommended
    :class:`~mimo_accel.tools.layout.advice.Row`); ``current``: the run's own row, where it is the same
    layout nothing switches."""
    layout = row.layout
    record = run_record(run_dir)
    if record is None:
        return Continuation(run_dir, row.spec, notes=(
            "the profile does not record the run's checkpoint settings (a profile made before mimo_accel recorded "
            f"them): resume with {LAUNCHER} --load-checkpoint DIR and the settings above",))
    saved = RunSettings.from_doc(record)
    if current is not None and current.spec == row.spec:
        return Continuation(run_dir, row.spec, switch=False)
    now = dataclasses.replace(saved, parallelism={m.name: (m.tp, m.pp, m.dp) for m in layout.modules},
                              global_batch=layout.gbs, micro_batch=layout.mbs)
    barriers = load_barriers(saved, now)
    batch = batch_barrier(saved, now)
    stops, notes = _order_notes(saved, now)
    barriers += ([batch] if batch else []) + stops
    checkpoint = saved.save or saved.load
    if checkpoint is None:
        barriers.append(Barrier("checkpoint", "the run saves no checkpoint (checkpoint.save unset; the launcher's "
                                              "--checkpoint-dir)", "save one (checkpoint.save, save_interval) and "
                                                                    "continue from it"))
    command = _command(row, saved, checkpoint) if checkpoint is not None and not barriers else None
    return Continuation(run_dir, row.spec, command, checkpoint, tuple(carried(saved, now, tuple(barriers))),
                        tuple(barriers), tuple(notes))


def render_continuation(way: Continuation, console: Optional[Console] = None) -> None:
    console = console or Console()
    if not way.switch:
        console.print(f"[bold]The run in {escape(way.run_dir)} goes on as it is[/]: the recommendation is its own "
                      "layout", highlight=False)
        return
    where = f", from its checkpoints in {escape(way.checkpoint_dir)}" if way.checkpoint_dir else ""
    head = "To continue" if way.command else "What stops continuing"
    console.print(f"[bold]{head} the run in {escape(way.run_dir)} on {escape(way.layout)}[/]{where}:", highlight=False)
    if way.command:
        console.print(f"  {escape(way.command)}", highlight=False, soft_wrap=True)
    if way.carried:
        console.print(f"  carries over: {escape('; '.join(way.carried))}", highlight=False, soft_wrap=True)
    for b in way.barriers:
        console.print(f"  [red]cannot carry over[/] ({escape(b.what)}): {escape(b.line())}", highlight=False,
                      soft_wrap=True)
    for note in way.notes:
        console.print(f"  [yellow]note:[/] {escape(note)}", highlight=False, soft_wrap=True)


__all__ = ["Continuation", "continuation", "render_continuation", "run_record"]
