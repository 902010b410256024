"""Each operator through real Airflow (``dag.test()``) and the real SDK against the emulator."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pendulum
import pytest

from airflow_azureml.emulator import Emulator
from airflow_azureml.emulator.scoring.data import write_heart_csvs
from tests.conftest import load_dag, task_states, xcom_value
from tests.helpers import preempt, when_running
from tests.integration.test_emulator_sdk import prediction_ids, setup_workspace
from tests.integration.test_exactly_once import when_sampled

LOGICAL = pendulum.datetime(2026, 11, 1, tz="UTC")
INPUT = "in/20261101"


@pytest.fixture
def run_case(
    emulator: Emulator, azureml_conn: dict[str, Any], airflow_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    failures = tmp_path / "failures.jsonl"
    monkeypatch.setenv("AZUREML_TEST_FAILURES", str(failures))

    def run(dag_id: str, case: dict[str, Any] | None = None) -> tuple[Any, list[dict[str, str]]]:
        monkeypatch.setenv("AZUREML_TEST_CASE", json.dumps(case or {}))
        failures.unlink(missing_ok=True)
        dag_run = load_dag("azureml_operator_cases.py", dag_id).test(logical_date=LOGICAL)
        recorded = [json.loads(line) for line in failures.read_text().splitlines()] if failures.exists() else []
        return dag_run, recorded

    return run


@pytest.fixture
def workspace(emulator: Emulator, azureml_conn: dict[str, Any]) -> Emulator:
    from airflow_azureml.hooks import AzureMLHook
    from airflow_azureml.specs import ClusterSpec

    ml = setup_workspace(AzureMLHook())
    ml.compute.begin_create_or_update(
        ClusterSpec(name="dedicated-pool", tier="dedicated", max_instances=2).to_entity()
    ).result()
    write_heart_csvs(emulator.datastore_path(INPUT), files=20, rows_per_file=5)
    return emulator


def puts(emulator: Emulator, contains: str) -> int:
    return sum(1 for r in emulator.requests() if r["method"] in ("PUT", "PATCH") and contains in r["path"])


def test_compute_operators_are_idempotent(emulator: Emulator, run_case) -> None:
    run, failures = run_case("azureml_compute_cases")
    assert str(run.state) == "success", (task_states(run), failures)
    assert puts(emulator, "/computes/") == 2
    assert xcom_value(run, "create_from_yaml")["tier"] == "low_priority"

    run, _ = run_case("azureml_compute_cases")
    assert str(run.state) == "success"
    assert puts(emulator, "/computes/") == 2, "an unchanged cluster must not be written again"
    assert xcom_value(run, "create_from_yaml")["changed"] is False

    run, _ = run_case("azureml_compute_cases", {"create_overrides": {"max_instances": 4}})
    assert str(run.state) == "success"
    assert puts(emulator, "/computes/low-pri-cluster") == 2  # exactly one update
    assert xcom_value(run, "create_from_yaml")["max_instances"] == 4

    run, failures = run_case("azureml_compute_cases", {"create_overrides": {"tier": "dedicated"}})
    assert str(run.state) == "failed"
    assert failures == [{"task": "create_from_yaml", "type": "AzureMLConfigError", "message": failures[0]["message"]}]
    assert "cannot change in place" in failures[0]["message"]

    run, _ = run_case("azureml_compute_cases", {"delete": "dedicated-pool"})
    assert str(run.state) == "success" and xcom_value(run, "delete") is True
    assert emulator.call(lambda: "dedicated-pool" not in emulator.workspace.computes)
    # teardown-safe: an absent cluster counts as deleted
    run, _ = run_case("azureml_compute_cases", {"delete": "never-existed"})
    assert str(run.state) == "success" and xcom_value(run, "delete") is False


def test_deployment_operator_is_idempotent(emulator: Emulator, run_case) -> None:
    run, failures = run_case("azureml_compute_cases")
    assert str(run.state) == "success", failures
    run, failures = run_case("azureml_deployment_case")
    assert str(run.state) == "success", (task_states(run), failures)
    assert xcom_value(run, "create_deployment")["changed"] is True
    writes = puts(emulator, "/batchEndpoints/")
    assert writes >= 2  # endpoint, deployment (and the default-deployment update)

    run, _ = run_case("azureml_deployment_case")
    assert str(run.state) == "success"
    assert puts(emulator, "/batchEndpoints/") == writes, "an unchanged deployment must not be written again"

    run, _ = run_case("azureml_deployment_case", {"deployment_overrides": {"mini_batch_size": 5}})
    assert str(run.state) == "success"
    assert puts(emulator, "/deployments/classifier-mlflow") == 2
    assert (
        emulator.call(
            lambda: emulator.workspace.deployments[("heart-classifier-batch", "classifier-mlflow")].body["properties"][
                "miniBatchSize"
            ]
        )
        == 5
    )


@pytest.mark.parametrize(
    ("dag_id", "case", "message"),
    [
        (
            "azureml_compute_cases",
            {"create_overrides": {"min_instances": 5, "max_instances": 2}, "with_dedicated": False},
            "min_instances",
        ),
        ("azureml_compute_cases", {"create_overrides": {"tier": "spot"}, "with_dedicated": False}, "Unknown tier"),
        (
            "azureml_compute_cases",
            {"create_overrides": {"name": "bad_name!"}, "with_dedicated": False},
            "Invalid compute name",
        ),
        ("azureml_deployment_case", {"deployment_overrides": {"mini_batch_size": 0}}, "mini_batch_size"),
        ("azureml_invoke_case", {"endpoint_name": "x"}, "Invalid batch endpoint name"),
        ("azureml_invoke_case", {"inputs": {"d": "/local/folder"}}, "is not a data URI"),
        ("azureml_invoke_case", {"inputs": {}}, "non-empty mapping"),
        ("azureml_invoke_case", {"fallback_compute": "dedicated-pool"}, "Give fallback_deployment"),
        ("azureml_invoke_case", {"fallback_after": 1}, "fallback_after needs a fallback: fallback_deployment"),
        ("azureml_invoke_case", {"fallback_deployment": "classifier-mlflow"}, "must differ from deployment_name"),
        ("azureml_invoke_case", {"fallback_deployment": "x", "fallback_after": 0}, "fallback_after must be >= 1"),
        ("azureml_invoke_case", {"inputs": {"d": "input/{{ ds_nodash }}/"}}, "'input/20261101/' is not a data URI"),
        (
            "azureml_compute_cases",
            {"compute_yaml": "/nonexistent/cluster.yml", "with_dedicated": False},
            "does not exist",
        ),
        ("azureml_compute_cases", {"compute_yaml": "MALFORMED", "with_dedicated": False}, "is not valid YAML"),
        ("azureml_invoke_case", {"_connection": "missing_workspace"}, "missing required field"),
        ("azureml_invoke_case", {"endpoint_name": ""}, "Invalid batch endpoint name"),
        ("azureml_invoke_case", {"resubmit_backoff": float("nan")}, "resubmit_backoff must be a finite number"),
        ("azureml_invoke_case", {"resubmit_backoff": float("inf")}, "resubmit_backoff must be a finite number"),
        ("azureml_invoke_case", {"loop_after": 1.5}, "loop_after must be a whole number"),
        ("azureml_invoke_case", {"max_resubmits": 2.5}, "max_resubmits must be a whole number"),
        ("azureml_invoke_case", {"max_resubmits": True}, "max_resubmits must be a whole number"),
        ("azureml_invoke_case", {"max_resubmits": -1}, "max_resubmits must be >= 0"),
    ],
)
def test_bad_input_fails_before_any_api_call(
    emulator: Emulator,
    run_case,
    dag_id: str,
    case: dict,
    message: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if case.get("compute_yaml") == "MALFORMED":
        bad = tmp_path / "cluster.yml"
        bad.write_text("name: low-pri-cluster\ntier: [low_priority\n")
        case = {**case, "compute_yaml": str(bad)}
    if case.pop("_connection", None):
        info = json.loads(emulator.connection_info()["airflow_conn_json"])
        del info["extra"]["workspace_name"]
        monkeypatch.setenv("AIRFLOW_CONN_AZURE_ML_DEFAULT", json.dumps(info))
    run, failures = run_case(dag_id, case)
    assert str(run.state) == "failed"
    assert failures[0]["type"] == "AzureMLConfigError" and message in failures[0]["message"]
    assert emulator.requests() == [], "validation must come before any request"


def test_empty_input_folder_is_a_clear_error_and_no_job(workspace: Emulator, run_case) -> None:
    workspace.datastore_path("in/empty").mkdir(parents=True)
    run, failures = run_case(
        "azureml_invoke_case", {"inputs": {"d": "azureml://datastores/workspaceblobstore/paths/in/empty/"}}
    )
    assert str(run.state) == "failed"
    assert "No input files found" in failures[0]["message"]
    assert workspace.jobs() == []


def test_invoke_happy_path(workspace: Emulator, run_case) -> None:
    run, failures = run_case("azureml_invoke_case")
    assert str(run.state) == "success", (task_states(run), failures)
    result = xcom_value(run, "invoke")
    assert result["status"] == "Completed" and result["resubmits"] == 0 and result["preemptions"] == 0
    assert result["output_uri"].startswith("azureml://datastores/workspaceblobstore/paths/")
    assert len(prediction_ids(workspace, result["job_name"])) == 100
    url = xcom_value(run, "invoke", key="azureml_studio_job_url")
    assert url.endswith(f"/_emulator/studio/jobs/{result['job_name']}")
    assert xcom_value(run, "invoke", key="azureml_studio_job_urls") == [url]
    assert len(workspace.jobs()) == 1


def test_submitted_job_is_persisted_in_task_state_store(
    workspace: Emulator, run_case, caplog: pytest.LogCaptureFixture
) -> None:
    from airflow_azureml import compat

    compat._warned.discard("task_state_store")  # the loss is logged once per process: this test's run is the first
    with (
        caplog.at_level(logging.WARNING, logger="airflow_azureml.compat"),
        when_sampled(workspace, preempt("canceled")),
    ):
        run, failures = run_case("azureml_invoke_case")
    assert str(run.state) == "success", failures
    result = xcom_value(run, "invoke")
    losses = [r for r in caplog.records if r.name == "airflow_azureml.compat" and "no task_state_store" in r.message]
    if compat.has_task_state_store():
        from airflow.models.task_state_store import TaskStateStoreModel
        from airflow.utils.session import create_session

        with create_session() as session:
            row = session.query(TaskStateStoreModel).filter_by(run_id=run.run_id, task_id="invoke", key="azureml_job")
            stored = json.loads(row.one().value)
        assert losses == []
    else:
        # Airflow < 3.3 (docs/airflow_versions.md): the loss is logged once at first use; the state lives for this
        # try only, in an XCom (cleared by Airflow when the next try starts); the chain still has one job per name
        assert len(losses) == 1 and "a crash between submit and persist can no longer be told" in losses[0].message
        stored = xcom_value(run, "invoke", key=compat.TRY_STATE_XCOM_PREFIX + "azureml_job")
        assert sorted(j.name for j in workspace.jobs()) == sorted(result["job_names"]) and len(result["job_names"]) == 2
    assert stored["job"] == result["job_name"] and stored["job"].endswith("-r1")
    assert stored["preemptions"] == 1 and stored["jobs"] == result["job_names"] and stored["key"]


def test_invoke_overrides_reach_the_job(workspace: Emulator, run_case) -> None:
    out = "azureml://datastores/workspaceblobstore/paths/out/{{ ds_nodash }}/"
    run, failures = run_case(
        "azureml_invoke_case", {"outputs": {"score": out}, "output_file_name": "scores.csv", "mini_batch_size": 7}
    )
    assert str(run.state) == "success", failures
    assert len(workspace.datastore_path("out/20261101/scores.csv").read_text().splitlines()) == 100
    job = workspace.jobs()[0]
    assert job.mini_batches_total == 3  # 20 files / 7 per mini-batch


def test_whole_cluster_preemption_resubmits_once(workspace: Emulator, run_case) -> None:
    with when_sampled(workspace, preempt("canceled")) as preempted:
        run, failures = run_case("azureml_invoke_case")
    assert str(run.state) == "success", (task_states(run), failures)
    result = xcom_value(run, "invoke")
    assert len(preempted) == 1
    assert result["resubmits"] == 1 and result["preemptions"] == 1
    jobs = {j.name: j for j in workspace.jobs()}
    assert len(jobs) == 2 and set(result["job_names"]) == set(jobs)
    assert [jobs[n].status for n in result["job_names"]] == ["Canceled", "Completed"]
    assert len(prediction_ids(workspace, result["job_name"])) == 100
    # a link for each job of the chain: the current one, and the preempted one before it
    chain = xcom_value(run, "invoke", key="azureml_studio_job_urls")
    assert [url.rsplit("/", 1)[-1] for url in chain] == result["job_names"]
    assert xcom_value(run, "invoke", key="azureml_studio_job_url") == chain[-1]


def test_preemption_error_form_is_resubmitted_too(workspace: Emulator, run_case) -> None:
    with when_running(workspace, preempt("failed")):
        run, failures = run_case("azureml_invoke_case")
    assert str(run.state) == "success", failures
    assert xcom_value(run, "invoke")["preemptions"] == 1
    assert [j.status for j in workspace.jobs()] == ["Failed", "Completed"]


def test_user_cancel_is_never_resubmitted(workspace: Emulator, run_case) -> None:
    with when_running(workspace, lambda emu, job: emu.call(lambda: emu.workspace.cancel_job(job))):
        run, failures = run_case("azureml_invoke_case")
    assert str(run.state) == "failed"
    assert failures[0]["type"] == "AzureMLJobCanceledError"
    assert len(workspace.jobs()) == 1


def test_preemptions_beyond_budget_raise_preempted_error(workspace: Emulator, run_case) -> None:
    with when_sampled(workspace, preempt("canceled"), times=2) as preempted:
        run, failures = run_case(
            "azureml_invoke_case", {"max_resubmits": 1, "mini_batch_size": 1, "polling": {"max_interval": 0.05}}
        )
    assert str(run.state) == "failed"
    assert len(preempted) == 2
    assert failures[0]["type"] == "AzureMLJobPreemptedError"
    assert "max_resubmits=1" in failures[0]["message"]
    assert len(workspace.jobs()) == 2
    # the chain that ran out of preemptions is billed too (the bill of a run or a backfill reads this XCom)
    report = xcom_value(run, "invoke", key="azureml_cost")
    assert report["job_names"] == [j.name for j in workspace.jobs()] and report["preemptions"] == 2
    assert sum(report["node_hours"].values()) > 0 and report["lost_node_hours"] > 0


def test_failed_job_raises_with_service_message(workspace: Emulator, run_case) -> None:
    from airflow_azureml.hooks import AzureMLHook

    ml = AzureMLHook().get_conn()  # error_threshold 0: one failed file fails the job (-1, the default, ignores it)
    deployment = ml.batch_deployments.get(name="classifier-mlflow", endpoint_name="heart-classifier-batch")
    (deployment.settings if hasattr(deployment, "settings") else deployment).error_threshold = 0
    ml.batch_deployments.begin_create_or_update(deployment).result()
    bad = workspace.datastore_path(INPUT) / "zz-broken.csv"
    bad.write_text("row_id,age\nx,not-a-number\n")
    run, failures = run_case("azureml_invoke_case")
    assert str(run.state) == "failed"
    assert failures[0]["type"] == "AzureMLJobFailedError"
    message = failures[0]["message"]
    # the MLflow model's own error, as Azure reports it: the signature's column type cannot read the value
    assert "mini-batch" in message and "Error processing input file" in message and "not-a-number" in message
    assert len(workspace.jobs()) == 1
    report = xcom_value(run, "invoke", key="azureml_cost")  # a failed job's nodes are billed: so is its task
    assert report["job_names"] == [workspace.jobs()[0].name] and sum(report["node_hours"].values()) > 0


def stored_state(run: Any, task_id: str) -> dict[str, Any]:
    """What a retry's context holds of the run's ``task_state_store`` (Airflow 3.3): the rows the first try
    wrote, read from the metadata DB, behind the store's get/set. Empty before 3.3 (no store)."""
    try:
        from airflow.models.task_state_store import TaskStateStoreModel as Row
    except ImportError:
        return {}
    from airflow.utils.session import create_session

    with create_session() as session:
        rows = session.query(Row).filter_by(dag_id=run.dag_id, run_id=run.run_id, task_id=task_id).all()
        values = {row.key: json.loads(row.value) if isinstance(row.value, str) else row.value for row in rows}

    class Store:
        @staticmethod
        def get(key: str) -> Any:
            return values.get(key)

        @staticmethod
        def set(key: str, value: Any) -> None:
            values[key] = value

    return {"task_state_store": Store()}


