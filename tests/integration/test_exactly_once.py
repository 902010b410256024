"""Issue 9 §2-§5: cancels, preemption evidence, exactly once without trusting the name, back-off in the triggerer.

Every case runs the real operator through Airflow (``dag.test()`` and, for a person's clear,
Airflow's own ``clear_task_instances`` followed by the same task runner), the real SDK, and the
emulator with Azure's behaviours switched on.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import pendulum
import pytest

from airflow_azureml import compat
from airflow_azureml.emulator import Emulator
from airflow_azureml.emulator.scoring.data import write_heart_csvs
from tests.conftest import load_dag, task_states, xcom_value
from tests.helpers import preempt_and_cancel_once_read, read_twice_since, when_running
from tests.integration.test_emulator_sdk import prediction_ids, setup_workspace

LOGICAL = pendulum.datetime(2026, 11, 1, tz="UTC")
INPUT = "in/20261101"
CLUSTER = "low-pri-cluster"
ENDPOINT, DEPLOYMENT = "heart-classifier-batch", "classifier-mlflow"


# ------------------------------------------------------------------ harness
@pytest.fixture
def workspace(emulator: Emulator, azureml_conn: dict[str, Any], airflow_db: Path) -> Emulator:
    from airflow_azureml.hooks import AzureMLHook

    setup_workspace(AzureMLHook())
    write_heart_csvs(emulator.datastore_path(INPUT), files=20, rows_per_file=5)
    return emulator


@pytest.fixture
def run_case(workspace: Emulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    failures = tmp_path / "failures.jsonl"
    monkeypatch.setenv("AZUREML_TEST_FAILURES", str(failures))

    def run(case: dict[str, Any] | None = None, dag_run: Any = None) -> tuple[Any, list[dict[str, str]]]:
        """A new DAG run of the invoke case; with ``dag_run``, a person clears its task and it runs again."""
        monkeypatch.setenv("AZUREML_TEST_CASE", json.dumps(case or {}))
        failures.unlink(missing_ok=True)
        dag = load_dag("azureml_operator_cases.py", "azureml_invoke_case")
        result = dag.test(logical_date=LOGICAL) if dag_run is None else clear_and_rerun(dag, dag_run)
        recorded = [json.loads(line) for line in failures.read_text().splitlines()] if failures.exists() else []
        return result, recorded

    return run


def clear_and_rerun(dag: Any, dag_run: Any) -> Any:
    """A person clears the task (Airflow's ``clear_task_instances``), then the run goes on as in ``dag.test()``."""
    from airflow.models import DagRun, TaskInstance
    from airflow.models.taskinstance import clear_task_instances
    from airflow.sdk.definitions.dag import _run_task
    from airflow.utils.session import create_session
    from airflow.utils.state import DagRunState, TaskInstanceState

    with create_session() as session:
        tis = session.query(TaskInstance).filter_by(dag_id=dag.dag_id, run_id=dag_run.run_id).all()
        clear_task_instances(tis, session)
        dr = session.query(DagRun).filter_by(dag_id=dag.dag_id, run_id=dag_run.run_id).one()
        dr.state = DagRunState.RUNNING
        session.commit()
    try:
        from airflow.serialization.serialized_objects import DagSerialization
    except ImportError:  # Airflow 3.1 calls it SerializedDAG
        from airflow.serialization.serialized_objects import SerializedDAG as DagSerialization

    scheduler_dag = DagSerialization.deserialize_dag(DagSerialization.serialize_dag(dag))
    for _ in range(20):  # each pass runs what is schedulable, as dag.test() does
        with create_session() as session:
            dr = session.query(DagRun).filter_by(dag_id=dag.dag_id, run_id=dag_run.run_id).one()
            if dr.state != DagRunState.RUNNING:
                return dr
            dr.dag = scheduler_dag
            schedulable, _ = dr.update_state(session=session)
            for ti in schedulable:
                ti.try_number += 1
                ti.state = TaskInstanceState.SCHEDULED
            session.commit()
            ready = [ti for ti in dr.get_task_instances(session=session) if ti.state == TaskInstanceState.SCHEDULED]
            session.expunge_all()
        for ti in ready:
            with contextlib.suppress(Exception):  # as dag.test(): the failure is in the task's state
                _run_task(ti=ti, task=dag.task_dict[ti.task_id], run_triggerer=True)
    raise AssertionError("the cleared run did not finish")


def try_numbers(dag_run: Any) -> int:
    from airflow.models import TaskInstance
    from airflow.utils.session import create_session

    with create_session() as session:
        return session.query(TaskInstance).filter_by(dag_id=dag_run.dag_id, run_id=dag_run.run_id).one().try_number


def sdk() -> Any:
    """A person's SDK client, as Studio or the CLI would be: built from the connection's JSON, never through
    Airflow's connection lookup. Called from a test's thread while ``dag.test()`` runs a task in-process,
    that lookup goes through the task's in-process supervisor channel, which is not thread-safe: it removes
    ``SUPERVISOR_COMMS`` while it serves a request, and the task's own next ``task_state_store`` call then
    failed with an ImportError (seen once in ``.ci/run`` under load)."""
    import os
    from types import SimpleNamespace

    from airflow_azureml.hooks import AzureMLHook

    conn = json.loads(os.environ["AIRFLOW_CONN_AZURE_ML_DEFAULT"])
    as_stored = SimpleNamespace(
        conn_id="a-person", login=conn.get("login"), password=conn.get("password"), extra_dejson=conn.get("extra") or {}
    )
    hook = AzureMLHook()
    hook._connection = lambda: as_stored  # type: ignore[method-assign]
    return hook.get_conn()


def person_cancels(emulator: Emulator, job: str, wait: bool = True) -> None:
    """A person cancels the job from the SDK (as Studio and the CLI do: POST .../cancel).

    ``wait=False``: send the cancel and leave its poll to the SDK's poller thread, which keeps any error to
    itself; a test's watcher thread may outlive the emulator (the try can end before the poll does), and its
    ``result()`` then raised "connection refused" into pytest's thread-exception warning."""
    poller = sdk().jobs.begin_cancel(job)
    if wait:
        poller.result()


def compute_reads_since(emulator: Emulator, since: float) -> int:
    return sum(
        1
        for r in emulator.requests()
        if r["method"] == "GET" and r["path"].endswith(f"/computes/{CLUSTER}") and r["t"] > since
    )


def gauge_read_while_running(emulator: Emulator, job: Any) -> bool:
    """The wait read the cluster after one of its polls saw the job Running (``first_gauge_read_while_running``)."""
    return first_gauge_read_while_running(emulator, job) is not None


def first_gauge_read_while_running(emulator: Emulator, job: Any) -> float | None:
    """When the wait first read the cluster after one of its polls saw the job Running: a compute read after a
    read of the job (its GET, or a LIST) that arrived once the job had started. A compute read alone is not
    enough: the waits also read the compute while the job is queued (its nodes are billed then), and a poll
    that saw the job Queued just before it started takes no gauge evidence from its read."""
    started = job.started.timestamp()
    requests = emulator.requests()
    seen = [
        r["t"]
        for r in requests
        if r["method"] == "GET" and r["path"].endswith((f"/jobs/{job.name}", "/jobs")) and r["t"] > started
    ]  # the job's GET, or the triggerer's LIST of jobs
    reads = [
        r["t"]
        for r in requests
        if seen and r["method"] == "GET" and r["path"].endswith(f"/computes/{CLUSTER}") and r["t"] > seen[0]
    ]
    return reads[0] if reads else None


def gauge_read_twice_since(emulator: Emulator, name: str, since: float) -> bool:
    """The wait of job ``name`` read it, then the cluster, twice over since ``since`` (``read_twice_since``)."""
    return read_twice_since(emulator.requests(), name, CLUSTER, since)


def sampled_twice(emulator: Emulator, job: Any) -> bool:
    """The wait read the job, then the cluster, twice since the job started: the first read is a sample."""
    return gauge_read_twice_since(emulator, job.name, job.started.timestamp())


def every_running_job_sampled(emulator: Emulator, _job: Any) -> bool:
    """Each Running job on the cluster has been read, and the gauge after it, twice since it started: a
    whole-cluster preemption then strikes no attempt whose nodes its wait never sampled (such an attempt
    bills 0 lost node-hours, as the bill comes from the reads: docs/cost.md)."""
    running = [j for j in emulator.jobs() if j.compute == CLUSTER and j.status == "Running" and j.started]
    return all(gauge_read_twice_since(emulator, j.name, j.started.timestamp()) for j in running)


def when_sampled(
    emulator: Emulator,
    action: Callable[[Emulator, str], object],
    *,
    times: int = 1,
    sampled: bool = True,
    timeout: float = 120,
) -> AbstractContextManager[list[str]]:
    """Run ``action(emulator, job)`` once a new job on the cluster is Running and (``sampled``) the wait has
    read the cluster's gauge since (the evidence a preemption needs), ``times`` times."""

    return when_running(
        emulator,
        action,
        times=times,
        cluster=CLUSTER,
        timeout=timeout,
        ready=gauge_read_while_running if sampled else None,
    )


def preempt_cluster(emulator: Emulator, job: str) -> None:
    preempt_and_cancel_once_read(emulator, job, CLUSTER)  # Azure cancels once the wait has read the gauge up


# ------------------------------------------------------------- §2 cancels
@pytest.mark.parametrize("deferrable", [False, True], ids=["polling", "deferred"])
def test_person_cancel_fails_the_try_without_retries(workspace: Emulator, run_case, deferrable: bool) -> None:
    with when_sampled(workspace, person_cancels, sampled=False) as cancelled:
        run, failures = run_case({"retries": 2, "deferrable": deferrable})
    assert str(run.state) == "failed" and len(cancelled) == 1
    assert [f["type"] for f in failures] == ["AzureMLJobCanceledError"]
    assert "clear the task" in failures[0]["message"]
    assert try_numbers(run) == 1, "a person's cancel must not be retried"
    assert [j.status for j in workspace.jobs()] == ["Canceled"], "nothing resubmitted"
    verdict = xcom_value(run, "invoke", key="azureml_verdict")
    assert verdict["outcome"] == "user_canceled" and "no lost-capacity message" in verdict["reason"]


def test_clear_after_a_person_cancel_runs_the_work_again(workspace: Emulator, run_case) -> None:
    with when_sampled(workspace, person_cancels, sampled=False):
        run, failures = run_case({"retries": 2})
    assert str(run.state) == "failed" and failures[0]["type"] == "AzureMLJobCanceledError"
    run, failures = run_case({"retries": 2}, dag_run=run)  # the clear is the request
    assert str(run.state) == "success", (task_states(run), failures)
    result = xcom_value(run, "invoke")
    jobs = {j.name: j for j in workspace.jobs()}
    assert [jobs[n].status for n in result["job_names"]] == ["Canceled", "Completed"] and len(jobs) == 2
    assert len(prediction_ids(workspace, result["job_name"])) == 100


@pytest.mark.parametrize("deferrable", [False, True], ids=["polling", "deferred"])
def test_clear_never_attaches_to_the_job_airflow_is_cancelling(workspace: Emulator, run_case, deferrable: bool) -> None:
    # The task times out; Airflow's on_kill cancels its job. Azure takes a while to finish a cancel, so the
    # job is still CancelRequested when the person clears the task and the new try starts. The cancel lands
    # just after the new try's last read before its wait: its first GET of the job (polling), or the second,
    # the look before deferring (deferred: that look saw CancelRequested, so the try deferred, and the trigger's
    # event carries found_ending back). Conditions, not a timer. (With a 1 s timer, Airflow 3.1 and 3.2 passed
    # only because their tries started later than that: a try that saw the cancel under way took it for a
    # person's cancel it had watched, and failed.)
    workspace.set_capacity(CLUSTER, 0)
    run, failures = run_case({"execution_timeout": 5})  # the submit lands well within it on a loaded machine
    assert str(run.state) == "failed" and failures[0]["type"] == "AirflowTaskTimeout"
    (first,) = workspace.jobs()
    assert first.status == "Canceled"
    workspace.call(lambda: first.set_status("CancelRequested"))  # a slow cancel
    workspace.set_capacity(CLUSTER, None)
    reads: list[str] = []
    looks = 2 if deferrable else 1

    def land_the_cancel(entry: dict[str, Any]) -> None:
        reads.append(entry["path"])
        if len(reads) == looks:
            first.set_status("Canceled")

    job_get = f"/jobs/{first.name}"
    workspace.after_response(lambda e: e["method"] == "GET" and e["path"].endswith(job_get), land_the_cancel)
    run, failures = run_case({"execution_timeout": 60, "deferrable": deferrable}, dag_run=run)
    assert len(reads) > looks, "the new try never read the job after the cancel landed"
    assert str(run.state) == "success", (task_states(run), failures)
    result = xcom_value(run, "invoke")
    assert result["job_names"][0] == first.name and len(result["job_names"]) == 2
    assert [j.status for j in workspace.jobs()] == ["Canceled", "Completed"]


def test_clear_of_a_running_sync_task_waits_for_its_cancel_to_show_then_runs_the_work_again(
    workspace: Emulator, run_case
) -> None:
    # The task is killed while its job runs (a clear of a running sync task kills it the same way; here an
    # execution_timeout). on_kill's cancel is accepted, but Azure still shows the job Running when the
    # person's clear starts the new try. That try must take the job's cancel as Airflow's (it cancels it
    # again, waits for it to show, then runs the work again), not fail as if a person had cancelled it.
    lag = 20.0
    # 10 mini-batches on 4 slots, 15 s each: the job would run about 45 s, past the try's 10 s and the lag.
    # 10 s, not less: the try builds its client and submits within it on a loaded machine (the job must exist).
    workspace.call(lambda: setattr(workspace.workspace.timing, "mini_batch", 15.0))
    workspace.set_behaviour(cancel_lag_seconds=lag)
    run, failures = run_case({"execution_timeout": 10})
    assert str(run.state) == "failed" and failures[0]["type"] == "AirflowTaskTimeout", failures
    (first,) = workspace.jobs()
    assert first.cancel_requested, "on_kill sent its cancel"
    assert first.status == "Running", "the accepted cancel has not shown yet: the case this test is about"

    def fast_once_cancelled() -> None:  # the next job need not take as long
        deadline = time.monotonic() + 120
        while workspace.call(lambda: first.status) != "Canceled" and time.monotonic() < deadline:
            time.sleep(0.05)
        workspace.call(lambda: setattr(workspace.workspace.timing, "mini_batch", 0.03))

    threading.Thread(target=fast_once_cancelled, daemon=True).start()
    run, failures = run_case({"execution_timeout": 120}, dag_run=run)
    from airflow_azureml import compat

    if not compat.has_task_state_store():
        # Airflow < 3.3 keeps no task_state_store: on_kill's record of its cancel does not reach the new
        # try, which takes the cancel for a person's (docs/airflow_versions.md, the documented loss).
        assert str(run.state) == "failed" and [f["type"] for f in failures] == ["AzureMLJobCanceledError"]
        return
    assert str(run.state) == "success", (task_states(run), failures)
    result = xcom_value(run, "invoke")
    assert result["job_names"][0] == first.name and len(result["job_names"]) == 2
    assert [j.status for j in workspace.jobs()] == ["Canceled", "Completed"]


# ------------------------------------------------------ §3 preemption evidence
def test_whole_cluster_preemption_without_a_message_is_told_by_the_gauge(workspace: Emulator, run_case) -> None:
    assert workspace.behaviour()["capacity_cancel_message"] is False  # Azure documents no message
    with when_sampled(workspace, preempt_cluster) as preempted:
        run, failures = run_case()
    assert str(run.state) == "success", (task_states(run), failures)
    result = xcom_value(run, "invoke")
    assert len(preempted) == 1 and result["preemptions"] == 1
    assert [j.status for j in workspace.jobs()] == ["Canceled", "Completed"]


def test_person_cancel_on_a_cluster_with_another_jobs_preempted_node(workspace: Emulator, run_case) -> None:
    workspace.set_behaviour(preempted_node_release_seconds=120)  # the other job's node stays "preempted"
    # The gauge's rung is what this is about: the person's cancel not yet in the Activity Log. The other job's
    # node, preempted already at the first read while this job ran, is not this job's loss, also when a read
    # near the end finds it as every node left (this job's own released): in a .ci/run that read made the
    # verdict weak evidence of a preemption, and the wait for the log sat out 900 s before resubmitting the
    # cancel. evidence_wait 45 s: were that back, the test would fail in a minute, not hang.
    workspace.set_behaviour(activity_log_lag_seconds=3600)
    from tests.integration.test_emulator_sdk import invoke

    other = invoke(sdk(), INPUT, "another-job")
    deadline = time.monotonic() + 60
    while not workspace.evict_nodes(CLUSTER, 1):
        assert time.monotonic() < deadline, "the other job never got a node"
        time.sleep(0.02)
    sdk().jobs.begin_cancel(other).result()
    with when_running(workspace, person_cancels, cluster=CLUSTER, ready=sampled_twice):  # surely a sample
        run, failures = run_case({"retries": 1, "evidence_wait": 45})
    assert str(run.state) == "failed"
    assert [f["type"] for f in failures] == ["AzureMLJobCanceledError"]
    verdict = xcom_value(run, "invoke", key="azureml_verdict")
    assert verdict["outcome"] == "user_canceled" and verdict["witness"] == "none", verdict
    assert "preemptedNodeCount" in verdict["reason"]
    assert verdict["evidence"]["gauge"]["first_while_running"] == 1
    assert verdict["evidence"]["gauge"]["whole_cluster_preempted_near_end"] is None
    assert len(workspace.jobs()) == 2, "not resubmitted"


def evict_one_node_then_person_cancels(emulator: Emulator, job: str) -> None:
    """One of the job's two nodes is evicted (its mini-batches are requeued, the job goes on); once the wait
    has read the gauge up while it saw the job Running, a person cancels the job.

    Both ends are conditions on the wait's requests, not on luck: it starts once the wait has read the job,
    then the gauge, twice (``sampled_twice``: the first read is surely a sample, from before the eviction),
    and the cancel waits for two such rounds after the eviction. The job is held again (no new work) in the
    emulator step that evicts the node, so it is still Running when the wait reads it again. CI once failed
    here with no sample at all: one round, on a loaded machine, proved nothing.
    """
    emulator.release_job(job)  # when_running holds it before its work: this fault needs the work under way
    nodes = emulator.workspace.computes[CLUSTER].nodes

    def evict_once_on_both_nodes() -> float | None:
        if sum(n.state == "running" and n.job_name == job for n in nodes) < 2:
            return None
        emulator.workspace.hold_job(job)  # an evicted mini-batch stays queued: Running until the cancel
        evicted = time.time()
        assert emulator.workspace.evict_nodes(CLUSTER, 1) == 1
        return evicted

    deadline = time.monotonic() + 60
    while (evicted := emulator.call(evict_once_on_both_nodes)) is None:
        assert time.monotonic() < deadline, "the job never ran on both nodes"
        time.sleep(0.01)
    while not gauge_read_twice_since(emulator, job, evicted):  # its 1st read of the gauge since is a sample
        assert time.monotonic() < deadline + 60, "the wait never read the gauge twice after the eviction"
        time.sleep(0.01)
    assert emulator.call(lambda: emulator.workspace.jobs[job].status) == "Running"
    person_cancels(emulator, job)


def test_person_cancel_after_a_partial_eviction_is_a_person_cancel(workspace: Emulator, run_case) -> None:
    # Azure cancels for lack of capacity only when the whole cluster goes: one evicted node of two, seen
    # while the job ran, is not evidence that a later cancel was the platform's.
    workspace.set_behaviour(preempted_node_release_seconds=120)  # the evicted node stays "preempted"
    workspace.call(lambda: setattr(workspace.workspace.timing, "mini_batch", 0.3))
    with when_running(workspace, evict_one_node_then_person_cancels, cluster=CLUSTER, ready=sampled_twice) as cancelled:
        run, failures = run_case({"retries": 1})
    assert len(cancelled) == 1 and str(run.state) == "failed"
    assert [f["type"] for f in failures] == ["AzureMLJobCanceledError"]
    verdict = xcom_value(run, "invoke", key="azureml_verdict")
    gauge = verdict["evidence"]["gauge"]
    assert gauge["peak_while_running"] > gauge["first_while_running"], "the wait saw the eviction"
    assert verdict["outcome"] == "user_canceled"
    assert [j.status for j in workspace.jobs()] == ["Canceled"], "a person's cancel was resubmitted"


# ------------------------------------------------- §4 exactly once, any name
def test_job_azure_named_is_found_before_submitting(workspace: Emulator, run_case) -> None:
    workspace.set_deployment_behaviour(ENDPOINT, DEPLOYMENT, ignore_job_name=True)
    run, failures = run_case({"job_identity": "partition-7"})
    assert str(run.state) == "success", failures
    first = xcom_value(run, "invoke")
    assert not first["job_name"].endswith("-r0"), "the emulator picked the name"
    # later runs of the same unit of work find that job by its property, whatever it is called
    for _ in range(2):
        run, failures = run_case({"job_identity": "partition-7"})
        assert str(run.state) == "success", failures
        assert xcom_value(run, "invoke")["job_name"] == first["job_name"]
    assert len(workspace.jobs()) == 1
    lists = [r for r in workspace.requests() if r["method"] == "GET" and r["path"].endswith("/jobs")]
    assert lists and all("airflow_azureml.unit=" in r["query"].get("properties", "") for r in lists)


def test_a_list_that_ignores_its_filter_hands_no_unit_another_units_job(workspace: Emulator, run_case) -> None:
    """The LIST answers every job of the workspace, whatever the filter; names are Azure's (no GET finds them)."""
    workspace.set_deployment_behaviour(ENDPOINT, DEPLOYMENT, ignore_job_name=True)
    workspace.set_behaviour(list_ignores_properties_filter=True)
    run, failures = run_case({"job_identity": "partition-1"})
    assert str(run.state) == "success", failures
    first = xcom_value(run, "invoke")["job_name"]
    run, failures = run_case({"job_identity": "partition-2"})
    assert str(run.state) == "success", failures
    second = xcom_value(run, "invoke")["job_name"]
    assert second != first, "partition-2 was handed partition-1's job"
    # and partition-1 still finds its own finished job among everything the LIST returns
    run, failures = run_case({"job_identity": "partition-1"})
    assert str(run.state) == "success", failures
    assert xcom_value(run, "invoke")["job_name"] == first
    jobs = {j.name: j for j in workspace.jobs()}
    assert set(jobs) == {first, second} and all(j.status == "Completed" for j in jobs.values())


def test_azure_named_chain_resubmits_and_finds_every_job(workspace: Emulator, run_case) -> None:
    workspace.set_deployment_behaviour(ENDPOINT, DEPLOYMENT, ignore_job_name=True)
    with when_sampled(workspace, preempt_cluster):
        run, failures = run_case({"retries": 2})
    assert str(run.state) == "success", (task_states(run), failures)
    result = xcom_value(run, "invoke")
    assert len(result["job_names"]) == 2 and len(workspace.jobs()) == 2
    props = [sdk().jobs.get(n).properties for n in result["job_names"]]
    assert [p["airflow_azureml.resubmission"] for p in props] == ["0", "1"]
    assert len({p["airflow_azureml.unit"] for p in props}) == 1


def test_default_identity_is_the_work_not_the_map_index(workspace: Emulator, run_case) -> None:
    other = "in/other"
    write_heart_csvs(workspace.datastore_path(other), files=6, rows_per_file=5)
    run, failures = run_case()
    assert str(run.state) == "success", failures
    first = xcom_value(run, "invoke")
    # the same task instance now means other input (a mapped upstream returned a shorter list): new work
    inputs = {"heart_dataset": f"azureml://datastores/workspaceblobstore/paths/{other}/"}
    run, failures = run_case({"inputs": inputs}, dag_run=run)
    assert str(run.state) == "success", (task_states(run), failures)
    second = xcom_value(run, "invoke")
    assert second["job_name"] != first["job_name"]
    assert len(prediction_ids(workspace, second["job_name"])) == 30
    # a new DAG run of the first work finds its completed job: nothing runs twice
    run, failures = run_case()
    assert str(run.state) == "success", failures
    assert xcom_value(run, "invoke")["job_name"] == first["job_name"]
    assert len(workspace.jobs()) == 2


def test_a_model_update_scores_a_finished_interval_again_and_a_description_change_does_not(
    workspace: Emulator, run_case
) -> None:
    """A re-run of a scored interval reuses its completed job while the deployment runs what it ran; after
    the deployment moves to a new model version, the same re-run scores the interval again, once. (Seen
    failing first: the re-run after the model update returned the old model's job.)"""
    from airflow_azureml.hooks import AzureMLHook

    def update_deployment(**changes: Any) -> None:
        ml = AzureMLHook().get_conn()
        deployment = ml.batch_deployments.get(DEPLOYMENT, endpoint_name=ENDPOINT)
        for name, value in changes.items():
            setattr(deployment, name, value)
        ml.batch_deployments.begin_create_or_update(deployment).result()

    run, failures = run_case()
    assert str(run.state) == "success", failures
    first = xcom_value(run, "invoke")["job_name"]
    update_deployment(description="the same model, described anew")  # what runs is unchanged
    run, failures = run_case()
    assert str(run.state) == "success", failures
    assert xcom_value(run, "invoke")["job_name"] == first and len(workspace.jobs()) == 1

    workspace.register_model("heart-classifier", "2", scoring_module="airflow_azureml.emulator.scoring.heart")
    update_deployment(model="azureml:heart-classifier:2")
    run, failures = run_case()
    assert str(run.state) == "success", failures
    second = xcom_value(run, "invoke")["job_name"]
    if not compat.has_task_state_store():  # 3.1/3.2: a retry cannot be told from a new run: always reused
        assert second == first and len(workspace.jobs()) == 1
        return
    assert second != first, "the re-run after a model update returned the old model's job"
    run, failures = run_case()  # and once only: the new model's job is reused from now on
    assert str(run.state) == "success", failures
    assert xcom_value(run, "invoke")["job_name"] == second
    assert [j.status for j in workspace.jobs()] == ["Completed", "Completed"]
    assert len(prediction_ids(workspace, second)) == 100


def test_a_blue_green_switch_of_the_default_deployment_scores_a_finished_interval_again(
    workspace: Emulator, run_case
) -> None:
    """With no deployment named, the work runs on the endpoint's default. Azure's documented way to move to a
    new model is a new deployment made the default: a re-run of a scored interval then scores it again on the
    new default, once. (Seen failing first: the job's own deployment never changed, so the old job was kept.)"""
    from azure.ai.ml.entities._load_functions import load_model_batch_deployment

    from airflow_azureml.hooks import AzureMLHook
    from tests.integration.test_emulator_sdk import SEED_DEPLOYMENT_YAML

    ml = AzureMLHook().get_conn()

    def make_default(deployment: str) -> None:
        endpoint = ml.batch_endpoints.get(ENDPOINT)
        endpoint.defaults.deployment_name = deployment
        ml.batch_endpoints.begin_create_or_update(endpoint).result()

    make_default(DEPLOYMENT)
    run, failures = run_case({"deployment_name": None})
    assert str(run.state) == "success", failures
    first = xcom_value(run, "invoke")["job_name"]

    workspace.register_model("heart-classifier", "2", scoring_module="airflow_azureml.emulator.scoring.heart")
    green = load_model_batch_deployment(source=str(SEED_DEPLOYMENT_YAML))
    green.name, green.model = "classifier-green", "azureml:heart-classifier:2"
    ml.batch_deployments.begin_create_or_update(green).result()
    make_default("classifier-green")
    run, failures = run_case({"deployment_name": None})
    assert str(run.state) == "success", failures
    second = xcom_value(run, "invoke")["job_name"]
    if not compat.has_task_state_store():  # 3.1/3.2: a retry cannot be told from a new run: always reused
        assert second == first and len(workspace.jobs()) == 1
        return
    assert second != first, "the re-run after the switch kept the old deployment's job"
    run, failures = run_case({"deployment_name": None})
    assert str(run.state) == "success", failures
    assert xcom_value(run, "invoke")["job_name"] == second
    deployments = [(j.status, j.deployment) for j in workspace.jobs()]
    assert deployments == [("Completed", DEPLOYMENT), ("Completed", "classifier-green")], deployments


def test_budget_belongs_to_one_run_of_the_task(workspace: Emulator, run_case) -> None:
    from airflow_azureml import compat

    with when_sampled(workspace, preempt_cluster):
        run, failures = run_case({"max_resubmits": 0, "retries": 1})
    if not compat.has_task_state_store():
        # Airflow < 3.3 (docs/airflow_versions.md): the preemption count restarts with each try, so the automatic
        # retry has a fresh budget and submits the chain's next job; one job per name, never a duplicate
        assert str(run.state) == "success" and try_numbers(run) == 2, (task_states(run), failures)
        result = xcom_value(run, "invoke")
        assert result["job_names"][-1].endswith("-r1") and len(result["job_names"]) == 2
        assert [j.status for j in workspace.jobs()] == ["Canceled", "Completed"]
        return
    assert str(run.state) == "failed"
    # the automatic retry shares the spent budget: no new job
    assert try_numbers(run) == 2 and [f["type"] for f in failures] == ["AzureMLJobPreemptedError"]
    assert "Clearing the task starts a fresh budget" in failures[-1]["message"]
    assert len(workspace.jobs()) == 1
    run, failures = run_case({"max_resubmits": 0, "retries": 1}, dag_run=run)  # a clear: a fresh budget
    assert str(run.state) == "success", (task_states(run), failures)
    result = xcom_value(run, "invoke")
    assert result["job_names"][-1].endswith("-r1") and [j.status for j in workspace.jobs()] == ["Canceled", "Completed"]


def test_new_dag_run_of_a_preempted_unit_gets_a_fresh_budget(workspace: Emulator, run_case) -> None:
    with when_sampled(workspace, preempt_cluster):
        run, failures = run_case({"max_resubmits": 0})
    assert str(run.state) == "failed" and failures[0]["type"] == "AzureMLJobPreemptedError"
    run, failures = run_case({"max_resubmits": 0})  # e.g. a backfill of the same unit of work
    assert str(run.state) == "success", (task_states(run), failures)
    assert xcom_value(run, "invoke")["job_names"][-1].endswith("-r1")
    assert [j.status for j in workspace.jobs()] == ["Canceled", "Completed"]


# ------------------------------------------------ §5 back-off in the triggerer
def test_deferred_backoff_is_spent_in_the_triggerer(
    workspace: Emulator, run_case, monkeypatch: pytest.MonkeyPatch
) -> None:
    import airflow_azureml.operators.job_base as job_base

    slept: list[float] = []

    class WorkerClock:  # records what the operator itself sleeps in the worker
        time = staticmethod(time.time)

        @staticmethod
        def sleep(seconds: float) -> None:
            slept.append(seconds)
            time.sleep(seconds)

    monkeypatch.setattr(job_base, "time", WorkerClock)
    # mini-batches slow enough for the trigger to sample the gauge (the evidence) before the job ends
    workspace.call(lambda: setattr(workspace.workspace.timing, "mini_batch", 0.3))
    with when_sampled(workspace, preempt_cluster):
        # loop_after 0: this first preemption already counts as a loop, so it backs off. evidence_wait 5 s: on a
        # loaded machine the trigger may see the loss only near the job's end (weak evidence), and the default
        # 900 s wait for the Activity Log, deferred too, outlived the test's timeout (a 3.1 run in .ci/run)
        case = {"deferrable": True, "resubmit_backoff": 0.5, "loop_after": 0, "evidence_wait": 5}
        run, failures = run_case(case)
    assert str(run.state) == "success", (task_states(run), failures)
    assert xcom_value(run, "invoke")["preemptions"] == 1
    assert slept == [], "the worker slept the back-off"


# ------------------------------------------------------------- not terminal
@pytest.mark.parametrize("deferrable", [False, True], ids=["polling", "deferred"])
def test_not_responding_job_is_waited_for(workspace: Emulator, run_case, deferrable: bool) -> None:
    workspace.set_behaviour(stall_seconds=0.5)
    run, failures = run_case({"deferrable": deferrable})
    assert str(run.state) == "success", (task_states(run), failures)
    assert len(workspace.jobs()) == 1
    assert len(prediction_ids(workspace, xcom_value(run, "invoke")["job_name"])) == 100


def test_duplicate_from_the_sdks_own_retry_is_cancelled(workspace: Emulator, run_case) -> None:
    # Azure picks the names and the invoke's response is lost after the job was created: the SDK posts
    # again and a second job of the same unit exists (azure-sdk-for-python#31166). One of them must go.
    workspace.set_deployment_behaviour(ENDPOINT, DEPLOYMENT, ignore_job_name=True)
    workspace.add_fault(kind="drop", when="after", route="invoke")
    run, failures = run_case()
    assert str(run.state) == "success", (task_states(run), failures)
    result = xcom_value(run, "invoke")
    statuses = {j.name: j.status for j in workspace.jobs()}
    assert len(statuses) == 2 and statuses[result["job_name"]] == "Completed"
    (duplicate,) = [name for name in statuses if name != result["job_name"]]
    assert statuses[duplicate] == "Canceled", "the duplicate kept running and billing"
    assert result["job_names"] == [result["job_name"]]


# ------------------------------------- a job this try watched while it ran
def cancel_once_watched(emulator: Emulator, after: Callable[[dict[str, Any]], bool], timeout: float = 120) -> list[str]:
    """In a thread: once a request matches ``after``, lift the faults; once a try has then read the (only)
    job twice (it is watching it), a person cancels that job. Returns the cancelled names as they happen."""
    cancelled: list[str] = []

    def watch() -> None:
        deadline = time.monotonic() + timeout
        since: float | None = None
        while time.monotonic() < deadline:
            log = emulator.requests()
            if since is None:
                since = next((r["t"] for r in log if after(r)), None)
                if since is not None:
                    emulator.clear_faults()
            jobs = emulator.jobs()
            if since is not None and jobs:
                job = jobs[0].name
                reads = [r for r in log if r["method"] == "GET" and r["path"].endswith(f"/jobs/{job}")]
                if sum(1 for r in reads if r["t"] > since) >= 2:
                    cancelled.append(job)  # before: the try may end before the SDK's cancel poller does
                    person_cancels(emulator, job, wait=False)
                    return
            time.sleep(0.01)

    threading.Thread(target=watch, daemon=True).start()
    return cancelled


@pytest.mark.parametrize("deferrable", [False, True], ids=["polling", "deferred"])
def test_clear_then_person_cancel_of_the_still_running_job_fails(
    workspace: Emulator, run_case, deferrable: bool
) -> None:
    # Try 1's wait fails (a non-transient error on the job's GET) and leaves the job queued; a person clears
    # the task, the new try attaches to the job, then a person cancels it in Studio: final, not a resubmit.
    workspace.set_capacity(CLUSTER, 0)

    def fail_the_wait() -> None:
        deadline = time.monotonic() + 60
        while not workspace.jobs():
            assert time.monotonic() < deadline
            time.sleep(0.01)
        job = workspace.jobs()[0].name
        workspace.add_fault(kind="status", status=400, path=rf"/jobs/{job}$", methods=["GET"], count=None)

    threading.Thread(target=fail_the_wait, daemon=True).start()
    run, failures = run_case()  # polling: its wait reads the job by GET, which the fault fails
    assert str(run.state) == "failed" and failures and failures[0]["type"] != "AzureMLJobCanceledError", failures
    (first,) = workspace.jobs()
    assert first.status == "Queued", "the failed wait left the job waiting for capacity"
    workspace.clear_faults()
    cleared_at = time.time()
    cancelled = cancel_once_watched(workspace, lambda r: r["t"] > cleared_at)
    run, failures = run_case({"retries": 2, "deferrable": deferrable}, dag_run=run)
    assert cancelled == [first.name]
    assert str(run.state) == "failed", (task_states(run), failures)
    assert [f["type"] for f in failures] == ["AzureMLJobCanceledError"]
    assert [j.status for j in workspace.jobs()] == ["Canceled"], "a person's cancel was resubmitted"


def test_failed_on_kill_cancel_then_person_cancel_fails(workspace: Emulator, run_case) -> None:
    # Try 1 times out; on_kill records its cancel, but the cancel POST fails: the job keeps waiting. The
    # retry attaches to it; a person then cancels it. The record must not make that cancel Airflow's.
    workspace.set_capacity(CLUSTER, 0)
    workspace.add_fault(kind="status", status=403, route="cancel", count=None)
    cancelled = cancel_once_watched(workspace, lambda r: r["method"] == "POST" and r["path"].endswith("/cancel"))
    # 10 s a try: the retry must attach, poll and see the person's cancel within it, also on a loaded machine
    run, failures = run_case({"retries": 1, "execution_timeout": 10})
    assert len(cancelled) == 1
    assert str(run.state) == "failed", (task_states(run), failures)
    assert [f["type"] for f in failures] == ["AzureMLJobCanceledError"], failures
    assert try_numbers(run) == 2, "the retry watched the job"
    assert [j.status for j in workspace.jobs()] == ["Canceled"], "a person's cancel was resubmitted"


def test_overlapping_runs_with_azure_chosen_names_share_one_job(
    workspace: Emulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two DAG runs submit the same work at the same time and Azure picks the names: one job must be kept
    # (the same one by both runs), the other cancelled, and neither run may read that cancel as a person's.
    from types import SimpleNamespace

    from airflow.sdk import DAG

    from airflow_azureml.operators.batch import AzureMLInvokeBatchEndpointOperator as Op

    workspace.set_deployment_behaviour(ENDPOINT, DEPLOYMENT, ignore_job_name=True)
    barrier = threading.Barrier(2)
    submit = Op.submit_job

    def submit_together(self: Any, *args: Any, **kwargs: Any) -> str | None:
        name = submit(self, *args, **kwargs)
        barrier.wait(60)  # both invokes are in flight together
        return name

    monkeypatch.setattr(Op, "submit_job", submit_together)

    class Store(dict):
        def set(self, key: str, value: Any) -> None:
            self[key] = value

    results: dict[str, Any] = {}

    def run(tag: str) -> None:
        dag = DAG("overlap", schedule=None, start_date=LOGICAL)
        op = Op(
            task_id="invoke",
            dag=dag,
            endpoint_name=ENDPOINT,
            deployment_name=DEPLOYMENT,
            inputs={"heart_dataset": f"azureml://datastores/workspaceblobstore/paths/{INPUT}/"},
            polling={"interval": 0.05, "max_interval": 0.2},
        )
        ti = SimpleNamespace(max_tries=0, try_number=1, xcom_push=lambda **kw: None)
        try:
            results[tag] = op.execute({"ti": ti, "task_state_store": Store()})
        except Exception as exc:  # the assertion below shows it
            results[tag] = exc

    threads = [threading.Thread(target=run, args=(tag,)) for tag in ("a", "b")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(300)
    assert all(isinstance(r, dict) for r in results.values()) and len(results) == 2, results
    assert results["a"]["job_name"] == results["b"]["job_name"]
    statuses = sorted(j.status for j in workspace.jobs())
    assert statuses == ["Canceled", "Completed"], statuses
    assert len(prediction_ids(workspace, results["a"]["job_name"])) == 100
