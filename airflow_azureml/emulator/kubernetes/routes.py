"""The HTTP binding of each cluster's store under ``/k8s/{cluster}``, and control routes under ``/_emulator``.

Errors are Kubernetes ``Status`` objects (``api``); the objects' semantics are the store's (``store``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from aiohttp import web

from airflow_azureml.emulator.azure_rules import API_VERSION, GROUP, LIST_KIND, PLURAL, VERSION
from airflow_azureml.emulator.kubernetes.api import (
    K8S_PREFIX,
    KubeError,
    check_cluster_name,
    not_found,
    status_response,
)
from airflow_azureml.emulator.kubernetes.discovery import (
    OPENAPI_GROUP_DOCUMENT,
    OPENAPI_HASH,
    OPENAPI_V2_MIME,
    OPENAPI_V2_PROTOBUF,
    group_json,
    resource_list_document,
    version_document,
)
from airflow_azureml.emulator.kubernetes.store import KubeCluster


class ClusterHost(Protocol):
    """What the routes need from the workspace: its clusters. A protocol, so that this module (below
    ``models`` and the concept modules) never imports them: one direction per layer."""

    kube_clusters: dict[str, KubeCluster]

    def kube_cluster(self, name: str) -> KubeCluster: ...


class KubernetesRoutes:
    """Binds each cluster's store to HTTP under ``/k8s/{cluster}``, plus control routes under ``/_emulator``."""

    def __init__(self, ws: ClusterHost, *, kubeconfig_writer: Callable[[str], Path]) -> None:
        self.ws = ws
        self.kubeconfig_writer = kubeconfig_writer

    def add_to(self, app: web.Application) -> None:
        r = app.router
        base = "/k8s/{cluster}"
        group = f"{base}/apis/{GROUP}/{VERSION}"
        r.add_route("*", f"{group}/{PLURAL}", self.collection)
        r.add_route("*", f"{group}/{PLURAL}/{{name}}", self.item)
        discovery = {
            f"{base}/version": self.version,
            f"{base}/api": self.core_versions,
            f"{base}/api/v1": self.core_resources,
            f"{base}/apis": self.groups,
            f"{base}/apis/{GROUP}": self.group,
            group: self.resources,
            f"{base}/openapi/v2": self.openapi_v2,
            f"{base}/openapi/v3": self.openapi_root,
            f"{base}/openapi/v3/apis/{GROUP}/{VERSION}": self.openapi_group,
        }
        for path, handler in discovery.items():  # the generated clients ask with a trailing slash
            r.add_get(path, handler)
            r.add_get(path + "/", handler)
        r.add_route("*", base + "/{tail:.*}", self.unknown)
        r.add_get("/_emulator/kubernetes/{cluster}/instancetypes", self.control_objects)
        r.add_post("/_emulator/kubernetes/{cluster}/kubeconfig", self.control_kubeconfig)

    # ---------------------------------------------------------------- helpers
    def _cluster(self, request: web.Request, *, create: bool) -> KubeCluster | None:
        name = request.match_info["cluster"]
        try:
            check_cluster_name(name)
        except ValueError as exc:
            raise KubeError(404, "NotFound", str(exc)) from None
        return self.ws.kube_cluster(name) if create else self.ws.kube_clusters.get(name)

    @staticmethod
    async def _body(request: web.Request) -> Any:
        text = await request.text()
        if not text.strip():
            return None
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise KubeError(400, "BadRequest", f"the request body is not valid JSON: {exc}") from None

    @staticmethod
    def _dry_run(request: web.Request) -> bool:
        """``dryRun`` of a write; also checks its ``fieldValidation`` (kubectl sends ``Strict``).

        Unknown fields are always refused, whatever ``fieldValidation`` says: the strictest reading.
        """
        validation = request.query.get("fieldValidation")
        if validation not in (None, "", "Strict", "Warn", "Ignore"):
            raise KubeError(
                400, "BadRequest", f'fieldValidation must be one of "Ignore", "Warn" or "Strict", not "{validation}"'
            )
        value = request.query.get("dryRun")
        if value not in (None, "", "All"):
            raise KubeError(400, "BadRequest", f'unsupported dryRun value "{value}": only "All" is allowed')
        return value == "All"

    @staticmethod
    def _no_watch(request: web.Request) -> None:
        if request.query.get("watch", "").lower() in ("true", "1"):
            raise KubeError(405, "MethodNotAllowed", "watch is not supported by the emulator")

    # --------------------------------------------------------------- objects
    async def collection(self, request: web.Request) -> web.Response:
        try:
            if request.method == "GET":
                self._no_watch(request)
                cluster = self._cluster(request, create=False)
                store = cluster if cluster is not None else KubeCluster(name=request.match_info["cluster"])
                listed = store.list(request.query.get("labelSelector", ""), request.query.get("fieldSelector", ""))
                return web.json_response(listed)
            if request.method == "POST":
                dry_run = self._dry_run(request)
                body = await self._body(request)
                cluster = self._cluster(request, create=True)
                assert cluster is not None
                return web.json_response(cluster.create(body, dry_run=dry_run), status=201)
            if request.method == "DELETE":
                dry_run = self._dry_run(request)
                cluster = self._cluster(request, create=False)
                deleted = []
                if cluster is not None:
                    for item in cluster.list(request.query.get("labelSelector", ""))["items"]:
                        deleted.append(cluster.delete(item["metadata"]["name"], dry_run=dry_run))
                revision = str(cluster.revision) if cluster is not None else "0"
                meta = {"resourceVersion": revision}
                return web.json_response(
                    {"apiVersion": API_VERSION, "kind": LIST_KIND, "metadata": meta, "items": deleted}
                )
            raise _method_not_allowed(request)
        except KubeError as exc:
            return status_response(exc.code, exc.reason, exc.message, exc.details)

    async def item(self, request: web.Request) -> web.Response:
        name = request.match_info["name"]
        try:
            if request.method == "GET":
                cluster = self._cluster(request, create=False)
                if cluster is None:
                    raise not_found(name)
                return web.json_response(cluster.get(name))
            if request.method not in ("PUT", "PATCH", "DELETE"):
                raise _method_not_allowed(request)
            dry_run = self._dry_run(request)
            body = await self._body(request)
            cluster = self._cluster(request, create=False)
            if cluster is None:
                raise not_found(name)
            if request.method == "PUT":
                return web.json_response(cluster.replace(name, body, dry_run=dry_run))
            if request.method == "PATCH":
                content_type = request.headers.get("Content-Type", "").split(";", 1)[0].strip().lower()
                return web.json_response(cluster.patch(name, body, content_type, dry_run=dry_run))
            return web.json_response(cluster.delete(name, body, dry_run=dry_run))
        except KubeError as exc:
            return status_response(exc.code, exc.reason, exc.message, exc.details)

    async def unknown(self, request: web.Request) -> web.Response:
        return status_response(404, "NotFound", "the server could not find the requested resource", {})

    # -------------------------------------------------------------- discovery
    async def version(self, request: web.Request) -> web.Response:
        return web.json_response(version_document())

    async def core_versions(self, request: web.Request) -> web.Response:
        host = request.host
        return web.json_response(
            {
                "kind": "APIVersions",
                "versions": ["v1"],
                "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": host}],
            }
        )

    async def core_resources(self, request: web.Request) -> web.Response:
        return web.json_response({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "v1", "resources": []})

    async def groups(self, request: web.Request) -> web.Response:
        return web.json_response({"kind": "APIGroupList", "apiVersion": "v1", "groups": [group_json()]})

    async def group(self, request: web.Request) -> web.Response:
        return web.json_response({"kind": "APIGroup", "apiVersion": "v1", **group_json()})

    async def resources(self, request: web.Request) -> web.Response:
        return web.json_response(resource_list_document())

    async def openapi_root(self, request: web.Request) -> web.Response:
        """``/openapi/v3``: where each group-version's document is. kubectl reads it before it validates."""
        cluster = request.match_info["cluster"]
        url = f"{K8S_PREFIX}{cluster}/openapi/v3/apis/{GROUP}/{VERSION}?hash={OPENAPI_HASH}"
        return web.json_response({"paths": {f"apis/{GROUP}/{VERSION}": {"serverRelativeURL": url}}})

    async def openapi_group(self, request: web.Request) -> web.Response:
        return web.json_response(OPENAPI_GROUP_DOCUMENT)

    async def openapi_v2(self, request: web.Request) -> web.Response:
        """``/openapi/v2``, protobuf only (what kubectl asks for): a document with no definitions.

        kubectl falls back to it for kinds the v3 documents have no PATCH for, such as ``InstanceTypeList``,
        and validates nothing it has no schema for; the server still checks every item strictly.
        """
        return web.Response(body=OPENAPI_V2_PROTOBUF, content_type=OPENAPI_V2_MIME)

    # ---------------------------------------------------------------- control
    async def control_objects(self, request: web.Request) -> web.Response:
        cluster = self.ws.kube_clusters.get(request.match_info["cluster"])
        return web.json_response(dict(cluster.objects) if cluster is not None else {})

    async def control_kubeconfig(self, request: web.Request) -> web.Response:
        try:
            path = self.kubeconfig_writer(request.match_info["cluster"])
        except ValueError as exc:
            return web.json_response({"error": {"code": "BadRequest", "message": str(exc)}}, status=400)
        return web.json_response({"path": str(path), "kubeconfig": path.read_text()})


def _method_not_allowed(request: web.Request) -> KubeError:
    return KubeError(405, "MethodNotAllowed", f"the server does not allow this method ({request.method}) here")
