"""The fallback deployment takes over, in ``dag.test()`` with the real SDK, for each rule that moves the
work off spot: ``fallback_after`` preemptions, the queue time, the expected cost and the deadline (a deadline
nothing can meet fails at once, with no job). Each case checks that no unit of work has two live jobs and
that every input row is scored exactly once, by the job that ran last.
"""

from __future__ import annotations

import json
import re
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pendulum
import pytest

from airflow_azureml.emulator import Emulator
from airflow_azureml.emulator.scoring.data import write_heart_csvs
from tests.conftest import load_dag, task_states, xcom_value
from tests.helpers import preempt
from tests.integration.test_emulator_sdk import input_ids, prediction_ids, setup_workspace
from tests.integration.test_exactly_once import compute_reads_since, when_sampled
from tests.integration.test_operators import INPUT

REPO = Path(__file__).resolve().parents[2]
LOGICAL = pendulum.datetime(2026, 11, 1, tz="UTC")
FALLBACK = "classifier-mlflow-dedicated"
TARGET = "heart-classifier-batch/classifier-mlflow"  # the spot deployment: its history's key


@pytest.fixture
def workspace(emulator: Emulator, azureml_conn: dict[str, Any], airflow_db: Path) -> Emulator:
    """The spot deployment (the endpoint's default) and its fallback on a dedicated cluster, from the DAG's YAML."""
    from azure.ai.ml import load_compute
    from azure.ai.ml.entities._load_functions import load_model_batch_deployment

    from airflow_azureml.hooks import AzureMLHook

    ml = setup_workspace(AzureMLHook())
    ml.compute.begin_create_or_update(load_compute(source=str(REPO / "dags/azureml/dedicated-pool.yml"))).result()
    fallback = load_model_batch_deployment(source=str(REPO / "dags/azureml/deployment-dedicated.yml"))
    ml.batch_deployments.begin_create_or_update(fallback).result()
    write_heart_csvs(emulator.datastore_path(INPUT), files=20, rows_per_file=5)
    return emulator


