"""Conformance: the emulator's answers against what real Azure answered in azure-ai-ml's recorded e2e tests.

Why: every other emulator rule is our own reading of the docs. azure-ai-ml's e2e tests were recorded
against real Azure (Azure/azure-sdk-for-python, ``sdk/ml/azure-ai-ml/tests/recordings/``); where they
exist, they outrank the docs. ``azure_shapes/`` holds one compact *shape* record per recorded
interaction, derived from those recordings (values left out: some recordings are not fully sanitised):
method, path template, status, which LRO headers were present and where they pointed, and every JSON
key path of the body with its type. Each record names its recording file, commit and entry indices.

The test runs one scenario through the real SDK (``MLClient`` over HTTPS, a real credential) against
the emulator, captures every response the SDK received (azure-core's ``raw_response_hook``), and for
each record of an interaction the provider uses compares the emulator's responses with Azure's:

* every key Azure sent is sent, unless the provider's code never names it (printed as "left out");
* a key Azure did not send must be one the SDK's REST models define (printed as "beyond the recordings");
* a key's JSON type is one Azure sent for it, wherever neither side is null;
* the status and the LRO headers (``Azure-AsyncOperation``, ``Location``, ``Retry-After``,
  ``x-ms-async-operation-timeout``) match, and each points where Azure's pointed.

It prints the coverage: records checked out of those recorded for the resources the provider touches.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest

from airflow_azureml.emulator import Emulator
from airflow_azureml.emulator.scoring.data import write_heart_csvs
from tests.integration.test_emulator_protocol import ml_client

REPO = Path(__file__).resolve().parents[2]
SHAPES = Path(__file__).with_name("azure_shapes")
LRO_HEADERS = ("Azure-AsyncOperation", "Location", "Retry-After", "x-ms-async-operation-timeout")

# Records of resources or calls the provider never makes (so the scenario does not make them either).
OUT_OF_SCOPE = {
    "compute_instance.get": "compute instances: the provider creates AmlCompute clusters only",
    "compute_instance.put.201": "compute instances: the provider creates AmlCompute clusters only",
    "compute.start": "start/stop are compute-instance actions",
    "compute.stop": "start/stop are compute-instance actions",
    "data_container.get": "data assets: the provider passes uri_folder inputs, registers no data asset",
    "data_version.get": "data assets: the provider passes uri_folder inputs, registers no data asset",
    "data_version.put": "data assets: the provider passes uri_folder inputs, registers no data asset",
    "datastore.put": "the provider uses the workspace's datastores, creates none",
    "datastore.put.200": "the provider uses the workspace's datastores, creates none",
    "datastore.delete": "the provider uses the workspace's datastores, deletes none",
    "datastore.get.404": "the recorded 404 is of a datastore the test had deleted; the provider deletes none",
    "environment_version.get": "curated-environment reads: the provider's deployments use an image + conda file",
    "environment_version.list": "curated-environment reads: the provider's deployments use an image + conda file",
    "model_version.list": "NOT checked yet, an open gap: the provider resolves model@latest by this list "
    "(batch.py), and the scenario makes it",
    "model_version.put.200": "model registration: the deployment's model is registered before the DAG runs",
    "model_version.put.201": "model registration: the deployment's model is registered before the DAG runs",
    "run_history.list_children": "pipeline child runs: a batch job's steps are not walked by the provider",
    "content_snapshot.get_by_hash": "a pipeline component snapshot, not a batch deployment's code",
    "snapshot.get_by_hash": "a pipeline component snapshot, not a batch deployment's code",
    "temporary_data_reference.create_or_get": "an older SDK's upload path (assetstore); 1.x uses startPendingUpload",
    "code_version.list": "an older SDK's lookup by content hash on the workspace host (mferp)",
    "storage.head": "Azure Storage, not the ML service: checked by test_code_deployment's blob tests",
    "storage.head.404": "Azure Storage, not the ML service: checked by test_code_deployment's blob tests",
    "storage.put_blob": "Azure Storage, not the ML service: checked by test_code_deployment's blob tests",
    "storage.set_metadata": "Azure Storage, not the ML service: checked by test_code_deployment's blob tests",
    "batch_deployment.list": "the provider reads one deployment by name",
    "batch_endpoint.delete": "the provider never deletes an endpoint",
    "batch_endpoint.get.404": "a read after the test's own delete; the provider deletes no endpoint",
    "operation_result.get.200": "the poll of an endpoint delete (mfeOperationResults); the provider deletes none",
    "operation_result.get.202": "the poll of an endpoint delete (mfeOperationResults); the provider deletes none",
    "datastore.list": "the provider names its datastore (AZUREML_DATASTORE_ROOT, azureml:// URIs), lists none",
    "datastore.list_secrets": "the provider reads no datastore secrets "
    "(the scenario asks; the SDK sends no listSecrets for a credential-less datastore)",
    "code_version.get": "azure-ai-ml 1.x finds a deployment's code by listing its versions, not by a GET of one",
    "model_version.get": "azure-ai-ml 1.x resolves a deployment's model@latest by listing its versions",
    "run_history.get": "the provider reads GET .../runs/{id}/details, which no recording holds; this is .../runs/{id}",
}

# A key Azure sent that the emulator leaves out is allowed only where the provider's code never reads it
# (its name appears nowhere in airflow_azureml/ outside the emulator): leaving it out cannot hide a
# provider bug. A key the emulator sends beyond the recording is allowed only where the REST models of the
# api-version the SDK speaks (2024-10-01; the recordings are of 2022-05-01 to 2023-04-01) define it, and
# test_contract holds its type to that model. Both lists are printed. A type differs only where one side
# is null (a value the recorded resource did not set); any other type difference fails.
PROVIDER_SOURCE = "\n".join(
    path.read_text() for path in (REPO / "airflow_azureml").rglob("*.py") if "emulator" not in path.parts
)


def leaf(path: str) -> str:
    return next(p for p in reversed(path.replace("[]", "").split(".")) if p != "*")


def provider_reads(path: str) -> bool:
    return f'"{leaf(path)}"' in PROVIDER_SOURCE or f"'{leaf(path)}'" in PROVIDER_SOURCE


def model_wire_names() -> set[str]:
    """Every JSON key the SDK's 2024-10-01 ARM REST models define (the api-version the emulator speaks)."""
    import inspect

    from azure.ai.ml._restclient.arm_ml_service import models as arm

    names: set[str] = set()
    for _, cls in inspect.getmembers(arm, inspect.isclass):
        if hasattr(cls, "_attr_to_rest_field") or hasattr(cls, "_calculated"):
            try:
                cls.__new__(cls)
            except TypeError:
                continue
        for field in getattr(cls, "_attr_to_rest_field", {}).values():
            names.add(field._rest_name)
    return names


