"""Contract test: the emulator's ARM JSON against Microsoft's REST examples (api-version 2024-10-01).

One emulator is started for the module. Over real HTTPS (TLS verified against the emulator's
certificate) and with a real bearer token from its identity endpoint, the test creates a
low-priority AmlCompute cluster, an attached Kubernetes compute, a batch endpoint, a batch
deployment and a batch job, then GETs each one (and each list) and checks it against the
``responses -> 200 -> body`` of Microsoft's example for the same resource:

* every key of the example must be in the emulator's response, with a compatible JSON type,
  recursively (extra keys in the emulator's response are fine);
* an example value of ``null`` matches any type;
* maps keyed by user-chosen names (``MAPS``) are checked entry by entry against the shape of
  the example's entries, and only when both sides have entries: placeholder keys such as
  ``"string"`` are never required;
* the few differences that are expected are listed in ``MAY_BE_ABSENT`` / ``MAY_BE_NULL``,
  each with its reason.

The examples live outside the repository (``/work/shared/azureml-rest-spec``, see its README);
set ``AZUREML_REST_SPEC`` to point elsewhere.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
from azure.identity import ClientSecretCredential

from airflow_azureml.emulator import Emulator, Timing
from airflow_azureml.emulator.scoring.data import write_heart_csvs

SPEC = Path(os.environ.get("AZUREML_REST_SPEC", Path(__file__).resolve().parents[3] / "shared" / "azureml-rest-spec"))
STABLE = SPEC / "stable" / "2024-10-01"
API = {"api-version": "2024-10-01"}
TIMING = Timing(provisioning=0.02, node_startup=0.05, mini_batch=0.02, command_job=0.2, tick=0.01)

# Dotted paths; "*" stands for any key of a map or any item of a list.
# Maps keyed by user-chosen names (``additionalProperties`` in the swagger), per resource kind.
MAPS: dict[str, set[str]] = {
    "compute": {
        "tags",
        "properties.properties.instanceTypes",
        "properties.properties.instanceTypes.*.resources.requests",
        "properties.properties.instanceTypes.*.resources.limits",
    },
    "batchEndpoint": {"tags", "identity.userAssignedIdentities", "properties.properties"},
    "batchDeployment": {
        "tags",
        "identity.userAssignedIdentities",
        "properties.properties",
        "properties.environmentVariables",
        "properties.resources.properties",
        "properties.resources.properties.*",
    },
    "job": {
        "properties.tags",
        "properties.properties",
        "properties.services",
        "properties.services.*.properties",
        "properties.inputs",
        "properties.outputs",
    },
}

# Keys of Microsoft's examples that the emulator may leave out, and why.
MAY_BE_ABSENT: dict[tuple[str, str], str] = {
    ("compute", "properties.resourceId"): "only attached computes (AKS, Kubernetes) wrap another ARM resource",
    ("batchEndpoint", "sku"): "batch endpoints are not billed by SKU; the SDK never sends one",
    ("batchDeployment", "sku"): "batch deployments are not billed by SKU; the SDK never sends one",
    ("batchEndpoint", "identity.userAssignedIdentities"): "only for user-assigned identities (ours is system)",
    ("batchDeployment", "identity.userAssignedIdentities"): "only for user-assigned identities (ours is system)",
    ("batchDeployment", "properties.codeConfiguration"): "an MLflow (no-code) deployment has no scoring script",
    ("batchDeployment", "properties.environmentId"): "an MLflow (no-code) deployment brings its own environment",
    ("batchDeployment", "properties.resources.instanceType"): "instance types exist only on Kubernetes targets",
    ("batchDeployment", "properties.resources.properties"): "optional free-form map the SDK does not send",
    ("job", "properties.inputs.*.value"): "field of literal inputs; batch inputs are uri_folder (uri + mode)",
    ("list", "nextLink"): "present only when there is a next page",
}

# Keys the emulator may render as null where the example has a value, and why.
MAY_BE_NULL: dict[tuple[str, str], str] = {
    ("compute", "properties.properties.subnet"): "the cluster is not in a virtual network",
    ("batchEndpoint", "kind"): "free-form resource kind, unset unless the client sends one",
    ("batchDeployment", "kind"): "free-form resource kind, unset unless the client sends one",
    ("job", "properties.description"): "the batch invocation has no description",
    ("job", "properties.inputs.*.description"): "the batch invocation describes no inputs",
    ("job", "properties.outputs.*.description"): "the batch invocation describes no outputs",
    ("job", "properties.services.*.port"): "the Studio service is a URL, not a port",
    ("job", "properties.services.*.status"): "Studio is not a running service with a status",
    ("job", "properties.services.*.errorMessage"): "no error",
    ("job", "properties.services.*.properties"): "Studio has no service properties",
}


def json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    return {str: "string", dict: "object", list: "array", type(None): "null"}[type(value)]


def compare(kind: str, example: Any, actual: Any, path: str = "") -> list[str]:
    """Differences between Microsoft's ``example`` and the emulator's ``actual`` JSON (empty = compatible)."""
    if example is None:
        return []
    if actual is None:
        return [] if (kind, path) in MAY_BE_NULL else [f"{path}: null, example has {json_type(example)}"]
    if json_type(actual) != json_type(example):
        return [f"{path}: {json_type(actual)}, example has {json_type(example)}"]
    child = f"{path}.*" if path else "*"
    if isinstance(example, list):  # every item against the example's first item
        return [p for item in actual for p in compare(kind, example[0], item, child)] if example else []
    if not isinstance(example, dict):
        return []
    if path in MAPS.get(kind, ()):  # user-named keys: each entry must match the shape of some example entry
        problems = []
        for value in actual.values():
            found = [compare(kind, shape, value, child) for shape in example.values()]
            if found and all(found):
                problems += found[0]
        return problems
    problems = []
    for key, value in example.items():
        sub = f"{path}.{key}" if path else key
        if key in actual:
            problems += compare(kind, value, actual[key], sub)
        elif (kind, sub) not in MAY_BE_ABSENT:
            problems.append(f"{sub}: missing")
    return problems


def example_body(name: str) -> Any:
    return json.loads((STABLE / "examples" / name).read_text())["responses"]["200"]["body"]


def swagger_enum(file: str, *keys: str) -> list[str]:
    node = json.loads((STABLE / file).read_text())["definitions"]
    for key in keys:
        node = node[key]
    return node["enum"]


# ----------------------------------------------------------------------------- the workspace under test
class Client:
    """GET/PUT/POST with TLS verified against the emulator's certificate and a real bearer token."""

    def __init__(self, info: dict[str, Any]) -> None:
        credential = ClientSecretCredential(
            info["tenant_id"],
            info["client_id"],
            info["client_secret"],
            authority=info["base_url"],
            connection_verify=info["ca_cert"],
            disable_instance_discovery=True,
        )
        self.token = credential.get_token(info["base_url"] + "/.default").token
        self.ca_cert = info["ca_cert"]
        self.ws_id = (
            f"/subscriptions/{info['subscription_id']}/resourceGroups/{info['resource_group']}"
            f"/providers/Microsoft.MachineLearningServices/workspaces/{info['workspace']}"
        )
        self.ws = info["base_url"] + self.ws_id
        self.session = requests.Session()
        # REQUESTS_CA_BUNDLE in the environment would otherwise override ``verify`` (requests#3829)
        self.session.trust_env = False
        self.session.verify = self.ca_cert
        self.session.headers["Authorization"] = f"Bearer {self.token}"

    def call(self, method: str, url: str, expect: tuple[int, ...] = (200,), **kwargs: Any) -> Any:
        url = url if url.startswith("https://") else self.ws + url
        response = self.session.request(method, url, params=API, timeout=30, **kwargs)
        assert response.status_code in expect, f"{method} {url}: {response.status_code} {response.text}"
        return response.json()

    def get(self, path: str) -> Any:
        return self.call("GET", path)


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Client]:
    assert STABLE.is_dir(), f"Microsoft's REST examples not found at {STABLE}: set AZUREML_REST_SPEC"
    with Emulator(tmp_path_factory.mktemp("emulator"), timing=TIMING) as emulator:
        client = Client(emulator.connection_info())
        # request bodies shaped like Microsoft's createOrUpdate examples and what azure-ai-ml sends
        client.call(
            "PUT",
            "/computes/cpu-cluster",
            (200, 201),
            json={
                "location": "eastus",
                "properties": {
                    "computeType": "AmlCompute",
                    "description": "low-priority scoring cluster",
                    "properties": {
                        "vmSize": "STANDARD_DS3_V2",
                        "vmPriority": "LowPriority",
                        "scaleSettings": {"maxNodeCount": 2, "minNodeCount": 0, "nodeIdleTimeBeforeScaleDown": "PT2M"},
                    },
                },
            },
        )
        k8s_type = {
            "nodeSelector": None,
            "resources": {
                "requests": {"cpu": "1", "memory": "4Gi", "nvidia.com/gpu": None},
                "limits": {"cpu": "1", "memory": "4Gi", "nvidia.com/gpu": None},
            },
        }
        client.call(
            "PUT",
            "/computes/k8s",
            (200, 201),
            json={
                "location": "eastus",
                "properties": {
                    "computeType": "Kubernetes",
                    "description": "attached AKS cluster",
                    "resourceId": "/subscriptions/00000000-0000-0000-0000-000000000001/resourcegroups/rg-emulator"
                    "/providers/Microsoft.ContainerService/managedClusters/aks",
                    "properties": {
                        "namespace": "default",
                        "defaultInstanceType": "defaultInstanceType",
                        "instanceTypes": {"defaultInstanceType": k8s_type},
                    },
                },
            },
        )
        endpoint = {
            "location": "eastus",
            "tags": {"team": "ml"},
            "properties": {"description": "heart scoring", "authMode": "AADToken", "properties": {"owner": "tests"}},
        }
        client.call("PUT", "/batchEndpoints/heart", (200, 201), json=endpoint)
        client.call(
            "PUT",
            "/batchEndpoints/heart/deployments/blue",
            (200, 201),
            json={
                "location": "eastus",
                "tags": {"team": "ml"},
                "properties": {
                    "description": "MLflow model on the low-priority cluster",
                    "properties": {"owner": "tests"},
                    "compute": "azureml:cpu-cluster",
                    "model": {"referenceType": "Id", "assetId": "azureml:heart-classifier:1"},
                    "miniBatchSize": 2,
                    "maxConcurrencyPerInstance": 2,
                    "resources": {"instanceCount": 1},
                    "retrySettings": {"maxRetries": 3, "timeout": "PT30S"},
                    "errorThreshold": -1,
                    "loggingLevel": "Info",
                    "outputAction": "AppendRow",
                    "outputFileName": "predictions.csv",
                    "environmentVariables": {"LOG_LEVEL": "info"},
                },
            },
        )
        endpoint["properties"]["defaults"] = {"deploymentName": "blue"}
        ep = client.call("PUT", "/batchEndpoints/heart", (200, 201), json=endpoint)
        write_heart_csvs(emulator.datastore_path("in"), files=4, rows_per_file=10)
        client.call(
            "POST",
            ep["properties"]["scoringUri"],
            (200, 201, 202),
            headers={"azureml-model-deployment": "blue"},
            json={
                "properties": {
                    "name": "job1",
                    "inputData": {
                        "x": {"jobInputType": "UriFolder", "uri": "azureml://datastores/workspaceblobstore/paths/in/"}
                    },
                }
            },
        )
        yield client