@pytest.fixture
def run_case(workspace: Emulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Run ``azureml_invoke_case`` (tests/dags/azureml_operator_cases.py) with ``dag.test()``; returns the
    run and the failures its callback recorded."""
    failures = tmp_path / "failures.jsonl"
    monkeypatch.setenv("AZUREML_TEST_FAILURES", str(failures))

    def run(dag_id: str, case: dict[str, Any]) -> tuple[Any, list[dict[str, str]]]:
        monkeypatch.setenv("AZUREML_TEST_CASE", json.dumps(case))
        failures.unlink(missing_ok=True)
        dag_run = load_dag("azureml_operator_cases.py", dag_id).test(logical_date=LOGICAL)
        recorded = [json.loads(line) for line in failures.read_text().splitlines()] if failures.exists() else []
        return dag_run, recorded

    return run


def deployments_of(emulator: Emulator) -> list[tuple[str, str, str]]:
    """(job, deployment, compute) of every job, oldest first, as the emulator ran them."""
    return emulator.call(
        lambda: [
            (j.name, j.deployment, j.compute) for j in sorted(emulator.workspace.jobs.values(), key=lambda j: j.created)
        ]
    )


def assert_scored_once(emulator: Emulator, job_name: str) -> None:
    scored = prediction_ids(emulator, job_name)
    assert sorted(scored) == sorted(input_ids(emulator.datastore_path(INPUT)))
    assert len(scored) == len(set(scored)) == 100


def assert_one_live_job(emulator: Emulator) -> None:
    live = emulator.call(
        lambda: [
            j.name for j in emulator.workspace.jobs.values() if j.status not in ("Completed", "Failed", "Canceled")
        ]
    )
    assert live == []


@pytest.mark.parametrize("deferrable", [False, True], ids=["polling", "deferred"])
def test_fallback_after_preemptions(workspace: Emulator, run_case, deferrable: bool) -> None:
    with when_sampled(workspace, preempt("canceled")) as preempted:
        run, failures = run_case(
            "azureml_invoke_case", {"fallback_deployment": FALLBACK, "fallback_after": 1, "deferrable": deferrable}
        )
    assert str(run.state) == "success", (task_states(run), failures)
    jobs = deployments_of(workspace)
    assert len(preempted) == 1
    assert [(d, c) for _, d, c in jobs] == [("classifier-mlflow", "low-pri-cluster"), (FALLBACK, "dedicated-pool")]
    result = xcom_value(run, "invoke")
    assert result["job_name"] == jobs[1][0] and result["preemptions"] == 1
    assert_scored_once(workspace, result["job_name"])
    assert_one_live_job(workspace)


@pytest.mark.parametrize("deferrable", [False, True], ids=["polling", "deferred"])
def test_no_spot_capacity_moves_to_the_fallback_instead_of_failing(
    workspace: Emulator, run_case, deferrable: bool
) -> None:
    workspace.call(lambda: workspace.workspace.set_capacity("low-pri-cluster", 0))  # no spot capacity at all
    run, failures = run_case(
        "azureml_invoke_case",
        {"fallback_deployment": FALLBACK, "max_queue_time": 1.0, "deferrable": deferrable, "retries": 0},
    )
    assert str(run.state) == "success", (task_states(run), failures)
    jobs = deployments_of(workspace)
    assert [(d, c) for _, d, c in jobs] == [("classifier-mlflow", "low-pri-cluster"), (FALLBACK, "dedicated-pool")]
    statuses = workspace.call(lambda: {j.name: j.status for j in workspace.workspace.jobs.values()})
    assert statuses[jobs[0][0]] == "Canceled" and statuses[jobs[1][0]] == "Completed"
    result = xcom_value(run, "invoke")
    assert result["job_name"] == jobs[1][0] and result["preemptions"] == 0
    assert_scored_once(workspace, result["job_name"])
    assert_one_live_job(workspace)


def test_no_spot_capacity_without_a_fallback_still_fails(workspace: Emulator, run_case) -> None:
    workspace.call(lambda: workspace.workspace.set_capacity("low-pri-cluster", 0))
    run, failures = run_case("azureml_invoke_case", {"max_queue_time": 1.0, "retries": 0})
    assert str(run.state) == "failed"
    assert [f["type"] for f in failures] == ["AzureMLJobQueueTimeoutError"]
    assert len(workspace.jobs()) == 1


def stored_state(run: Any) -> dict[str, Any]:
    """What the invoke task keeps in ``task_state_store`` (the switch is written there before the next submit);
    before Airflow 3.3, in the XCom that keeps it for one try (docs/airflow_versions.md)."""
    from airflow_azureml import compat

    if not compat.has_task_state_store():
        return xcom_value(run, "invoke", key=compat.TRY_STATE_XCOM_PREFIX + "azureml_job")
    from airflow.models.task_state_store import TaskStateStoreModel
    from airflow.utils.session import create_session

    with create_session() as session:
        row = session.query(TaskStateStoreModel).filter_by(run_id=run.run_id, task_id="invoke", key="azureml_job").one()
        return json.loads(row.value)


def seed_cluster_history() -> None:
    """A cluster seen before: two jobs completed on spot, an hour of work each, no preemption yet.

    The emulator's jobs last seconds, so its own runs say little about an hour-long job; this record
    gives the policy a realistic amount of work to weigh a preemption against.
    """
    from airflow_azureml.hooks.azure_ml import AzureMLHook
    from airflow_azureml.spot_policy import SpotHistory

    history = SpotHistory(exposure_hours=0.5, spot_completions=2, completed_jobs=2, completed_hours=2.0)
    store = AzureMLHook().spot_history_store(TARGET)
    assert store.update(lambda _history, _known: (history, {}))
    assert "airflow-spot-history" in store.where  # the emulator's storage account, as the tasks will use


def spot_priced_at(ratio: float) -> dict[str, dict[str, float]]:
    """Prices set by hand (an operator argument), spot at ``ratio`` of dedicated, for the cluster's size."""
    return {"Standard_DS3_v2": {"dedicated": 1.0, "low_priority": ratio}}


@pytest.mark.parametrize("deferrable", [False, True], ids=["polling", "deferred"])
def test_expected_cost_moves_to_the_fallback_when_spot_costs_nearly_dedicated(
    workspace: Emulator, run_case, deferrable: bool
) -> None:
    """Spot at 95 % of dedicated, an hour of work, a cluster just seen preempted: finishing on spot is
    expected to cost more (before the preemption it was not: the first job goes to spot)."""
    seed_cluster_history()
    with when_sampled(workspace, preempt("canceled")) as preempted:
        run, failures = run_case(
            "azureml_invoke_case",
            {"fallback_deployment": FALLBACK, "prices": spot_priced_at(0.95), "deferrable": deferrable},
        )
    assert str(run.state) == "success", (task_states(run), failures)
    jobs = deployments_of(workspace)
    assert len(preempted) == 1
    assert [(d, c) for _, d, c in jobs] == [("classifier-mlflow", "low-pri-cluster"), (FALLBACK, "dedicated-pool")]
    assert stored_state(run)["fallback_rule"] == "expected_cost"
    result = xcom_value(run, "invoke")
    assert result["job_name"] == jobs[1][0]
    assert_scored_once(workspace, result["job_name"])
    assert_one_live_job(workspace)


def test_expected_cost_stays_on_spot_when_spot_is_cheap(workspace: Emulator, run_case) -> None:
    """The same cluster and preemption with spot at 20 %: resubmitting on spot is still expected to be cheaper."""
    seed_cluster_history()
    with when_sampled(workspace, preempt("canceled")) as preempted:
        run, failures = run_case(
            "azureml_invoke_case", {"fallback_deployment": FALLBACK, "prices": spot_priced_at(0.2)}
        )
    assert str(run.state) == "success", (task_states(run), failures)
    jobs = deployments_of(workspace)
    assert len(preempted) == 1
    assert [(d, c) for _, d, c in jobs] == [("classifier-mlflow", "low-pri-cluster")] * 2
    assert stored_state(run)["fallback_rule"] is None
    assert_scored_once(workspace, xcom_value(run, "invoke")["job_name"])
    assert_one_live_job(workspace)


def test_the_cluster_history_is_shared_between_runs(workspace: Emulator, run_case) -> None:
    """What one run saw on the cluster (a preemption) is in its shared history for the next task."""
    with when_sampled(workspace, preempt("canceled")):
        run, failures = run_case(
            "azureml_invoke_case", {"fallback_deployment": FALLBACK, "prices": spot_priced_at(0.2)}
        )
    assert str(run.state) == "success", failures
    records = workspace.spot_histories()  # the blobs in the emulated storage account
    assert len(records) == 1, f"the task saved no history, or more than one: {sorted(records)}"
    record = next(iter(records.values()))
    history = record["history"]
    # counts fade with a half-life (spot_policy.SpotHistory), so seconds later they are just below 1
    assert history["preemptions"] == pytest.approx(1, abs=1e-3)
    assert history["spot_completions"] == pytest.approx(1, abs=1e-3)
    assert history["exposure_hours"] > 0
    assert record["compute"]["vm_size"].lower() == "standard_ds3_v2"


@pytest.mark.parametrize("deferrable", [False, True], ids=["polling", "deferred"])
def test_queue_time_switch_whose_cancel_failed_reaches_the_fallback_on_the_retry(
    workspace: Emulator, run_case, deferrable: bool
) -> None:
    """The switch is recorded, its cancel refused (403): the retry cancels the still-queued spot job and
    moves on to the fallback, instead of taking that job for one already on the fallback."""
    workspace.call(lambda: workspace.workspace.set_capacity("low-pri-cluster", 0))
    workspace.add_fault(kind="status", status=403, route="cancel", count=1)
    run, failures = run_case(
        "azureml_invoke_case",
        {"fallback_deployment": FALLBACK, "max_queue_time": 1.0, "deferrable": deferrable, "retries": 1},
    )
    assert str(run.state) == "success", (task_states(run), failures)
    jobs = deployments_of(workspace)
    assert [(d, c) for _, d, c in jobs] == [("classifier-mlflow", "low-pri-cluster"), (FALLBACK, "dedicated-pool")]
    assert_scored_once(workspace, xcom_value(run, "invoke")["job_name"])
    assert_one_live_job(workspace)
    # the spot job ended (cancelled after queueing): the cluster's history no longer counts it as running
    (record,) = workspace.spot_histories().values()
    assert record["history"]["running"] == {}, record["history"]
    assert record["history"]["preemptions"] == 0


def test_a_person_cancels_a_job_that_outlived_the_queue_time_cancel(workspace: Emulator, run_case) -> None:
    """The queue-time cancel is answered but never happens; capacity comes back and the job runs; then a
    person cancels it. That cancel is the person's: the task fails and nothing goes to the fallback."""
    import threading
    import time

    from tests.helpers import when_running
    from tests.integration.test_exactly_once import person_cancels

    workspace.call(lambda: workspace.workspace.set_capacity("low-pri-cluster", 0))
    workspace.add_fault(kind="status", status=202, route="cancel", count=1)  # accepted, never done
    stop = threading.Event()

    def capacity_back_after_the_cancel() -> None:
        while not stop.is_set():
            if any(r["method"] == "POST" and r["path"].endswith("/cancel") for r in workspace.requests()):
                workspace.call(lambda: workspace.workspace.set_capacity("low-pri-cluster", None))
                return
            time.sleep(0.02)

    def polled_while_running(emu: Emulator, job: Any) -> bool:
        since = job.started.timestamp()
        return any(
            r["method"] == "GET" and r["path"].endswith(f"/jobs/{job.name}") and r["t"] > since for r in emu.requests()
        )

    watcher = threading.Thread(target=capacity_back_after_the_cancel, daemon=True)
    watcher.start()
    try:
        with when_running(workspace, person_cancels, ready=polled_while_running) as cancelled:
            run, failures = run_case(
                "azureml_invoke_case", {"fallback_deployment": FALLBACK, "max_queue_time": 1.0, "retries": 0}
            )
    finally:
        stop.set()
        watcher.join(5)
    assert len(cancelled) == 1
    assert str(run.state) == "failed"
    assert [f["type"] for f in failures] == ["AzureMLJobCanceledError"]
    assert [(d, c) for _, d, c in deployments_of(workspace)] == [("classifier-mlflow", "low-pri-cluster")]


def test_a_missing_fallback_deployment_fails_before_any_job(workspace: Emulator, run_case) -> None:
    run, failures = run_case("azureml_invoke_case", {"fallback_deployment": "no-such-deployment", "fallback_after": 1})
    assert str(run.state) == "failed"
    assert failures[0]["type"] == "AzureMLConfigError" and "no-such-deployment" in failures[0]["message"]
    assert workspace.jobs() == []


def test_a_fallback_on_low_priority_compute_is_refused_before_any_job(workspace: Emulator, run_case) -> None:
    from airflow_azureml.hooks import AzureMLHook

    ml = AzureMLHook().get_conn()
    spotty = ml.batch_deployments.get(name=FALLBACK, endpoint_name="heart-classifier-batch")
    spotty.compute = "low-pri-cluster"
    ml.batch_deployments.begin_create_or_update(spotty).result()
    run, failures = run_case("azureml_invoke_case", {"fallback_deployment": FALLBACK, "fallback_after": 1})
    assert str(run.state) == "failed"
    assert failures[0]["type"] == "AzureMLConfigError" and "low-priority" in failures[0]["message"]
    assert workspace.jobs() == []


@pytest.mark.parametrize("deferrable", [False, True], ids=["polling", "deferred"])
def test_a_job_queued_on_spot_adds_no_exposure(workspace: Emulator, run_case, deferrable: bool) -> None:
    """Issue 18 §3: exposure counts only while a job's nodes run. A job queued on a spot cluster with no
    capacity is not "running" in the cluster's history (it would lower the rate: spot would look safer
    the less capacity it has); a polling wait adds it once it sees the job Running."""
    import threading
    import time

    cluster = "low-pri-cluster"
    workspace.set_capacity(cluster, 0)
    seen: dict[str, Any] = {}
    stop = threading.Event()

    def histories() -> dict[str, Any]:
        return {k: v["history"] for k, v in workspace.spot_histories().items()}

    def watch() -> None:
        while not stop.is_set():
            jobs = [j for j in workspace.jobs() if j.compute == cluster]
            queued = jobs and jobs[0].status == "Queued"
            if "queued" not in seen and queued and compute_reads_since(workspace, jobs[0].created.timestamp()) >= 1:
                # the operator read the cluster for the queued job: it recorded what it records at submit
                seen["job"], seen["queued"] = jobs[0].name, histories()
                workspace.set_capacity(cluster, None)
            elif "queued" in seen and jobs and jobs[0].status == "Running" and not deferrable:
                now = histories()  # the wait that saw it Running records its start: wait for that write
                if any(jobs[0].name in h.get("running", {}) for h in now.values()):
                    seen["running"], seen["started"] = now, jobs[0].started.timestamp()
                    workspace.release_job(jobs[0].name)
                    return
            time.sleep(0.02)

    if not deferrable:
        workspace.hold_cluster(cluster)  # the job's end waits for the watcher's read while it runs
    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        run, failures = run_case("azureml_invoke_case", {"fallback_deployment": FALLBACK, "deferrable": deferrable})
    finally:
        stop.set()
        watcher.join(5)
        workspace.hold_cluster(cluster, held=False)
    assert str(run.state) == "success", (task_states(run), failures)
    assert "queued" in seen, "the watcher never saw the job queued"
    job = seen["job"]
    queued = [h.get("running", {}) for h in seen["queued"].values()]
    assert all(job not in running for running in queued), f"a queued job counted as exposure: {seen['queued']}"
    if not deferrable:
        assert "running" in seen, "the polling wait never recorded the job's start"
        (running,) = [h["running"] for h in seen["running"].values()]
        assert running[job] >= seen["started"] - 1, running  # from when its nodes ran, not from its submit
    (record,) = workspace.spot_histories().values()
    assert record["history"]["running"] == {}, record["history"]  # its end closed its exposure
    assert 0 < record["history"]["exposure_hours"] * 3600 < run_seconds(workspace, job)


def run_seconds(emulator: Emulator, job_name: str) -> float:
    """Seconds from the job's start (nodes allocated) to its end, as the emulator ran it, plus a second."""
    (job,) = [j for j in emulator.jobs() if j.name == job_name]
    return (job.ended - job.started).total_seconds() + 1.0


# ------------------------------------------------------------------ deadline
def in_hours(hours: float) -> str:
    """An absolute deadline, ISO-8601 with its offset, ``hours`` from now."""
    return datetime.fromtimestamp(time.time() + hours * 3600, tz=timezone.utc).isoformat(timespec="seconds")


def test_an_impossible_deadline_is_said_at_once_and_the_unit_finishes_on_the_fallback(
    workspace: Emulator, run_case: Any
) -> None:
    """Not even dedicated compute makes it: said at once (a warning), never a failure, and the unit goes to the
    fallback to finish as early as it can."""
    seed_cluster_history()  # an hour of work a unit; half an hour left
    run, failures = run_case("azureml_invoke_case", {"fallback_deployment": FALLBACK, "deadline": in_hours(0.5)})
    assert str(run.state) == "success", (task_states(run), failures)
    assert [(d, c) for _, d, c in deployments_of(workspace)] == [(FALLBACK, "dedicated-pool")]
    assert stored_state(run)["fallback_rule"] == "deadline"
    assert_scored_once(workspace, xcom_value(run, "invoke")["job_name"])


def test_an_impossible_deadline_fails_before_any_job_when_asked(workspace: Emulator, run_case: Any) -> None:
    """``on_infeasible_deadline="fail"``: the same deadline fails the task at once, with the numbers that
    decided it, before any job is sent; it is not retried (a retry is only later)."""
    seed_cluster_history()  # an hour of work a unit; half an hour left
    deadline = in_hours(0.5)
    case = {"fallback_deployment": FALLBACK, "deadline": deadline, "on_infeasible_deadline": "fail", "retries": 2}
    run, failures = run_case("azureml_invoke_case", case)
    assert str(run.state) == "failed", task_states(run)
    assert workspace.jobs() == [], [j.name for j in workspace.jobs()]  # nothing sent
    ((failure,),) = [[f for f in failures if f["task"] == "invoke"]]
    assert failure["type"] == "AzureMLDeadlineError", failures
    message = failure["message"]
    assert f"Deadline {deadline} cannot be met even on dedicated compute" in message, message
    assert "on_infeasible_deadline='fallback'" in message, message
    found = re.search(r"work estimate ([0-9.]+) h .*fastest finish (\S+) ", message)
    assert found and 0.5 < float(found[1]) <= 1.0, message  # the seeded hour, less the cluster's start-up
    assert datetime.fromisoformat(found[2]) > datetime.fromisoformat(deadline), message
    assert task_states(run)["invoke"] == "failed"


def test_an_offset_counts_from_the_runs_data_interval_and_a_passed_one_is_not_applied(
    workspace: Emulator, run_case: Any
) -> None:
    """ "+6h" after the run's data interval (2026-11-01) passed long ago: missed, so the unit runs on spot as it
    would without a deadline (dedicated nodes would only be late at a higher price)."""
    run, failures = run_case("azureml_invoke_case", {"fallback_deployment": FALLBACK, "deadline": "+6h"})
    assert str(run.state) == "success", (task_states(run), failures)
    (only,) = deployments_of(workspace)
    assert only[1] != FALLBACK and only[2] != "dedicated-pool", only
    assert not stored_state(run).get("fallback_rule")


def test_a_tight_deadline_sends_the_first_job_to_the_fallback(workspace: Emulator, run_case: Any) -> None:
    seed_cluster_history()  # an hour of work; 1.5 h left: no room for a preemption on spot and a redo
    deadline = in_hours(1.5)
    run, failures = run_case(
        "azureml_invoke_case",
        {
            "fallback_deployment": FALLBACK,
            "deadline": deadline,
            "prices": {"Standard_DS3_v2": {"dedicated": 1.0, "low_priority": 0.2}},
        },
    )
    assert str(run.state) == "success", (task_states(run), failures)
    assert [(d, c) for _, d, c in deployments_of(workspace)] == [(FALLBACK, "dedicated-pool")]
    assert stored_state(run)["fallback_rule"] == "deadline"
    assert_scored_once(workspace, xcom_value(run, "invoke")["job_name"])
    # the bill carries the deadline and when the chain ended: the UI's savings view shows the margin (docs/ui.md)
    report = xcom_value(run, "invoke", key="azureml_cost")
    assert report["deadline"] == deadline
    assert time.time() - 600 < datetime.fromisoformat(report["finished_at"]).timestamp() <= time.time()
