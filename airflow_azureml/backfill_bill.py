"""The bill of a range of DAG runs (a backfill): ``python -m airflow_azureml.cost --dag-id ... --from ... --to ...``.

Each job task reports its chain's bill in XCom ``azureml_cost`` (``operators.job_cost``). This command reads
those reports for every DAG run whose logical date is in the range, through Airflow's public REST API
(``AirflowRestHook``: in Airflow 3 nothing outside the api-server may read the metadata DB), and sums them
with ``cost.run_bill``: per compute over the union of the tasks' times, so runs that shared a cluster at the
same time are billed once for that time and the range's total can be less than the sum of its runs. It prints
the bill, and sends it as metrics through Airflow's ``Stats`` (a no-op unless ``[metrics]`` sends somewhere).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, time, timedelta
from typing import Any
from urllib.parse import quote

from airflow_azureml import cost
from airflow_azureml.cli import ARGUMENTS, DESCRIPTION
from airflow_azureml.hooks.airflow_rest import AirflowRestHook

PAGE = 100


@dataclass
class RunCosts:
    """One DAG run and the cost reports of its tasks."""

    run_id: str
    logical_date: str | None
    state: str | None
    run_type: str | None
    costs: list[dict[str, Any]] = field(default_factory=list)
    unreadable: int = 0  # listed reports whose value is gone or not a report (e.g. a remote XCom backend's path)


def parse_bound(text: str, *, end: bool) -> datetime:
    """A date (the whole day: from its start, or to its last microsecond) or an ISO date-time; naive means UTC."""
    text = text.strip()
    try:
        day = date.fromisoformat(text)  # YYYY-MM-DD, and the compact YYYYMMDD
    except ValueError:
        pass
    else:
        return datetime.combine(day, time.max if end else time.min, UTC)
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"{text!r} is not a date (YYYY-MM-DD) or an ISO 8601 date-time") from None
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)


def run_types() -> list[str]:
    """The DAG run types of the running Airflow (3.3 has more than 3.1)."""
    try:
        from airflow.utils.types import DagRunType

        return [t.value for t in DagRunType]
    except ImportError:  # not expected on 3.1-3.3; the server checks it then
        return []


def check_range(start: datetime, end: datetime) -> None:
    if start > end:
        raise ValueError(f"--from {start.isoformat()} is after --to {end.isoformat()}")
    if end - start > timedelta(days=3660):
        raise ValueError("the range is over ten years long: give --from and --to")


class DagRunCostsHook(AirflowRestHook):
    """Reads a range of DAG runs and their tasks' ``azureml_cost`` XComs over ``/api/v2``."""

    hook_name = "Airflow REST API (cost reports)"
    needs = "read the DAG's runs and XComs"

    def _pages(self, path: str, params: dict[str, Any], items: str, what: str) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        while True:
            page = self._ok(self._call("GET", path, params={**params, "limit": PAGE, "offset": len(out)}), what)
            batch = list(page.get(items) or [])
            out.extend(batch)
            if not batch or len(out) >= int(page.get("total_entries") or 0):
                return out

    def dag_runs(self, dag_id: str, start: datetime, end: datetime, run_type: str | None) -> list[dict[str, Any]]:
        params: dict[str, Any] = {
            "logical_date_gte": start.isoformat(),
            "logical_date_lte": end.isoformat(),
            "order_by": "logical_date",
        }
        if run_type:
            params["run_type"] = run_type
        return self._pages(f"/dags/{quote(dag_id, safe='')}/dagRuns", params, "dag_runs", f"list the runs of {dag_id}")

    def cost_entries(self, dag_id: str, start: datetime, end: datetime) -> list[dict[str, Any]]:
        """Which tasks reported a cost in the range (the list holds no values); all runs in one listing."""
        params = {"xcom_key": cost.COST_XCOM_KEY, "logical_date_gte": start.isoformat()}
        params["logical_date_lte"] = end.isoformat()
        path = f"/dags/{quote(dag_id, safe='')}/dagRuns/~/taskInstances/~/xcomEntries"
        return self._pages(path, params, "xcom_entries", f"list the cost reports of {dag_id}")

    def cost_value(self, dag_id: str, run_id: str, task_id: str, map_index: int) -> Any:
        path = (
            f"/dags/{quote(dag_id, safe='')}/dagRuns/{quote(run_id, safe='')}/taskInstances/"
            f"{quote(task_id, safe='')}/xcomEntries/{cost.COST_XCOM_KEY}"
        )
        response = self._call("GET", path, params={"map_index": map_index})
        if response.status_code == 404:  # cleared since it was listed
            return None
        from airflow_azureml.savings import report_value

        return report_value(
            self._ok(response, f"read the cost report of {task_id}[{map_index}] in {run_id}").get("value")
        )

    def read(self, dag_id: str, start: datetime, end: datetime, run_type: str | None = None) -> list[RunCosts]:
        runs = {
            r["dag_run_id"]: RunCosts(r["dag_run_id"], r.get("logical_date"), r.get("state"), r.get("run_type"))
            for r in self.dag_runs(dag_id, start, end, run_type)
        }
        seen: set[tuple[str, str, int]] = set()
        for entry in self.cost_entries(dag_id, start, end):
            run = runs.get(entry.get("run_id"))
            if run is None:  # another run type than asked for
                continue
            key = (run.run_id, str(entry["task_id"]), int(entry.get("map_index", -1)))
            if key in seen:  # an offset page shifted by a report added meanwhile (a backfill still going)
                continue
            seen.add(key)
            value = self.cost_value(dag_id, *key)
            if value is None:
                run.unreadable += 1
            else:
                run.costs.append(dict(value))
        return list(runs.values())


