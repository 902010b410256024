"""Command jobs and batch deployments on Kubernetes compute with instance types (issue: instance types)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pendulum
import pytest

from airflow_azureml.emulator import Emulator
from airflow_azureml.hooks import AzureMLHook
from airflow_azureml.instance_types import load_instance_types
from tests.conftest import load_dag, task_states, xcom_value

REPO = Path(__file__).resolve().parents[2]
TYPES_YAML = REPO / "dags" / "azureml" / "instance-types.yml"
LOGICAL = pendulum.datetime(2026, 11, 2, tz="UTC")
# Under gpusmall's limits (4 cores, 16Gi, 1 GPU): strictly below for cpu and memory, all of its one GPU.
GPU_RESOURCES = {
    "requests": {"cpu": "2", "memory": "8Gi"},
    "limits": {"cpu": "3", "memory": "12Gi", "nvidia.com/gpu": 1},
}


@pytest.fixture
def k8s(emulator: Emulator, azureml_conn: dict[str, Any]) -> Emulator:
    """A Kubernetes compute attached to the workspace, with the example's instance types applied via kubectl's API."""
    from azure.ai.ml.entities import KubernetesCompute
    from kubernetes import client, config

    from airflow_azureml.instance_types import GROUP, PLURAL, VERSION

    api = client.CustomObjectsApi(config.new_client_from_config(config_file=str(emulator.kubeconfig("k8s-compute"))))
    for itype in load_instance_types(TYPES_YAML):
        api.create_cluster_custom_object(GROUP, VERSION, PLURAL, itype.to_custom_object())
    resource_id = (
        f"/subscriptions/{emulator.subscription_id}/resourceGroups/{emulator.resource_group}"
        "/providers/Microsoft.ContainerService/managedClusters/k8s-compute"
    )
    AzureMLHook().get_conn().compute.begin_create_or_update(
        KubernetesCompute(name="k8s-compute", resource_id=resource_id, namespace="azureml")
    ).result()
    return emulator


@pytest.fixture
def run_case(k8s: Emulator, airflow_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    failures = tmp_path / "failures.jsonl"
    monkeypatch.setenv("AZUREML_TEST_FAILURES", str(failures))

    def run(dag_id: str, case: dict[str, Any]) -> tuple[Any, list[dict[str, str]]]:
        monkeypatch.setenv("AZUREML_TEST_CASE", json.dumps(case))
        dag_run = load_dag("azureml_k8s_cases.py", dag_id).test(logical_date=LOGICAL)
        recorded = [json.loads(x) for x in failures.read_text().splitlines()] if failures.exists() else []
        return dag_run, recorded

    return run


def job_puts(emulator: Emulator) -> int:
    return sum(1 for r in emulator.requests() if r["method"] == "PUT" and "/jobs/" in r["path"])


def test_command_job_on_gpu_instance_type_completes(k8s: Emulator, run_case) -> None:
    run, failures = run_case("azureml_k8s_command_case", {"resources": GPU_RESOURCES})
    assert str(run.state) == "success", (task_states(run), failures)
    result = xcom_value(run, "command")
    job = k8s.job(result["job_name"])
    assert job is not None and job.status == "Completed" and job.compute == "k8s-compute"
    assert job.properties["resources"]["instanceType"] == "gpusmall"  # what the request body carried


@pytest.mark.parametrize(
    ("case", "message"),
    [
        ({"instance_type": "nosuchtype"}, "nosuchtype"),
        (
            {"resources": {**GPU_RESOURCES, "limits": {**GPU_RESOURCES["limits"], "nvidia.com/gpu": 4}}},
            "nvidia.com/gpu",
        ),
        ({"instance_type": "cpusmall", "resources": {"requests": {"cpu": "2", "memory": "1Gi"}}}, "cpu"),
    ],
)
def test_bad_instance_type_or_resources_fail_before_submission(
    k8s: Emulator, run_case, case: dict, message: str
) -> None:
    run, failures = run_case("azureml_k8s_command_case", case)
    assert str(run.state) == "failed"
    assert failures[0]["type"] == "AzureMLConfigError" and message in failures[0]["message"]
    assert job_puts(k8s) == 0, "nothing may be submitted"


@pytest.mark.parametrize("instance_types", [None, str(TYPES_YAML)], ids=["read-from-compute", "given-offline"])
def test_limits_equal_to_the_instance_type_are_warned_by_the_provider_and_refused_by_the_emulator(
    k8s: Emulator, run_case, caplog: pytest.LogCaptureFixture, instance_types: str | None
) -> None:
    """The gap of an ambiguous rule (docs/instance_types.md): limits "under" the instance type's.

    A cpu limit equal to gpusmall's is not above it (the lenient reading: the provider warns and submits)
    but not below it either (the strict reading: the emulator refuses the job).
    """
    equal = {**GPU_RESOURCES, "limits": {**GPU_RESOURCES["limits"], "cpu": "4"}}
    caplog.set_level(logging.WARNING, logger="airflow_azureml.instance_types")
    case: dict[str, Any] = {"resources": equal}
    if instance_types:
        case["instance_types"] = instance_types
    run, failures = run_case("azureml_k8s_command_case", case)
    assert str(run.state) == "failed"
    assert failures and failures[0]["type"] != "AzureMLConfigError", failures  # not refused by the provider
    assert "resources.limits.cpu" in failures[0]["message"], failures
    assert job_puts(k8s) >= 1, "the provider only warned: the job reached the emulator"
    assert not k8s.jobs(), "the emulator refused it"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("under-instance-type-limits" in w and "Azure ML may refuse" in w for w in warnings), warnings


def test_local_definitions_check_with_no_api_call(k8s: Emulator, run_case) -> None:
    before = len(k8s.requests())
    run, failures = run_case(
        "azureml_k8s_command_case", {"instance_type": "nosuchtype", "instance_types": str(TYPES_YAML)}
    )
    assert str(run.state) == "failed" and failures[0]["type"] == "AzureMLConfigError"
    assert len(k8s.requests()) == before, "validated against the given definitions: zero requests"


@pytest.mark.parametrize(
    ("instance_type", "outcome", "message"),
    [("cpularge", "success", None), ("nosuchtype", "failed", "nosuchtype"), ("cpusmall", "failed", "MLflow")],
)
def test_kubernetes_deployment_checks_instance_type(
    k8s: Emulator, run_case, instance_type: str, outcome: str, message: str | None
) -> None:
    run, failures = run_case("azureml_k8s_deployment_case", {"instance_type": instance_type})
    assert str(run.state) == outcome, failures
    puts = sum(1 for r in k8s.requests() if r["method"] == "PUT" and "/deployments/" in r["path"])
    if message:
        assert message in failures[0]["message"] and puts == 0
    else:
        dep = k8s.call(lambda: k8s.workspace.deployments[("heart-classifier-k8s", "classifier-k8s")].body)
        assert dep["properties"]["resources"]["instanceType"] == "cpularge" and puts == 1


@pytest.mark.parametrize("manual", [False, True], ids=["logical-date", "manual-no-logical-date"])
def test_kubernetes_example_dag(
    emulator: Emulator, azureml_conn: dict[str, Any], airflow_db: Path, monkeypatch: pytest.MonkeyPatch, manual: bool
) -> None:
    """With a logical date, and as a manual run without one (``airflow dags trigger``): no data interval, so
    the run works on the minute it was triggered in, its GPU job's identity included."""
    monkeypatch.setenv("AZUREML_DATASTORE_ROOT", f"file://{emulator.datastore_path('')}")
    monkeypatch.setenv("AZUREML_KUBECONFIG", str(emulator.kubeconfig("k8s-compute")))
    monkeypatch.setenv(
        "AZUREML_K8S_RESOURCE_ID",
        f"/subscriptions/{emulator.subscription_id}/resourceGroups/{emulator.resource_group}"
        "/providers/Microsoft.ContainerService/managedClusters/k8s-compute",
    )
    monkeypatch.setenv("AZUREML_POLL_SECONDS", "0.1")
    dag = load_dag("kubernetes_instance_type_scoring.py")
    run = dag.test(logical_date=None, run_after=LOGICAL.add(seconds=42)) if manual else dag.test(logical_date=LOGICAL)
    assert str(run.state) == "success", task_states(run)
    assert (run.data_interval_start is None) is manual
    assert set(emulator.instance_type_objects("k8s-compute")) >= {
        "cpusmall",
        "cpularge",
        "gpusmall",
        "defaultinstancetype",
    }
    jobs = emulator.jobs()
    gpu = [j for j in jobs if j.job_type == "Command"]
    assert len(gpu) == 1 and gpu[0].status == "Completed"
    assert gpu[0].properties["resources"]["instanceType"] == "gpusmall"
    batch = [j for j in jobs if j.job_type == "Pipeline"]
    assert len(batch) == 2 and all(j.status == "Completed" and j.compute == "k8s-compute" for j in batch)
    report = json.loads(emulator.datastore_path("k8s-scoring/reports/20261102T0000/report.json").read_text())
    assert report["rows_in"] == report["rows_scored"] == 2 * 4 * 25