# Headers the emulator adds to every interaction, with the reason.
ADDED_HEADERS = {
    "Retry-After": "Azure sends none on these LROs, so the SDK would wait its default interval (about 30 s in the "
    "recordings) between polls; the emulator asks for 1 s so that the suite does not wait minutes per LRO",
}


# ----------------------------------------------------------------------------------------- shapes
def load_shapes() -> dict[str, dict[str, Any]]:
    return {p.stem: json.loads(p.read_text()) for p in sorted(SHAPES.glob("*.json"))}


def template_regex(template: str) -> re.Pattern[str]:
    """A path template's regex, matched at the end of a request path (hosts differ in the emulator)."""
    parts = re.split(r"(\{[^}]+\})", template)
    body = "".join("[^/]+?" if p.startswith("{") else re.escape(p) for p in parts)
    return re.compile(body + "$", re.IGNORECASE)


def json_type(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def key_paths(value: Any, maps: set[str], prefix: str = "") -> dict[str, set[str]]:
    """Every key path of a JSON value and its types; a user-keyed map's keys become ``*``."""
    found: dict[str, set[str]] = {}

    def walk(node: Any, path: str) -> None:
        if isinstance(node, dict):
            for key, child in node.items():
                name = "*" if path in maps else key
                child_path = f"{path}.{name}" if path else name
                found.setdefault(child_path, set()).add(json_type(child))
                walk(child, child_path)
        elif isinstance(node, list):
            for child in node:
                found.setdefault(f"{path}[]", set()).add(json_type(child))
                walk(child, f"{path}[]")

    walk(value, prefix)
    return found


# Maps whose keys a user chooses (the REST models type them as dicts of strings or of objects): their keys
# become ``*`` even where the recorded resource had the map null or empty.
USER_MAPS = {
    "tags",
    "properties.tags",
    "properties.properties",
    "properties.inputs",
    "properties.outputs",
    "properties.inputData",
    "properties.services",
    "properties.interactionEndpoints",
    "properties.environmentVariables",
    "properties.jobs",
    "identity.userAssignedIdentities",
}


def user_maps(record: dict[str, Any]) -> set[str]:
    """The user-keyed maps of a record: its own ``*`` paths, and ``USER_MAPS`` unless the record shows the
    path with fixed keys (a compute's ``properties.properties`` is an AmlCompute's settings, not a map)."""
    keys = record["body_keys"]
    fixed = {m for m in USER_MAPS if any(k.startswith(m + ".") and not k.startswith(m + ".*") for k in keys)}
    return (USER_MAPS - fixed) | {k[: -len(".*")] for k in keys if k.endswith(".*")}


def ancestors(path: str) -> Iterator[str]:
    parts = path.split(".")
    for end in range(1, len(parts)):
        yield ".".join(parts[:end])


# Records that share a path template with another kind of resource: only responses of this jobType match.
JOB_TYPES = {"batch_job.get": "Pipeline", "command_job.get": "Command", "command_job.put": "Command"}


def header_target(value: str, request_path: str) -> str:
    """Where an LRO header points: the ``operation`` status, the ``resource`` itself, or ``other:<path>``."""
    path = urlsplit(value).path
    if "/mfeOperationsStatus/" in path:
        return "operation"
    if "/locations/" not in path and path.rstrip("/").lower() == request_path.rstrip("/").lower():
        return "resource"
    return f"other:{path}"


def target_matches(expected: str, actual: str) -> bool:
    if expected in ("operation", "resource"):
        return actual == expected
    return actual.startswith("other:") and bool(template_regex(expected[len("other:") :]).search(actual[6:]))


# --------------------------------------------------------------------------------------- scenario
class Capture:
    """Every response the SDK received: azure-core calls the hook once per response, polls and retries too."""

    def __init__(self) -> None:
        self.responses: list[dict[str, Any]] = []

    def __call__(self, pipeline_response: Any) -> None:
        request, response = pipeline_response.http_request, pipeline_response.http_response
        try:
            response.read()  # an LRO's first response is streamed; read() keeps the bytes for the SDK too
            text = response.text()
            body: Any = json.loads(text) if text else None
            has_body = bool(text)
        except Exception:  # a streamed or non-JSON body
            body, has_body = None, False
        self.responses.append(
            {
                "method": request.method,
                "path": urlsplit(request.url).path,
                "status": response.status_code,
                "headers": {k.lower(): v for k, v in response.headers.items()},
                "body": body,
                "has_body": has_body,
            }
        )


def client(emulator: Emulator, capture: Capture) -> Any:
    """The real MLClient over HTTPS with a real credential, every response it receives going to ``capture``."""
    return ml_client(emulator, emulator.ml_audience, raw_response_hook=capture)


def run_scenario(ml: Any, emulator: Emulator) -> None:
    """What the provider does through the SDK: cluster, endpoint, deployment, invoke, reads, cancel, command job."""
    from azure.ai.ml import Input, command, load_compute
    from azure.ai.ml.entities import BatchEndpoint
    from azure.ai.ml.entities._load_functions import load_model_batch_deployment

    ml.workspaces.get(emulator.workspace_name)
    ml.compute.begin_create_or_update(load_compute(source=str(REPO / "dags/azureml/low-pri-cluster.yml"))).result()
    ml.compute.get("low-pri-cluster")
    ml.batch_endpoints.begin_create_or_update(BatchEndpoint(name="heart-classifier-batch")).result()
    ml.batch_endpoints.get("heart-classifier-batch")
    # the custom-script deployment: its code and inline environment are registered too (code_version.put ...)
    deployment = load_model_batch_deployment(source=str(REPO / "dags/azureml/deployment-custom-script.yml"))
    ml.batch_deployments.begin_create_or_update(deployment).result()
    ml.batch_deployments.get("classifier-sklearn-script", endpoint_name="heart-classifier-batch")
    ml.datastores.get("workspaceblobstore", include_secrets=True)
    write_heart_csvs(emulator.datastore_path("conformance/input"), files=1, rows_per_file=4)
    emulator.set_capacity("low-pri-cluster", 0)  # the job waits queued, so that the cancel finds it running
    job = ml.batch_endpoints.invoke(
        endpoint_name="heart-classifier-batch",
        deployment_name="classifier-sklearn-script",
        inputs={
            "heart_dataset": Input(
                type="uri_folder", path="azureml://datastores/workspaceblobstore/paths/conformance/input/"
            )
        },
    )
    ml.jobs.get(job.name)
    emulator.set_behaviour(cancel_requested_seconds=3)  # the cancel poll must see the job still active (202)
    ml.jobs.begin_cancel(job.name).result()
    emulator.set_behaviour(cancel_requested_seconds=0)
    emulator.set_capacity("low-pri-cluster", None)
    submitted = ml.jobs.create_or_update(
        command(
            command="echo hello",
            environment="azureml:AzureML-sklearn-1.0-ubuntu20.04-py38-cpu@latest",
            compute="low-pri-cluster",
            experiment_name="conformance",
        )
    )
    ml.jobs.get(submitted.name)
    ml.compute.begin_delete("low-pri-cluster").result()


def discover(emulator: Emulator, capture: Capture) -> None:
    """The provider's own discovery read (hooks/rest.py): the workspace's ``discoveryUrl``, with no token."""
    import requests

    workspace = next(r for r in capture.responses if r["path"].endswith(f"/workspaces/{emulator.workspace_name}"))
    url = workspace["body"]["properties"]["discoveryUrl"]
    response = requests.get(url, verify=emulator.ca_cert, timeout=30)
    capture.responses.append(
        {
            "method": "GET",
            "path": urlsplit(url).path,
            "status": response.status_code,
            "headers": {k.lower(): v for k, v in response.headers.items()},
            "body": response.json(),
            "has_body": True,
        }
    )


# ------------------------------------------------------------------------------------------ check
def compare(
    record: dict[str, Any],
    responses: list[dict[str, Any]],
    wire_names: set[str],
    omitted: list[str],
    added: list[str],
) -> list[str]:
    """Each difference between Azure's record and the emulator's matching responses, as a sentence."""
    name = record["interaction"]
    problems: list[str] = []
    maps = user_maps(record)
    sent: dict[str, set[str]] = {}
    for response in responses:
        for path, types in key_paths(response["body"], maps).items():
            sent.setdefault(path, set()).update(types)
    azure = {path: set(types.split("|")) for path, types in record["body_keys"].items()}
    for path in sorted(set(azure) - set(sent)):
        if ".*" in path and path.split(".*")[0] in sent:
            continue  # an entry of a user-keyed map the emulator sends: which entries exist is the input's
        if any(sent.get(a) == {"null"} for a in ancestors(path)):
            continue  # inside an object this resource does not have (null here; the recorded one had it)
        if provider_reads(path):
            problems.append(f"{name}: Azure sent {path!r}, which the provider reads; the emulator does not")
        else:
            omitted.append(f"{name}: {path}")
    for path in sorted(set(sent) - set(azure)):
        if record["host"] == "arm" and leaf(path) in wire_names:
            added.append(f"{name}: {path}")
        else:
            problems.append(f"{name}: the emulator sends {path!r}; neither Azure's answer nor the REST models have it")
    for path in sorted(set(sent) & set(azure)):
        ours, theirs = sent[path] - {"null"}, azure[path] - {"null"}
        if ours and theirs and not ours <= theirs:
            problems.append(f"{name}: {path!r} is {sorted(sent[path])} here, {sorted(azure[path])} in Azure")
    for header in LRO_HEADERS:
        if header in ADDED_HEADERS and not record["lro_headers"].get(header):
            continue
        expected = record["lro_headers"].get(header, False)
        for response in responses:
            value = response["headers"].get(header.lower())
            if not expected and value is not None:
                problems.append(f"{name}: the emulator sends {header}, Azure did not")
            elif expected and value is None:
                problems.append(f"{name}: Azure sent {header}, the emulator does not")
            elif isinstance(expected, str) and value is not None:
                actual = header_target(value, response["path"])
                if not target_matches(expected, actual):
                    problems.append(f"{name}: {header} points at {actual}, Azure's at {expected}")
            else:
                continue
            break
    return problems


@pytest.fixture(scope="module")
def captured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Emulator, list[dict[str, Any]]]]:
    from tests.conftest import FAST

    capture = Capture()
    from tests.helpers import register_example_model

    with Emulator(tmp_path_factory.mktemp("conformance"), timing=FAST) as emulator:
        register_example_model(emulator)
        run_scenario(client(emulator, capture), emulator)
        discover(emulator, capture)
        yield emulator, capture.responses


