"""Partitioned assets (Airflow 3.3) with the real scheduler: a backfill of ``example_asset_scoring`` over two
intervals gives ``example_asset_partition_report`` one run per scored (interval, partition) key, and none for
the interval the ETL wrote but the backfill did not score (``dags/example_asset_chain.py``, docs/assets.md).

The scheduler creates runs here (the other e2e files turn ``use_job_schedule`` off, which stops asset-triggered
runs too), with every DAG paused at creation: only the chain's are unpaused. The ETL writes three intervals
while the scoring DAG is still paused (Airflow queues no run of a paused DAG for an event), so only the backfill
scores; its own latest ``@daily`` run, for a day the ETL never wrote, must skip every task.
``example_asset_report`` stays paused: it runs Azure ML command jobs and is not what this file proves.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_azureml import compat
from tests.e2e.conftest import E2E, deployment
from tests.e2e.rows import wait_until

# Beside the 3.1/3.2 runs in .ci/run (make test-distributed): inside `make test` its deployment took it 29 s
# past the 12 min budget (12 min 29 s in the .ci/run of a079fa2).
pytestmark = [pytest.mark.e2e, pytest.mark.distributed]

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
    scheduling = {"AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE": "True", "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "True"}
    with deployment(tmp_path_factory.mktemp("e2e-partitions"), extra_env=scheduling) as running:
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
