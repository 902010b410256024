"""The savings view: its figures (``savings``), its page (``plugins.savings_page``) and its app's handling of
credentials and of Airflow's answers (``plugins.savings``), with Airflow's REST API faked at the HTTP edge.
The real api-server, auth manager and browser are in tests/e2e/test_partitioned_assets.py."""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import pytest

from airflow_azureml import cost, savings
from airflow_azureml.plugins import savings_page
from airflow_azureml.plugins.savings import AzureMLSavingsPlugin, build_app, credential

PRICES = {"spot-c": {"dedicated": 1.0, "spot": 0.2, "source": "manual"}}


def report(
    job_names: list[str],
    start: float,
    end: float,
    task: str = "score",
    map_index: int = 0,
    preemptions: int = 0,
    deadline: float | None = None,
    finished: float | None = None,
) -> dict[str, Any]:
    """A task's ``azureml_cost`` as the job operators push it: two spot nodes running from start to end."""
    usage = {
        "v": 1,
        "computes": {"spot-c": {"vm_size": "STANDARD_DS3_V2", "location": "eastus", "tier": "low_priority"}},
        "spans": [
            {
                "job": job_names[-1],
                "compute": "spot-c",
                "points": [[start, 0, 2, 0, 0, 0, 0]],
                "end": end,
                "statuses": [],
            }
        ],
    }
    bill = cost.estimate(usage, PRICES, preemptions=preemptions)
    bill.update(
        task_id=task,
        map_index=map_index,
        job_names=job_names,
        usage=usage,
        deadline=cost.iso_time(deadline),
        finished_at=cost.iso_time(finished if finished is not None else end),
    )
    return bill


T0 = 1_780_000_000.0


def test_a_runs_figures_are_its_reports_billed_together() -> None:
    reports = [
        report(["a-1", "a-2"], T0, T0 + 3600, map_index=0, preemptions=1),
        report(["b-1"], T0 + 1800, T0 + 5400, map_index=1),
    ]
    figures = savings.run_figures(savings.RunReports("r1", reports=reports))
    bill = cost.run_bill(reports)
    assert figures["jobs"] == 3 and figures["resubmissions"] == 1 and figures["preemptions"] == 1
    assert figures["cost"] == bill["cost"] and figures["dedicated_equivalent"] == bill["dedicated_equivalent"]["cost"]
    assert figures["spot_node_hours"] == pytest.approx(bill["node_hours"]["low_priority"])
    assert [t["task"] for t in figures["tasks"]] == ["score[0]", "score[1]"]
    assert figures["tasks"][0]["cost"] == reports[0]["cost"] and figures["tasks"][0]["resubmissions"] == 1
    assert figures["price_sources"] == ["spot-c: manual"]


def test_a_run_without_a_report_has_an_unknown_cost_not_zero() -> None:
    figures = savings.run_figures(savings.RunReports("r1"))
    assert not figures["reported"] and figures["cost"] is None and figures["savings"] is None


def test_each_task_is_measured_against_its_own_deadline_and_the_worst_one_shows() -> None:
    """Task A met an early deadline, task B a late one: neither is late, whatever the other's end."""
    met_early = report(["a-1"], T0, T0 + 3000, deadline=T0 + 3600, finished=T0 + 3000)
    met_late = report(["b-1"], T0, T0 + 10800, map_index=1, deadline=T0 + 14400, finished=T0 + 10800)
    no_deadline = report(["c-1"], T0, T0 + 7200, map_index=2, finished=T0 + 7200)
    deadline, margin, late, counted = savings.deadline_margin([met_early, met_late, no_deadline])
    assert (deadline, margin, late, counted) == (cost.iso_time(T0 + 3600), 600, 0, 2)
    missed = report(["d-1"], T0, T0 + 700, map_index=3, deadline=T0 + 300, finished=T0 + 700)
    assert savings.deadline_margin([met_early, missed])[1:] == (-400, 1, 2)
    assert savings.deadline_margin([no_deadline]) == (None, None, 0, 0)
    assert savings.task_figures(met_late)["margin_seconds"] == 3600


