"""Issue 10 §2.5: faults after commit. The service does the work, then the answer is lost or replaced by a 5xx.

Each case runs the real operator through Airflow (``dag.test()``), the real SDK and credentials, and the
emulator's after-commit faults. A client that retries such a request meets its own earlier work: an
invoke's retry is answered 409 for the fixed job name, and the hook must attach to that job (the only
path that reaches the hook's attach code); a PUT or a cancel is idempotent, so its retry is answered with
the resource, and the work must still exist exactly once.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pendulum
import pytest

from airflow_azureml.emulator import Emulator
from airflow_azureml.emulator.scoring.data import write_heart_csvs
from tests.conftest import load_dag, task_states, xcom_value
from tests.integration.test_emulator_sdk import input_ids, prediction_ids, setup_workspace
from tests.integration.test_exactly_once import clear_and_rerun, try_numbers

LOGICAL = pendulum.datetime(2026, 11, 1, tz="UTC")
INPUT = "in/20261101"
CLUSTER = "low-pri-cluster"
ENDPOINT, DEPLOYMENT = "heart-classifier-batch", "classifier-mlflow"
ROWS = 100


# ------------------------------------------------------------------ harness
@pytest.fixture
def workspace(emulator: Emulator, azureml_conn: dict[str, Any], airflow_db: Path) -> Emulator:
    from airflow_azureml.hooks import AzureMLHook

    setup_workspace(AzureMLHook())
    write_heart_csvs(emulator.datastore_path(INPUT), files=20, rows_per_file=5)
    return emulator


@pytest.fixture
def run_dag(
    emulator: Emulator, azureml_conn: dict[str, Any], airflow_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Any:
    failures = tmp_path / "failures.jsonl"
    monkeypatch.setenv("AZUREML_TEST_FAILURES", str(failures))

    def run(
        dag_id: str,
        case: dict[str, Any] | None = None,
        *,
        file_name: str = "azureml_operator_cases.py",
        rerun: Any = None,
    ) -> tuple[Any, list[dict[str, str]]]:
        """A new run of ``dag_id`` shaped by ``case``; with ``rerun``, a person clears that run's tasks."""
        monkeypatch.setenv("AZUREML_TEST_CASE", json.dumps(case or {}))
        failures.unlink(missing_ok=True)
        dag = load_dag(file_name, dag_id)
        result = dag.test(logical_date=LOGICAL) if rerun is None else clear_and_rerun(dag, rerun)
        recorded = [json.loads(line) for line in failures.read_text().splitlines()] if failures.exists() else []
        return result, recorded

    return run


@pytest.fixture
def command_dag_file() -> str:
    """A DAG with one command job on the seed's cluster, written beside the other test DAGs."""
    from tests.conftest import DAGS_FOLDER

    path = DAGS_FOLDER / "azureml_lost_response_cases.py"
    path.write_text(COMMAND_DAG)
    return path.name


COMMAND_DAG = """
from __future__ import annotations

import json
import os
from datetime import timedelta

import pendulum
from airflow.sdk import DAG

from airflow_azureml.operators import AzureMLSubmitCommandJobOperator
from tests.dag_support import record_failure

with DAG(
    "azureml_lost_response_command",
    schedule=None,
    start_date=pendulum.datetime(2026, 11, 1, tz="UTC"),
    default_args={
        "retries": json.loads(os.environ.get("AZUREML_TEST_CASE", "{}")).get("retries", 0),
        "retry_delay": timedelta(0),
        "on_failure_callback": record_failure,
    },
) as command_dag:
    AzureMLSubmitCommandJobOperator(
        task_id="command",
        command="python score.py",
        environment="azureml:AzureML-sklearn-1.5@latest",
        compute="low-pri-cluster",
        polling={"interval": 0.05, "max_interval": 0.2},
    )
"""


def requests_for(emulator: Emulator, method: str, suffix: str) -> list[dict[str, Any]]:
    return [r for r in emulator.requests() if r["method"] == method and r["path"].endswith(suffix)]


