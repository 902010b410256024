"""``dag.test()`` of the example DAG against the emulator, with an injected whole-cluster preemption."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pendulum
import pytest

from airflow_azureml.emulator import Emulator
from tests.conftest import load_dag, task_states
from tests.helpers import preempt, when_running

INTERVAL = pendulum.datetime(2026, 11, 28, tz="UTC")


@pytest.fixture
def example_env(emulator: Emulator, azureml_conn: dict[str, Any], airflow_db: Path, monkeypatch: pytest.MonkeyPatch):
    root = emulator.datastore_path("")
    monkeypatch.setenv("AZUREML_DATASTORE_ROOT", f"file://{root}")
    monkeypatch.setenv("AZUREML_POLL_SECONDS", "0.1")
    monkeypatch.setenv("AZUREML_RESUBMIT_BACKOFF_SECONDS", "0.1")
    return emulator


def read_report(emulator: Emulator) -> dict[str, Any]:
    return json.loads(
        emulator.datastore_path(f"scoring/reports/{INTERVAL.strftime('%Y%m%dT%H%M')}/report.json").read_text()
    )


@pytest.mark.parametrize("form", ["canceled", "failed"])
def test_example_dag_survives_whole_cluster_preemption(example_env: Emulator, form: str) -> None:
    emulator = example_env
    dag = load_dag("low_priority_batch_scoring.py")
    with when_running(emulator, preempt(form)) as preempted:
        run = dag.test(logical_date=INTERVAL)
    assert str(run.state) == "success", task_states(run)
    assert len(preempted) == 1
    report = read_report(emulator)
    assert report["rows_in"] == report["rows_scored"] == 4 * 6 * 25
    assert report["preemptions"] == 1 and report["resubmissions"] == 1
    jobs = emulator.jobs()
    assert len(jobs) == report["partitions"] + report["resubmissions"] == 5
    assert sorted(j.name for j in jobs) == report["jobs"]
    assert sum(j.status == "Completed" for j in jobs) == 4

    # the same data interval again: every partition is a finished checkpoint, so no job at all
    rerun = load_dag("low_priority_batch_scoring.py").test(logical_date=INTERVAL)
    assert str(rerun.state) == "success", task_states(rerun)
    assert len(emulator.jobs()) == 5
    assert read_report(emulator)["partitions_scored_this_run"] == 0