def test_the_dags_margin_is_the_worst_runs_not_the_runs_pooled() -> None:
    """Two daily runs, each 1000 s ahead of its own deadline: the DAG's worst margin is +1000 s, no run late."""
    day = 86400
    runs = [
        savings.RunReports(
            f"r{n}",
            reports=[
                report(
                    [f"j{n}"],
                    T0 + n * day,
                    T0 + n * day + 600,
                    deadline=T0 + n * day + 1600,
                    finished=T0 + n * day + 600,
                )
            ],
        )
        for n in (1, 0)
    ]
    total = savings.dag_figures(runs)["total"]
    assert (total["margin_seconds"], total["late"], total["with_deadline"]) == (1000, 0, 2)


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (2600, "+43 min 20 s"),
        (-400, "-6 min 40 s"),
        (5, "+5 s"),
        (0, "+0 s"),
        (3540, "+59 min"),
        (3 * 3600 + 65, "+3 h 1 min"),
        (None, "unknown"),
    ],
)
def test_margin_text(seconds: float | None, text: str) -> None:
    assert savings_page.margin(seconds) == text


def test_report_values_as_the_api_returns_them() -> None:
    assert savings.report_value({"cost": 1}) == {"cost": 1}
    assert savings.report_value(json.dumps({"cost": 1})) == {"cost": 1}
    assert savings.report_value("s3://bucket/xcom/path") is None and savings.report_value(None) is None


def test_everything_from_airflow_or_a_report_is_escaped() -> None:
    hostile = savings.RunReports('<script>alert(1)</script>"', state="<b>", reports=[report(["j<1>"], T0, T0 + 60)])
    hostile.reports[0]["task_id"] = "<img src=x onerror=alert(1)>"
    page = savings_page.run_page("<dag>", savings.run_figures(hostile))
    dag = savings_page.dag_page("<dag>", savings.dag_figures([hostile]), 25)
    for html in (page, dag):
        assert "<script>" not in html and "<img" not in html and "<dag>" not in html and "<b>" not in html


def test_a_page_shows_the_deadline_card_only_when_a_report_has_one() -> None:
    with_deadline = savings.run_figures(
        savings.RunReports("r", reports=[report(["a"], T0, T0 + 60, deadline=T0 + 3600, finished=T0 + 60)])
    )
    html = savings_page.run_page("d", with_deadline)
    assert re.search(r'data-figure="deadline">' + re.escape(cost.iso_time(T0 + 3600) or "") + "<", html)
    assert len(re.findall(r'data-figure="margin"[^>]*>\+59 min<', html)) == 2  # the card and the task's line
    assert re.search(r'data-figure="late">0 of 1<', html)
    without = savings_page.run_page(
        "d", savings.run_figures(savings.RunReports("r", reports=[report(["a"], T0, T0 + 60)]))
    )
    assert 'data-figure="deadline"' not in without


def test_the_dag_page_links_each_run_below_the_dags_own_path() -> None:
    html = savings_page.dag_page(
        "my dag", savings.dag_figures([savings.RunReports("manual__2026-01-01T00:00:00+00:00")]), 25
    )
    # the page is /azureml-savings/dags/my%20dag: a link relative to it must start with the DAG's own segment
    assert 'href="my%20dag/runs/manual__2026-01-01T00%3A00%3A00%2B00%3A00"' in html


# ------------------------------------------------------------------ the app, with Airflow's API at the HTTP edge
class FakeAirflow:
    """Airflow's /api/v2 as the view reads it. ``allowed``: the tokens that may read the DAG."""

    def __init__(self, reports: dict[str, list[Any]], allowed: set[str]) -> None:
        self.reports, self.allowed, self.tokens = reports, allowed, []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        token = request.headers.get("authorization", "").removeprefix("Bearer ")
        if not token and request.headers.get("cookie", "").startswith("_token="):
            token = "cookie:" + request.headers["cookie"].removeprefix("_token=")
        self.tokens.append(token)
        if token not in self.allowed:
            return httpx.Response(403, json={"detail": "Forbidden"})
        path = request.url.raw_path.decode().split("?")[0]
        base = "/api/v2/dags/d"
        if path == base:
            return httpx.Response(200, json={"dag_id": "d"})
        if path == f"{base}/dagRuns":
            runs = [
                {"dag_run_id": r, "state": "success", "logical_date": None, "run_after": None} for r in self.reports
            ]
            return httpx.Response(200, json={"dag_runs": runs, "total_entries": len(runs)})
        for run_id, values in self.reports.items():
            if path == f"{base}/dagRuns/{run_id}":
                return httpx.Response(200, json={"dag_run_id": run_id, "state": "success"})
            if path == f"{base}/dagRuns/{run_id}/taskInstances/~/xcomEntries":
                rows = [{"task_id": "score", "map_index": i} for i in range(len(values))]
                return httpx.Response(200, json={"xcom_entries": rows, "total_entries": len(rows)})
            if path == f"{base}/dagRuns/{run_id}/taskInstances/score/xcomEntries/azureml_cost":
                value = values[int(request.url.params["map_index"])]
                if value == 404:
                    return httpx.Response(404, json={"detail": "gone"})
                return httpx.Response(200, json={"key": "azureml_cost", "value": value})
        return httpx.Response(500, text=f"unexpected {path}")