def bill_of_runs(runs: Sequence[RunCosts]) -> dict[str, Any]:
    """The range's bill (``cost.run_bill`` over every task of every run) and one line of figures per run."""
    total = cost.run_bill(c for run in runs for c in run.costs)
    total.pop("usage", None)
    total.pop("tasks", None)
    per_run = []
    for run in runs:
        one = cost.run_bill(run.costs)
        per_run.append(
            {
                "run_id": run.run_id,
                "logical_date": run.logical_date,
                "state": run.state,
                "run_type": run.run_type,
                "tasks_reported": len(run.costs),
                "reports_unreadable": run.unreadable,
                "jobs": sorted({j for c in run.costs for j in c.get("job_names") or []}),
                "cost": one.get("cost") if run.costs else None,  # no report: unknown, not $0
                "node_hours": sum((one.get("node_hours") or {}).values()),
                "dedicated_equivalent": (one.get("dedicated_equivalent") or {}).get("cost") if run.costs else None,
                "savings": one.get("savings"),
                "preemptions": one.get("preemptions", 0),
            }
        )
    total["runs"] = per_run
    total["jobs"] = sorted({j for r in per_run for j in r["jobs"]})
    total["tasks_reported"] = sum(r["tasks_reported"] for r in per_run)
    total["reports_unreadable"] = sum(r["reports_unreadable"] for r in per_run)
    reported = [r for r in per_run if r["tasks_reported"]]
    total["sum_of_runs_cost"] = None if any(r["cost"] is None for r in reported) else sum(r["cost"] for r in reported)
    total["sum_of_runs_node_hours"] = sum(r["node_hours"] for r in per_run)
    total["price_changes"] = price_changes(c for run in runs for c in run.costs)
    return total


def price_changes(reports: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, list[float]]]:
    """Computes whose hourly price differs between reports. Where every report says since when its rates were
    in force (the Retail Prices API's), ``cost.run_bill`` prices each node-second at the rate in force then;
    otherwise at one rate, and over a long backfill whose spot price moved the total is approximate."""
    seen: dict[str, dict[str, set[float]]] = {}
    for report in reports:
        for name, entry in (report.get("computes") or {}).items():
            for kind in ("hourly_price", "dedicated_hourly_price"):
                if entry.get(kind) is not None:
                    seen.setdefault(name, {}).setdefault(kind, set()).add(float(entry[kind]))
    return {
        name: {kind: sorted(rates) for kind, rates in kinds.items() if len(rates) > 1}
        for name, kinds in sorted(seen.items())
        if any(len(rates) > 1 for rates in kinds.values())
    }


def bill_metrics(bill: Mapping[str, Any], dag_id: str) -> list[tuple[str, float, dict[str, str]]]:
    """``(name, value, tags)`` gauges of a range's bill (docs/cost.md); unknown values are left out."""
    tags = {"dag_id": dag_id}
    out: list[tuple[str, float, dict[str, str]]] = [("azureml.backfill.runs", float(len(bill.get("runs") or [])), tags)]
    for tier, hours in sorted((bill.get("node_hours") or {}).items()):
        out.append(("azureml.backfill.node_hours", float(hours), {**tags, "tier": tier}))
    for name in ("evicted_node_hours", "lost_node_hours", "preemptions", "cost", "savings", "savings_pct"):
        if bill.get(name) is not None:
            out.append((f"azureml.backfill.{name}", float(bill[name]), tags))
    equivalent = (bill.get("dedicated_equivalent") or {}).get("cost")
    if equivalent is not None:
        out.append(("azureml.backfill.dedicated_equivalent_cost", float(equivalent), tags))
    return out


