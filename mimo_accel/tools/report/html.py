"""The report as one HTML page: the console's tables and the charts embedded."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from mimo_accel.tools.report.blocks import CHANGE_STYLES, ReportTable
from mimo_accel.tools.report.charts import chart_figures, png_bytes
from mimo_accel.tools.report.console import (bound_line, bound_table, doc_sides, gain_lines, gains_table,
                                             report_messages, run_lines, runs_table, slowest_lines, summary_table)
from mimo_accel.tools.report.details import detail_tables
from mimo_accel.tools.report.like import verdict


# ------------------------------------------------------------------------------------------ HTML

_CSS = """
body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2em; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.1em; margin-top: 1.6em; }
table { border-collapse: collapse; margin: 0.6em 0 1.2em; font-size: 0.9em; }
caption { text-align: left; font-weight: bold; padding: 0.3em 0; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; }
th { background: #f3f3f3; } td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
td.better { color: #11772d; } td.worse { color: #b3261e; } td.dim { color: #888; }
li.warning { color: #8a5a00; } li.note { color: #035e7b; } p.bound { color: #8a5a00; font-weight: bold; }
p.verdict { font-weight: bold; }
figure { margin: 1em 0; } figure img { max-width: 100%; border: 1px solid #eee; }
figcaption { font-size: 0.85em; color: #555; }
"""


def _html_table(t: ReportTable) -> str:
    from html import escape

    def cls(right: bool, style: str = "") -> str:
        names = " ".join(n for n in (("num" if right else ""), CHANGE_STYLES[style][1]) if n)
        return f' class="{names}"' if names else ""

    head = "".join(f"<th{cls(right)}>{escape(h)}</th>" for h, right in t.columns)
    body = []
    for row in t.rows:
        cells = []
        for (_, right), c in zip(t.columns, row):
            text, style = c if isinstance(c, tuple) else (c, "")
            cells.append(f"<td{cls(right, style)}>{escape(str(text))}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    return (f"<table>\n<caption>{escape(t.title)}</caption>\n<thead><tr>{head}</tr></thead>\n<tbody>\n"
            + "\n".join(body) + "\n</tbody>\n</table>")


def _items(lines: list[str]) -> str:
    from html import escape

    return "<ul>" + "".join(f"<li>{escape(line)}</li>" for line in lines) + "</ul>" if lines else ""


def write_html(doc: dict[str, Any], path: str | Path) -> list[str]:
    """The report (:func:`build`'s document) as one self-contained HTML page: the same tables as
    the terminal, as HTML tables, and the charts embedded as PNG data URIs (module time per rank,
    step-time CDF, each module's straggler per step). Without matplotlib the page has the tables
    and says the charts are missing; returns the warnings (that one)."""
    import base64
    from html import escape

    sides = doc_sides(doc)
    warnings: list[str] = []
    parts = ["<!DOCTYPE html>", '<html lang="en">', "<head>", '<meta charset="utf-8">',
             "<title>mimo-accel profile report</title>", f"<style>{_CSS}</style>", "</head>", "<body>",
             "<h1>mimo-accel profile report</h1>", _html_table(runs_table(sides)), _items(run_lines(sides))]
    if (said := verdict(sides)) is not None:
        parts.append(f'<p class="verdict">verdict: {escape(said)}</p>')
    messages = report_messages(sides, doc.get("warnings"))
    if messages:
        parts.append("<ul>" + "".join(f'<li class="{kind}">{escape(text)}</li>' for kind, text in messages)
                     + "</ul>")
    parts.append(_html_table(summary_table(sides)))
    if (gained := gains_table(sides)) is not None:
        parts.append(_html_table(gained))
    parts.append(_items(gain_lines(sides) + slowest_lines(sides)))
    if (bound := bound_table(sides)) is not None:
        parts.append(_html_table(bound))
    if (line := bound_line(sides)) is not None:
        parts.append(f'<p class="bound">{escape(line)}</p>')
    parts.append("<h2>Charts</h2>")
    try:
        figures = chart_figures(sides)
    except RuntimeError as e:
        warnings.append(f"the HTML has no charts: {e}")
        parts.append(f"<p>{escape(warnings[-1])}</p>")
        figures = []
    for caption, fig in figures:
        data = base64.b64encode(png_bytes(fig)).decode("ascii")
        parts.append(f'<figure><img src="data:image/png;base64,{data}" alt="{escape(caption)}">'
                     f"<figcaption>{escape(caption)}</figcaption></figure>")
    parts.append("<h2>Details</h2>")
    parts += [_html_table(t) for t in detail_tables(sides)]
    parts += ["</body>", "</html>"]
    Path(path).write_text("\n".join(parts) + "\n", encoding="utf-8")
    return warnings
