"""What spot saved, per DAG run and over a DAG's last runs: the figures of the UI's savings view.

Only the job tasks' ``azureml_cost`` reports (``operators.job_cost``) go in, and ``cost.run_bill`` does the
arithmetic, as for ``airflow azureml bill``: a run's tasks that shared a cluster at the same time are billed
once for that time. Pure: the plugin (``plugins.savings``) reads the reports and renders these figures.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from airflow_azureml import cost
from airflow_azureml.outcomes import utc_epoch


@dataclass
class RunReports:
    """One DAG run and the cost reports its job tasks wrote."""

    run_id: str
    logical_date: str | None = None
    run_after: str | None = None
    state: str | None = None
    reports: list[dict[str, Any]] = field(default_factory=list)
    unreadable: int = 0  # listed reports whose value is gone or not a report (a custom XCom backend's path)


def report_value(value: Any) -> dict[str, Any] | None:
    """An XCom value as the REST API returns it: a report, or None (JSON text is read; anything else is not one)."""
    if isinstance(value, str):  # stored as JSON text by some Airflow versions and XCom backends
        try:
            value = json.loads(value)
        except ValueError:
            return None
    return dict(value) if isinstance(value, Mapping) else None


def report_margin(report: Mapping[str, Any]) -> float | None:
    """One task's margin in seconds: its own deadline minus when its own job chain ended (negative: late).
    None without a deadline or an end."""
    deadline, ended = utc_epoch(report.get("deadline")), utc_epoch(report.get("finished_at"))
    return deadline - ended if deadline is not None and ended is not None else None


def deadline_margin(reports: Iterable[Mapping[str, Any]]) -> tuple[str | None, float | None, int, int]:
    """The worst task's deadline and margin (each task against its own deadline), how many tasks were late,
    and how many had a deadline. Tasks without a deadline do not count."""
    worst: tuple[float, str] | None = None
    late = counted = 0
    for report in reports:
        margin = report_margin(report)
        if margin is None:
            continue
        counted += 1
        late += margin < 0
        if worst is None or margin < worst[0]:
            worst = (margin, cost.iso_time(utc_epoch(report.get("deadline"))) or "")
    if worst is None:
        return None, None, 0, 0
    return worst[1], worst[0], late, counted


def task_figures(report: Mapping[str, Any]) -> dict[str, Any]:
    """One task's line, straight from its report."""
    names = list(report.get("job_names") or [])
    hours = report.get("node_hours") or {}
    return {
        "task": f"{report.get('task_id')}" + (f"[{report['map_index']}]" if report.get("map_index", -1) != -1 else ""),
        "jobs": len(names),
        "resubmissions": max(0, len(names) - 1),
        "preemptions": int(report.get("preemptions") or 0),
        "spot_node_hours": float(hours.get("low_priority", 0.0)),
        "dedicated_node_hours": float(hours.get("dedicated", 0.0)),
        "cost": report.get("cost"),
        "dedicated_equivalent": (report.get("dedicated_equivalent") or {}).get("cost"),
        "savings": report.get("savings"),
        "deadline": report.get("deadline"),
        "margin_seconds": report_margin(report),
    }


def bill_figures(reports: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The figures of a set of reports (one run's, or several runs'), from ``cost.run_bill``."""
    bill = cost.run_bill(reports)
    hours = bill.get("node_hours") or {}
    names = [n for r in reports for n in r.get("job_names") or []]
    deadline, margin, late, counted = deadline_margin(reports)
    latest: dict[str, Mapping[str, Any]] = {}  # per compute, the price read last (one line, however many reads)
    for r in reports:
        for name, c in (r.get("computes") or {}).items():
            if c.get("price_source") and str(c.get("price_retrieved_at") or "") >= str(
                (latest.get(name) or {}).get("price_retrieved_at") or ""
            ):
                latest[name] = c
    sources = [f"{name}: {cost.price_note(c)}" for name, c in sorted(latest.items())]
    return {
        "reported": bool(reports),
        "jobs": len(set(names)),
        "resubmissions": sum(max(0, len(r.get("job_names") or []) - 1) for r in reports),
        "preemptions": int(bill.get("preemptions") or 0),
        "spot_node_hours": float(hours.get("low_priority", 0.0)),
        "dedicated_node_hours": float(hours.get("dedicated", 0.0)),
        "evicted_node_hours": float(bill.get("evicted_node_hours") or 0.0),
        "lost_node_hours": float(bill.get("lost_node_hours") or 0.0),
        "cost": bill.get("cost") if reports else None,  # no report: unknown, not $0
        "dedicated_equivalent": (bill.get("dedicated_equivalent") or {}).get("cost") if reports else None,
        "savings": bill.get("savings") if reports else None,
        "savings_pct": bill.get("savings_pct") if reports else None,
        "cost_unknown": bill.get("cost_unknown"),
        "deadline": deadline,  # the worst task's
        "margin_seconds": margin,  # the worst task's: each against its own deadline
        "late": late,  # tasks past their deadline
        "with_deadline": counted,
        "price_sources": sources,
    }


def run_figures(run: RunReports) -> dict[str, Any]:
    """A DAG run's figures, with a line per task."""
    return {
        "run_id": run.run_id,
        "logical_date": run.logical_date,
        "run_after": run.run_after,
        "state": run.state,
        "reports_unreadable": run.unreadable,
        "tasks": [task_figures(r) for r in run.reports],
        **bill_figures(run.reports),
    }


def dag_figures(runs: Sequence[RunReports]) -> dict[str, Any]:
    """The last runs (newest first, as given) and their total: the runs' reports billed together. The
    total's margin is the worst run's, and ``late`` counts the runs with a task past its deadline."""
    lines = [run_figures(run) for run in runs]
    total = bill_figures([r for run in runs for r in run.reports])
    dated = [line for line in lines if line["margin_seconds"] is not None]
    worst = min(dated, key=lambda line: line["margin_seconds"]) if dated else None
    total.update(
        deadline=worst["deadline"] if worst else None,
        margin_seconds=worst["margin_seconds"] if worst else None,
        late=sum(line["margin_seconds"] < 0 for line in dated),
        with_deadline=len(dated),
        reports_unreadable=sum(run.unreadable for run in runs),
    )
    return {"runs": lines, "total": total}
