"""Contract test: the emulator's JSON against the REST models that azure-ai-ml itself ships.

Why: a test that only compares the provider with our own emulator proves nothing where the
emulator invents a field. Here the emulator's responses are checked against a source that
installs with the project and that Microsoft generates from its REST specification:
``azure.ai.ml._restclient.arm_ml_service.models`` (ARM resources) and
``azure.ai.ml._restclient.runhistory.models`` (run history). Nothing outside the repository is read.

One emulator is started for the module. Over real HTTPS (TLS verified against the emulator's
certificate) and with a real bearer token from its identity endpoint, the test creates a
low-priority AmlCompute cluster, an attached Kubernetes compute, a batch endpoint, a batch
deployment, a batch job and a command job, then GETs each one (and each list) and walks the
JSON through the model class of that resource (``model_problems``):

* a key the model does not have is an error (the emulator must never add a field Azure does not send);
* a key the model marks required (not ``Optional``) must be present;
* every value must have the model's JSON type: string, integer, number, boolean, RFC 3339
  date-time, ISO 8601 duration, object, array, or ``null`` where the model allows it;
* enum-typed values must be one of the model's enum values, exactly as spelled;
* polymorphic models (``computeType``, ``jobType``, ``datastoreType``, ``jobInputType`` ...) are
  resolved through the models' own discriminator maps; an unknown discriminator is an error.

What the models cannot say is written here, as expected shapes of our own:

* ``ALWAYS_SENT``: optional fields that Azure does send for these resources (they are in
  Microsoft's ``x-ms-examples`` for api-version 2024-10-01) and that the provider relies on;
* ``INVOKE_RESPONSE``: the batch invoke response (data plane), which ``arm_ml_service`` does not
  model (``BatchJob._from_rest_object`` reads the wire dict directly).
"""

from __future__ import annotations

import datetime
import enum
import inspect
import re
import sys
import time
import types
import typing
from collections.abc import Iterator
from typing import Any

import pytest
import requests
from azure.ai.ml._restclient.arm_ml_service import models as arm
from azure.ai.ml._restclient.runhistory import models as run_history
from azure.identity import ClientSecretCredential

from airflow_azureml.emulator import Emulator, Timing
from airflow_azureml.emulator.scoring.data import write_heart_csvs

API = {"api-version": "2024-10-01"}
TIMING = Timing(provisioning=0.02, node_startup=0.05, mini_batch=0.02, command_job=0.2, tick=0.01)
ISO_DURATION = re.compile(
    r"^-?P(?!$)(\d+(\.\d+)?Y)?(\d+(\.\d+)?M)?(\d+(\.\d+)?W)?(\d+(\.\d+)?D)?"
    r"(T(?=\d)(\d+(\.\d+)?H)?(\d+(\.\d+)?M)?(\d+(\.\d+)?S)?)?$"
)


# ---------------------------------------------------------------------------- the model walker
def _json_name(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, (int, float)):
        return "number"
    return {str: "string", dict: "object", list: "array", type(None): "null"}.get(type(value), type(value).__name__)


def _resolve(annotation: Any, namespace: dict[str, Any]) -> Any:
    """Evaluate string and nested ``ForwardRef`` annotations (``Union[str, "_models.X"]``)."""
    if isinstance(annotation, str):
        return _resolve(eval(annotation, namespace), namespace)
    if isinstance(annotation, typing.ForwardRef):
        return _resolve(eval(annotation.__forward_arg__, namespace), namespace)
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if not args or origin is typing.Literal:
        return annotation
    resolved = tuple(_resolve(a, namespace) for a in args)
    if origin in (typing.Union, types.UnionType):
        return typing.Union[resolved]  # noqa: UP007 - built from a tuple
    return origin[resolved]


def _annotations(cls: type) -> dict[str, Any]:
    """The resolved annotations of a generated model class and its generated bases."""
    hints: dict[str, Any] = {}
    for klass in reversed(cls.__mro__):
        if not getattr(klass, "_is_model", False) or klass.__module__.endswith("model_base"):
            continue
        module = sys.modules[klass.__module__]
        # the generated files import ``_models`` only under TYPE_CHECKING: bind it to their package
        namespace = {**vars(module), "_models": sys.modules[klass.__module__.rsplit(".", 1)[0]]}
        for attr, annotation in inspect.get_annotations(klass).items():
            if not attr.startswith("_"):
                hints[attr] = _resolve(annotation, namespace)
    return hints