def assert_attached(emulator: Emulator, job_name: str, fault: str) -> None:
    """The request log shows the attach path: the lost invoke, the SDK's retry answered 409, then the hook's
    GET of that job (``job_snapshot``) before anything else touched it."""
    log = emulator.requests()
    posts = [i for i, r in enumerate(log) if r["method"] == "POST" and r["path"].startswith("/inference/batch/")]
    assert len(posts) == 2, [log[i] for i in posts]
    first, retry = (log[i] for i in posts)
    assert first.get("fault") == fault
    assert retry["status"] == 409 and "fault" not in retry
    after = [r for r in log[posts[1] + 1 :] if f"/jobs/{job_name}" in r["path"]]
    assert after and after[0]["method"] == "GET" and after[0]["path"].endswith(f"/jobs/{job_name}")
    assert after[0]["status"] == 200


def assert_scored_once(emulator: Emulator, job_name: str) -> None:
    scored = prediction_ids(emulator, job_name)
    assert len(scored) == ROWS and len(set(scored)) == ROWS
    assert sorted(scored) == sorted(input_ids(emulator.datastore_path(INPUT)))


# ------------------------------------------------------------------- invoke
@pytest.mark.parametrize(
    "fault",
    [{"kind": "drop"}, {"kind": "status", "status": 500}, {"kind": "status", "status": 503}],
    ids=["dropped", "500", "503"],
)
def test_invoke_lost_after_commit_attaches_to_the_job(workspace: Emulator, run_dag, fault: dict[str, Any]) -> None:
    # The job is created, the answer is lost; the SDK posts again with the same job name and meets a 409.
    workspace.add_fault(**fault, when="after", route="invoke")
    run, failures = run_dag("azureml_invoke_case")
    assert str(run.state) == "success", (task_states(run), failures)
    result = xcom_value(run, "invoke")
    assert result["job_names"] == [result["job_name"]]
    assert [(j.name, j.status) for j in workspace.jobs()] == [(result["job_name"], "Completed")]
    assert_attached(workspace, result["job_name"], f"{fault['kind']}-after")
    assert_scored_once(workspace, result["job_name"])


def test_invoke_lost_after_commit_then_a_new_run_finds_the_same_job(workspace: Emulator, run_dag) -> None:
    workspace.add_fault(kind="drop", when="after", route="invoke")
    run, failures = run_dag("azureml_invoke_case")
    assert str(run.state) == "success", (task_states(run), failures)
    name = xcom_value(run, "invoke")["job_name"]
    run, failures = run_dag("azureml_invoke_case")  # e.g. a backfill of the same unit of work
    assert str(run.state) == "success", (task_states(run), failures)
    assert xcom_value(run, "invoke")["job_name"] == name
    assert len(workspace.jobs()) == 1 and len(requests_for(workspace, "POST", "/jobs")) == 2
    assert_scored_once(workspace, name)


def test_invoke_lost_past_the_sdks_retries_is_found_by_the_next_try(workspace: Emulator, run_dag) -> None:
    # The first post's answer is lost after the job was created, the SDK's four retries never get through:
    # the SDK gives up, the try fails, and Airflow's retry finds the job by its unit instead of invoking again.
    workspace.add_fault(kind="drop", when="after", route="invoke")
    workspace.add_fault(kind="drop", route="invoke", count=4)
    run, failures = run_dag("azureml_invoke_case", {"retries": 1})
    assert str(run.state) == "success", (task_states(run), failures)
    result = xcom_value(run, "invoke")
    assert result["job_names"] == [result["job_name"]]
    assert [(j.name, j.status) for j in workspace.jobs()] == [(result["job_name"], "Completed")]
    posts = requests_for(workspace, "POST", "/jobs")
    assert [p.get("fault") for p in posts] == ["drop-after"] + ["drop"] * 4
    assert [f["task"] for f in failures] == [], "a try that Airflow retries is not a failure"
    assert try_numbers(run) == 2
    assert_scored_once(workspace, result["job_name"])


def test_invoke_lost_past_the_sdks_retries_with_its_name_ignored_and_the_list_behind(
    workspace: Emulator, run_dag
) -> None:
    # As above, but neither the name nor the LIST finds the job at once: Azure chose the name, and the LIST
    # shows the job only 20 s after it was created. The failed try recorded its unfinished submit, so the
    # retry looks for that submit's job before invoking again.
    workspace.set_deployment_behaviour(ENDPOINT, DEPLOYMENT, ignore_job_name=True)
    workspace.set_behaviour(list_lag_seconds=20.0)
    workspace.add_fault(kind="drop", when="after", route="invoke")
    workspace.add_fault(kind="drop", route="invoke", count=4)
    run, failures = run_dag("azureml_invoke_case", {"retries": 1})
    assert str(run.state) == "success", (task_states(run), failures)
    result = xcom_value(run, "invoke")
    # Airflow < 3.3 keeps no task state between tries: the unit journal carries the unfinished submit there
    assert result["job_names"] == [result["job_name"]] and result["job_name"].startswith("batchjob-")
    assert [(j.name, j.status) for j in workspace.jobs()] == [(result["job_name"], "Completed")]
    assert len(requests_for(workspace, "POST", "/jobs")) == 5, "the retry invoked again"
    assert try_numbers(run) == 2
    assert_scored_once(workspace, result["job_name"])