def client(api: FakeAirflow) -> Any:
    from fastapi.testclient import TestClient

    return TestClient(build_app(transport=lambda _request: httpx.MockTransport(api)))


def test_the_view_reads_with_the_persons_own_token_header_first_then_cookie() -> None:
    reports = {"r1": [report(["a"], T0, T0 + 3600), json.dumps(report(["b"], T0, T0 + 60, map_index=1)), 404]}
    api = FakeAirflow(reports, allowed={"cookie:alice"})
    with client(api) as app:
        page = app.get("/dags/d/runs/r1", cookies={"_token": "alice"})
        assert page.status_code == 200 and set(api.tokens) == {"cookie:alice"}
        assert 'data-task="score[0]"' in page.text and 'data-task="score[1]"' in page.text
        assert "1 cost reports could not be read" in page.text
        bill = cost.run_bill([report(["a"], T0, T0 + 3600), report(["b"], T0, T0 + 60, map_index=1)])
        assert f'data-figure="cost">{cost.money(bill["cost"])}<' in page.text
        api.tokens.clear()
        denied = app.get("/dags/d", headers={"Authorization": "Bearer mallory"}, cookies={"_token": "alice"})
        assert denied.status_code == 403 and api.tokens == ["mallory"]  # the explicit credential wins, as in Airflow
        assert "cost" not in re.findall(r'data-figure="(\w+)"', denied.text) and "may not read it" in denied.text


def test_no_credential_no_call_and_no_figure() -> None:
    api = FakeAirflow({"r1": [report(["a"], T0, T0 + 60)]}, allowed={"alice"})
    with client(api) as app:
        page = app.get("/dags/d")
    assert page.status_code == 401 and api.tokens == [] and re.findall(r'data-figure="(\w+)"', page.text) == ["message"]


