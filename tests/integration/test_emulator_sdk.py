"""The real azure-ai-ml MLClient and azure-identity credentials against the emulator over HTTPS."""

from __future__ import annotations

import asyncio
import csv
import socket
import time
from pathlib import Path
from typing import Any

import pytest
import requests

from airflow_azureml.emulator import Emulator
from airflow_azureml.emulator.scoring.data import write_heart_csvs
from airflow_azureml.hooks.azure_ml import AzureMLHook

REPO = Path(__file__).resolve().parents[2]
SEED_CLUSTER_YAML = REPO / "dags" / "azureml" / "low-pri-cluster.yml"
SEED_DEPLOYMENT_YAML = REPO / "dags" / "azureml" / "deployment.yml"
ENDPOINT = "heart-classifier-batch"
DEPLOYMENT = "classifier-mlflow"


def setup_workspace(hook: AzureMLHook) -> Any:
    """Create the source documents' cluster, endpoint and deployment with the real SDK, from their YAML."""
    from azure.ai.ml import load_compute
    from azure.ai.ml.entities import BatchEndpoint
    from azure.ai.ml.entities._load_functions import load_model_batch_deployment

    ml = hook.get_conn()
    ml.compute.begin_create_or_update(load_compute(source=str(SEED_CLUSTER_YAML))).result()
    ml.batch_endpoints.begin_create_or_update(BatchEndpoint(name=ENDPOINT)).result()
    ml.batch_deployments.begin_create_or_update(load_model_batch_deployment(source=str(SEED_DEPLOYMENT_YAML))).result()
    return ml


def invoke(ml: Any, input_path: str, job_name: str) -> str:
    from azure.ai.ml import Input

    job = ml.batch_endpoints.invoke(
        endpoint_name=ENDPOINT,
        deployment_name=DEPLOYMENT,
        inputs={
            "heart_dataset": Input(
                type="uri_folder", path=f"azureml://datastores/workspaceblobstore/paths/{input_path}/"
            )
        },
        job_name=job_name,
    )
    return str(job.name)


