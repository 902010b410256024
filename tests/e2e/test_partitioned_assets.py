"""Partitioned assets (Airflow 3.3) with the real scheduler: a backfill of ``example_asset_scoring`` over two
intervals gives ``example_asset_partition_report`` one run per scored (interval, partition) key, and none for
the interval the ETL wrote but the backfill did not score (``dags/example_asset_chain.py``, docs/assets.md).

The scheduler creates runs here (the other e2e files turn ``use_job_schedule`` off, which stops asset-triggered
runs too), with every DAG paused at creation: only the chain's are unpaused. The ETL writes three intervals
while the scoring DAG is still paused (Airflow queues no run of a paused DAG for an event), so only the backfill
scores; its own latest ``@daily`` run, for a day the ETL never wrote, must skip every task.
``example_asset_report`` stays paused: it runs Azure ML command jobs and is not what this file proves.

The savings view (``airflow_azureml.plugins.savings``, docs/ui.md) is tested here too, in headless Chromium on
this deployment's api-server, with the runs the backfill made: its figures must equal the XCom cost reports.
This deployment is not all-admins: the harness and the browser sign in (``POST /auth/token``) as ``admin``, and
its auth manager (``tests/e2e/savings_auth.py``) lets the user ``outsider`` read no DAG. The scoring tasks have
an absolute deadline (``AZUREML_DEADLINE``, six hours after the deployment started), which a backfill applies.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from airflow_azureml import compat, cost
from airflow_azureml.plugins import savings_page
from tests.e2e import browser
from tests.e2e.conftest import E2E, deployment
from tests.e2e.harness import REPO
from tests.e2e.rows import wait_until

# Beside the 3.1/3.2 runs in .ci/run (make test-distributed): inside `make test` its deployment took it 29 s
# past the 12 min budget (12 min 29 s in the .ci/run of a079fa2).
# Its own timeout, as the other distributed files have: the first row's also holds the module's deployment start,
# which `make test-distributed` runs beside the Celery deployment (two workers) and .ci/run beside 3.1/3.2.
pytestmark = [pytest.mark.e2e, pytest.mark.distributed, pytest.mark.timeout(900)]

ETL, SCORING, REPORT, PARTITION_REPORT = (
    "example_asset_etl",
    "example_asset_scoring",
    "example_asset_report",
    "example_asset_partition_report",
)
WRITTEN = ["2026-11-01", "2026-11-02", "2026-11-03"]  # the ETL's intervals
BACKFILLED = WRITTEN[:2]  # the scoring backfill's
EXPECTED_KEYS = {f"{day}T00:00:00|part-{k:03d}" for day in BACKFILLED for k in (0, 1)}


def runs(e2e: E2E, dag_id: str) -> list[dict[str, Any]]:
    return list(e2e.airflow.api("GET", f"/dags/{dag_id}/dagRuns", params={"limit": 100})["dag_runs"])


def pause(e2e: E2E, dag_id: str, paused: bool) -> None:
    e2e.airflow.api("PATCH", f"/dags/{dag_id}", json={"is_paused": paused})


@pytest.fixture(scope="module")
def e2e(tmp_path_factory: pytest.TempPathFactory) -> Iterator[E2E]:
    base = tmp_path_factory.mktemp("e2e-partitions")
    passwords = base / "simple_auth_manager_passwords.json"
    passwords.write_text(json.dumps({"admin": secrets.token_urlsafe(12), "outsider": secrets.token_urlsafe(12)}))
    deadline = datetime.now(timezone.utc).replace(microsecond=0) + timedelta(hours=6)
    scheduling = {
        "AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE": "True",
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "True",
        # signed-in users, one of whom may read no DAG (the savings view's test)
        "AIRFLOW__CORE__AUTH_MANAGER": "tests.e2e.savings_auth.OutsiderDeniedAuthManager",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "False",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin,outsider:admin",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE": str(passwords),
        "AZUREML_E2E_LOGIN": "admin",
        "PYTHONPATH": os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p),
        "AZUREML_DEADLINE": deadline.isoformat(),
    }
    with deployment(base, extra_env=scheduling) as running:
        yield running


def test_a_backfill_of_the_scoring_dag_runs_the_partition_report_once_per_scored_partition(
    e2e: E2E, tmp_path: Path
) -> None:
    assert compat.has_partitioned_assets(), "this deployment's Airflow (3.3) keys asset events per partition"
    airflow = e2e.airflow
    for dag_id in (ETL, SCORING, REPORT, PARTITION_REPORT):
        airflow.wait_for_dag(dag_id)
    pause(e2e, ETL, False)
    pause(e2e, PARTITION_REPORT, False)

    etl_runs = [airflow.trigger(ETL, f"{day}T00:00:00+00:00") for day in WRITTEN]
    assert [airflow.wait_for_run(ETL, run_id, timeout=180) for run_id in etl_runs] == ["success"] * 3
    assert runs(e2e, SCORING) == []  # paused: the ETL's events queued nothing

    pause(e2e, SCORING, False)
    started = time.monotonic()
    created = airflow.airflow(
        "backfill", "create", "--dag-id", SCORING, "--from-date", BACKFILLED[0], "--to-date", BACKFILLED[-1]
    )
    backfilled = wait_until(
        lambda: [r for r in runs(e2e, SCORING) if r["run_type"] == "backfill"], 60, "backfill runs", interval=1
    )
    assert sorted(r["logical_date"][:10] for r in backfilled) == BACKFILLED, created.stdout[-2000:]
    for run in backfilled:
        assert airflow.wait_for_run(SCORING, run["dag_run_id"], timeout=300) == "success", airflow.task_instances(
            SCORING, run["dag_run_id"]
        )
    # unpaused, the scoring DAG's @daily part makes a run for the latest day (catchup off): it scores nothing
    scheduled = wait_until(
        lambda: [r for r in runs(e2e, SCORING) if r["run_type"] == "scheduled"], 120, "the @daily run", interval=1
    )
    assert [r["run_type"] for r in runs(e2e, SCORING)].count("scheduled") == len(scheduled) >= 1
    for run in scheduled:
        airflow.wait_for_run(SCORING, run["dag_run_id"], timeout=120)
        assert {t["state"] for t in airflow.task_instances(SCORING, run["dag_run_id"])} == {"skipped"}, run
    # Azure got one job per scored partition, none for the interval nobody scored (the emulator's records)
    for day in WRITTEN:
        jobs = e2e.jobs_for(e2e.interval_key(f"{day}T00:00"))
        assert len(jobs) == (2 if day in BACKFILLED else 0), (day, [j.name for j in jobs])

    # The keyed events are written with announce_interval's success, with the queue entries the scheduler
    # turns into runs: every run the backfill caused exists once its four keys have runs that ended.
    def report_runs_ended() -> list[dict[str, Any]]:
        found = runs(e2e, PARTITION_REPORT)
        done = len(found) >= len(EXPECTED_KEYS) and all(r["state"] in ("success", "failed") for r in found)
        return found if done else []

    report_runs = wait_until(report_runs_ended, 180, "the partition report's runs", interval=1)
    elapsed = time.monotonic() - started
    assert sorted(r["partition_key"] for r in report_runs) == sorted(EXPECTED_KEYS)  # one per key, no other
    assert {r["run_type"] for r in report_runs} == {"asset_triggered"}
    assert {r["state"] for r in report_runs} == {"success"}
    for run in report_runs:
        xcom = f"/dags/{PARTITION_REPORT}/dagRuns/{run['dag_run_id']}/taskInstances/partition_rows/xcomEntries"
        rows = airflow.api("GET", f"{xcom}/return_value", params={"deserialize": "true"})["value"]
        rows = json.loads(rows) if isinstance(rows, str) else rows
        assert rows["partition_key"] == run["partition_key"] and rows["rows"] == 2 * 10, rows  # 2 files of 10 rows

    events = airflow.api("GET", "/assets/events", params={"limit": 100, "source_dag_id": SCORING})["asset_events"]
    keyed = sorted(e["partition_key"] for e in events if e["partition_key"])
    assert keyed == sorted(EXPECTED_KEYS)  # the interval the ETL wrote and nobody scored has no key
    print(f"backfill to the last partition report run: {elapsed:.0f} s")
    for run in sorted(report_runs, key=lambda r: r["partition_key"]):
        print(run["partition_key"], run["run_id"] if "run_id" in run else run["dag_run_id"], run["state"])


def cost_reports(e2e: E2E, dag_id: str, run_id: str) -> list[dict[str, Any]]:
    """The run's ``azureml_cost`` XComs, read as an admin through Airflow's REST API."""
    base = f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances"
    entries = e2e.airflow.api("GET", f"{base}/~/xcomEntries", params={"xcom_key": cost.COST_XCOM_KEY})
    reports = []
    for entry in entries["xcom_entries"]:
        path = f"{base}/{entry['task_id']}/xcomEntries/{cost.COST_XCOM_KEY}"
        value = e2e.airflow.api("GET", path, params={"map_index": entry["map_index"]})["value"]
        reports.append(json.loads(value) if isinstance(value, str) else value)
    return reports


def margin_of(report: dict[str, Any]) -> float:
    """The report's own deadline minus its chain's end, in seconds (what the view calls its margin)."""
    return (datetime.fromisoformat(report["deadline"]) - datetime.fromisoformat(report["finished_at"])).total_seconds()


def bill_cards(reports: list[dict[str, Any]]) -> dict[str, str]:
    """What the view's cards must say of these reports: ``cost.run_bill``'s figures, as the page prints them,
    and the worst task's deadline margin."""
    bill = cost.run_bill(reports)
    hours = bill["node_hours"]
    worst = min(reports, key=margin_of)
    return {
        "jobs": str(len({n for r in reports for n in r["job_names"]})),
        "preemptions": str(bill["preemptions"]),
        "resubmissions": str(sum(len(r["job_names"]) - 1 for r in reports)),
        "spot_node_hours": f"{hours.get('low_priority', 0.0):.4f}",
        "dedicated_node_hours": f"{hours.get('dedicated', 0.0):.4f}",
        "evicted_node_hours": f"{bill['evicted_node_hours']:.4f}",
        "lost_node_hours": f"{bill['lost_node_hours']:.4f}",
        "cost": cost.money(bill["cost"]),
        "dedicated_equivalent": cost.money(bill["dedicated_equivalent"]["cost"]),
        "savings": cost.money(bill["savings"]),
        "savings_pct": f"{bill['savings_pct']:.1f} %",
        "deadline": datetime.fromisoformat(worst["deadline"]).isoformat(timespec="seconds"),
        "margin": savings_page.margin(margin_of(worst)),
    }


