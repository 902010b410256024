"""backfill_bill: the bill of a range of DAG runs, read through Airflow's REST API (here a fake transport)."""

from __future__ import annotations

import argparse
import json
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from airflow_azureml import backfill_bill, cost
from airflow_azureml.backfill_bill import DagRunCostsHook, RunCosts, bill_metrics, bill_of_runs, parse_bound

PRICES = {"spot-c": {"dedicated": 0.3, "spot": 0.06, "source": "manual"}}


def report(job: str, start: float, end: float, task: str, preemptions: int = 0) -> dict[str, Any]:
    """A task's ``azureml_cost`` as the job operators push it: two spot nodes running from start to end."""
    usage = {
        "v": 1,
        "computes": {"spot-c": {"vm_size": "STANDARD_DS3_V2", "location": "eastus", "tier": "low_priority"}},
        "spans": [{"job": job, "compute": "spot-c", "points": [[start, 0, 2, 0, 0, 0, 0]], "end": end, "statuses": []}],
    }
    bill = cost.estimate(usage, PRICES, preemptions=preemptions)
    bill.update(task_id=task, map_index=0, job_names=[job], usage=usage)
    return bill


def test_the_key_is_the_operators() -> None:
    from airflow_azureml.operators.job_cost import COST_XCOM_KEY

    assert cost.COST_XCOM_KEY == COST_XCOM_KEY == "azureml_cost"