def test_an_api_failure_is_said_without_the_token() -> None:
    def broken(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError(f"refused, token {request.headers['authorization']}")

    from fastapi.testclient import TestClient

    with TestClient(build_app(transport=lambda _r: httpx.MockTransport(broken))) as app:
        page = app.get("/dags/d", headers={"Authorization": "Bearer eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhIn0.c2lnbmF0dXJl"})
    assert page.status_code == 502 and "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhIn0" not in page.text


def test_the_dag_page_caps_the_runs_it_asks_for() -> None:
    api = FakeAirflow({"r1": []}, allowed={"cookie:alice"})
    seen: list[httpx.Request] = []

    def recording(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return api(request)

    from fastapi.testclient import TestClient

    with TestClient(build_app(transport=lambda _r: httpx.MockTransport(recording))) as app:
        assert app.get("/dags/d?runs=100000", cookies={"_token": "alice"}).status_code == 200
    listing = next(r for r in seen if r.url.path.endswith("/dagRuns"))
    assert listing.url.params["limit"] == "100" and listing.url.params["order_by"] == "-run_after"


def test_credential_order() -> None:
    assert credential({"authorization": "Bearer a"}, {"_token": "b"}) == {"Authorization": "Bearer a"}
    assert credential({"authorization": "Basic eA=="}, {"_token": "b"}) == {"Cookie": "_token=b"}
    assert credential({}, {}) is None


@pytest.mark.parametrize("destination", ["dag", "dag_run"])
def test_each_tab_opens_a_page_of_the_app_relative_to_the_uis_base(destination: str) -> None:
    """The UI fills {DAG_ID} and {RUN_ID} (URL-encoded) and resolves the href against its <base href>: so
    it must be relative, and below the app's mount point it must be one of the app's routes."""
    (view,) = [v for v in AzureMLSavingsPlugin.external_views if v["destination"] == destination]
    prefix = AzureMLSavingsPlugin.fastapi_apps[0]["url_prefix"]
    href = view["href"].replace("{DAG_ID}", "d").replace("{RUN_ID}", "r1")
    assert not href.startswith("/") and "/" + href.split("/", 1)[0] == prefix
    api = FakeAirflow({"r1": [report(["a"], T0, T0 + 60)]}, allowed={"cookie:alice"})
    with client(api) as app:
        assert app.get("/" + href.split("/", 1)[1], cookies={"_token": "alice"}).status_code == 200


def test_the_plugin_is_an_airflow_plugins_entry_point() -> None:
    from importlib.metadata import entry_points

    (ep,) = [e for e in entry_points(group="airflow.plugins") if e.value.startswith("airflow_azureml")]
    assert ep.load() is AzureMLSavingsPlugin


def test_a_value_read_refused_to_the_person_shows_nothing_not_a_smaller_bill() -> None:
    reports = {"r1": [report(["a"], T0, T0 + 60), report(["b"], T0, T0 + 60, map_index=1)]}
    api = FakeAirflow(reports, allowed={"alice"})

    def value_forbidden(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/xcomEntries/azureml_cost") and request.url.params["map_index"] == "1":
            return httpx.Response(403, json={"detail": "Forbidden"})
        return api(request)

    from fastapi.testclient import TestClient

    with TestClient(build_app(transport=lambda _r: httpx.MockTransport(value_forbidden))) as app:
        for path in ("/dags/d", "/dags/d/runs/r1"):
            page = app.get(path, headers={"Authorization": "Bearer alice"})
            assert page.status_code == 403 and re.findall(r'data-figure="(\w+)"', page.text) == ["message"], path


def test_the_dag_page_says_how_many_reports_it_left_out() -> None:
    api = FakeAirflow({"r1": [report(["a"], T0, T0 + 60), 404], "r2": ["s3://bucket/xcom"]}, allowed={"alice"})
    with client(api) as app:
        page = app.get("/dags/d", headers={"Authorization": "Bearer alice"})
    assert page.status_code == 200 and "2 cost reports could not be read" in page.text


def test_an_unknown_cost_is_no_bar_in_the_chart() -> None:
    run = savings.run_figures(savings.RunReports("r1", reports=[report(["b"], T0, T0 + 60)]))
    run.update(cost=None)
    svg = savings_page.chart([run])
    assert svg.count("<rect") == 1 and 'data-unknown="cost"' in svg


def test_an_error_inside_airflows_api_is_a_502_page_and_a_hang_a_504(monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio

    from fastapi.testclient import TestClient

    from airflow_azureml.plugins import savings as plugin

    def failing(_request: httpx.Request) -> httpx.Response:
        return httpx.Response(500, text="Internal Server Error")

    async def hanging(_request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(30)
        return httpx.Response(200, json={})

    with TestClient(build_app(transport=lambda _r: httpx.MockTransport(failing))) as app:
        assert app.get("/dags/d", headers={"Authorization": "Bearer a"}).status_code == 502
    monkeypatch.setattr(plugin, "PAGE_TIMEOUT", 0.2)
    with TestClient(build_app(transport=lambda _r: httpx.MockTransport(hanging))) as app:
        page = app.get("/dags/d", headers={"Authorization": "Bearer a"})
    assert page.status_code == 504 and re.findall(r'data-figure="(\w+)"', page.text) == ["message"]


def test_the_report_ends_when_the_chains_last_job_ended_by_run_history() -> None:
    from airflow_azureml.lifecycle import ResubmissionState
    from airflow_azureml.operators.job_cost import chain_end

    state = ResubmissionState(key="k", job_names=["j-1", "j-2"])
    state.usage = {"spans": [{"job": "j-1", "ended_at": T0 + 10}, {"job": "j-2", "ended_at": T0 + 50}, {"job": "j-2"}]}
    assert chain_end(state) == T0 + 50
    state.usage = {"spans": [{"job": "j-1", "ended_at": T0 + 10}]}
    assert chain_end(state) is None  # the last job's end unknown: the report's own time is used
