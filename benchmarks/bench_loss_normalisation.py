"""How far reordering moves the gradient under megatron's per-replica loss normalisation.

With ``calculate_per_token_loss=False`` (megatron-core's default) each language replica's loss is
the mean over its own loss tokens, per micro-batch, and the replicas' gradients are averaged: a
sample's weight in the gradient is 1/(tokens of the cell it lands in). Reordering moves samples
between cells, so it changes the gradient; a plan that gives every (replica, micro-batch) cell the
same tokens makes the per-replica mean equal to the per-token loss exactly.

Side by side in one run, on Bridge's loop (``examples/train_mimo.py``: ``pretrain_megatron_mimo``
on CPU gloo ranks), vision dp2 -> language dp2, mimo_accel's synthetic samples with 0-3 images of
varied sizes (``--varied``), the same samples every run:

  per-token            sharded reads + packing (upstream's contiguous split),
                       ``calculate_per_token_loss=True``: the reference gradient
  per-replica          the same with ``--no-per-token-loss``: per-replica means
  + reorder (vision)   all features, ``--no-per-token-loss``, a plan on the vision cost only (the
                       planner shipped before the joint one)
  + reorder (joint)    the same with the shipped plan (``balance_modules``: vision cost and real
                       language tokens per replica balanced together)
  + reorder (tokens)   a plan that equalises the real language tokens (text + image
                       placeholders) per language replica and micro-batch, vision ignored
  + reorder (loss)     a plan that equalises the *loss* tokens per language replica and
                       micro-batch (what the normaliser divides by): the bound
  + reorder, per-token all features with the per-token loss: equals the reference

All reorders plan a whole step (``reorder_window`` = micro-batches per step). For each run: the
relative L2 distance of the iteration-1 gradient (every parameter's ``main_grad`` as the
optimizer gets it, vision and language) from the reference's, the grad norm, the spread of loss
tokens over the language (replica, micro-batch) cells, and the per-token loss of iterations 1-4
relative to the reference's.

    .venv/bin/python benchmarks/bench_loss_normalisation.py [--iters 4] [--mbs 8] [--gbs 16] [--runs NAMES] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

VDP, LDP = 2, 2


def _record_optimizer(out: Path) -> None:
    """Every optimizer step: the grad norm; the first: every parameter's gradient (this rank)."""
    import torch
    from megatron.core.models.mimo import optimizer as mimo_optimizer

    step = mimo_optimizer.MimoOptimizer.step
    calls = {"n": 0}

    def recording_step(self):
        calls["n"] += 1
        if calls["n"] == 1:
            grads = [(getattr(p, "main_grad", None) if getattr(p, "main_grad", None) is not None else p.grad)
                     for group in self.param_groups for p in group["params"]]
            flat = torch.cat([g.detach().reshape(-1).double() for g in grads if g is not None]) if grads else None
            torch.save(flat, out / "grads.pt")
        result = step(self)
        with open(out / "grad_norm.jsonl", "a") as f:
            f.write(json.dumps(None if result[1] is None else float(result[1])) + "\n")
        return result

    mimo_optimizer.MimoOptimizer.step = recording_step


def _loss_tokens(indices) -> "list[int]":
    """Loss tokens of the --varied synthetic samples (what the per-replica normaliser counts)."""
    from mimo_accel_dev.rehearse import stack as st

    spec = st.VariedSpec()
    out = []
    for i in indices:
        s = spec(int(i))
        out.append(s.text_tokens if s.images else s.text_tokens - 1)
    return out


def _install_plan(kind: str) -> None:
    """Replace the shipped joint plan of CostIndexPlanner by the vision-only, real-token or
    loss-token plan."""
    import numpy as np

    from mimo_accel import planner
    from mimo_accel.balance import balanced_order, module_spreads

    def plan(self, indices, micro_batches=1, model=None):
        idx = np.asarray(indices, dtype=np.int64)
        costs = self.costs(indices, model)
        if kind == "vision":  # the vision cost alone, as the planner shipped before the joint one
            order = balanced_order(costs["vision"], VDP * micro_batches)
        elif kind == "tokens":  # equal real tokens (text + image placeholders) per language cell
            order = balanced_order(self.index.tokens(idx).astype(float), LDP * micro_batches)
        else:  # loss: equal loss tokens per (language replica, micro-batch) cell
            order = balanced_order(np.asarray(_loss_tokens(indices), dtype=float), LDP * micro_batches)
        return [indices[p] for p in order], module_spreads(costs, self.dps, order, micro_batches)

    planner.CostIndexPlanner.__call__ = plan


def _train(rank, world, argv, features, plan, out):
    from tests._example import run_example

    out = Path(out) / f"rank{rank}"
    out.mkdir(parents=True, exist_ok=True)
    _record_optimizer(out)
    if plan:
        _install_plan(plan)
    return run_example(argv, features, {})["notes"]