def deployment_yaml(tmp_path: Path, resources: dict[str, Any]) -> str:
    """A deployment YAML (as the az ml CLI writes it) whose own resources are ``resources.properties.resources``."""
    import yaml

    path = tmp_path / "k8s-deployment.yml"
    path.write_text(
        yaml.safe_dump(
            {
                "$schema": "https://azuremlschemas.azureedge.net/latest/modelBatchDeployment.schema.json",
                "name": "classifier-k8s",
                "endpoint_name": "heart-classifier-k8s",
                "type": "model",
                "model": "azureml:heart-classifier@latest",
                "compute": "azureml:k8s-compute",
                "resources": {"instance_count": 1, "instance_type": "cpularge", "properties": {"resources": resources}},
                "settings": {"mini_batch_size": 2},
            }
        )
    )
    return str(path)


def deployment_puts(emulator: Emulator) -> int:
    return sum(1 for r in emulator.requests() if r["method"] == "PUT" and "/deployments/" in r["path"])


def test_kubernetes_deployment_own_resources_reach_the_service(k8s: Emulator, run_case, tmp_path: Path) -> None:
    """cpularge (limits 4, 8Gi): requests of 2 cores and 4Gi fit and meet the MLflow minimum."""
    wanted = {"requests": {"cpu": "2", "memory": "4Gi"}}
    run, failures = run_case("azureml_k8s_deployment_case", {"deployment": deployment_yaml(tmp_path, wanted)})
    assert str(run.state) == "success", failures
    dep = k8s.call(lambda: k8s.workspace.deployments[("heart-classifier-k8s", "classifier-k8s")].body)
    assert dep["properties"]["resources"]["properties"]["resources"] == wanted  # what the SDK sent


