"""Waiting in the triggerer: the coalesced poller, Retry-After, queue limits, on_kill, the sensor."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from airflow_azureml.emulator import Emulator
from airflow_azureml.emulator.scoring.data import write_heart_csvs
from airflow_azureml.hooks import AzureMLHook
from airflow_azureml.triggers.job import AzureMLJobTrigger
from airflow_azureml.triggers.poller import WorkspacePoller
from tests.conftest import load_dag, task_states
from tests.helpers import preempt, preempt_and_cancel_once_read, when_running
from tests.integration.test_emulator_sdk import invoke, setup_workspace
from tests.integration.test_example_dag import INTERVAL, read_report
from tests.integration.test_waits import invoke_tagged

FAST = {"interval": 0.05, "max_interval": 0.2, "jitter": 0.0}


async def run_trigger(trigger: AzureMLJobTrigger) -> dict[str, Any]:
    async for event in trigger.run():
        return event.payload
    raise AssertionError("trigger yielded nothing")


@pytest.fixture
def jobs(emulator: Emulator, azureml_conn: dict[str, Any]) -> tuple[Emulator, Any]:
    ml = setup_workspace(AzureMLHook())
    write_heart_csvs(emulator.datastore_path("in/a"), files=6, rows_per_file=4)
    return emulator, ml


def test_many_waits_share_one_paged_list(jobs: tuple[Emulator, Any]) -> None:
    emulator, ml = jobs
    names = [invoke_tagged(ml, "in/a", f"job-{i}") for i in range(12)]  # as the provider submits them
    before = len(emulator.requests())

    async def wait_all() -> tuple[list[dict[str, Any]], Any]:
        triggers = [AzureMLJobTrigger(job_name=n, azure_ml_conn_id="azure_ml_default", polling=FAST) for n in names]
        poller = None

        async def one(t: AzureMLJobTrigger) -> dict[str, Any]:
            nonlocal poller
            poller = WorkspacePoller.for_connection("azure_ml_default")
            return await run_trigger(t)

        results = await asyncio.gather(*(one(t) for t in triggers))
        return results, poller

    events, poller = asyncio.run(wait_all())
    assert [e["status"] for e in events] == ["terminal"] * 12
    assert {e["job"]["status"] for e in events} == {"Completed"}
    reads = [r for r in emulator.requests()[before:] if r["method"] == "GET" and "/jobs" in r["path"]]
    lists = [r for r in reads if r["path"].endswith("/jobs")]
    gets = [r for r in reads if not r["path"].endswith("/jobs")]
    assert poller.stats.list_pages == len(lists) > 0
    # single GETs only once few waits are left (cheaper than a page); every job read once by its waiter
    assert len(gets) == poller.stats.job_gets
    assert len(lists) + len(gets) < poller.stats.waits_served / 2, "coalescing must save most reads"


def test_trigger_honours_429_retry_after(jobs: tuple[Emulator, Any]) -> None:
    emulator, ml = jobs
    name = invoke(ml, "in/a", "job-429")
    emulator.add_fault(kind="status", status=429, retry_after=1, path=f"/jobs/{name}$", methods=["GET"], count=1)
    # Retry-After is honoured up to the policy's max_interval (test_waits: a larger one is capped)
    polling = {**FAST, "max_interval": 2.0}
    event = asyncio.run(
        run_trigger(AzureMLJobTrigger(job_name=name, azure_ml_conn_id="azure_ml_default", polling=polling))
    )
    assert event["status"] == "terminal"
    hits = [r for r in emulator.requests() if r["path"].endswith(f"/jobs/{name}") and r["method"] == "GET"]
    assert hits[0]["status"] == 429 and hits[0]["retry_after"] == "1"
    assert hits[1]["t"] - hits[0]["t"] >= 0.95, "the next poll must wait for Retry-After"


def test_transient_errors_and_dropped_connections_are_retried(jobs: tuple[Emulator, Any]) -> None:
    emulator, ml = jobs
    name = invoke(ml, "in/a", "job-flaky")
    emulator.add_fault(kind="status", status=503, path=f"/jobs/{name}$", count=2)
    emulator.add_fault(kind="drop", path=f"/jobs/{name}$", count=2)
    event = asyncio.run(
        run_trigger(AzureMLJobTrigger(job_name=name, azure_ml_conn_id="azure_ml_default", polling=FAST))
    )
    assert event["status"] == "terminal" and event["job"]["status"] == "Completed"
    faults = [r.get("fault") for r in emulator.requests() if r["path"].endswith(f"/jobs/{name}")]
    assert faults.count("status") == 2 and faults.count("drop") == 2


def test_max_queue_time_ends_the_wait(jobs: tuple[Emulator, Any]) -> None:
    emulator, ml = jobs
    emulator.set_capacity("low-pri-cluster", 0)
    name = invoke(ml, "in/a", "job-starved")
    event = asyncio.run(
        run_trigger(
            AzureMLJobTrigger(
                job_name=name, azure_ml_conn_id="azure_ml_default", polling={**FAST, "max_queue_time": 0.5}
            )
        )
    )
    assert event["status"] == "queue_timeout" and "stayed Queued" in event["message"]


def test_trigger_on_kill_cancels_the_job(jobs: tuple[Emulator, Any]) -> None:
    emulator, ml = jobs
    emulator.set_capacity("low-pri-cluster", 0)  # keep it waiting
    name = invoke(ml, "in/a", "job-killed")
    trigger = AzureMLJobTrigger(job_name=name, azure_ml_conn_id="azure_ml_default", polling=FAST)
    asyncio.run(trigger.on_kill())
    job = emulator.job(name)
    assert job is not None and job.cancel_requested


class FakeSupervisor:
    """The triggerer's supervisor as a trigger sees it (``SUPERVISOR_COMMS.asend``), answering the task-states
    read with ``state`` for the one task instance: the edge between a trigger and Airflow's Execution API."""

    def __init__(self, state: str | None, delay: float = 0.0) -> None:
        self.state = state
        self.delay = delay
        self.asked: list[Any] = []

    async def asend(self, msg: Any) -> Any:
        from airflow.sdk.execution_time.comms import GetTaskStates, TaskStatesResult

        if not isinstance(msg, GetTaskStates):
            return None  # what else a trigger's libraries send (a secret to mask): acknowledged
        self.asked.append(msg)
        await asyncio.sleep(self.delay)  # the supervisor's round trip to the API server
        if self.state == "unreadable":
            raise ConnectionError("the supervisor went away")
        if self.state == "absent":  # the DAG run was deleted: Airflow answers without the task
            return TaskStatesResult(task_states={"run-1": {}})
        return TaskStatesResult(task_states={"run-1": {"score_7": self.state}})