# Where a generated model is narrower than what Microsoft documents Azure sending, and why.
MODEL_OVERRIDES: dict[tuple[str, str], Any] = {
    # Microsoft's example Compute/get/KubernetesCompute.json (2024-10-01) returns "nvidia.com/gpu": null
    ("InstanceTypeSchemaResources", "requests"): typing.Optional[dict[str, typing.Optional[str]]],  # noqa: UP045
    ("InstanceTypeSchemaResources", "limits"): typing.Optional[dict[str, typing.Optional[str]]],  # noqa: UP045
    # the msrest model of the same package (runhistory/models/_models_py3.py) types it "object"
    ("RunDetails", "runDefinition"): typing.Optional[Any],  # noqa: UP045
}


def _fields(cls: type) -> dict[str, tuple[Any, Any]]:
    """``{wire name: (annotation, rest field)}`` as the SDK's own deserializer sees the class."""
    cls.__new__(cls)  # type: ignore[call-overload]  # computes cls._attr_to_rest_field, as the SDK does
    hints = _annotations(cls)
    fields = cls._attr_to_rest_field.items()  # type: ignore[attr-defined]
    return {rf._rest_name: (MODEL_OVERRIDES.get((cls.__name__, rf._rest_name), hints[attr]), rf) for attr, rf in fields}


def _is_optional(annotation: Any) -> bool:
    return typing.get_origin(annotation) in (typing.Union, types.UnionType) and type(None) in typing.get_args(
        annotation
    )


def _value_problems(annotation: Any, value: Any, path: str) -> list[str]:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is Any:
        return []
    if origin in (typing.Union, types.UnionType):
        if value is None:
            return [] if type(None) in args else [f"{path}: null where the model requires a value"]
        members = [a for a in args if a is not type(None)]
        enums = [a for a in members if isinstance(a, type) and issubclass(a, enum.Enum)]
        if enums:  # ``Union[str, SomeEnum]``: Azure's "known values"; we accept only those
            allowed = sorted({e.value for klass in enums for e in klass})
            return [] if isinstance(value, str) and value in allowed else [f"{path}: {value!r} not in {allowed}"]
        found = [_value_problems(member, value, path) for member in members]
        return [] if any(not f for f in found) else found[0]
    if value is None:
        return [f"{path}: null where the model requires a value"]
    if origin is typing.Literal:
        allowed = [a.value if isinstance(a, enum.Enum) else a for a in args]
        return [] if value in allowed else [f"{path}: {value!r} is not {allowed}"]
    if origin is dict or annotation is dict:
        if not isinstance(value, dict):
            return [f"{path}: {_json_name(value)}, model has an object"]
        item = args[1] if args else Any
        return [p for key, v in value.items() for p in _value_problems(item, v, f"{path}.{key}")]
    if origin is list or annotation is list:
        if not isinstance(value, list):
            return [f"{path}: {_json_name(value)}, model has an array"]
        item = args[0] if args else Any
        return [p for i, v in enumerate(value) for p in _value_problems(item, v, f"{path}[{i}]")]
    if annotation is str:
        return [] if isinstance(value, str) else [f"{path}: {_json_name(value)}, model has a string"]
    if annotation is bool:
        return [] if isinstance(value, bool) else [f"{path}: {_json_name(value)}, model has a boolean"]
    if annotation is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
        return [] if ok else [f"{path}: {_json_name(value)}, model has an integer"]
    if annotation is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        return [] if ok else [f"{path}: {_json_name(value)}, model has a number"]
    if annotation is datetime.datetime:
        try:
            datetime.datetime.fromisoformat(str(value).replace("Z", "+00:00"))
            return [] if isinstance(value, str) else [f"{path}: {_json_name(value)}, model has a date-time"]
        except ValueError:
            return [f"{path}: {value!r} is not an RFC 3339 date-time"]
    if annotation is datetime.timedelta:
        ok = isinstance(value, str) and ISO_DURATION.match(value)
        return [] if ok else [f"{path}: {value!r} is not an ISO 8601 duration"]
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return [] if value in {e.value for e in annotation} else [f"{path}: {value!r} not in {annotation.__name__}"]
    if isinstance(annotation, type) and getattr(annotation, "_is_model", False):
        return model_problems(annotation, value, path)
    raise TypeError(f"{path}: the walker does not know the annotation {annotation!r}")


