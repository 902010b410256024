"""The savings view's HTML: one self-contained page (inline style and SVG chart, no script, no remote asset).

Every figure is in an element with ``data-figure`` (and its run's ``data-run-id``), so a browser test can read
what a person sees. Everything from Airflow or a report is escaped.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape
from typing import Any
from urllib.parse import quote

from airflow_azureml.cost import money

STYLE = """
body{font-family:system-ui,sans-serif;margin:16px;color:#1f2937;background:#fff}
h1{font-size:20px;margin:0 0 4px} h2{font-size:16px;margin:20px 0 8px} p{margin:4px 0}
table{border-collapse:collapse;font-size:13px} th,td{border-bottom:1px solid #e5e7eb;padding:4px 8px;text-align:right}
th:first-child,td:first-child{text-align:left} th{background:#f3f4f6}
.cards{display:flex;flex-wrap:wrap;gap:8px;margin:8px 0}
.card{border:1px solid #e5e7eb;border-radius:6px;padding:8px 12px;min-width:130px}
.card .k{font-size:12px;color:#6b7280} .card .v{font-size:18px;font-weight:600}
.good{color:#047857} .bad{color:#b91c1c} .muted{color:#6b7280;font-size:12px}
"""


def hours(value: float | None) -> str:
    return "unknown" if value is None else f"{value:.4f}"


def margin(seconds: float | None) -> str:
    """``+1 h 20 min`` ahead of the deadline, ``-5 min 3 s`` late."""
    if seconds is None:
        return "unknown"
    sign, left = ("+" if seconds >= 0 else "-"), round(abs(seconds))
    h, rest = divmod(left, 3600)
    m, s = divmod(rest, 60)
    parts = [f"{h} h"] if h else []
    parts += [f"{m} min"] if m or h else []
    parts += [f"{s} s"] if not h and (s or not m) else []
    return sign + " ".join(parts)


def percent(value: float | None) -> str:
    return "unknown" if value is None else f"{value:.1f} %"


def _cell(name: str, text: str, css: str = "") -> str:
    klass = f' class="{css}"' if css else ""
    return f'<td data-figure="{name}"{klass}>{escape(text)}</td>'


def _savings_css(value: float | None) -> str:
    return "" if value is None else ("good" if value >= 0 else "bad")


def _cards(figures: Mapping[str, Any], scope: str) -> str:
    cards = [
        ("jobs", "Jobs", str(figures["jobs"])),
        ("preemptions", "Preemptions", str(figures["preemptions"])),
        ("resubmissions", "Resubmissions", str(figures["resubmissions"])),
        ("spot_node_hours", "Spot node-hours", hours(figures["spot_node_hours"])),
        ("dedicated_node_hours", "Dedicated node-hours", hours(figures["dedicated_node_hours"])),
        ("evicted_node_hours", "Evicted node-hours", hours(figures["evicted_node_hours"])),
        ("lost_node_hours", "Lost node-hours", hours(figures["lost_node_hours"])),
        ("cost", "Cost", money(figures["cost"])),
        ("dedicated_equivalent", "All-dedicated cost", money(figures["dedicated_equivalent"])),
        ("savings", "Savings", money(figures["savings"])),
        ("savings_pct", "Savings %", percent(figures["savings_pct"])),
    ]
    if figures.get("with_deadline"):
        whose = "runs" if scope == "dag" else "tasks"
        cards += [
            ("deadline", "Deadline" if scope == "run" else "Deadline (worst run)", str(figures["deadline"])),
            ("margin", "Margin" if scope == "run" else "Worst margin", margin(figures["margin_seconds"])),
            ("late", f"{whose.capitalize()} late", f"{figures['late']} of {figures['with_deadline']}"),
        ]
    out = []
    for name, label, text in cards:
        css = _savings_css(figures.get("savings")) if name.startswith("savings") else ""
        if name == "margin" and figures.get("margin_seconds") is not None:
            css = "good" if figures["margin_seconds"] >= 0 else "bad"
        out.append(
            f'<div class="card"><div class="k">{label}</div>'
            f'<div class="v {css}" data-figure="{name}">{escape(text)}</div></div>'
        )
    return '<div class="cards">' + "".join(out) + "</div>"


def _notes(figures: Mapping[str, Any]) -> str:
    notes = []
    if figures.get("reports_unreadable"):
        notes.append(
            f"{figures['reports_unreadable']} cost reports could not be read (cleared meanwhile, or kept outside "
            "Airflow's database by a custom XCom backend): the figures leave them out."
        )
    if figures.get("cost_unknown"):
        notes.append(f"Cost unknown: {figures['cost_unknown']}.")
    if figures.get("price_sources"):
        notes.append("Prices: " + "; ".join(figures["price_sources"]) + ".")
    notes.append("Estimates from the job tasks' azureml_cost reports (docs/cost.md); not an invoice.")
    return "".join(f'<p class="muted">{escape(n)}</p>' for n in notes)


def chart(runs: Sequence[Mapping[str, Any]], width: int = 720, height: int = 180) -> str:
    """Cost against the all-dedicated cost per run, oldest on the left: an inline SVG bar chart."""
    shown = [r for r in reversed(runs) if r["reported"]]
    if not shown:
        return '<p class="muted" data-figure="chart">No run in this window has a cost report.</p>'
    top = max([r["dedicated_equivalent"] or 0.0 for r in shown] + [r["cost"] or 0.0 for r in shown]) or 1.0
    slot = (width - 40) / len(shown)
    bar = max(1.0, min(36.0, slot / 2 - 2))
    parts = [
        f'<svg data-figure="chart" width="{width}" height="{height + 30}" role="img" '
        f'aria-label="cost against the all-dedicated cost over the last {len(shown)} runs">'
    ]
    for i, run in enumerate(shown):
        x = 30 + i * slot
        for j, (key, color) in enumerate((("cost", "#2563eb"), ("dedicated_equivalent", "#d1d5db"))):
            if run[key] is None:  # unknown is not $0: no bar, a question mark
                parts.append(
                    f'<text x="{x + j * (bar + 1):.1f}" y="{height:.1f}" font-size="11" data-unknown="{key}">?'
                    f"<title>{escape(str(run['run_id']))}: {key} unknown</title></text>"
                )
                continue
            h = run[key] / top * height
            parts.append(
                f'<rect x="{x + j * (bar + 1):.1f}" y="{height - h + 5:.1f}" width="{bar:.1f}" height="{h:.1f}" '
                f'fill="{color}"><title>{escape(str(run["run_id"]))}: {key} {escape(money(run[key]))}</title></rect>'
            )
    parts.append(f'<text x="0" y="12" font-size="11">{escape(money(top))}</text>')
    parts.append(f'<text x="30" y="{height + 25}" font-size="11">oldest</text>')
    parts.append(f'<text x="{width - 50}" y="{height + 25}" font-size="11">newest</text>')
    parts.append("</svg>")
    legend = '<p class="muted"><span style="color:#2563eb">■</span> cost <span style="color:#9ca3af">■</span> '
    return "".join(parts) + legend + "all-dedicated cost</p>"


def _page(title: str, body: str) -> str:
    return (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{escape(title)}</title>'
        f"<style>{STYLE}</style></head><body>{body}</body></html>"
    )


def dag_page(dag_id: str, figures: Mapping[str, Any], limit: int) -> str:
    runs = figures["runs"]
    rows = []
    for run in runs:
        # relative to this page, /azureml-savings/dags/<dag_id>: its last segment is the DAG's own
        link = f"{quote(dag_id, safe='')}/runs/{quote(run['run_id'], safe='')}"
        label = run["logical_date"] or run["run_after"] or run["run_id"]
        cells = [
            f'<td><a href="{escape(link)}">{escape(str(label))}</a></td>',
            _cell("state", str(run["state"])),
            _cell("jobs", str(run["jobs"])),
            _cell("preemptions", str(run["preemptions"])),
            _cell("resubmissions", str(run["resubmissions"])),
            _cell("spot_node_hours", hours(run["spot_node_hours"])),
            _cell("dedicated_node_hours", hours(run["dedicated_node_hours"])),
            _cell("cost", money(run["cost"]) if run["reported"] else "no report"),
            _cell("dedicated_equivalent", money(run["dedicated_equivalent"]) if run["reported"] else ""),
            _cell("savings", money(run["savings"]) if run["reported"] else "", _savings_css(run["savings"])),
            _cell("margin", margin(run["margin_seconds"]) if run["deadline"] else ""),
        ]
        rows.append(f'<tr data-run-id="{escape(run["run_id"])}">' + "".join(cells) + "</tr>")
    head = (
        "<tr><th>Run</th><th>State</th><th>Jobs</th><th>Preemptions</th><th>Resubmissions</th>"
        "<th>Spot node-h</th><th>Dedicated node-h</th><th>Cost</th><th>All-dedicated</th><th>Savings</th>"
        "<th>Deadline margin</th></tr>"
    )
    table = f"<table>{head}{''.join(rows)}</table>" if rows else '<p class="muted">No run yet.</p>'
    body = (
        f"<h1>Azure ML savings: {escape(dag_id)}</h1>"
        f'<p class="muted">The last {len(runs)} runs (at most {limit}), billed together; runs that shared a '
        "cluster at the same time are billed once for that time.</p>"
        f'<section data-scope="dag">{_cards(figures["total"], "dag")}</section>'
        f"<h2>Cost over the last runs</h2>{chart(runs)}"
        f"<h2>Runs</h2>{table}{_notes(figures['total'])}"
    )
    return _page(f"Azure ML savings: {dag_id}", body)


def run_page(dag_id: str, run: Mapping[str, Any]) -> str:
    rows = []
    for task in run["tasks"]:
        rows.append(
            f'<tr data-task="{escape(task["task"])}">'
            f"<td>{escape(task['task'])}</td>"
            + _cell("jobs", str(task["jobs"]))
            + _cell("preemptions", str(task["preemptions"]))
            + _cell("resubmissions", str(task["resubmissions"]))
            + _cell("spot_node_hours", hours(task["spot_node_hours"]))
            + _cell("dedicated_node_hours", hours(task["dedicated_node_hours"]))
            + _cell("cost", money(task["cost"]))
            + _cell("dedicated_equivalent", money(task["dedicated_equivalent"]))
            + _cell("savings", money(task["savings"]), _savings_css(task["savings"]))
            + _cell("margin", margin(task["margin_seconds"]) if task["deadline"] else "")
            + "</tr>"
        )
    head = (
        "<tr><th>Task</th><th>Jobs</th><th>Preemptions</th><th>Resubmissions</th><th>Spot node-h</th>"
        "<th>Dedicated node-h</th><th>Cost</th><th>All-dedicated</th><th>Savings</th><th>Deadline margin</th></tr>"
    )
    table = f"<table>{head}{''.join(rows)}</table>" if rows else '<p class="muted">No job task reported a cost.</p>'
    body = (
        f"<h1>Azure ML savings: {escape(dag_id)}</h1>"
        f'<p data-figure="run_id">{escape(run["run_id"])}</p>'
        f'<p class="muted">State {escape(str(run["state"]))}; the tasks billed together.</p>'
        f'<section data-scope="run">{_cards(run, "run")}</section>'
        f"<h2>Tasks</h2>{table}{_notes(run)}"
    )
    return _page(f"Azure ML savings: {dag_id} {run['run_id']}", body)


def message_page(title: str, text: str) -> str:
    """A page with no figures: no credential, no access, or Airflow could not be read."""
    return _page(title, f'<h1>{escape(title)}</h1><p data-figure="message">{escape(text)}</p>')