# Upstream as shipped cannot train this data on this layout (its slice of the patch-packed images
# stops with "Number of vision tokens (49) does not match number of vision embeddings (47)"), so the
# contiguous split is sharded reads + packing, which keep upstream's split and its math.
RUNS = {
    "per-token": (True, "shard+pack", None),
    "per-replica": (False, "shard+pack", None),
    "+ reorder (vision)": (False, "all", "vision"),
    "+ reorder (joint)": (False, "all", None),
    "+ reorder (tokens)": (False, "all", "tokens"),
    "+ reorder (loss)": (False, "all", "loss"),
    "+ reorder, per-token": (True, "all", None),
}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--iters", type=int, default=4)
    p.add_argument("--mbs", type=int, default=8, help="global micro-batch size")
    p.add_argument("--gbs", type=int, default=16, help="global batch size")
    p.add_argument("--runs", default=",".join(RUNS),
                   help="the runs to make, comma-separated (default: all); the reference, per-token, always runs")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    asked = [name.strip() for name in args.runs.split(",") if name.strip()]
    unknown = [name for name in asked if name not in RUNS]
    if unknown:
        p.error(f"--runs: no run named {', '.join(map(repr, unknown))}; the runs: {', '.join(RUNS)}")
    runs = {name: RUNS[name] for name in RUNS if name == "per-token" or name in asked}

    import torch

    from mimo_accel_dev.rehearse.ranks import run_ranks

    micro_batches = args.gbs // args.mbs
    work = Path(tempfile.mkdtemp(prefix="bench-loss-norm-"))
    results = {}
    for name, (per_token, features, plan) in runs.items():
        out = work / name.replace(" ", "_").replace("(", "").replace(")", "").replace(",", "")
        trace = out / "trace.jsonl"
        out.mkdir(parents=True)
        run_argv = ["--cpu", "--vision-dp", str(VDP), "--language-dp", str(LDP), "--mbs", str(args.mbs),
                    "--gbs", str(args.gbs), "--train-iters", str(args.iters), "--eval-interval", "0",
                    "--varied", "--trace", str(trace), "--per-token-loss" if per_token else "--no-per-token-loss"]
        feats = (dict(sharded_reads=True, packing=True) if features == "shard+pack" else
                 dict(sharded_reads=True, reorder=True, packing=True, reorder_window=micro_batches))
        notes = run_ranks(_train, VDP + LDP, run_argv, feats, plan, str(out), deadline_s=600)
        records = [json.loads(line) for line in trace.read_text().splitlines()]
        losses = {}
        cells = []
        for r in records:
            if r["loss_sum"] is None:
                continue
            s = losses.setdefault(r["iteration"], [0.0, 0.0])
            s[0] += r["loss_sum"]
            s[1] += r["tokens"]
            if r["iteration"] == 1:
                cells += [sum(_loss_tokens(micro)) for micro in r["ids"]]
        grads = torch.cat([torch.load(out / f"rank{r}" / "grads.pt") for r in (0, VDP)])  # one rank per module
        norms = [json.loads(line) for line in (out / "rank0" / "grad_norm.jsonl").read_text().splitlines()]
        results[name] = dict(grads=grads, grad_norm=norms, loss={it: s / n for it, (s, n) in sorted(losses.items())},
                             cells=sorted(cells), said=any("calculate_per_token_loss=False" in str(n)
                                                            for n in notes[0]))

    ref = results["per-token"]
    rows = []
    print(f"\nBridge's loop, vision dp{VDP} -> language dp{LDP}, --varied, mbs {args.mbs}, gbs {args.gbs} "
          f"({micro_batches} micro-batches a step), {args.iters} iterations; reference: per-token\n")
    head = f"{'run':<22} {'|g-g_ref|/|g_ref| it1':>22} {'grad norm it1':>14} {'loss tokens/cell':>18}  " \
           f"{'loss rel. diff it1..' + str(args.iters):<40} said"
    print(head)
    print("-" * len(head))
    for name, r in results.items():
        dist = float((r["grads"] - ref["grads"]).norm() / ref["grads"].norm())
        rel = [abs(r["loss"][it] - ref["loss"][it]) / abs(ref["loss"][it]) for it in sorted(ref["loss"])]
        cells = f"{min(r['cells'])}-{max(r['cells'])}"
        print(f"{name:<22} {dist:>22.2e} {r['grad_norm'][0]:>14.6f} {cells:>18}  "
              f"{' '.join(f'{x:.1e}' for x in rel):<40} {'yes' if r['said'] else '-'}")
        rows.append(dict(run=name, grad_distance_it1=dist, grad_norm=r["grad_norm"], loss=r["loss"],
                         loss_rel_diff=rel, loss_tokens_per_cell=r["cells"], said=r["said"]))
    if args.json:
        Path(args.json).write_text(json.dumps(dict(mbs=args.mbs, gbs=args.gbs, iters=args.iters, runs=rows),
                                              indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
