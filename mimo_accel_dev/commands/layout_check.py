"""``make demo-reference``'s layout check: the layout ``mimo-accel layout`` recommends from the reference
run's own profile, rehearsed and replayed.

The advisor reads the receipt-like run with mimo_accel on (its cost model learnt while training, each
module's config, its layout) and the run's own cost index (the same samples), and searches every
layout of at most the reference's ranks + :data:`EXTRA_RANKS` CPU ranks. On CPU ranks every
communication term is 0 (what gloo's collectives cost is inside the measured thread times of the
run's own layout) and each module's TP is held at the run's (how TP scales on a CPU is not
modelled). The advisor's own recommendation (``advisor_recommended``, its first / last PP split
included: the rehearsal's stack passes it to megatron-core) is rehearsed on Bridge's loop with
mimo_accel on, over the same samples, and replayed; so is a third layout of the advisor's list, its
predicted throughput between theirs and apart from both, so that the advisor's order can be held
against the replay's (a recommendation is checked the way a plan is). Where the advisor keeps the
current layout (``keep_current``) the best other layout it found is checked instead, labelled "best
found", never "recommended"; a layout the rehearsal cannot build is replaced by the best one it can,
labelled "stand-in"; where none is left the check says so (``outcome``) and rehearses nothing.

The order holds the two layouts priced before they ran: the advisor scales its costs so that the
reference prices at its own replayed step, so the reference's prediction is fitted
(``reference_fitted``) and cannot be out of place. Each rehearsed layout trains the reference's
samples in the same steps from the same weights (the rehearsal seeds each language layer by its
number, whatever the pipeline depth or split), so its per-step loss tokens must equal the
reference's and its per-step global loss must agree within :data:`LOSS_TOLERANCE`
(``loss_max_rel_diff``): a layout that computed other tokens, or other math, fails the check."""

from __future__ import annotations

import math
from pathlib import Path
from dataclasses import dataclass
from typing import Any, Optional, Union

from mimo_accel_dev.rehearse.rehearsal import InvariantViolation

EXTRA_RANKS = 2
#: The same samples from the same weights through the same math, summed in another order (another
#: micro-batch size, pipeline depth or split): measured within 2.5e-7 over 20 steps.
LOSS_TOLERANCE = 1e-4
COMMUNICATION = ("zero on CPU ranks: gloo's collectives run inside the measured thread times of the run's own "
                 "layout, and each module's TP is held at the run's")


SEPARATION = 1.10  # the third layout's predicted throughput at least this far from both others


def advise_from(profile: Path, index: Path, budget: int, seq_length: int):
    """The advisor's answer from a rehearsal's profile and cost index, on CPU ranks (its top 12 of
    each side priced, for the third layout to be chosen among)."""
    from mimo_accel.tools.layout import DataRequest, Request, Search, advise, build

    problem = build(Request(profile=str(profile), data=DataRequest(index=str(index), seq_length=seq_length)))
    return advise(problem, Search(budget, top=12))


def why_not_rehearsed(row) -> Optional[str]:
    """Why the rehearsal's stack cannot build ``row``'s layout (None: it can; a first / last PP split
    it builds)."""
    if not row.fits:
        return f"it does not fit ({row.why_not})"
    if any(m.tp != 1 for m in row.layout.modules.encoders):
        return "the rehearsal runs its encoder at TP 1"
    return None


@dataclass(frozen=True)
class Checked:
    """The layout the check rehearses beside the reference: the advisor's recommendation (``role``
    "recommended"), or, where the advisor keeps the current layout, its best other layout ("best
    found"), or one that stands in for a recommendation the rehearsal cannot build ("stand-in");
    ``why`` says which."""

    row: Any
    role: str
    why: str

    @property
    def spec(self) -> str:
        return self.row.spec


