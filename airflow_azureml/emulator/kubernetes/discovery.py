"""What clients read before they call: the server version, the API group and its resources, and the
OpenAPI documents (v3 for ``amlarc.azureml.com/v1alpha1``; an empty protobuf v2 for kubectl's fallback)."""

from __future__ import annotations

import hashlib
import json
from typing import Any

from airflow_azureml.emulator.azure_rules import API_VERSION, GROUP, KIND, LIST_KIND, PLURAL, VERSION
from airflow_azureml.emulator.kubernetes.patches import JSON_PATCH, MERGE_PATCH

SINGULAR = "instancetype"
#: Kubernetes version reported by ``GET /k8s/{cluster}/version``.
GIT_VERSION = "v1.30.0"
VERBS = ["delete", "deletecollection", "get", "list", "patch", "create", "update"]


def version_document() -> dict[str, Any]:
    """``GET /version``."""
    major, minor = GIT_VERSION[1:].split(".")[:2]
    return {
        "major": major,
        "minor": minor,
        "gitVersion": GIT_VERSION,
        "gitCommit": "emulator",
        "gitTreeState": "clean",
        "buildDate": "2024-01-01T00:00:00Z",
        "goVersion": "go1.22.0",
        "compiler": "gc",
        "platform": "linux/amd64",
    }


def group_json() -> dict[str, Any]:
    """The ``amlarc.azureml.com`` group, as ``/apis`` lists it and ``/apis/{group}`` answers it."""
    version = {"groupVersion": API_VERSION, "version": VERSION}
    return {"name": GROUP, "versions": [version], "preferredVersion": version}


def resource_list_document() -> dict[str, Any]:
    """``GET /apis/{group}/{version}``: the one resource served, cluster-scoped."""
    return {
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": API_VERSION,
        "resources": [
            {
                "name": PLURAL,
                "singularName": SINGULAR,
                "namespaced": False,
                "kind": KIND,
                "verbs": VERBS,
                "storageVersionHash": "emulator",
            }
        ],
    }


def _openapi_group_document() -> dict[str, Any]:
    """The OpenAPI v3 document of ``amlarc.azureml.com/v1alpha1``, as an API server publishes it for a CRD.

    kubectl (1.27+) reads the PATCH operation's parameters: ``fieldValidation`` there means the server
    validates (``?fieldValidation=Strict``), so kubectl needs no schema of its own. The PATCH body types are
    a custom resource's (no strategic merge), so ``kubectl apply`` sends a JSON merge patch.
    """
    gvk = [{"group": GROUP, "version": VERSION, "kind": KIND}]
    schema_name = f"com.azure.azureml.amlarc.{VERSION}.{KIND}"
    ref = {"$ref": f"#/components/schemas/{schema_name}"}
    quantity = {"anyOf": [{"type": "integer"}, {"type": "string"}], "x-kubernetes-int-or-string": True}
    resource_list = {"type": "object", "additionalProperties": quantity}
    item_schema = {
        "type": "object",
        "description": "An Azure ML instance type: a nodeSelector and the pods' resources.",
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "spec": {
                "type": "object",
                "properties": {
                    "nodeSelector": {"type": "object", "additionalProperties": {"type": "string"}},
                    "resources": {
                        "type": "object",
                        "properties": {"limits": resource_list, "requests": resource_list},
                    },
                },
            },
        },
        "x-kubernetes-group-version-kind": gvk,
    }
    list_schema = {
        "type": "object",
        "required": ["items"],
        "properties": {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": {"type": "object"},
            "items": {"type": "array", "items": ref},
        },
        "x-kubernetes-group-version-kind": [{**gvk[0], "kind": LIST_KIND}],
    }

    def query(name: str) -> dict[str, Any]:
        return {"name": name, "in": "query", "schema": {"type": "string", "uniqueItems": True}}

    write_params = [query("dryRun"), query("fieldManager"), query("fieldValidation")]
    json_body = {"content": {"application/json": {"schema": ref}}, "required": True}
    ok = {"200": {"description": "OK", "content": {"application/json": {"schema": ref}}}}
    created = {**ok, "201": {"description": "Created", "content": {"application/json": {"schema": ref}}}}

    def op(action: str, **extra: Any) -> dict[str, Any]:
        # on an operation the extension is one object; on a schema, a list of them
        return {"x-kubernetes-action": action, "x-kubernetes-group-version-kind": gvk[0], **extra}

    collection = f"/apis/{GROUP}/{VERSION}/{PLURAL}"
    patch_types = (JSON_PATCH, MERGE_PATCH, "application/apply-patch+yaml")
    return {
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes CRD Swagger", "version": "v0.1.0"},
        "paths": {
            collection: {
                "get": op("list", responses=ok),
                "post": op("post", parameters=write_params, requestBody=json_body, responses=created),
                "delete": op("deletecollection", parameters=[query("dryRun")], responses=ok),
            },
            f"{collection}/{{name}}": {
                "parameters": [{"name": "name", "in": "path", "required": True, "schema": {"type": "string"}}],
                "get": op("get", responses=ok),
                "put": op("put", parameters=write_params, requestBody=json_body, responses=created),
                "patch": op(
                    "patch",
                    parameters=[*write_params, query("force")],
                    requestBody={"content": {t: {"schema": {"type": "object"}} for t in patch_types}, "required": True},
                    responses=ok,
                ),
                "delete": op("delete", parameters=[query("dryRun")], responses=ok),
            },
        },
        "components": {"schemas": {schema_name: item_schema, f"{schema_name}List": list_schema}},
    }


def _protobuf_field(number: int, payload: bytes) -> bytes:
    """One length-delimited protobuf field (enough to encode gnostic's ``openapi_v2.Document`` strings)."""

    def varint(value: int) -> bytes:
        out = bytearray()
        while True:
            out.append((value & 0x7F) | (0x80 if value > 0x7F else 0))
            value >>= 7
            if not value:
                return bytes(out)

    return varint(number << 3 | 2) + varint(len(payload)) + payload


OPENAPI_V2_MIME = "application/com.github.proto-openapi.spec.v2.v1.0+protobuf"  # as an API server labels it
#: ``Document{swagger: "2.0", info: {title: "Kubernetes", version: GIT_VERSION}}``.
OPENAPI_V2_PROTOBUF = _protobuf_field(1, b"2.0") + _protobuf_field(
    2, _protobuf_field(1, b"Kubernetes") + _protobuf_field(2, GIT_VERSION.encode())
)
OPENAPI_GROUP_DOCUMENT = _openapi_group_document()
OPENAPI_HASH = hashlib.sha256(json.dumps(OPENAPI_GROUP_DOCUMENT, sort_keys=True).encode()).hexdigest()[:32].upper()