def format_runs(bill: Mapping[str, Any], dag_id: str, start: datetime, end: datetime) -> str:
    runs = bill.get("runs") or []
    lines = [f"{len(runs)} runs of {dag_id} with a logical date from {start.isoformat()} to {end.isoformat()}"]
    if runs:
        lines.append(f"  {'logical date':<26} {'state':<8} {'tasks':>5} {'jobs':>4} {'cost':>10} {'all-dedicated':>13}")
    for run in runs:
        figures = ("no report", "")
        if run["tasks_reported"]:
            figures = (cost.money(run["cost"]), cost.money(run["dedicated_equivalent"]))
        lines.append(
            f"  {str(run['logical_date'] or run['run_id'])[:26]:<26} {str(run['state'])[:8]:<8} "
            f"{run['tasks_reported']:>5} {len(run['jobs']):>4} {figures[0]:>10} {figures[1]:>13}"
        )
    if not runs:
        lines.append(
            "  no run: check the DAG id and the range (logical dates, UTC); runs without a logical date are not read"
        )
    unfinished = [r for r in runs if r["state"] not in ("success", "failed")]
    if unfinished:
        lines.append(f"  {len(unfinished)} runs not finished: their part of the bill is what they reported so far")
    if bill.get("reports_unreadable"):
        lines.append(
            f"  {bill['reports_unreadable']} cost reports could not be read (cleared meanwhile, or not stored in "
            "Airflow's database by a custom XCom backend): the bill leaves them out"
        )
    shared = bill.get("sum_of_runs_node_hours", 0.0) - sum((bill.get("node_hours") or {}).values())
    if shared > 1e-9 and bill.get("sum_of_runs_cost") is not None and bill.get("cost") is not None:
        lines.append(
            f"  sum of the runs {cost.money(bill['sum_of_runs_cost'])}; the range {cost.money(bill['cost'])}: runs "
            f"that waited on one cluster at the same time share its nodes ({shared:.4f} node-hours), billed once"
        )
    for name, kinds in (bill.get("price_changes") or {}).items():
        rates = "; ".join(f"{kind} {min(v)}-{max(v)}/h" for kind, v in kinds.items())
        undated = (bill.get("computes") or {}).get(name, {}).get("price_undated")
        how = (
            "not every report says since when its rate was in force, so the range is priced at one rate, the "
            "one seen last: approximate"
            if undated
            else "each node-second is priced at the rate in force then (the reports say since when)"
        )
        lines.append(f"  {name}: its price changed within the range ({rates}); {how}")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The command's arguments (``cli.ARGUMENTS``, which ``airflow azureml bill`` declares too)."""
    for flags, kwargs in ARGUMENTS:
        parser.add_argument(*flags, **kwargs)


def checked(args: argparse.Namespace) -> tuple[datetime, datetime]:
    """The range, with every argument checked before any call (ValueError says what is wrong)."""
    start, end = parse_bound(args.start, end=False), parse_bound(args.end, end=True)
    check_range(start, end)
    if not args.dag_id.strip():
        raise ValueError("--dag-id is empty")
    known = run_types()
    if args.run_type is not None and known and args.run_type not in known:
        raise ValueError(f"--run-type {args.run_type!r} is not one of {', '.join(known)}")
    return start, end


def run(args: argparse.Namespace, start: datetime, end: datetime) -> int:
    """Read, sum, print and send the bill of checked arguments (``checked``); 1 when Airflow could not be read."""
    hook = DagRunCostsHook(args.conn_id or AirflowRestHook.default_conn_name)
    try:
        runs = hook.read(args.dag_id, start, end, args.run_type)
    except Exception as exc:
        from airflow_azureml.redaction import scrub

        print(f"error: {scrub(str(exc), limit=500)}", file=sys.stderr)
        return 1
    finally:
        hook.close()
    bill = bill_of_runs(runs)
    bill.update(dag_id=args.dag_id, start=start.isoformat(), end=end.isoformat())
    if args.json:
        print(json.dumps(bill, indent=2, sort_keys=True))
    else:
        print(format_runs(bill, args.dag_id, start, end))
        print(cost.format_bill(bill, title=f"Azure ML bill of {args.dag_id}, {len(runs)} runs"))
    if not args.no_metrics:
        try:
            from airflow_azureml import compat

            stats = compat.command_stats()
            for name, value, tags in bill_metrics(bill, args.dag_id):
                stats.gauge(name, value, tags=tags)
        except Exception as exc:  # metrics are best effort
            print(f"metrics not sent: {type(exc).__name__}", file=sys.stderr)
    return 0


def main(argv: Iterable[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m airflow_azureml.cost",
        description=DESCRIPTION,
    )
    add_arguments(parser)
    args = parser.parse_args(list(argv) if argv is not None else None)
    try:  # bad input is refused before any call
        start, end = checked(args)
    except ValueError as exc:
        parser.error(str(exc))
    return run(args, start, end)