def model_problems(cls: type, value: Any, path: str = "$", resolved: tuple[str, ...] = ()) -> list[str]:
    """Where ``value`` (wire JSON) differs from the SDK model ``cls`` (empty = conforms)."""
    if not isinstance(value, dict):
        return [f"{path}: {_json_name(value)}, {cls.__name__} is an object"]
    mapping = cls.__dict__.get("__mapping__")
    if mapping is not None:  # a polymorphic base: pick the subclass as the SDK's _deserialize does
        discriminator = next(
            (
                rf
                for rf in cls.__dict__.values()
                if getattr(rf, "_is_discriminator", False) and rf._rest_name not in resolved
            ),
            None,
        )
        if discriminator is not None:
            kind = value.get(discriminator._rest_name)
            if kind not in mapping:
                return [f"{path}.{discriminator._rest_name}: {kind!r} is not a {cls.__name__} ({sorted(mapping)})"]
            if mapping[kind] is not cls:
                return model_problems(mapping[kind], value, path, (*resolved, discriminator._rest_name))
    fields = _fields(cls)
    problems = []
    for key, item in value.items():
        if key not in fields:
            problems.append(f"{path}.{key}: not a field of {cls.__name__}")
        else:
            problems += _value_problems(fields[key][0], item, f"{path}.{key}")
    for key, (annotation, _rf) in fields.items():
        if key not in value and not _is_optional(annotation):
            problems.append(f"{path}.{key}: required by {cls.__name__}, missing")
    return problems


def list_problems(cls: type, body: Any) -> list[str]:
    """An ARM list page: ``{"value": [...], "nextLink": "..."}`` (nextLink only when there is a next page)."""
    if not isinstance(body, dict) or not isinstance(body.get("value"), list):
        return [f"$: not a list page: {str(body)[:200]}"]
    problems = [f"$.{key}: not a field of a list page" for key in body if key not in ("value", "nextLink")]
    if "nextLink" in body and not isinstance(body["nextLink"], str):
        problems.append("$.nextLink: not a string")
    return problems + [p for i, item in enumerate(body["value"]) for p in model_problems(cls, item, f"$.value[{i}]")]


def lookup(body: Any, dotted: str) -> tuple[bool, Any]:
    node = body
    for key in dotted.split("."):
        if not isinstance(node, dict) or key not in node:
            return False, None
        node = node[key]
    return True, node


# Optional in the models, but Azure sends them for these resources (Microsoft's 2024-10-01 examples
# Compute/get/AmlCompute.json, Workspace/BatchEndpoint/get.json, Workspace/BatchDeployment/get.json,
# Job/PipelineJob/get.json, Job/CommandJob/get.json, Datastore/get.json), and the provider reads them.
ALWAYS_SENT: dict[str, list[str]] = {
    "amlCompute": [
        "location",
        "properties.computeType",
        "properties.provisioningState",
        "properties.properties.vmPriority",
        "properties.properties.scaleSettings.maxNodeCount",
        "properties.properties.allocationState",
        "properties.properties.currentNodeCount",
        "properties.properties.targetNodeCount",
        "properties.properties.nodeStateCounts.preemptedNodeCount",
        "properties.properties.nodeStateCounts.runningNodeCount",
        "systemData.createdAt",
    ],
    "kubernetesCompute": ["properties.computeType", "properties.provisioningState", "properties.resourceId"],
    "batchEndpoint": [
        "properties.provisioningState",
        "properties.scoringUri",
        "properties.authMode",
        "properties.defaults.deploymentName",
    ],
    "batchDeployment": [
        "properties.provisioningState",
        "properties.compute",
        "properties.model",
        "properties.miniBatchSize",
        "properties.errorThreshold",
        "properties.retrySettings.maxRetries",
        "properties.outputAction",
        "properties.outputFileName",
    ],
    "job": [
        "properties.status",
        "properties.experimentName",
        "properties.computeId",
        "properties.services.Studio.endpoint",
        "systemData.createdAt",
    ],
    "datastore": ["properties.datastoreType", "properties.isDefault", "properties.containerName"],
}