def test_the_savings_view_shows_the_cost_reports_and_nothing_to_a_user_who_cannot_read_the_dag(
    e2e: E2E, tmp_path: Path
) -> None:
    """Needs the backfill of the test above: its runs are the ones the view shows. Signed in as a person is,
    with the UI's session cookie."""
    base = e2e.airflow.base
    backfilled = sorted(
        (r for r in runs(e2e, SCORING) if r["run_type"] == "backfill" and r["state"] == "success"),
        key=lambda r: r["logical_date"],
    )
    assert len(backfilled) == len(BACKFILLED), "the backfill test of this file makes the runs the view shows"
    reports = {r["dag_run_id"]: cost_reports(e2e, SCORING, r["dag_run_id"]) for r in backfilled}
    for run_id, found in reports.items():
        assert len(found) == 2 and all(r["cost"] is not None for r in found), (run_id, found)  # 2 partitions, priced
        assert all(r["deadline"] == e2e.airflow.env["AZUREML_DEADLINE"] for r in found), found  # applied in a backfill
        assert all(0 < margin_of(r) <= 6 * 3600 for r in found), found
    plugins = e2e.airflow.api("GET", "/plugins")["plugins"]
    assert any(p["name"] == "azureml_savings" for p in plugins), plugins  # loaded through the entry point

    def signed_in(browser_: Any, username: str | None) -> Any:
        context = browser_.new_context(viewport={"width": 1400, "height": 1000})
        if username is not None:  # the UI's session cookie, as a sign-in leaves it
            context.add_cookies([{"name": "_token", "value": e2e.airflow.token_for(username), "url": base}])
        return context.new_page()

    with browser.chromium(tmp_path / "browser-home") as chromium:
        page = signed_in(chromium, "admin")
        # A run's page: one line per task, each figure its own report's; the cards, the run's reports billed together
        for run_id, found in reports.items():
            response = page.goto(f"{base}/azureml-savings/dags/{SCORING}/runs/{run_id}")
            assert response is not None and response.status == 200, response and response.text()
            cards = browser.figures(page, '[data-scope="run"]')
            assert cards == {**bill_cards(found), "late": f"0 of {len(found)}"}
            for report in found:
                row = browser.figures(page, f'tr[data-task="{report["task_id"]}[{report["map_index"]}]"]')
                assert row == {
                    "jobs": str(len(report["job_names"])),
                    "preemptions": str(report["preemptions"]),
                    "resubmissions": str(len(report["job_names"]) - 1),
                    "spot_node_hours": f"{report['node_hours'].get('low_priority', 0.0):.4f}",
                    "dedicated_node_hours": f"{report['node_hours'].get('dedicated', 0.0):.4f}",
                    "cost": cost.money(report["cost"]),
                    "dedicated_equivalent": cost.money(report["dedicated_equivalent"]["cost"]),
                    "savings": cost.money(report["savings"]),
                    "margin": savings_page.margin(margin_of(report)),
                }, report
        # The DAG's page: a line per run, the chart, and the total of every run shown
        response = page.goto(f"{base}/azureml-savings/dags/{SCORING}")
        assert response is not None and response.status == 200
        for run_id, found in reports.items():
            row = browser.figures(page, f'tr[data-run-id="{run_id}"]')
            expected = bill_cards(found)
            assert row == {
                "state": "success",
                **{k: expected[k] for k in ("jobs", "preemptions", "resubmissions", "cost", "savings", "margin")},
                **{k: expected[k] for k in ("spot_node_hours", "dedicated_node_hours", "dedicated_equivalent")},
            }, row
        shown = page.eval_on_selector_all("tr[data-run-id]", "els => els.map(e => e.dataset.runId)")
        everything = [r for run_id in shown for r in (reports.get(run_id) or cost_reports(e2e, SCORING, run_id))]
        worst_run = min(reports.values(), key=lambda found: min(margin_of(r) for r in found))
        total = browser.figures(page, '[data-scope="dag"]')
        assert total == {
            **bill_cards(everything),
            "deadline": bill_cards(worst_run)["deadline"],
            "margin": bill_cards(worst_run)["margin"],
            "late": f"0 of {len(reports)}",  # the runs with a deadline; the @daily run scored nothing
        }
        assert page.locator('svg[data-figure="chart"] rect').count() == 2 * len(reports)  # cost and all-dedicated
        first = backfilled[0]["dag_run_id"]
        page.click(f'tr[data-run-id="{first}"] a')  # a run's line leads to its page
        page.wait_for_url(f"**/azureml-savings/dags/{SCORING}/runs/**")
        assert browser.figures(page)["run_id"] == first
        # The tab in Airflow's own UI, signed in by the cookie: the view in its frame on the DAG's page
        page.goto(f"{base}/dags/{SCORING}/plugin/azureml-savings")
        frame = page.frame_locator("iframe").first
        frame.locator('[data-scope="dag"] [data-figure="cost"]').wait_for(timeout=60_000)
        assert frame.locator('[data-scope="dag"] [data-figure="cost"]').inner_text() == total["cost"]
        shot = tmp_path / "ui_savings.png"
        page.screenshot(path=str(shot))
        assert shot.stat().st_size > 10_000
        if os.environ.get("AZUREML_SCREENSHOT_DIR"):  # AZUREML_SCREENSHOT_DIR=docs: the picture in docs/ui.md
            shutil.copy(shot, Path(os.environ["AZUREML_SCREENSHOT_DIR"]) / shot.name)

        # A signed-in user who may not read the DAG, and a person not signed in: no figure on either page
        for who, status in (("outsider", 403), (None, 401)):
            other = signed_in(chromium, who)
            for path in (f"/dags/{SCORING}", f"/dags/{SCORING}/runs/{first}"):
                response = other.goto(f"{base}/azureml-savings{path}")
                assert response is not None and response.status == status, (who, path)
                assert set(browser.figures(other)) == {"message"}, (who, path)