def wait_terminal(ml: Any, name: str, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = ml.jobs.get(name).status
        status = str(getattr(status, "value", status))
        if status in ("Completed", "Failed", "Canceled"):
            return status
        time.sleep(0.05)
    raise AssertionError(f"job {name} did not finish")


def wait_status(emulator: Emulator, name: str, status: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = emulator.job(name)
        if job is not None and job.status == status:
            return
        time.sleep(0.01)
    raise AssertionError(f"job {name} never reached {status}")


def prediction_ids(emulator: Emulator, job_name: str) -> list[str]:
    """The row ids of the job's output lines: an MLflow deployment's ``['<file>', <prediction>]`` lines are
    matched to the job's input rows by position (``scored_row_ids``), a script's carry the id."""
    from airflow_azureml.example_data import input_row_ids, scored_row_ids

    path = emulator.datastore_path(f"azureml/{job_name}/score/predictions.csv")
    job = emulator.job(job_name)
    inputs = input_row_ids(emulator.datastore_path(job.input_uri)) if job is not None and job.input_uri else {}
    return scored_row_ids(path.read_text(), inputs)


def input_ids(folder: Path) -> list[str]:
    ids: list[str] = []
    for path in sorted(folder.glob("*.csv")):
        with open(path, newline="") as handle:
            ids.extend(row["row_id"] for row in csv.DictReader(handle))
    return ids


def test_seed_yaml_cluster_reads_back_low_priority(emulator: Emulator, azureml_conn: dict[str, Any]) -> None:
    ml = setup_workspace(AzureMLHook())
    cluster = ml.compute.get("low-pri-cluster")
    assert cluster.tier == "low_priority"
    assert (cluster.min_instances, cluster.max_instances, cluster.idle_time_before_scale_down) == (0, 2, 120)
    puts = [r for r in emulator.requests() if r["method"] == "PUT" and r["path"].endswith("/computes/low-pri-cluster")]
    assert len(puts) == 1 and puts[0]["status"] == 201  # ARM LRO: 201 + Azure-AsyncOperation
    deployment = ml.batch_deployments.get(name=DEPLOYMENT, endpoint_name=ENDPOINT)
    assert deployment.mini_batch_size == 2 and deployment.max_concurrency_per_instance == 2
    assert deployment.output_file_name == "predictions.csv"


def test_invoke_scores_every_row_exactly_once(emulator: Emulator, azureml_conn: dict[str, Any]) -> None:
    ml = setup_workspace(AzureMLHook())
    rows = write_heart_csvs(emulator.datastore_path("inputs/day1"), files=7, rows_per_file=13)
    name = invoke(ml, "inputs/day1", "job-day1")
    assert wait_terminal(ml, name) == "Completed"
    scored = prediction_ids(emulator, name)
    assert len(scored) == rows == 91
    assert sorted(scored) == sorted(input_ids(emulator.datastore_path("inputs/day1")))
    # the run-history data plane is where the SDK reads details; a completed job has no error
    assert ml.jobs._runs_operations.get_run_details(name).error is None


def test_node_evictions_keep_every_row_exactly_once(emulator: Emulator, azureml_conn: dict[str, Any]) -> None:
    ml = setup_workspace(AzureMLHook())
    write_heart_csvs(emulator.datastore_path("inputs/evict"), files=24, rows_per_file=5, seed=3)
    # mini-batches long enough to be caught in flight, and each eviction waits for a node running one (not a
    # fixed sleep: on a busy machine the job could be between mini-batches, or over, when a sleep ends)
    emulator.call(lambda: setattr(emulator.workspace.timing, "mini_batch", 0.3))
    name = invoke(ml, "inputs/evict", "job-evict")
    wait_status(emulator, name, "Running")

    def busy() -> bool:
        nodes = emulator.workspace.computes["low-pri-cluster"].nodes
        return emulator.call(lambda: any(n.state == "running" and n.job_name == name for n in nodes))

    evicted = 0
    for _ in range(2):
        deadline = time.monotonic() + 60
        while not busy():
            assert time.monotonic() < deadline, "no node of the job ever ran a mini-batch"
            time.sleep(0.01)
        evicted += emulator.evict_nodes("low-pri-cluster", 1)
    assert evicted == 2
    assert wait_terminal(ml, name) == "Completed"
    scored = prediction_ids(emulator, name)
    assert len(scored) == len(set(scored)) == 120
    assert sorted(scored) == sorted(input_ids(emulator.datastore_path("inputs/evict")))
    job = emulator.job(name)
    assert job is not None and job.mini_batch_attempts > job.mini_batches_total  # evicted mini-batches were redone
    compute = ml.compute._operation.get(
        resource_group_name=emulator.resource_group,
        workspace_name=emulator.workspace_name,
        compute_name="low-pri-cluster",
    )
    # preemptedNodeCount is a gauge: the evicted nodes were deallocated or replaced by now (docs/emulator.md)
    assert compute.properties.properties.node_state_counts.preempted_node_count <= evicted


@pytest.mark.parametrize("form", ["canceled", "failed"])
def test_whole_cluster_preemption(emulator: Emulator, azureml_conn: dict[str, Any], form: str) -> None:
    ml = setup_workspace(AzureMLHook())
    write_heart_csvs(emulator.datastore_path("inputs/pre"), files=40, rows_per_file=5)
    name = invoke(ml, "inputs/pre", f"job-pre-{form}")
    wait_status(emulator, name, "Running")
    emulator.set_behaviour(preempted_node_release_seconds=30)  # keep the gauge up while this test reads it
    assert emulator.preempt_cluster("low-pri-cluster", form=form) == [name]
    status = wait_terminal(ml, name)
    details = ml.jobs._runs_operations.get_run_details(name)
    compute = ml.compute._operation.get(
        resource_group_name=emulator.resource_group,
        workspace_name=emulator.workspace_name,
        compute_name="low-pri-cluster",
    )
    assert compute.properties.properties.node_state_counts.preempted_node_count > 0
    if form == "canceled":
        assert status == "Canceled"
        assert details.error is None and not details.warnings  # Azure documents no message for this cancel
    else:
        assert status == "Failed"
        assert "PreemptionError: Nodes of this job got pre-empted" in details.error.error.message
    assert not emulator.datastore_path(f"azureml/{name}/score/predictions.csv").exists()


def test_invoke_with_existing_name_is_rejected_not_duplicated(emulator: Emulator, azureml_conn: dict[str, Any]) -> None:
    from azure.core.exceptions import HttpResponseError

    ml = setup_workspace(AzureMLHook())
    write_heart_csvs(emulator.datastore_path("inputs/dup"), files=1, rows_per_file=3)
    invoke(ml, "inputs/dup", "job-dup")
    with pytest.raises(HttpResponseError) as excinfo:
        invoke(ml, "inputs/dup", "job-dup")
    assert excinfo.value.status_code == 409
    assert len([j for j in emulator.jobs() if j.name == "job-dup"]) == 1


def test_sdk_honours_429_retry_after(emulator: Emulator, azureml_conn: dict[str, Any]) -> None:
    ml = setup_workspace(AzureMLHook())
    emulator.add_fault(kind="status", status=429, retry_after=1, path="/computes/low-pri-cluster$", methods=["GET"])
    assert ml.compute.get("low-pri-cluster").tier == "low_priority"
    hits = [r for r in emulator.requests() if r["path"].endswith("/computes/low-pri-cluster") and r["method"] == "GET"]
    assert [r["status"] for r in hits[-2:]] == [429, 200]
    assert hits[-1]["t"] - hits[-2]["t"] >= 0.9  # waited for Retry-After


def test_wrong_secret_is_a_clear_auth_error(emulator: Emulator) -> None:
    from azure.core.exceptions import ClientAuthenticationError
    from azure.identity import ClientSecretCredential

    credential = ClientSecretCredential(
        emulator.tenant_id,
        emulator.client_id,
        "not-the-secret",
        authority=emulator.base_url,
        connection_verify=emulator.ca_cert,
        disable_instance_discovery=True,
    )
    with pytest.raises(ClientAuthenticationError, match="AADSTS7000215: Invalid client secret"):
        credential.get_token(f"{emulator.base_url}/.default")


def test_async_credential_signs_in(emulator: Emulator) -> None:
    from azure.identity.aio import ClientSecretCredential

    async def token() -> str:
        async with ClientSecretCredential(
            emulator.tenant_id,
            emulator.client_id,
            emulator.client_secret,
            authority=emulator.base_url,
            connection_verify=emulator.ca_cert,
            disable_instance_discovery=True,
        ) as credential:
            return (await credential.get_token(f"{emulator.base_url}/.default")).token

    assert asyncio.run(token()).count(".") == 2


@pytest.mark.parametrize("header", [None, "Bearer not-a-token"])
def test_routes_reject_missing_or_unknown_token(emulator: Emulator, header: str | None) -> None:
    url = (
        f"{emulator.base_url}/subscriptions/{emulator.subscription_id}/resourceGroups/{emulator.resource_group}"
        f"/providers/Microsoft.MachineLearningServices/workspaces/{emulator.workspace_name}/jobs"
    )
    headers = {"Authorization": header} if header else {}
    response = requests.get(url, headers=headers, verify=emulator.ca_cert, timeout=10)
    assert response.status_code == 401
    assert response.json()["error"]["code"] == "AuthenticationFailed"


@pytest.mark.parametrize(
    "path",
    [
        # an experiment named "oauth2": the run history route, once readable with no token
        "/history/v1.0{ws}/experiments/oauth2/runs/some-run/details",
        # a cluster named ".well-known": a control action, once open to anyone
        "/_emulator/clusters/.well-known/preempt",
        "/_emulator/behaviour",
        "/_emulator/requests",
        "/_emulator/jobs/some-job",  # the control API's job record: only the Studio page is open
        "/_emulator/studio/jobs/some-job/extra",
    ],
)
def test_only_the_identity_discovery_and_prices_routes_are_open(emulator: Emulator, path: str) -> None:
    ws = (
        f"/subscriptions/{emulator.subscription_id}/resourceGroups/{emulator.resource_group}"
        f"/providers/Microsoft.MachineLearningServices/workspaces/{emulator.workspace_name}"
    )
    url = emulator.base_url + path.format(ws=ws)
    method = "POST" if "/clusters/" in path else "GET"
    response = requests.request(method, url, verify=emulator.ca_cert, timeout=10, json={} if method == "POST" else None)
    assert response.status_code == 401, (path, response.status_code, response.text[:200])
    open_paths = [
        f"/{emulator.tenant_id}/v2.0/.well-known/openid-configuration",
        "/common/discovery/instance?api-version=1.1&authorization_endpoint=x",
        "/discovery",
    ]
    for open_path in open_paths:
        assert requests.get(emulator.base_url + open_path, verify=emulator.ca_cert, timeout=10).status_code != 401


def test_the_studio_link_opens_in_a_browser_without_a_token(emulator: Emulator) -> None:
    """The task's Studio link, as a person opens it: a page of the job's state, escaped; no token needed."""
    (name,) = emulator.call(lambda: emulator.workspace.create_synthetic_jobs("studio<b>", [0.01]))
    url = f"{emulator.base_url}/_emulator/studio/jobs/{name}"
    response = requests.get(url, verify=emulator.ca_cert, timeout=10)
    assert response.status_code == 200 and response.headers["Content-Type"].startswith("text/html")
    assert "studio&lt;b&gt;" in response.text and "<b>" not in response.text
    assert "<th>Status</th>" in response.text
    missing = f"{emulator.base_url}/_emulator/studio/jobs/no-such-job"
    answer = requests.get(missing, verify=emulator.ca_cert, timeout=10)
    assert answer.status_code == 404 and answer.json()["error"]["code"] == "NotFound"


def test_listens_on_loopback_only(emulator: Emulator) -> None:
    assert emulator.base_url.startswith("https://127.0.0.1:")
    addresses = {info[4][0] for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)}
    addresses.discard("127.0.0.1")
    addresses = {a for a in addresses if not a.startswith("127.")}
    for address in addresses:
        with socket.socket() as probe:
            probe.settimeout(1)
            assert probe.connect_ex((address, emulator.port)) != 0, f"emulator reachable on {address}"
    with socket.create_connection(("127.0.0.1", emulator.port), timeout=2):
        pass


def test_startup_writes_connection_file(tmp_path: Path) -> None:
    with Emulator(tmp_path / "emu") as emu:
        info = (tmp_path / "emu" / "emulator.json").read_text()
        for key in (
            "base_url",
            "ca_cert",
            "subscription_id",
            "resource_group",
            "workspace",
            "tenant_id",
            "client_id",
            "client_secret",
            "airflow_conn_uri",
        ):
            assert key in info
        assert emu.base_url in info


def test_hook_test_connection(emulator: Emulator, azureml_conn: dict[str, Any]) -> None:
    ok, message = AzureMLHook().test_connection()
    assert ok, message
    assert emulator.workspace_name in message


def test_tls_verification_stays_on(emulator: Emulator, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without the CA bundle the self-signed emulator is refused; with it given explicitly, it is trusted."""
    import json

    info = json.loads(emulator.connection_info()["airflow_conn_json"])
    del info["extra"]["ca_bundle"]
    monkeypatch.setenv("AIRFLOW_CONN_AZURE_ML_DEFAULT", json.dumps(info))
    monkeypatch.delenv("REQUESTS_CA_BUNDLE", raising=False)
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    ok, message = AzureMLHook().test_connection()
    assert not ok and "CERTIFICATE_VERIFY_FAILED" in message
    assert emulator.client_secret not in message
    assert AzureMLHook(azure_ml_conn_id="azure_ml_default").settings.connection_verify is True