# The batch invoke response (data plane). arm_ml_service has no model for it; the SDK's
# ``BatchJob._from_rest_object`` reads ``id``, ``name``, ``type`` and ``properties.status``. The shape is
# the one Azure answered in azure-ai-ml's recording (azure_shapes/batch_endpoint.invoke.json, which
# test_conformance compares key by key).
INVOKE_RESPONSE = {
    "id": str,
    "name": str,
    "type": str,
    "systemData": dict,
    "properties": {
        "provisioningState": str,
        "inputData": dict,
        "compute": dict,
        "output": dict,
        "retrySettings": dict,
        "status": str,
        "interactionEndpoints": dict,
        "tags": dict,
        "properties": dict,
        "name": str,
    },
}


def shape_problems(shape: Any, value: Any, path: str = "$") -> list[str]:
    if isinstance(shape, dict):
        if not isinstance(value, dict):
            return [f"{path}: {_json_name(value)}, expected an object"]
        problems = [f"{path}.{k}: not in the expected shape" for k in value if k not in shape]
        for key, sub in shape.items():
            problems += shape_problems(sub, value[key], f"{path}.{key}") if key in value else [f"{path}.{key}: missing"]
        return problems
    return [] if isinstance(value, shape) else [f"{path}: {_json_name(value)}, expected {shape}"]


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
        self.credential = credential
        self.base_url = info["base_url"]
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
        self.invoke_response: Any = None

    def call(self, method: str, url: str, expect: tuple[int, ...] = (200,), **kwargs: Any) -> Any:
        url = url if url.startswith("https://") else self.ws + url
        kwargs.setdefault("params", API)
        response = self.session.request(method, url, timeout=30, **kwargs)
        assert response.status_code in expect, f"{method} {url}: {response.status_code} {response.text}"
        return response.json()

    def get(self, path: str) -> Any:
        return self.call("GET", path)


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Client]:
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
        aml_token = client.credential.get_token("https://ml.azure.com/.default").token
        client.invoke_response = client.call(
            "POST",
            ep["properties"]["scoringUri"],
            (200, 201, 202),
            params={},
            headers={"azureml-model-deployment": "blue", "Authorization": f"Bearer {aml_token}"},
            json={
                "properties": {
                    "name": "job1",
                    "inputData": {
                        "x": {"jobInputType": "UriFolder", "uri": "azureml://datastores/workspaceblobstore/paths/in/"}
                    },
                }
            },
        )
        # a command job, with the body azure-ai-ml's ``command()`` builds
        client.call(
            "PUT",
            "/jobs/cmd1",
            (200, 201),
            json={
                "properties": {
                    "jobType": "Command",
                    "displayName": "cmd1",
                    "experimentName": "contract",
                    "tags": {"team": "ml"},
                    "properties": {},
                    "computeId": f"{client.ws_id}/computes/cpu-cluster",
                    "command": 'python -c "print(1)"',
                    "environmentId": "azureml://registries/azureml/environments/sklearn-1.5/labels/latest",
                    "inputs": {},
                    "outputs": {},
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
def test_walker_reports_unknown_missing_mistyped_and_out_of_enum_fields() -> None:
    good = {
        "location": "eastus",
        "properties": {"authMode": "AADToken", "provisioningState": "Succeeded"},
        "tags": {"a": "b"},
    }
    assert model_problems(arm.BatchEndpoint, good) == []
    bad = {
        "properties": {"authMode": "Keys", "provisioningState": "Done", "cancelRequested": True},
        "tags": {"a": 1},
        "id": None,
        "extra": 1,
    }
    assert sorted(model_problems(arm.BatchEndpoint, bad)) == sorted(
        [
            "$.properties.authMode: 'Keys' not in ['AADToken', 'AMLToken', 'Key']",
            "$.properties.provisioningState: 'Done' not in ['Canceled', 'Creating', 'Deleting', 'Failed', "
            "'Succeeded', 'Updating']",
            "$.properties.cancelRequested: not a field of BatchEndpointProperties",
            "$.tags.a: number, model has a string",
            "$.extra: not a field of BatchEndpoint",
            "$.location: required by BatchEndpoint, missing",
        ]
    )
    # polymorphic: the discriminator picks the subclass, and an unknown one is an error
    compute = {"properties": {"computeType": "AmlCompute", "properties": {"vmPriority": "Spot"}}}
    assert model_problems(arm.ComputeResource, compute) == [
        "$.properties.properties.vmPriority: 'Spot' not in ['Dedicated', 'LowPriority']"
    ]
    assert model_problems(arm.ComputeResource, {"properties": {"computeType": "Laptop"}})[0].startswith(
        "$.properties.computeType: 'Laptop' is not a Compute"
    )
    assert model_problems(arm.BatchRetrySettings, {"timeout": "30 seconds"}) == [
        "$.timeout: '30 seconds' is not an ISO 8601 duration"
    ]


def test_a_field_azure_does_not_send_fails_the_contract(client: Client) -> None:
    """Proof that the check bites on real emulator output: one invented field anywhere is reported."""
    cluster = client.get("/computes/cpu-cluster")
    assert model_problems(arm.ComputeResource, cluster) == []
    cluster["properties"]["properties"]["nodeStateCounts"]["preemptedNodeCountSinceStart"] = 0
    assert model_problems(arm.ComputeResource, cluster) == [
        "$.properties.properties.nodeStateCounts.preemptedNodeCountSinceStart: not a field of NodeStateCounts"
    ]
    job = finished_job(client, "job1")
    assert model_problems(arm.JobBase, job) == []
    job["properties"]["cancelRequested"] = True
    assert model_problems(arm.JobBase, job) == ["$.properties.cancelRequested: not a field of PipelineJob"]


@pytest.mark.parametrize(
    ("model", "path", "sent"),
    [
        (arm.Workspace, "", None),
        (arm.ComputeResource, "/computes/cpu-cluster", "amlCompute"),
        (arm.ComputeResource, "/computes/k8s", "kubernetesCompute"),
        (arm.BatchEndpoint, "/batchEndpoints/heart", "batchEndpoint"),
        (arm.BatchDeployment, "/batchEndpoints/heart/deployments/blue", "batchDeployment"),
        (arm.JobBase, "/jobs/job1", "job"),
        (arm.JobBase, "/jobs/cmd1", "job"),
        (arm.Datastore, "/datastores/workspaceblobstore", "datastore"),
        (arm.ModelContainer, "/models/heart-classifier", None),
        (arm.ModelVersion, "/models/heart-classifier/versions/1", None),
    ],
)
def test_get_matches_the_sdk_model(client: Client, model: type, path: str, sent: str | None) -> None:
    actual = finished_job(client, path.rsplit("/", 1)[1]) if path.startswith("/jobs/") else client.get(path)
    assert actual["id"] == client.ws_id + path
    assert model_problems(model, actual) == []
    missing = [key for key in ALWAYS_SENT.get(sent or "", []) if not lookup(actual, key)[0]]
    assert missing == [], f"fields Azure sends for {path} are missing"


@pytest.mark.parametrize(
    ("model", "path", "count"),
    [
        (arm.ComputeResource, "/computes", 2),
        (arm.BatchEndpoint, "/batchEndpoints", 1),
        (arm.BatchDeployment, "/batchEndpoints/heart/deployments", 1),
        (arm.JobBase, "/jobs", 2),
        (arm.Datastore, "/datastores", 1),
        (arm.ModelVersion, "/models/heart-classifier/versions", 1),
    ],
)
def test_list_matches_the_sdk_model(client: Client, model: type, path: str, count: int) -> None:
    finished_job(client, "job1")
    actual = client.get(path)
    assert len(actual["value"]) >= count
    assert list_problems(model, actual) == []


def test_run_history_details_match_the_sdk_model(client: Client) -> None:
    finished_job(client, "job1")
    url = f"{client.base_url}/history/v1.0{client.ws_id}/runs/job1/details"
    aml_token = client.credential.get_token("https://ml.azure.com/.default").token
    details = client.call("GET", url, params={}, headers={"Authorization": f"Bearer {aml_token}"})
    assert model_problems(run_history.RunDetails, details) == []
    assert details["status"] == "Completed"


def test_invoke_response_has_the_data_plane_shape(client: Client) -> None:
    assert shape_problems(INVOKE_RESPONSE, client.invoke_response) == []
    assert client.invoke_response["name"] == "job1"


def test_values_are_the_ones_the_resources_should_have(client: Client) -> None:
    inner = client.get("/computes/cpu-cluster")["properties"]["properties"]
    assert inner["vmPriority"] == "LowPriority"
    job = finished_job(client, "job1")["properties"]
    assert job["status"] == "Completed"
    assert job["jobType"] == "Pipeline"
    assert finished_job(client, "cmd1")["properties"]["jobType"] == "Command"


def test_requests_without_a_token_are_rejected(client: Client) -> None:
    response = requests.get(client.ws + "/computes", params=API, verify=client.ca_cert, timeout=30)
    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"].startswith("Bearer ")