def finished_job(client: Client, name: str) -> dict[str, Any]:
    deadline = time.monotonic() + 60
    while True:
        job = client.get(f"/jobs/{name}")
        if job["properties"]["status"] in ("Completed", "Failed", "Canceled") or time.monotonic() > deadline:
            return job
        time.sleep(0.05)


# ----------------------------------------------------------------------------------------------- tests
def test_helper_reports_missing_keys_and_wrong_types() -> None:
    example = {"a": 1, "b": {"c": "x"}, "n": None, "tags": {"string": "string"}}
    assert compare("batchEndpoint", example, {"a": 2, "b": {"c": "y"}, "n": [], "tags": {}, "extra": 1}) == []
    assert compare("batchEndpoint", example, {"a": True, "b": {}, "n": 1, "tags": {"k": 1}}) == [
        "a: boolean, example has number",
        "b.c: missing",
        "tags.*: number, example has string",
    ]


@pytest.mark.parametrize(
    ("kind", "path", "example"),
    [
        ("compute", "/computes/cpu-cluster", "Compute/get/AmlCompute.json"),
        ("compute", "/computes/k8s", "Compute/get/KubernetesCompute.json"),
        ("batchEndpoint", "/batchEndpoints/heart", "Workspace/BatchEndpoint/get.json"),
        ("batchDeployment", "/batchEndpoints/heart/deployments/blue", "Workspace/BatchDeployment/get.json"),
        ("job", "/jobs/job1", "Job/PipelineJob/get.json"),
    ],
)
def test_get_matches_microsoft_example(client: Client, kind: str, path: str, example: str) -> None:
    actual = finished_job(client, "job1") if kind == "job" else client.get(path)
    assert actual["id"] == client.ws_id + path
    assert actual["name"] == path.rsplit("/", 1)[1]
    assert compare(kind, example_body(example), actual) == []