def to_check(advice) -> Union[Checked, str]:
    """What the check rehearses (:class:`Checked`), or why nothing is (a sentence)."""
    ref, rec = advice.current, advice.recommended
    others = [r for r in advice.ranked["mimo_accel"] if ref is None or r.spec != ref.spec]
    buildable = [r for r in others if why_not_rehearsed(r) is None]
    if advice.keep_current:
        if not buildable:
            return (f"the advisor keeps the current layout ({advice.margin}) and no other layout it ranked can be "
                    "rehearsed here")
        return Checked(buildable[0], "best found",
                       f"the advisor keeps the current layout ({advice.margin}); its best other layout that the "
                       "rehearsal builds, checked as found, not recommended")
    why = why_not_rehearsed(rec)
    if why is None:
        return Checked(rec, "recommended", "the advisor's recommendation, as it recommends it")
    stand_in = next((r for r in buildable if r.spec != rec.spec), None)
    if stand_in is None:
        return (f"the advisor recommends {rec.spec}, which the rehearsal cannot build ({why}), and no other layout "
                "it ranked can be")
    return Checked(stand_in, "stand-in", f"stands in for the advisor's recommendation {rec.spec}, which the "
                                         f"rehearsal cannot build ({why})")


def third_layout(advice, checked: Checked) -> Optional[Any]:
    """Of the advisor's priced rows (other than the checked one and the reference), the one whose
    predicted samples/s is nearest the middle (in ratio) of theirs while :data:`SEPARATION` from
    both, so that the order of the three tests the model rather than the noise; else the one
    farthest from both."""
    rec, ref = checked.row, advice.current
    if ref is None or ref.accelerated is None:
        return None
    unique = {r.spec: r for rows in advice.ranked.values() for r in rows}  # one row per layout
    others = [r for spec, r in unique.items() if r.accelerated and why_not_rehearsed(r) is None
              and spec not in (rec.spec, ref.spec)]
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
    for flag, layers in (("--language-first-stage-layers", layout.first), ("--language-last-stage-layers", layout.last)):
        if layers is not None:
            argv += [flag, str(layers)]
    return vision.dp, lang.dp, layout.mbs, argv, lang.tp * lang.pp


def _replayed(run_dir: Path) -> tuple[Optional[float], int]:
    from mimo_accel.profiler.run import read_run
    from mimo_accel.tools.report.summary import summarize

    run = read_run(run_dir)
    return summarize(run).get("step_time_replayed_p50"), int(run.world_size or len(run.ranks))


def compare_losses(reference: list[dict], runs: dict[str, list[dict]]) -> dict[str, float]:
    """Each rehearsed layout's largest relative difference from the reference run in the step's global
    loss (``runs``: spec -> :func:`~mimo_accel_dev.rehearse.rehearsal.bridge_steps`' result over the same
    samples). Only the step's sum is compared: under the per-token loss a micro-batch's loss is a sum
    over its own tokens, so another micro-batch size groups them otherwise. Raises past
    :data:`LOSS_TOLERANCE`, or where a step's loss tokens differ."""
    diffs = {}
    for spec, steps in runs.items():
        if len(steps) != len(reference):
            raise InvariantViolation(f"layout {spec}: {len(steps)} steps against the reference's {len(reference)}")
        worst = 0.0
        for it, (ref, run) in enumerate(zip(reference, steps), start=1):
            if run["tokens"] != ref["tokens"]:
                raise InvariantViolation(f"layout {spec}, iteration {it}: {run['tokens']:.0f} loss tokens against the "
                                         f"reference's {ref['tokens']:.0f}: it did not compute the same samples")
            worst = max(worst, abs(run["loss_sum"] - ref["loss_sum"]) / max(abs(ref["loss_sum"]), 1e-12))
        diffs[spec] = worst
    apart = {spec: d for spec, d in diffs.items() if d > LOSS_TOLERANCE}
    if apart:
        raise InvariantViolation("per-step losses differ from the reference's by "
                                 + ", ".join(f"{d:.1e} ({spec})" for spec, d in apart.items())
                                 + f" relative, past {LOSS_TOLERANCE:.0e}: not the same computation")
    return diffs