def test_kubernetes_deployment_own_requests_below_the_mlflow_minimum_fail_before_the_put(
    k8s: Emulator, run_case, tmp_path: Path
) -> None:
    """cpularge's own requests (2, 8Gi) meet the MLflow minimum, the deployment's own (1, 2Gi) do not."""
    small = {"requests": {"cpu": "1", "memory": "2Gi"}}
    run, failures = run_case("azureml_k8s_deployment_case", {"deployment": deployment_yaml(tmp_path, small)})
    assert str(run.state) == "failed"
    assert failures[0]["type"] == "AzureMLConfigError" and "MLflow" in failures[0]["message"], failures
    assert deployment_puts(k8s) == 0, "nothing may be sent"


def test_kubernetes_deployment_limit_equal_to_the_instance_type_is_warned_then_refused_by_the_emulator(
    k8s: Emulator, run_case, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The ``under-instance-type-limits`` gap for a deployment: memory equal to cpularge's 8Gi limit."""
    equal = {"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"cpu": "3", "memory": "8Gi"}}
    caplog.set_level(logging.WARNING, logger="airflow_azureml.instance_types")
    run, failures = run_case("azureml_k8s_deployment_case", {"deployment": deployment_yaml(tmp_path, equal)})
    assert str(run.state) == "failed"
    assert failures and failures[0]["type"] != "AzureMLConfigError", failures  # not refused by the provider
    assert "resources.limits.memory" in failures[0]["message"], failures
    assert deployment_puts(k8s) >= 1, "the provider only warned: the deployment reached the emulator"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("under-instance-type-limits" in w and "Azure ML may refuse" in w for w in warnings), warnings