def killed_trigger(ml: Any, emulator: Emulator, tag: str, **kwargs: Any) -> tuple[str, AzureMLJobTrigger]:
    emulator.set_capacity("low-pri-cluster", 0)  # keep it waiting
    name = invoke(ml, "in/a", tag)
    trigger = AzureMLJobTrigger(job_name=name, azure_ml_conn_id="azure_ml_default", polling=FAST, **kwargs)
    trigger.task_instance = SimpleNamespace(dag_id="dag", run_id="run-1", task_id="score", map_index=7)
    return name, trigger


@pytest.mark.parametrize(
    ("state", "cancelled"),
    [
        ("deferred", False),  # the trigger moved to another triggerer (apache/airflow#73454)
        (None, False),  # cleared: the next try cancels the job it was deferred on itself
        ("scheduled", False),
        ("running", False),  # the moved trigger fired and the same try runs again: it owns the job
        ("up_for_retry", False),
        ("failed", True),  # marked by a person
        ("success", True),
        ("absent", True),  # the DAG run was deleted: no try will ever come back for the job
        ("unreadable", False),
    ],
    ids=lambda v: str(v),
)
def test_trigger_on_kill_cancels_only_after_a_person_acted_on_the_task(
    jobs: tuple[Emulator, Any], monkeypatch: pytest.MonkeyPatch, state: str | None, cancelled: bool
) -> None:
    """Airflow 3.3 calls on_kill when a trigger moved to another triggerer too (apache/airflow#73454): only a
    person's mark of the task (or its run deleted) cancels; any other state leaves the job to the task's
    tries, and a state Airflow does not tell cancels nothing."""
    from airflow.sdk.execution_time import task_runner

    emulator, ml = jobs
    supervisor = FakeSupervisor(state)
    monkeypatch.setattr(task_runner, "SUPERVISOR_COMMS", supervisor, raising=False)
    name, trigger = killed_trigger(ml, emulator, f"job-kill-{state}")
    asyncio.run(trigger.on_kill())
    job = emulator.job(name)
    assert job is not None and job.cancel_requested is cancelled
    (asked,) = supervisor.asked
    assert (asked.dag_id, asked.run_ids, asked.task_ids, asked.map_index) == ("dag", ["run-1"], ["score"], 7)