def loss_table(reference: str, runs: dict[str, list[dict]], roles: dict[str, str]):
    """Each rehearsed layout's per-step global loss (per token) beside the reference's, and the tokens
    (``roles``: spec -> the column's name)."""
    from rich.table import Table

    t = Table(title="receipts: per-iteration global loss (per token) of each rehearsed layout, the same samples "
                    "from the same weights")
    specs = [reference, *(s for s in runs if s != reference)]
    t.add_column("iteration", justify="right")
    for spec in specs:
        t.add_column(roles[spec], justify="right")
    t.add_column("tokens", justify="right")
    for it, ref in enumerate(runs[reference]):
        t.add_row(str(it + 1), *(f"{runs[s][it]['loss_sum'] / runs[s][it]['tokens']:.6f}" for s in specs),
                  f"{ref['tokens']:.0f}")
    return t


def advised(advice) -> dict[str, Any]:
    """What the advisor answered, whatever is rehearsed: its own pick (its split included) and whether
    it keeps the current layout, with its margin."""
    rec = advice.recommended
    return {"advisor_recommended": rec.spec, "advisor_recommended_split": rec.layout.split,
            "keep_current": advice.keep_current, "margin": advice.margin}


def nothing_to_check(advice, budget: int, why: str) -> dict[str, Any]:
    """The JSON's ``layout_check`` where no layout is rehearsed beside the reference (``why``)."""
    return {"budget": budget, **advised(advice), "reference": advice.current.spec if advice.current else None,
            "checked": None, "outcome": f"nothing rehearsed: {why}"}


def layout_check(advice, checked: Checked, reference_dir: Path, runs: dict[str, Path], budget: int,
                 loss_max_rel_diff: dict[str, float]) -> dict[str, Any]:
    """The JSON's ``layout_check`` from the advice, the layout checked (:func:`to_check`), the rehearsed
    runs (``runs``: spec -> profile directory, the reference's included) and :func:`compare_losses`'
    result.

    The advisor scales its compute costs so that the run it reads, the reference, prices at its
    replayed step: the reference's prediction is fitted, so the order is checked on the layouts
    priced before they ran."""
    gbs = advice.problem.gbs
    ref, rec = advice.current, checked.row
    rows = {r.spec: r for r in (*(r for rs in advice.ranked.values() for r in rs), ref) if r is not None}
    replayed, ranks = {}, {}
    for spec, path in runs.items():
        replayed[spec], ranks[spec] = _replayed(path)
    per_s = {s: gbs / t if t else None for s, t in replayed.items()}
    per_rank = {s: v / ranks[s] if v else None for s, v in per_s.items()}
    predicted = {s: rows[s].accelerated.samples_per_s for s in runs if s in rows}

    def side(values: dict) -> dict:
        return {"reference": values.get(ref.spec), "checked": values.get(rec.spec)}

    gain = {k: (v["checked"] / v["reference"] if v["checked"] and v["reference"] else None)
            for k, v in (("samples_per_s", side(per_s)), ("samples_per_s_per_rank", side(per_rank)))}
    priced = [s for s in predicted if s != ref.spec]
    by_prediction = sorted(priced, key=lambda s: -predicted[s])
    by_replay = sorted((s for s in priced if per_s[s] is not None), key=lambda s: -per_s[s])
    role = {s: "reference" if s == ref.spec else checked.role if s == rec.spec else "third" for s in runs}
    layouts = {s: {"role": role[s], "ranks": ranks[s], "predicted_step_s": rows[s].accelerated.step_time_s,
                   "replayed_step_s": replayed[s], "predicted_samples_per_s": predicted[s],
                   "replayed_samples_per_s": per_s[s], "replayed_samples_per_s_per_rank": per_rank[s],
                   "pipeline_split": rows[s].layout.split, "fitted": s == ref.spec,
                   "loss_max_rel_diff": loss_max_rel_diff.get(s)}
               for s in by_prediction + [ref.spec] if s in runs}
    step = replayed.get(rec.spec)
    return {
        "budget": budget, "communication": COMMUNICATION, **advised(advice), "reference": ref.spec,
        "checked": rec.spec, "checked_role": checked.role, "checked_why": checked.why,
        "samples_per_s": side(per_s), "samples_per_s_per_rank": side(per_rank), "gain": gain,
        "predicted_step_s": rec.accelerated.step_time_s, "replayed_step_s": step,
        "predicted_error": abs(rec.accelerated.step_time_s / step - 1.0) if step else None,
        "reference_predicted_step_s": ref.accelerated.step_time_s, "reference_replayed_step_s": replayed.get(ref.spec),
        "reference_fitted": True,
        "loss_max_rel_diff": dict(loss_max_rel_diff), "loss_tolerance": LOSS_TOLERANCE,
        "order": {"predicted": by_prediction, "replayed": by_replay, "same": by_prediction == by_replay,
                  "of": "the layouts priced before they ran (the reference's prediction is fitted to its replay)"},
        "layouts": layouts, "profiles": {s: str(p) for s, p in runs.items()}, "advice_from": str(reference_dir),
    }