def test_invoke_lost_with_the_task_state_lost_and_the_properties_dropped_finds_the_job_by_its_carrier(
    workspace: Emulator, run_dag
) -> None:
    # Issue 18 §4, every switch on at once: Azure ignores the name, drops the invoke's properties (the unit
    # key never reaches the job), answers the LIST as if unfiltered and 20 s late; the try that invoked
    # loses its answer and fails, and its task state is lost before the retry. The unit journal says a submit
    # did not return; the job's data paths, endpoint, deployment and experiment say which job it made. A job
    # of another unit (another partition) created in the same window must not be taken.
    from airflow_azureml import naming
    from airflow_azureml.hooks import AzureMLHook

    write_heart_csvs(workspace.datastore_path("in/20261031"), files=2, rows_per_file=5)
    workspace.set_deployment_behaviour(ENDPOINT, DEPLOYMENT, ignore_job_name=True)
    workspace.set_behaviour(list_lag_seconds=20.0, list_ignores_properties_filter=True, invoke_properties_dropped=True)
    other = AzureMLHook().invoke_batch_endpoint(
        endpoint_name=ENDPOINT,
        deployment_name=DEPLOYMENT,
        inputs={"heart_dataset": "azureml://datastores/workspaceblobstore/paths/in/20261031/"},
        job_name="other-unit-job",
        experiment_name=naming.experiment_name("azureml_invoke_case"),
    )
    workspace.add_fault(kind="drop", when="after", route="invoke")
    workspace.add_fault(kind="drop", route="invoke", count=4)
    run, failures = run_dag("azureml_invoke_case", {"retries": 1, "lose_task_state": True})
    assert str(run.state) == "success", (task_states(run), failures)
    result = xcom_value(run, "invoke")
    assert result["job_names"] == [result["job_name"]] and result["job_name"] not in (other, "other-unit-job")
    jobs = {j.name: j.status for j in workspace.jobs()}
    assert len(jobs) == 2 and result["job_name"] in jobs and other in jobs, jobs
    assert len(requests_for(workspace, "POST", "/jobs")) == 6, "the retry invoked again"
    assert try_numbers(run) == 2
    assert_scored_once(workspace, result["job_name"])


# -------------------------------------------------------------- command PUT
@pytest.mark.parametrize("fault", [{"kind": "drop"}, {"kind": "status", "status": 503}], ids=["dropped", "503"])
def test_command_job_put_lost_after_commit(
    workspace: Emulator, run_dag, command_dag_file: str, fault: dict[str, Any]
) -> None:
    # A PUT is idempotent: the SDK's retry of the same body is answered with the job the first PUT created.
    workspace.add_fault(**fault, when="after", route="job_put")
    run, failures = run_dag("azureml_lost_response_command", file_name=command_dag_file)
    assert str(run.state) == "success", (task_states(run), failures)
    result = xcom_value(run, "command")
    assert result["job_names"] == [result["job_name"]]
    assert [(j.name, j.status) for j in workspace.jobs()] == [(result["job_name"], "Completed")]
    puts = requests_for(workspace, "PUT", f"/jobs/{result['job_name']}")
    assert [p.get("fault") for p in puts] == [f"{fault['kind']}-after", None]
    assert puts[-1]["status"] in (200, 201)


def test_command_job_put_lost_past_the_sdks_retries_is_found_by_the_next_try(
    workspace: Emulator, run_dag, command_dag_file: str
) -> None:
    # Every answer is lost until the SDK gives up: the try fails, and the next one finds the job by its unit.
    workspace.add_fault(kind="drop", when="after", route="job_put", count=10)
    run, failures = run_dag("azureml_lost_response_command", {"retries": 1}, file_name=command_dag_file)
    assert str(run.state) == "success", (task_states(run), failures)
    assert [f["task"] for f in failures] == [] and try_numbers(run) == 2
    result = xcom_value(run, "command")
    assert [(j.name, j.status) for j in workspace.jobs()] == [(result["job_name"], "Completed")]
    puts = requests_for(workspace, "PUT", f"/jobs/{result['job_name']}")
    assert puts and all(p.get("fault") == "drop-after" for p in puts), "the second try must not PUT again"