@pytest.mark.parametrize(
    ("kind", "path", "example", "count"),
    [
        ("compute", "/computes", "Compute/list.json", 2),
        ("batchEndpoint", "/batchEndpoints", "Workspace/BatchEndpoint/list.json", 1),
        ("batchDeployment", "/batchEndpoints/heart/deployments", "Workspace/BatchDeployment/list.json", 1),
        ("job", "/jobs", "Job/PipelineJob/list.json", 1),
    ],
)
def test_list_matches_microsoft_example(client: Client, kind: str, path: str, example: str, count: int) -> None:
    expected = example_body(example)
    actual = client.get(path)
    assert len(actual["value"]) == count
    assert compare("list", {**expected, "value": []}, actual) == []  # the envelope: value, nextLink
    assert [p for item in actual["value"] for p in compare(kind, expected["value"][0], item)] == []


def test_values_are_in_the_swagger_enums(client: Client) -> None:
    cluster = client.get("/computes/cpu-cluster")["properties"]
    assert cluster["provisioningState"] in swagger_enum(
        "machineLearningServices.json", "Compute", "properties", "provisioningState"
    )
    inner = cluster["properties"]
    assert inner["vmPriority"] == "LowPriority"
    assert inner["allocationState"] in swagger_enum(
        "machineLearningServices.json", "AmlComputeProperties", "properties", "allocationState"
    )
    endpoint = client.get("/batchEndpoints/heart")["properties"]
    assert endpoint["provisioningState"] in swagger_enum("mfe.json", "EndpointProvisioningState")
    assert endpoint["authMode"] in swagger_enum("mfe.json", "EndpointAuthMode")
    deployment = client.get("/batchEndpoints/heart/deployments/blue")["properties"]
    assert deployment["provisioningState"] in swagger_enum("mfe.json", "DeploymentProvisioningState")
    job = finished_job(client, "job1")["properties"]
    assert job["status"] == "Completed"
    assert job["status"] in swagger_enum("mfe.json", "JobStatus")
    assert job["jobType"] == "Pipeline"
    assert {i["jobInputType"] for i in job["inputs"].values()} <= set(swagger_enum("mfe.json", "JobInputType"))
    assert {o["jobOutputType"] for o in job["outputs"].values()} <= set(swagger_enum("mfe.json", "JobOutputType"))


def test_requests_without_a_token_are_rejected(client: Client) -> None:
    response = requests.get(client.ws + "/computes", params=API, verify=client.ca_cert, timeout=30)
    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"].startswith("Bearer ")