def table(check: dict):
    """The check as a rich Table: each rehearsed layout's ranks, predicted and replayed step and samples/s,
    the reference's prediction marked fitted (its losses against the reference's: :func:`loss_table`)."""
    from rich.table import Table

    t = Table(title=f"The layouts mimo-accel layout weighed (at most {check['budget']} CPU ranks), rehearsed "
                    "and replayed", title_justify="left",
              caption="* fitted: the advisor scales its costs so the reference prices at its replay",
              caption_justify="left")
    for col in ("layout", "ranks", "predicted step", "replayed step", "samples/s predicted", "samples/s replayed",
                "samples/s per rank"):
        # a spec's parts fold onto lines of their own in a narrow terminal rather than being cut
        t.add_column(col, justify="left" if col == "layout" else "right", overflow="fold",
                     min_width=20 if col == "layout" else None)
    for spec, row in check["layouts"].items():
        fitted = "*" if row["fitted"] else ""
        per_s, ranks, replayed = row["replayed_samples_per_s"], row["ranks"], row["replayed_step_s"]
        t.add_row(f"{spec} ({row['role']}{', fitted' if fitted else ''})", str(ranks),
                  f"{row['predicted_step_s']:.3f} s{fitted}", f"{replayed:.3f} s" if replayed else "—",
                  f"{row['predicted_samples_per_s']:.1f}{fitted}", f"{per_s:.1f}" if per_s else "—",
                  f"{per_s / ranks:.2f}" if per_s and ranks else "—")
    return t


def _named(check: dict) -> str:
    """The checked layout, named by what it is to the advisor."""
    if check["checked_role"] == "recommended":
        return f"recommended {check['checked']}"
    if check["checked_role"] == "best found":
        return (f"the advisor keeps the current layout ({check['margin']}); checked its best found "
                f"{check['checked']} (not recommended)")
    return f"{check['checked']} ({check['checked_why']})"


def verdict(check: dict) -> str:
    if check["checked"] is None:  # the outcome says what the advisor answered and why nothing ran
        return check["outcome"]
    g, err, step = check["gain"], check["predicted_error"], check["replayed_step_s"]
    diffs = check["loss_max_rel_diff"]
    losses = (f"; per-step losses within {max(diffs.values()):.0e} of the reference's (same samples, same tokens; "
              f"held to {check['loss_tolerance']:.0e})" if diffs else "")
    if None in (g["samples_per_s"], g["samples_per_s_per_rank"], err, step):
        return (f"{_named(check)}: a rehearsed run has no replayed step (no per-micro-batch "
                f"times in its profile), so the advisor is not checked{losses}")
    order = check["order"]
    if len(order["predicted"]) < 2:
        ranked = "one layout priced before it ran, so no order to check"
    else:
        same = "the same order as" if order["same"] else "NOT the order of"
        ranked = (f"the advisor ranks the {len(order['predicted'])} layouts priced before they ran in {same} the "
                  "replay (the reference's prediction is fitted)")
    return (f"{_named(check)}: replayed samples/s x{g['samples_per_s']:.2f} the reference's, "
            f"x{g['samples_per_s_per_rank']:.2f} per rank; its predicted step {check['predicted_step_s']:.3f} s "
            f"against {step:.3f} s replayed ({err:.0%} off); {ranked}{losses}")