# -------------------------------------------------------------- compute PUT
@pytest.mark.parametrize("fault", [{"kind": "drop"}, {"kind": "status", "status": 503}], ids=["dropped", "503"])
def test_compute_put_lost_after_commit(emulator: Emulator, run_dag, fault: dict[str, Any]) -> None:
    emulator.add_fault(**fault, when="after", route="compute_put")
    run, failures = run_dag("azureml_compute_cases", {"with_dedicated": False})
    assert str(run.state) == "success", (task_states(run), failures)
    summary = xcom_value(run, "create_from_yaml")
    assert summary["changed"] is True and summary["tier"] == "low_priority"
    assert emulator.call(lambda: sorted(emulator.workspace.computes)) == [CLUSTER]
    puts = requests_for(emulator, "PUT", f"/computes/{CLUSTER}")
    assert [p.get("fault") for p in puts] == [f"{fault['kind']}-after", None]
    # the lost write took effect with the wanted settings: the next run writes nothing
    run, failures = run_dag("azureml_compute_cases", {"with_dedicated": False})
    assert str(run.state) == "success", (task_states(run), failures)
    assert xcom_value(run, "create_from_yaml")["changed"] is False
    assert len(requests_for(emulator, "PUT", f"/computes/{CLUSTER}")) == 2


# ------------------------------------------------------------------- cancel
@pytest.mark.parametrize(
    "fault",
    [{"kind": "drop"}, {"kind": "status", "status": 500}, {"kind": "status", "status": 503}],
    ids=["dropped", "500", "503"],
)
def test_airflow_cancel_lost_after_commit(workspace: Emulator, run_dag, fault: dict[str, Any]) -> None:
    # The task times out; on_kill cancels its job, and the cancel's answer is lost after Azure took it.
    workspace.set_capacity(CLUSTER, 0)
    workspace.add_fault(**fault, when="after", route="cancel")
    # 5 s: the job is submitted well within it on a loaded machine (at 1 s a busy CI timed out before the
    # submit); at capacity 0 the job stays queued, so the longer timeout changes nothing else
    run, failures = run_dag("azureml_invoke_case", {"execution_timeout": 5})
    assert str(run.state) == "failed" and [f["type"] for f in failures] == ["AirflowTaskTimeout"]
    (job,) = workspace.jobs()
    assert job.status == "Canceled"
    cancels = requests_for(workspace, "POST", f"/jobs/{job.name}/cancel")
    assert [c.get("fault") for c in cancels] == [f"{fault['kind']}-after", None]
    assert 200 <= cancels[-1]["status"] < 300
    # the cancel was Airflow's, though its answer was lost: a clear runs the work again, once
    workspace.set_capacity(CLUSTER, None)
    run, failures = run_dag("azureml_invoke_case", {"execution_timeout": 120}, rerun=run)
    assert str(run.state) == "success", (task_states(run), failures)
    result = xcom_value(run, "invoke")
    assert result["job_names"] == [job.name, result["job_name"]]
    assert [j.status for j in workspace.jobs()] == ["Canceled", "Completed"]
    assert_scored_once(workspace, result["job_name"])


@pytest.mark.parametrize("fault", [{"kind": "drop"}, {"kind": "status", "status": 503}], ids=["dropped", "503"])
def test_hook_cancel_lost_after_commit(workspace: Emulator, fault: dict[str, Any]) -> None:
    from airflow_azureml.hooks import AzureMLHook
    from tests.integration.test_emulator_sdk import invoke, wait_status, wait_terminal

    hook = AzureMLHook()
    workspace.set_capacity(CLUSTER, 0)
    name = invoke(hook.get_conn(), INPUT, "job-cancel-lost")
    wait_status(workspace, name, "Queued")
    workspace.add_fault(**fault, when="after", route="cancel")
    hook.cancel_job(name)  # no error: the cancel happened, the retry is answered with the job
    assert wait_terminal(hook.get_conn(), name) == "Canceled"
    cancels = requests_for(workspace, "POST", f"/jobs/{name}/cancel")
    assert [c.get("fault") for c in cancels] == [f"{fault['kind']}-after", None]
    assert len(workspace.jobs()) == 1