@pytest.mark.parametrize("model_updated", [False, True], ids=["same-model", "model-updated"])
def test_retry_reattaches_instead_of_resubmitting(workspace: Emulator, run_case, model_updated: bool) -> None:
    """(model-updated, seen failing first: the retry took its own completed job as superseded and paid for
    a second one; a model update scores again only in another DAG run or after a clear.)"""
    from airflow_azureml.hooks import AzureMLHook

    run, _ = run_case("azureml_invoke_case")
    assert str(run.state) == "success"
    first = xcom_value(run, "invoke")
    # A second try of the same unit of work has the same run id: it must find the completed job.
    # (Real retries after crashes run on a real scheduler in the e2e suite.)
    from airflow.sdk import DAG

    from airflow_azureml.operators import AzureMLInvokeBatchEndpointOperator

    with DAG("azureml_invoke_case", schedule=None, start_date=LOGICAL):
        op = AzureMLInvokeBatchEndpointOperator(
            task_id="invoke",
            endpoint_name="heart-classifier-batch",
            deployment_name="classifier-mlflow",
            inputs={"heart_dataset": f"azureml://datastores/workspaceblobstore/paths/{INPUT}/"},
            polling={"interval": 0.05},
        )
    pushed: dict[str, Any] = {}

    class RetryTaskInstance:  # only what execute() touches of the runtime task instance
        map_index = -1

        @staticmethod
        def xcom_push(key: str, value: Any) -> None:
            pushed[key] = value

    if model_updated:  # a retry reuses its run's job even when the deployment's model changed meanwhile
        workspace.register_model("heart-classifier", "2", scoring_module="airflow_azureml.emulator.scoring.heart")
        ml = AzureMLHook().get_conn()
        deployment = ml.batch_deployments.get("classifier-mlflow", endpoint_name="heart-classifier-batch")
        deployment.model = "azureml:heart-classifier:2"
        ml.batch_deployments.begin_create_or_update(deployment).result()
    again = op.execute({"ti": RetryTaskInstance(), "run_id": run.run_id, **stored_state(run, "invoke")})
    assert again["job_name"] == first["job_name"] and again["job_names"] == first["job_names"]
    assert len(workspace.jobs()) == 1
    assert pushed["azureml_studio_job_url"].endswith(first["job_name"])