def matching(record: dict[str, Any], responses: list[dict[str, Any]]) -> list[dict[str, Any]]:
    pattern = template_regex(record["path"])
    job_type = JOB_TYPES.get(record["interaction"])
    return [
        r
        for r in responses
        if r["method"] == record["method"]
        and r["status"] == record["status"]
        and pattern.search(r["path"])
        and (job_type is None or ((r["body"] or {}).get("properties") or {}).get("jobType") == job_type)
    ]


def test_the_emulator_answers_in_the_shapes_azure_recorded(
    captured: tuple[Emulator, list[dict[str, Any]]], record_property: Any
) -> None:
    _, responses = captured
    shapes = load_shapes()
    in_scope = {name: record for name, record in shapes.items() if name not in OUT_OF_SCOPE}
    problems: list[str] = []
    checked, unexercised = [], []
    omitted: list[str] = []
    added: list[str] = []
    wire_names = model_wire_names()
    for name, record in in_scope.items():
        found = matching(record, responses)
        if not found:
            unexercised.append(name)
            continue
        checked.append(name)
        problems += compare(record, found, wire_names, omitted, added)
    # printed in make test's summary by tests/conftest.py (pytest-xdist drops a worker's stdout)
    if checked:
        record_property(
            "conformance",
            f"conformance: {len(checked)} of {len(in_scope)} recorded interactions of the resources the provider "
            f"touches checked against the emulator ({len(shapes) - len(in_scope)} more recorded, out of scope); "
            f"not exercised: {', '.join(sorted(unexercised)) or 'none'}; "
            f"{len(omitted)} keys Azure sent left out (the provider never reads them), {len(added)} keys sent "
            f"beyond the recordings (in the SDK's REST models)",
        )
        record_property("conformance: left out", "; ".join(omitted))
        record_property("conformance: beyond the recordings", "; ".join(added))
    seen = sorted({(r["method"], r["status"], r["path"]) for r in responses})
    assert not problems, "\n".join(problems) + "\n\nresponses seen:\n" + "\n".join(map(str, seen))
    assert not unexercised, (unexercised, seen)