def test_trigger_on_kill_survives_the_triggerers_repeated_cancels(
    jobs: tuple[Emulator, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Airflow 3.3's triggerer cancels a killed trigger again at every sync until it finishes: on_kill's
    state read and cancel must run to the end anyway (in CI a task marked failed kept its job running)."""
    from airflow.sdk.execution_time import task_runner

    emulator, ml = jobs
    monkeypatch.setattr(task_runner, "SUPERVISOR_COMMS", FakeSupervisor("failed", delay=0.3), raising=False)
    name, trigger = killed_trigger(ml, emulator, "job-kill-recancelled")

    async def triggerer() -> None:
        killing = asyncio.ensure_future(trigger.on_kill())
        for _ in range(3):  # the next syncs' cancels, while the state read is still out
            await asyncio.sleep(0.05)
            killing.cancel("user-action")
        with contextlib.suppress(asyncio.CancelledError):
            await killing
        deadline = time.monotonic() + 30
        while not emulator.job(name).cancel_requested and time.monotonic() < deadline:
            await asyncio.sleep(0.05)

    asyncio.run(triggerer())
    assert emulator.job(name).cancel_requested


def test_a_sensors_trigger_on_kill_cancels_nothing(jobs: tuple[Emulator, Any]) -> None:
    """The sensor watches a job someone else submitted: marking the sensor failed leaves that job running."""
    emulator, ml = jobs
    name, trigger = killed_trigger(ml, emulator, "job-watched", wait_for_creation=True)
    asyncio.run(trigger.on_kill())
    job = emulator.job(name)
    assert job is not None and not job.cancel_requested


def test_unknown_job_is_an_error_event(jobs: tuple[Emulator, Any]) -> None:
    event = asyncio.run(
        run_trigger(AzureMLJobTrigger(job_name="no-such-job", azure_ml_conn_id="azure_ml_default", polling=FAST))
    )
    assert event["status"] == "error" and "not found" in event["message"]


@pytest.fixture
def sensor_case(jobs: tuple[Emulator, Any], airflow_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    emulator, ml = jobs
    failures = tmp_path / "failures.jsonl"
    monkeypatch.setenv("AZUREML_TEST_FAILURES", str(failures))

    def run(case: dict[str, Any]) -> tuple[Any, list[dict[str, Any]]]:
        monkeypatch.setenv("AZUREML_TEST_CASE", json.dumps(case))
        dag_run = load_dag("azureml_sensor_cases.py").test(logical_date=INTERVAL)
        recorded = [json.loads(x) for x in failures.read_text().splitlines()] if failures.exists() else []
        return dag_run, recorded

    return emulator, ml, run


@pytest.mark.parametrize("mode", ["poke", "reschedule", "deferrable"])
def test_sensor_modes_succeed_on_completion(sensor_case, mode: str) -> None:
    _, ml, run = sensor_case
    name = invoke(ml, "in/a", f"job-sensed-{mode}")
    dag_run, failures = run({"job_name": name, "mode": mode})
    assert str(dag_run.state) == "success", (task_states(dag_run), failures)


@pytest.mark.parametrize("mode", ["poke", "deferrable"])
def test_sensor_raises_typed_error_on_preemption(sensor_case, mode: str) -> None:
    emulator, ml, run = sensor_case
    write_heart_csvs(emulator.datastore_path("in/big"), files=60, rows_per_file=2)
    name = invoke(ml, "in/big", f"job-pre-{mode}")
    with when_running(emulator, preempt("failed")):
        dag_run, failures = run({"job_name": name, "mode": mode})
    assert str(dag_run.state) == "failed"
    assert failures[0]["type"] == "AzureMLJobPreemptedError"


def preempt_after_a_gauge_sample(form: str = "canceled") -> Any:
    """Preempt the cluster once a wait has read its gauge while the job ran: the evidence a verdict needs
    (the preemption is then seen as a rise of ``preemptedNodeCount`` while the job was Running)."""

    def action(emulator: Emulator, job_name: str) -> object:
        from tests.integration.test_exactly_once import gauge_read_while_running

        job = emulator.job(job_name)
        deadline = time.monotonic() + 120  # a compute read after a poll saw the job Running (not a Queued poll's)
        while not (job is not None and job.started and gauge_read_while_running(emulator, job)):
            assert time.monotonic() < deadline, "the wait never read the gauge while the job ran"
            time.sleep(0.01)
        if form == "canceled":  # Azure cancels once the wait has read the gauge up (no message tells it)
            return preempt_and_cancel_once_read(emulator, job_name)
        return emulator.preempt_cluster("low-pri-cluster", form=form)

    return action


def test_example_dag_deferrable_with_preemption(
    emulator: Emulator, azureml_conn: dict[str, Any], airflow_db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AZUREML_DATASTORE_ROOT", f"file://{emulator.datastore_path('')}")
    monkeypatch.setenv("AZUREML_POLL_SECONDS", "0.1")
    monkeypatch.setenv("AZUREML_RESUBMIT_BACKOFF_SECONDS", "0.1")
    monkeypatch.setenv("AZUREML_DEFERRABLE", "true")
    dag = load_dag("low_priority_batch_scoring.py")
    assert dag.get_task("score_partition").partial_kwargs["deferrable"] is True
    # jobs run long enough for the wait to sample the gauge while they run (the preemption's evidence)
    emulator.call(lambda: setattr(emulator.workspace.timing, "mini_batch", 0.3))
    with when_running(emulator, preempt_after_a_gauge_sample("canceled")) as preempted:
        run = dag.test(logical_date=INTERVAL)
    assert str(run.state) == "success", task_states(run)
    assert len(preempted) == 1
    report = read_report(emulator)
    assert report["rows_in"] == report["rows_scored"] == 600
    assert report["resubmissions"] == 1 and len(emulator.jobs()) == 5
    # the wait after the resubmission ran in the triggerer: execute_complete resubmitted and deferred again
    resubmitted = next(j.name for j in emulator.jobs() if j.name.endswith("-r1"))
    pollers = {r["ua"] for r in emulator.requests() if r["path"].endswith(f"/jobs/{resubmitted}")}
    assert "airflow-azureml/0.1 (asyncio)" in pollers


def test_a_connection_stored_in_the_metadata_db_works_or_fails_at_once(
    sensor_case, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As a user who ran `airflow connections add`: the connection is in the metadata DB, not in the env.

    Before, a trigger that did not see it retried "conn_id isn't defined" as transient (0.5 s to 64 s,
    30 times), so the deferred task hung. It must either work or fail at once, saying where it looked.
    """
    import os
    import subprocess
    import sys

    emulator, ml, run = sensor_case
    name = invoke(ml, "in/a", "job-db-connection")
    conn_json = os.environ["AIRFLOW_CONN_AZURE_ML_DEFAULT"]
    monkeypatch.delenv("AIRFLOW_CONN_AZURE_ML_DEFAULT")
    cli = [sys.executable, "-m", "airflow", "connections"]
    subprocess.run([*cli, "add", "azure_ml_default", "--conn-json", conn_json], check=True, capture_output=True)
    try:
        dag_run, failures = run({"job_name": name, "mode": "deferrable"})
    finally:
        subprocess.run([*cli, "delete", "azure_ml_default"], check=True, capture_output=True)
    if str(dag_run.state) == "failed":  # Airflow 3.3's dag.test(): its in-process run does not see it
        assert [f["type"] for f in failures] == ["AzureMLConfigError"], failures
        assert "'azure_ml_default' is not defined" in failures[0]["message"], failures
    else:
        assert str(dag_run.state) == "success", (task_states(dag_run), failures)
    assert emulator.job(name).status == "Completed"
