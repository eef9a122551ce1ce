"""The points file (``mimo-accel-cost-points/1``) and the console table of the fits."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from mimo_accel.modules import LANGUAGE
from mimo_accel_dev.commands.calibrate_gpu.budget import Collection, Measured
from mimo_accel_dev.commands.calibrate_gpu.fit import LANGUAGE_NUISANCE, LANGUAGE_TERMS, ModuleFit, VISION_TERMS
from mimo_accel_dev.commands.calibrate_gpu.points import (POINTS_FORMAT, PROG, VISION, LanguagePoint, LanguageShape,
                                                   MeasureError, VisionPoint, shapes)


# ------------------------------------------------------------------------------------ output


def points_doc(args, device_info: dict, collections: dict[str, Collection], elapsed: float) -> dict[str, Any]:
    vision_shape, language_shape = shapes(args)
    return {
        "format": POINTS_FORMAT, "device": device_info, "size": args.size, "dtype": args.dtype,
        "warmup": args.warmup, "repeats": args.repeats, "budget_s": args.budget_s, "elapsed_s": elapsed,
        "vision_module": args.vision_module,
        "shapes": {VISION: dataclasses.asdict(vision_shape), LANGUAGE: dataclasses.asdict(language_shape)},
        "modules": {name: {"points": [{**m.point.to_doc(), "times_s": m.times} for m in c.measured],
                           "planned": c.planned, "stopped": c.stopped, "skipped": c.skipped}
                    for name, c in collections.items()},
    }


def read_points(path: str) -> tuple[dict[str, Any], list[Measured], list[Measured]]:
    """(the document, vision measurements, language measurements) of a ``--points`` file."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise MeasureError(f"{path}: not a JSON points file ({exc})") from None
    if not isinstance(doc, dict) or doc.get("format") != POINTS_FORMAT:
        found = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        raise MeasureError(f"{path}: expected \"format\": \"{POINTS_FORMAT}\", found {found!r}; write it with "
                           f"{PROG} --points")
    vision_name = doc.get("vision_module", VISION)
    mods = doc.get("modules")
    for name in (vision_name, LANGUAGE):
        if not isinstance(mods, dict) or name not in mods:
            raise MeasureError(f"{path}: no {name} points (the measuring run stopped before them?); measure again")
    try:
        vision = [Measured(VisionPoint(tuple((int(h), int(w)) for h, w in p["images"])),
                           [float(t) for t in p["times_s"]]) for p in mods[vision_name]["points"]]
        language = [Measured(LanguagePoint(tuple(int(n) for n in p["segments"])), [float(t) for t in p["times_s"]])
                    for p in mods[LANGUAGE]["points"]]
    except (KeyError, TypeError, ValueError) as exc:
        raise MeasureError(f"{path}: malformed points ({type(exc).__name__}: {exc})") from None
    if any(not m.times for m in vision + language):
        raise MeasureError(f"{path}: a point without times")
    return doc, vision, language


def render(console, fits: dict[str, ModuleFit], collections: dict[str, Collection], scale: float,
            language_shape: LanguageShape) -> None:
    from rich.table import Table

    for name, c in collections.items():
        f = fits.get(name)
        is_vision = name != LANGUAGE
        t = Table(title=f"{name}: measured points (forward + backward, median of repeats)", title_justify="left")
        cols = (("point", "left"), ("rows" if is_vision else "tokens", "right"),
                ("Σ rows²" if is_vision else "Σ tokens²", "right"), ("images" if is_vision else "sequences", "right"),
                ("median ms", "right"), ("min–max ms", "right"), ("fit ms", "right"), ("error", "right"))
        for col, justify in cols:
            t.add_column(col, justify=justify)
        for i, m in enumerate(c.measured):
            p = m.point
            feats = (p.rows, p.sq_rows, p.items) if is_vision else (p.tokens, p.sq_tokens, p.items)
            pred = f.predicted[i] if f is not None else None
            t.add_row(p.label, f"{feats[0]:,}", f"{feats[1]:.3g}", str(feats[2]), f"{m.median * 1e3:.3f}",
                      f"{min(m.times) * 1e3:.3f}–{max(m.times) * 1e3:.3f}",
                      "—" if pred is None else f"{pred * 1e3:.3f}",
                      "—" if pred is None else f"{(pred - m.median) / m.median:+.1%}")
        console.print(t)
        if f is None:
            continue
        q = Table(title=f"{name}: fitted cost (written to the file)", title_justify="left")
        for col in ("term", "coefficient", "units"):
            q.add_column(col, justify="right" if col == "coefficient" else "left")
        terms = VISION_TERMS if is_vision else LANGUAGE_TERMS
        for key, label, units in terms:
            value = f.coefficients[key] * (1.0 if is_vision else scale)
            q.add_row(f"{key} · {label}", f"{value:.4g}", units)
        for key, label, units in LANGUAGE_NUISANCE if not is_vision else ():
            q.add_row(f"per {label[:-1]}: THD RoPE / attention calls (not in the model)", f"{f.nuisance[key]:.4g}",
                      units)
        q.add_row("overhead per call (not in the model)", f"{f.overhead_s:.4g}", "s")
        q.add_row("R²", f"{f.r2:.4f}", "")
        q.add_row("relative RMSE / worst point", f"{f.rel_rmse:.2%} / {f.max_rel_err:.2%}", "")
        a, b = f.coefficients["a"], f.coefficients["b"]
        q.add_row("b / a", "—" if a <= 0 else f"{b / a:.3g}", "1 / row" if is_vision else "1 / token")
        if not is_vision and scale != 1.0:
            q.add_row("language scale", f"× {scale:g}",
                      f"{language_shape.layers} layers measured → {language_shape.depth}")
        console.print(q)
        if f.r2 < 0.95:
            console.print(f"[yellow]warning:[/] {name}: R² = {f.r2:.3f}; the machine may be busy — rerun on an idle "
                          "device")