def test_bounds_a_date_is_the_whole_day_and_naive_means_utc() -> None:
    assert parse_bound("2026-01-02", end=False) == datetime(2026, 1, 2, tzinfo=UTC)
    assert parse_bound("2026-01-02", end=True) == datetime(2026, 1, 2, 23, 59, 59, 999999, tzinfo=UTC)
    assert parse_bound("2026-01-02T06:00:00", end=True) == datetime(2026, 1, 2, 6, tzinfo=UTC)
    assert parse_bound("2026-01-02T06:00:00Z", end=False) == datetime(2026, 1, 2, 6, tzinfo=UTC)
    assert parse_bound("20260102", end=True) == datetime(2026, 1, 2, 23, 59, 59, 999999, tzinfo=UTC)  # a day too
    with pytest.raises(ValueError, match="not a date"):
        parse_bound("yesterday", end=False)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--dag-id", "d", "--from", "2026-02-01", "--to", "2026-01-01"], "is after --to"),
        (["--dag-id", "d", "--from", "last week", "--to", "2026-01-01"], "not a date"),
        (["--dag-id", " ", "--from", "2026-01-01", "--to", "2026-01-01"], "--dag-id is empty"),
        (["--from", "2026-01-01", "--to", "2026-01-01"], "--dag-id"),
        (["--dag-id", "d", "--from", "2026-01-01", "--to", "2026-01-01", "--run-type", "bogus"], "is not one of"),
    ],
)
def test_bad_input_is_refused_before_any_call(
    argv: list[str], message: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def no_call(*_: Any, **__: Any) -> None:
        raise AssertionError("the API was called")

    monkeypatch.setattr(DagRunCostsHook, "_connect", no_call)
    with pytest.raises(SystemExit) as exited:
        backfill_bill.main(argv)
    assert exited.value.code == 2
    assert message in capsys.readouterr().err


def test_airflow_azureml_bill_is_the_same_command_in_airflows_cli(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``airflow azureml bill`` (Airflow 3.2+ reads the provider's ``cli`` list): the same arguments, and bad input
    refused before any call with exit code 2."""
    from airflow_azureml import cli
    from airflow_azureml.get_provider_info import get_provider_info

    assert "airflow_azureml.cli.get_azureml_cli_commands" in get_provider_info()["cli"]
    (group,) = cli.get_azureml_cli_commands()
    (bill,) = group.subcommands
    assert (group.name, bill.name) == ("azureml", "bill")
    assert [a.flags for a in bill.args] == [flags for flags, _ in cli.ARGUMENTS]
    from airflow_azureml.hooks.airflow_rest import AirflowRestHook

    conn_help = dict(cli.ARGUMENTS)[("--conn-id",)]["help"]  # cli.py may not import the hook: Airflow's every call
    assert f"default: {AirflowRestHook.default_conn_name}" in conn_help

    def no_call(*_: Any, **__: Any) -> None:
        raise AssertionError("the API was called")

    monkeypatch.setattr(DagRunCostsHook, "_connect", no_call)
    parser = argparse.ArgumentParser()
    commands = parser.add_subparsers()
    sub = commands.add_parser("bill")
    for arg in bill.args:
        arg.add_to_parser(sub)
    sub.set_defaults(func=bill.func)
    args = parser.parse_args(["bill", "--dag-id", "d", "--from", "2026-02-01", "--to", "2026-01-01"])
    with pytest.raises(SystemExit) as exited:
        args.func(args)
    assert exited.value.code == 2 and "is after --to" in capsys.readouterr().err


class FakeApi:
    """Airflow's /api/v2 routes the hook reads, over runs and XCom values held here; records every request."""

    def __init__(
        self, runs: list[dict[str, Any]], values: dict[tuple[str, str, int], Any], listing_again: int = 0
    ) -> None:
        self.runs, self.values, self.requests = runs, values, []
        self.listing_again = listing_again  # entries listed twice, as an offset page shifted by a new row does

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        path, query = request.url.raw_path.decode().split("?")[0], request.url.params  # as sent: quoted
        assert request.headers["Authorization"] == "Bearer t0ken"
        if path == "/api/v2/dags/score%20it/dagRuns":
            assert query["logical_date_gte"] == "2026-01-01T00:00:00+00:00"
            rows = [r for r in self.runs if not query.get("run_type") or r["run_type"] == query["run_type"]]
            return self.page(rows, "dag_runs", query)
        if path == "/api/v2/dags/score%20it/dagRuns/~/taskInstances/~/xcomEntries":
            assert query["xcom_key"] == "azureml_cost"
            rows = [{"run_id": r, "task_id": t, "map_index": m} for (r, t, m) in self.values]
            rows += rows[: self.listing_again]
            return self.page(rows, "xcom_entries", query)
        prefix = "/api/v2/dags/score%20it/dagRuns/"
        if path.startswith(prefix) and path.endswith("/xcomEntries/azureml_cost"):
            run_id, _, task_id = path[len(prefix) :].split("/")[:3]
            key = (run_id, task_id, int(query["map_index"]))
            if key not in self.values or self.values[key] == 404:
                return httpx.Response(404, json={"detail": "not found"})
            return httpx.Response(200, json={"key": "azureml_cost", "value": self.values[key]})
        return httpx.Response(500, text=f"unexpected {path}")

    @staticmethod
    def page(rows: list[dict[str, Any]], items: str, query: Any) -> httpx.Response:
        offset, limit = int(query["offset"]), int(query["limit"])
        return httpx.Response(200, json={items: rows[offset : offset + limit], "total_entries": len(rows)})


def hook_on(api: FakeApi) -> DagRunCostsHook:
    hook = DagRunCostsHook()
    hook._client = httpx.Client(
        base_url="http://airflow", transport=httpx.MockTransport(api), headers={"Authorization": "Bearer t0ken"}
    )
    return hook


def test_reads_every_page_and_keeps_only_the_runs_asked_for(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backfill_bill, "PAGE", 2)
    runs = [
        {"dag_run_id": f"backfill__{d}", "logical_date": d, "state": "success", "run_type": "backfill"}
        for d in ("2026-01-01", "2026-01-02", "2026-01-03")
    ] + [{"dag_run_id": "manual__1", "logical_date": "2026-01-02", "state": "success", "run_type": "manual"}]
    values = {
        ("backfill__2026-01-01", "score", 0): report("j1", 0, 3600, "score"),
        ("backfill__2026-01-01", "score", 1): json.dumps(report("j2", 0, 3600, "score")),  # JSON text
        ("backfill__2026-01-02", "score", 0): report("j3", 7200, 10800, "score"),
        ("backfill__2026-01-03", "score", 0): 404,  # cleared after the listing
        ("backfill__2026-01-03", "score", 1): "s3://bucket/xcom/a-path",  # a remote XCom backend's reference
        ("manual__1", "score", 0): report("j4", 0, 3600, "score"),
    }
    api = FakeApi(runs, values)
    hook = hook_on(api)
    start, end = parse_bound("2026-01-01", end=False), parse_bound("2026-01-03", end=True)
    read = hook.read("score it", start, end, run_type="backfill")
    assert [(r.run_id, len(r.costs), r.unreadable) for r in read] == [
        ("backfill__2026-01-01", 2, 0),
        ("backfill__2026-01-02", 1, 0),
        ("backfill__2026-01-03", 0, 2),
    ]
    assert sum(r.url.path.endswith("/dagRuns") for r in api.requests) == 2  # 3 runs, pages of 2
    # every run in the range (the manual one too) without the run-type filter
    assert len(hook.read("score it", start, end)) == 4
    # a report listed twice (a backfill still writing while the pages are read) counts once
    twice = hook_on(FakeApi(runs, values, listing_again=2)).read("score it", start, end, run_type="backfill")
    assert [len(r.costs) for r in twice] == [2, 1, 0]


def test_the_bill_of_the_range_counts_shared_cluster_time_once() -> None:
    # runs A and B waited on one cluster at the same time (a backfill's overlapping runs), C an hour later
    a = RunCosts("a", "2026-01-01", "success", "backfill", [report("ja", 0, 3600, "score", preemptions=1)])
    b = RunCosts("b", "2026-01-02", "success", "backfill", [report("jb", 0, 3600, "score")])
    c = RunCosts("c", "2026-01-03", "running", "backfill", [report("jc", 7200, 10800, "score")])
    empty = RunCosts("d", "2026-01-04", "failed", "backfill", [])
    bill = bill_of_runs([a, b, c, empty])
    assert bill["node_hours"]["low_priority"] == pytest.approx(4.0)  # 2 nodes x (1 h shared by A and B + C's 1 h)
    assert bill["cost"] == pytest.approx(4 * 0.06)
    assert bill["sum_of_runs_cost"] == pytest.approx(6 * 0.06)  # each run alone pays for the shared hour
    assert bill["preemptions"] == 1 and bill["jobs"] == ["ja", "jb", "jc"] and bill["tasks_reported"] == 3
    assert [(r["run_id"], r["tasks_reported"], r["cost"]) for r in bill["runs"]][3] == ("d", 0, None)  # not $0
    assert "usage" not in bill and "tasks" not in bill
    json.dumps(bill)
    text = backfill_bill.format_runs(bill, "score", datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 1, 4, tzinfo=UTC))
    assert "4 runs of score" in text and "1 runs not finished" in text and "no report" in text
    assert "(2.0000 node-hours), billed once" in text and "price changed" not in text


def test_the_shared_time_is_only_claimed_when_runs_overlapped_and_a_price_change_is_said() -> None:
    a = RunCosts("a", "2026-01-01", "success", "backfill", [report("ja", 0, 3600, "score")])
    later = report("jb", 7200, 10800, "score")
    later["computes"]["spot-c"]["hourly_price"] = 0.03  # the spot price moved between the two runs
    b = RunCosts("b", "2026-01-02", "success", "backfill", [later])
    bill = bill_of_runs([a, b])
    text = backfill_bill.format_runs(bill, "score", datetime(2026, 1, 1, tzinfo=UTC), datetime(2026, 1, 2, tzinfo=UTC))
    assert "billed once" not in text  # no overlap: whatever the totals, no shared time
    assert bill["price_changes"] == {"spot-c": {"hourly_price": [0.03, 0.06]}}
    assert "spot-c: its price changed within the range (hourly_price 0.03-0.06/h)" in text


def test_a_price_that_moved_prices_each_node_second_at_the_rate_in_force_then() -> None:
    """A long backfill sees the spot price move (issue 22 section 3): where the reports say since when each rate
    was in force, the range bills each stretch at its own rate; without the dates, at one rate (said so)."""
    from datetime import timedelta

    start = datetime(2026, 1, 1, tzinfo=UTC)
    t0 = start.timestamp()
    moved_at = (start + timedelta(hours=1, minutes=30)).isoformat()

    def dated(job: str, begin: float, end: float, rate: float, since: str | None) -> dict[str, Any]:
        r = report(job, t0 + begin, t0 + end, "score")
        r["computes"]["spot-c"].update(
            hourly_price=rate,
            price_effective_from=since,
            dedicated_price_effective_from="2024-04-01T00:00:00Z" if since else None,
        )
        return r

    old, new = 0.06, 0.03
    a = RunCosts("a", "2026-01-01", "success", "backfill", [dated("ja", 0, 3600, old, "2024-04-01T00:00:00Z")])
    b = RunCosts("b", "2026-01-02", "success", "backfill", [dated("jb", 3600, 3 * 3600, new, moved_at)])
    bill = bill_of_runs([a, b])
    # two nodes each: the first 1.5 h at the old rate, the last 1.5 h at the new one
    assert bill["cost"] == pytest.approx(2 * 1.5 * old + 2 * 1.5 * new)
    windows = bill["computes"]["spot-c"]["price_windows"]
    assert [(w["from"], w["hourly_price"]) for w in windows] == [
        ("2024-04-01T00:00:00+00:00", old),
        ("2026-01-01T01:30:00+00:00", new),
    ]
    assert [round(w["node_hours"], 6) for w in windows] == [3.0, 3.0]
    assert bill["dedicated_equivalent"]["cost"] == pytest.approx(2 * 3 * 0.3)  # pay-as-you-go did not move
    assert bill["node_hours"]["low_priority"] == pytest.approx(6.0)
    text = backfill_bill.format_runs(bill, "score", start, start)
    assert "each node-second is priced at the rate in force then" in text
    assert "from 2026-01-01T01:30:00+00:00: 3.0000 node-hours at $0.03/h" in cost.format_bill(bill)
    # without the dates: one rate, and said so
    undated = bill_of_runs(
        [
            RunCosts("a", "2026-01-01", "success", "backfill", [dated("ja", 0, 3600, old, None)]),
            RunCosts("b", "2026-01-02", "success", "backfill", [dated("jb", 3600, 3 * 3600, new, None)]),
        ]
    )
    assert undated["cost"] == pytest.approx(2 * 3 * new)  # the rate seen last, as before
    assert "so the range is priced at one rate" in backfill_bill.format_runs(undated, "score", start, start)
    # one report without dates among dated ones: the compute is priced at one rate, the one seen last
    mixed = bill_of_runs(
        [a, RunCosts("b", "2026-01-02", "success", "backfill", [dated("jb", 3600, 3 * 3600, new, None)])]
    )
    assert mixed["cost"] == pytest.approx(2 * 3 * new) and mixed["computes"]["spot-c"]["price_undated"]


T0 = datetime(2026, 1, 1, tzinfo=UTC).timestamp()


def priced(r: dict[str, Any], rate: float, since: float, payg: float = 0.3, payg_since: float = 0.0) -> dict[str, Any]:
    """A report quoting ``rate`` (spot) since ``since`` and pay-as-you-go ``payg`` since ``payg_since`` (epoch)."""
    r["computes"]["spot-c"].update(
        hourly_price=rate,
        price_effective_from=cost.iso_time(since),
        dedicated_hourly_price=payg,
        dedicated_price_effective_from=cost.iso_time(payg_since),
    )
    return r


def with_run_history(job: str, begin: float, end: float, readings: list[list[float]]) -> dict[str, Any]:
    """A report whose node time rests on run history's times too (``cost._attempt_floors``): 2 nodes ran the
    job from ``begin`` to ``end``, and the reads say ``readings`` ([t, queued, running, ...])."""
    r = report(job, begin, end, "score")
    span = r["usage"]["spans"][0]
    span.update(points=readings, started_at=begin, ended_at=end, instance_count=2)
    return r


@pytest.mark.parametrize(
    "readings",
    [
        [
            [T0, 0, 4, 0, 0, 0, 0],
            [T0 + 1000, 0, 4, 0, 0, 0, 0],
            [T0 + 2000, 0, 0, 0, 0, 0, 0],
            [T0 + 3600, 0, 0, 0, 0, 0, 0],
        ],
        # [t, preparing, running, idle, leaving, preempted, unusable]
        [[T0, 0, 2, 0, 0, 0, 0], [T0 + 100, 0, 0, 0, 0, 2, 0], [T0 + 3600, 0, 0, 0, 0, 2, 0]],
    ],
    ids=["floor-after-the-reads", "evicted-then-floor"],
)
def test_a_price_move_reprices_the_node_time_and_changes_none_of_it(readings: list[list[float]]) -> None:
    """The node time, evicted and lost hours and the all-dedicated node time are those of one rate (the floors
    of run history's times included); only the price of each stretch changes (a review found the stretches'
    floors computed apart: +32 % node time)."""
    job = with_run_history("ja", T0, T0 + 3600, readings)
    other = with_run_history("jb", T0 + 7200, T0 + 7300, [[T0 + 7200, 0, 0, 0, 0, 0, 0]])
    moved = cost.run_bill([priced(job, 0.06, T0 - 86400), priced(other, 0.03, T0 + 1800)])
    both = cost.run_bill([priced(job, 0.06, T0 - 86400), priced(other, 0.06, T0 - 86400)])
    for key in ("node_hours", "evicted_node_hours", "lost_node_hours"):
        assert moved[key] == pytest.approx(both[key]), key
    assert moved["dedicated_equivalent"]["node_hours"] == pytest.approx(both["dedicated_equivalent"]["node_hours"])
    windows = moved["computes"]["spot-c"]["price_windows"]
    assert sum(w["node_hours"] for w in windows) == pytest.approx(both["node_hours"]["low_priority"])
    assert [w["hourly_price"] for w in windows] == [0.06, 0.03]
    assert moved["cost"] == pytest.approx(sum(w["node_hours"] * w["hourly_price"] for w in windows))
    assert moved["cost"] < both["cost"]


def test_pay_as_you_go_moves_on_its_own_date_and_equal_dates_take_the_rate_read_last() -> None:
    a = priced(report("ja", T0, T0 + 3600, "score"), 0.06, T0 - 86400, payg=0.3, payg_since=T0 - 86400)
    b = priced(report("jb", T0 + 3600, T0 + 7200, "score"), 0.06, T0 - 86400, payg=0.4, payg_since=T0 + 3600)
    bill = cost.run_bill([a, b])
    assert bill["dedicated_equivalent"]["cost"] == pytest.approx(2 * 1 * 0.3 + 2 * 1 * 0.4)  # each hour its rate
    assert bill["cost"] == pytest.approx(2 * 2 * 0.06)
    c = priced(report("jc", T0, T0 + 3600, "score"), 0.05, T0 - 3600)
    d = priced(report("jd", T0 + 3600, T0 + 7200, "score"), 0.02, T0 - 3600)  # the same date: read last wins
    assert cost.run_bill([c, d])["cost"] == pytest.approx(2 * 2 * 0.02)
    assert cost.run_bill([d, c])["cost"] == pytest.approx(2 * 2 * 0.05)


def test_metrics_of_the_range() -> None:
    run = RunCosts("a", "2026-01-01", "success", "backfill", [report("ja", 0, 3600, "score", preemptions=2)])
    sent = {(name, tuple(sorted(tags.items()))): value for name, value, tags in bill_metrics(bill_of_runs([run]), "d")}
    assert sent[("azureml.backfill.runs", (("dag_id", "d"),))] == 1
    assert sent[("azureml.backfill.node_hours", (("dag_id", "d"), ("tier", "low_priority")))] == pytest.approx(2.0)
    assert sent[("azureml.backfill.cost", (("dag_id", "d"),))] == pytest.approx(0.12)
    assert sent[("azureml.backfill.preemptions", (("dag_id", "d"),))] == 2
    assert sent[("azureml.backfill.dedicated_equivalent_cost", (("dag_id", "d"),))] == pytest.approx(0.6)


def test_an_api_error_is_one_line_without_the_token(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    leaked = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhZG1pbiJ9.c2lnbmF0dXJlc2lnbmF0dXJl"

    def failing(self: DagRunCostsHook, *_: Any) -> list[RunCosts]:
        raise RuntimeError(f"500 from the api-server; request had Authorization: Bearer {leaked}")

    monkeypatch.setattr(DagRunCostsHook, "read", failing)
    code = backfill_bill.main(["--dag-id", "d", "--from", "2026-01-01", "--to", "2026-01-02", "--no-metrics"])
    err = capsys.readouterr().err
    assert code == 1 and err.startswith("error: 500 from the api-server") and leaked not in err


SENDS_METRICS = """
import json, sys
from airflow_azureml import backfill_bill
runs = [backfill_bill.RunCosts(**r) for r in json.loads(sys.argv[1])]
backfill_bill.DagRunCostsHook.read = lambda self, *args, **kwargs: runs  # the REST reads are tested above
sys.exit(backfill_bill.main(sys.argv[2:]))
"""


def test_the_command_sends_its_gauges_through_airflows_statsd_client(tmp_path: Any) -> None:
    """A plain process: nothing but the command sets Airflow's metrics client up (a task's runner does it)."""
    import os
    import socket
    import subprocess
    import sys
    import time

    from tests.conftest import REPO

    run = RunCosts("a", "2026-01-01", "success", "backfill", [report("ja", 0, 3600, "score", preemptions=1)])
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.settimeout(1.0)
        env = {
            **os.environ,
            "AIRFLOW_HOME": str(tmp_path),
            "AIRFLOW__METRICS__STATSD_ON": "True",
            "AIRFLOW__METRICS__STATSD_HOST": "127.0.0.1",
            "AIRFLOW__METRICS__STATSD_PORT": str(listener.getsockname()[1]),
            "AIRFLOW__METRICS__STATSD_INFLUXDB_ENABLED": "True",  # tags in the name; plain StatsD drops them
            "PYTHONPATH": str(REPO),
        }
        argv = [json.dumps([run.__dict__]), "--dag-id", "d", "--from", "2026-01-01", "--to", "2026-01-01"]
        done = subprocess.run(
            [sys.executable, "-c", SENDS_METRICS, *argv], env=env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr[-2000:]
        received: list[str] = []
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and not any("backfill.cost" in r for r in received):
            try:
                received += listener.recv(65536).decode().splitlines()
            except TimeoutError:
                continue
    assert "airflow.azureml.backfill.cost,dag_id=d:0.12|g" in received, received
    assert "airflow.azureml.backfill.node_hours,dag_id=d,tier=low_priority:2.0|g" in received, received
