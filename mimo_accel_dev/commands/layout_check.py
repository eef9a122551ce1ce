"""``make demo-reference``'s layout check: the layout ``mimo-accel layout`` recommends from the reference
run's own profile, rehearsed and replayed.

The advisor reads the receipt-like run with mimo_accel on (its cost model learnt while training, each
module's config, its layout) and the run's own cost index (the same samples), and searches every
layout of at most the reference's ranks + :data:`EXTRA_RANKS` CPU ranks. On CPU ranks every
communication term is 0 (what gloo's collectives cost is inside the measured thread times of the
run's own layout) and each module's TP is held at the run's (how TP scales on a CPU is not
modelled). The recommended layout is rehearsed on Bridge's loop with mimo_accel on, over the same
samples, and replayed; so is a third layout of the advisor's list, its predicted throughput
between theirs and apart from both, so that the advisor's order of the three can be held against
the replay's (a recommendation is checked the way a plan is)."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Optional

EXTRA_RANKS = 2
COMMUNICATION = ("zero on CPU ranks: gloo's collectives run inside the measured thread times of the run's own "
                 "layout, and each module's TP is held at the run's")


SEPARATION = 1.10  # the third layout's predicted throughput at least this far from both others


def advise_from(profile: Path, index: Path, budget: int, seq_length: int):
    """The advisor's answer from a rehearsal's profile and cost index, on CPU ranks (its top 12 of
    each side priced, for the third layout to be chosen among)."""
    from mimo_accel.tools.layout import advise

    return advise(str(profile), budget, index=str(index), seq_length=seq_length, top=12)


def third_layout(advice, reference: str) -> Optional[Any]:
    """Of the advisor's priced rows (other than the recommended and the reference), the one whose
    predicted samples/s is nearest the middle (in ratio) of theirs while :data:`SEPARATION` from
    both, so that the order of the three tests the model rather than the noise; else the one
    farthest from both."""
    rec, ref = advice.recommended, advice.current
    if ref is None or ref.accelerated is None:
        return None
    unique = {r.spec: r for r in (*advice.with_mimo_accel, *advice.without)}  # one row per layout
    others = [r for spec, r in unique.items() if r.fits and r.accelerated and spec not in (rec.spec, reference)]
    if not others:
        return None
    s_rec, s_ref = rec.accelerated.samples_per_s, ref.accelerated.samples_per_s

    def apart(row) -> float:
        s = row.accelerated.samples_per_s
        return min(abs(math.log(s / s_rec)), abs(math.log(s / s_ref)))

    middle = math.sqrt(s_rec * s_ref)
    spaced = [r for r in others if apart(r) >= math.log(SEPARATION)]
    if spaced:
        return min(spaced, key=lambda r: abs(math.log(r.accelerated.samples_per_s / middle)))
    return max(others, key=apart)


def run_argv(layout, base: dict) -> tuple[int, int, int, list[str], int]:
    """(vision dp, language dp, micro-batch, the example's layout flags, ranks per language replica) of
    ``layout`` (an advisor :class:`~mimo_accel.tools.layout.spec.LayoutSpec`)."""
    from mimo_accel.modules import LANGUAGE

    lang = layout.modules[LANGUAGE]
    vision = next(m for m in layout.modules if m.name != LANGUAGE)
    if vision.tp != 1:
        raise ValueError(f"{layout.spec}: the rehearsal runs its encoder at TP 1")
    argv = ["--gbs", str(layout.gbs), "--language-tp", str(lang.tp), "--language-pp", str(lang.pp),
            "--language-layers", str(base["language_layers"]), "--vision-layers", str(base["vision_layers"]),
            "--image-mix", "receipts"]
    return vision.dp, lang.dp, layout.mbs, argv, lang.tp * lang.pp


def _replayed(run_dir: Path) -> tuple[Optional[float], int]:
    from mimo_accel.profiler.run import read_run
    from mimo_accel.tools.report.summary import summarize

    run = read_run(run_dir)
    return summarize(run).get("step_time_replayed_p50"), int(run.world_size or len(run.ranks))


def layout_check(advice, reference_dir: Path, runs: dict[str, Path], budget: int) -> dict[str, Any]:
    """The JSON's ``layout_check`` from the advice and the rehearsed runs (``runs``: spec -> profile
    directory, the reference's included)."""
    gbs = advice.problem.gbs
    ref = advice.current
    rec = advice.recommended
    rows = {r.spec: r for r in (*advice.with_mimo_accel, *advice.without, ref) if r is not None}
    replayed, ranks = {}, {}
    for spec, path in runs.items():
        replayed[spec], ranks[spec] = _replayed(path)
    per_s = {s: gbs / t if t else None for s, t in replayed.items()}
    per_rank = {s: v / ranks[s] if v else None for s, v in per_s.items()}
    predicted = {s: rows[s].accelerated.samples_per_s for s in runs if s in rows}
    predicted_step = {s: rows[s].accelerated.step_time_s for s in runs if s in rows}

    def side(values: dict) -> dict:
        return {"reference": values.get(ref.spec), "recommended": values.get(rec.spec)}

    gain = {k: (v["recommended"] / v["reference"] if v["recommended"] and v["reference"] else None)
            for k, v in (("samples_per_s", side(per_s)), ("samples_per_s_per_rank", side(per_rank)))}
    by_prediction = sorted(predicted, key=lambda s: -predicted[s])
    by_replay = sorted((s for s in per_s if per_s[s] is not None), key=lambda s: -per_s[s])
    step = replayed.get(rec.spec)
    return {
        "budget": budget, "communication": COMMUNICATION, "reference": ref.spec, "recommended": rec.spec,
        "samples_per_s": side(per_s), "samples_per_s_per_rank": side(per_rank), "gain": gain,
        "predicted_step_s": rec.accelerated.step_time_s, "replayed_step_s": step,
        "predicted_error": abs(rec.accelerated.step_time_s / step - 1.0) if step else None,
        "reference_predicted_step_s": ref.accelerated.step_time_s, "reference_replayed_step_s": replayed.get(ref.spec),
        "order": {"predicted": by_prediction, "replayed": by_replay, "same": by_prediction == by_replay,
                  "predicted_samples_per_s": predicted, "replayed_samples_per_s": per_s,
                  "predicted_step_s": predicted_step, "replayed_step_s": replayed, "ranks": ranks},
        "profiles": {s: str(p) for s, p in runs.items()}, "advice_from": str(reference_dir),
    }


def table(check: dict):
    """The check as a rich Table: each rehearsed layout's ranks, predicted and replayed step and samples/s."""
    from rich.table import Table

    t = Table(title=f"The layout to run next (mimo-accel layout, at most {check['budget']} CPU ranks), rehearsed "
                    "and replayed", title_justify="left")
    for col in ("layout", "ranks", "predicted step", "replayed step", "samples/s predicted", "samples/s replayed",
                "samples/s per rank"):
        # a spec's parts fold onto lines of their own in a narrow terminal rather than being cut
        t.add_column(col, justify="left" if col == "layout" else "right", overflow="fold",
                     min_width=20 if col == "layout" else None)
    order = check["order"]
    for spec in order["predicted"]:
        role = {check["reference"]: " (reference)", check["recommended"]: " (recommended)"}.get(spec, "")
        per_s, ranks = order["replayed_samples_per_s"].get(spec), order["ranks"].get(spec)
        replayed = order["replayed_step_s"].get(spec)
        t.add_row(spec + role, str(ranks), f"{order['predicted_step_s'][spec]:.3f} s",
                  f"{replayed:.3f} s" if replayed else "—", f"{order['predicted_samples_per_s'][spec]:.1f}",
                  f"{per_s:.1f}" if per_s else "—", f"{per_s / ranks:.2f}" if per_s and ranks else "—")
    return t


def verdict(check: dict) -> str:
    g, err, step = check["gain"], check["predicted_error"], check["replayed_step_s"]
    if None in (g["samples_per_s"], g["samples_per_s_per_rank"], err, step):
        return (f"recommended {check['recommended']}: a rehearsed run has no replayed step (no per-micro-batch "
                "times in its profile), so the advisor is not checked")
    same = "the same order as" if check["order"]["same"] else "NOT the order of"
    return (f"recommended {check['recommended']}: replayed samples/s x{g['samples_per_s']:.2f} the reference's, "
            f"x{g['samples_per_s_per_rank']:.2f} per rank; its predicted step {check['predicted_step_s']:.3f} s "
            f"against {step:.3f} s replayed ({err:.0%} off); the advisor ranks the "
            f"{len(check['order']['predicted'])} rehearsed layouts in {same} the replay")
