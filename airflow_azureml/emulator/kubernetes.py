"""The Kubernetes side of an attached cluster: the ``InstanceType`` custom-objects API.

Azure ML reads a Kubernetes compute's instance types from ``InstanceType`` custom resources
(``amlarc.azureml.com/v1alpha1``, cluster-scoped) in the attached cluster. This module serves that API
under ``/k8s/{cluster}`` on the emulator's port, so the official ``kubernetes`` client (and kubectl) can
create, read, list, patch, replace and delete them with a kubeconfig whose ``server`` is
``https://127.0.0.1:<port>/k8s/<cluster>``.

- Cluster ``X`` is the Kubernetes compute ``X`` of the workspace: its objects appear in the compute's ARM
  JSON (``properties.properties.instanceTypes``) and in the instance-type checks of jobs and deployments.
  A cluster exists before it is attached (objects applied to it are kept and show up on attach).
- Bodies are validated with the emulator's own copy of Azure's rules (``emulator.azure_rules``, never the
  provider's code); a bad one gets ``422 Invalid``.
- ``resourceVersion`` changes only when the stored object changes (spec, labels, annotations), and
  ``generation`` only when the spec changes, as in Kubernetes: a no-op update is observable.
- Errors are Kubernetes ``Status`` objects (404 NotFound, 409 AlreadyExists/Conflict, 422 Invalid...).
"""

from __future__ import annotations

import copy
import datetime as dt
import hashlib
import json
import re
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import yaml
from aiohttp import web

from airflow_azureml.emulator.azure_rules import (
    API_VERSION,
    DEFAULT_NAME,
    GROUP,
    KIND,
    LIST_KIND,
    PLURAL,
    VERSION,
    InstanceTypeRecord,
    RuleViolation,
    check_instance_type,
)
from airflow_azureml.emulator.certs import write_private


class ClusterHost(Protocol):
    """What the routes need from the workspace: its clusters. A protocol, so that this module (below
    ``models`` and ``runtime``) never imports them: one direction per layer."""

    kube_clusters: dict[str, KubeCluster]

    def kube_cluster(self, name: str) -> KubeCluster: ...


K8S_PREFIX = "/k8s/"
SINGULAR = "instancetype"
#: Kubernetes version reported by ``GET /k8s/{cluster}/version``.
GIT_VERSION = "v1.30.0"
#: Lifetime of the bearer token written into kubeconfigs (ten years: kubeconfigs are long-lived).
KUBECONFIG_TOKEN_LIFETIME = 10 * 365 * 24 * 3600
MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
_CLUSTER_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
_VERBS = ["delete", "deletecollection", "get", "list", "patch", "create", "update"]


class KubeError(Exception):
    """An API error, answered as a Kubernetes ``Status`` object."""

    def __init__(self, code: int, reason: str, message: str, details: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.reason = reason
        self.message = message
        self.details = details


def status_response(code: int, reason: str, message: str, details: dict[str, Any] | None = None) -> web.Response:
    """A Kubernetes ``Status`` (what the API server answers for every error)."""
    body: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success" if code < 400 else "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details:
        body["details"] = details
    return web.json_response(body, status=code)


def is_kubernetes_path(path: str) -> bool:
    return path.startswith(K8S_PREFIX)


def check_cluster_name(cluster: str) -> str:
    """Cluster names become URL segments and file names: keep them to compute-name characters."""
    if not isinstance(cluster, str) or not _CLUSTER_RE.match(cluster):
        raise ValueError(f"invalid cluster name {cluster!r}: use letters, digits, '-', '_' and '.'")
    return cluster


def _timestamp() -> str:
    return dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def _qualified(name: str) -> str:
    return f'{PLURAL}.{GROUP} "{name}"'


def _details(name: str | None, causes: list[dict[str, str]] | None = None) -> dict[str, Any]:
    details: dict[str, Any] = {"group": GROUP, "kind": PLURAL}
    if name:
        details["name"] = name
    if causes:
        details["causes"] = causes
    return details


def not_found(name: str) -> KubeError:
    return KubeError(404, "NotFound", f"{_qualified(name)} not found", _details(name))


def invalid(name: str, message: str, field_path: str = "") -> KubeError:
    cause = {"reason": "FieldValueInvalid", "message": message}
    if field_path:
        cause["field"] = field_path
    return KubeError(422, "Invalid", f'{KIND}.{GROUP} "{name}" is invalid: {message}', _details(name, [cause]))


def conflict(name: str) -> KubeError:
    return KubeError(
        409,
        "Conflict",
        f"Operation cannot be fulfilled on {_qualified(name)}: the object has been modified; "
        "please apply your changes to the latest version and try again",
        _details(name),
    )


# ------------------------------------------------------------------------------------------- patches
def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: maps merge, ``null`` deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def _pointer(path: Any) -> list[str]:
    if not isinstance(path, str) or (path and not path.startswith("/")):
        raise ValueError(f"invalid JSON pointer {path!r}")
    return [part.replace("~1", "/").replace("~0", "~") for part in path.split("/")[1:]] if path else []


def _parent(doc: Any, parts: list[str]) -> tuple[Any, str]:
    if not parts:
        raise ValueError("the whole document cannot be the target of this operation")
    node = doc
    for part in parts[:-1]:
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise ValueError(f"path /{'/'.join(parts)} does not exist")
    return node, parts[-1]


def _get(doc: Any, parts: list[str]) -> Any:
    node, last = _parent(doc, parts) if parts else (None, "")
    if not parts:
        return doc
    if isinstance(node, dict) and last in node:
        return node[last]
    if isinstance(node, list) and last.isdigit() and int(last) < len(node):
        return node[int(last)]
    raise ValueError(f"path /{'/'.join(parts)} does not exist")


def _remove(doc: Any, parts: list[str]) -> Any:
    node, last = _parent(doc, parts)
    value = _get(doc, parts)
    if isinstance(node, dict):
        del node[last]
    else:
        del node[int(last)]
    return value


def _add(doc: Any, parts: list[str], value: Any) -> Any:
    if not parts:
        return copy.deepcopy(value)
    node, last = _parent(doc, parts)
    if isinstance(node, dict):
        node[last] = copy.deepcopy(value)
    elif isinstance(node, list):
        if last == "-":
            node.append(copy.deepcopy(value))
        elif last.isdigit() and int(last) <= len(node):
            node.insert(int(last), copy.deepcopy(value))
        else:
            raise ValueError(f"index {last!r} is out of range")
    else:
        raise ValueError(f"path /{'/'.join(parts)} does not exist")
    return doc


def json_patch(doc: Any, operations: Any) -> Any:
    """RFC 6902 JSON patch (add, remove, replace, move, copy, test). Raises ValueError on failure."""
    if not isinstance(operations, list):
        raise ValueError("a JSON patch must be a list of operations")
    doc = copy.deepcopy(doc)
    for op in operations:
        if not isinstance(op, dict) or "op" not in op or "path" not in op:
            raise ValueError(f"invalid operation {op!r}")
        kind, parts = op["op"], _pointer(op["path"])
        if kind == "add":
            doc = _add(doc, parts, op.get("value"))
        elif kind == "remove":
            _remove(doc, parts)
        elif kind == "replace":
            _get(doc, parts)
            if not parts:
                doc = copy.deepcopy(op.get("value"))
            else:
                _remove(doc, parts)
                doc = _add(doc, parts, op.get("value"))
        elif kind in ("move", "copy"):
            source = _pointer(op.get("from"))
            value = _remove(doc, source) if kind == "move" else copy.deepcopy(_get(doc, source))
            doc = _add(doc, parts, value)
        elif kind == "test":
            if _get(doc, parts) != op.get("value"):
                raise ValueError(f"test failed at {op['path']}")
        else:
            raise ValueError(f"unknown operation {kind!r}")
    return doc


# ------------------------------------------------------------------------------------------ the store
def _string_map(value: Any, where: str, name: str) -> dict[str, str] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise invalid(name, f"{where} must be a map of strings to strings", where)
    return dict(value)


def _label_matcher(selector: str) -> Callable[[Mapping[str, str]], bool]:
    """Equality-based label selectors: ``k=v``, ``k==v``, ``k!=v``, ``k``, ``!k`` joined by commas."""
    tests: list[Callable[[Mapping[str, str]], bool]] = []
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            key, value = (s.strip() for s in term.split("!=", 1))
            tests.append(lambda labels, k=key, v=value: labels.get(k) != v)
        elif "=" in term:
            key, value = (s.strip() for s in term.replace("==", "=").split("=", 1))
            tests.append(lambda labels, k=key, v=value: labels.get(k) == v)
        elif term.startswith("!"):
            tests.append(lambda labels, k=term[1:].strip(): k not in labels)
        else:
            tests.append(lambda labels, k=term: k in labels)
    return lambda labels: all(test(labels) for test in tests)


@dataclass
class KubeCluster:
    """The ``InstanceType`` objects of one Kubernetes cluster (what its API server stores)."""

    name: str
    objects: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> stored object
    #: The Azure ML extension's nodeSelector; every instance type's nodeSelector must be a subset of it.
    extension_node_selector: dict[str, str] | None = None
    #: The last resourceVersion handed out (one counter per cluster, as etcd's revision).
    revision: int = 1000

    def _next_version(self) -> str:
        self.revision += 1
        return str(self.revision)

    # ------------------------------------------------------------------ views
    def instance_types(self) -> list[InstanceTypeRecord]:
        """The stored objects as the service reads them (they were validated when written)."""
        return [_model(obj) for obj in self.objects.values()]

    def compute_instance_types(self) -> dict[str, dict[str, Any]]:
        """``properties.instanceTypes`` entries of the attached compute, keyed by name."""
        return {t.name: t.compute_entry() for t in self.instance_types()}

    def get(self, name: str) -> dict[str, Any]:
        obj = self.objects.get(name)
        if obj is None:
            raise not_found(name)
        return copy.deepcopy(obj)

    def list(self, label_selector: str = "", field_selector: str = "") -> dict[str, Any]:
        matches = _label_matcher(label_selector)
        names: set[str] | None = None
        for term in filter(None, (t.strip() for t in field_selector.split(","))):
            key, _, value = term.replace("==", "=").partition("=")
            if key.strip() != "metadata.name":
                raise KubeError(400, "BadRequest", f'field label not supported: "{key.strip()}"')
            names = {value.strip()} if names is None else names & {value.strip()}
        items = [
            copy.deepcopy(obj)
            for name, obj in sorted(self.objects.items())
            if matches(obj["metadata"].get("labels") or {}) and (names is None or name in names)
        ]
        return {
            "apiVersion": API_VERSION,
            "kind": LIST_KIND,
            "metadata": {"resourceVersion": str(self.revision)},
            "items": items,
        }

    # --------------------------------------------------------------- writes
    def _checked(self, body: Any, name_hint: str | None) -> tuple[str, dict[str, Any], dict[str, Any]]:
        """Validate a full object body; returns ``(name, spec, metadata-to-keep)``."""
        if not isinstance(body, Mapping):
            raise KubeError(400, "BadRequest", "the request body must be a JSON object")
        metadata = body.get("metadata")
        name = metadata.get("name") if isinstance(metadata, Mapping) else None
        label = name if isinstance(name, str) and name else (name_hint or "")
        if body.get("kind") not in (None, KIND) or body.get("apiVersion") not in (None, API_VERSION):
            raise KubeError(
                400,
                "BadRequest",
                f"the API version in the data ({body.get('apiVersion')}) and kind ({body.get('kind')}) do not "
                f"match the expected {API_VERSION}, Kind={KIND}",
            )
        if name_hint is not None and isinstance(name, str) and name and name != name_hint:
            raise KubeError(
                400, "BadRequest", f"the name of the object ({name}) does not match the name on the URL ({name_hint})"
            )
        try:
            model = check_instance_type(name, body.get("spec"), self.extension_node_selector)
        except RuleViolation as exc:
            raise invalid(label, str(exc)) from None
        keep = {
            "labels": _string_map(metadata.get("labels"), "metadata.labels", model.name),
            "annotations": _string_map(metadata.get("annotations"), "metadata.annotations", model.name),
        }
        return model.name, copy.deepcopy(dict(body["spec"])), {k: v for k, v in keep.items() if v}

    def create(self, body: Any, *, dry_run: bool = False) -> dict[str, Any]:
        if isinstance(body, dict) and (body.get("metadata") or {}).get("resourceVersion"):
            raise KubeError(400, "BadRequest", "resourceVersion should not be set on objects to be created")
        name, spec, keep = self._checked(body, None)
        if name in self.objects:
            raise KubeError(409, "AlreadyExists", f"{_qualified(name)} already exists", _details(name))
        obj = {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": {
                "name": name,
                "uid": str(uuid.uuid4()),
                "resourceVersion": str(self.revision + 1) if dry_run else self._next_version(),
                "generation": 1,
                "creationTimestamp": _timestamp(),
                **keep,
            },
            "spec": spec,
        }
        if not dry_run:
            self.objects[name] = obj
        return copy.deepcopy(obj)

    def _check_preconditions(self, name: str, current: dict[str, Any], metadata: Any, *, required: bool) -> None:
        metadata = metadata if isinstance(metadata, Mapping) else {}
        wanted_version = metadata.get("resourceVersion")
        if wanted_version in (None, ""):
            if required:  # custom resources do not allow unconditional updates
                raise invalid(name, "metadata.resourceVersion: Invalid value: 0x0: must be specified for an update")
        elif str(wanted_version) != current["metadata"]["resourceVersion"]:
            raise conflict(name)
        uid = metadata.get("uid")
        if uid not in (None, "") and uid != current["metadata"]["uid"]:
            raise conflict(name)

    def replace(self, name: str, body: Any, *, dry_run: bool = False) -> dict[str, Any]:
        current = self.objects.get(name)
        if current is None:
            raise not_found(name)
        if not isinstance(body, Mapping):
            raise KubeError(400, "BadRequest", "the request body must be a JSON object")
        self._check_preconditions(name, current, body.get("metadata"), required=True)
        _, spec, keep = self._checked(body, name)
        return self._store(current, spec, keep, dry_run=dry_run)

    def patch(self, name: str, patch: Any, content_type: str, *, dry_run: bool = False) -> dict[str, Any]:
        current = self.objects.get(name)
        if current is None:
            raise not_found(name)
        if content_type == MERGE_PATCH:
            if not isinstance(patch, dict):
                raise KubeError(400, "BadRequest", "a merge patch must be a JSON object")
            patched = merge_patch(current, patch)
        elif content_type == JSON_PATCH:
            try:
                patched = json_patch(current, patch)
            except ValueError as exc:
                raise KubeError(422, "Invalid", f"the server rejected our request due to an error: {exc}") from None
        else:
            raise KubeError(
                415,
                "UnsupportedMediaType",
                f"the body of the request was in an unknown format ({content_type or 'none'}) - "
                f"accepted media types include: {JSON_PATCH}, {MERGE_PATCH}",
            )
        if not isinstance(patched, dict):
            raise KubeError(422, "Invalid", "the patched object is not a JSON object")
        metadata = patched.get("metadata") if isinstance(patched.get("metadata"), Mapping) else {}
        if metadata.get("name") != name:
            raise invalid(name, "metadata.name: Invalid value: field is immutable", "metadata.name")
        self._check_preconditions(name, current, metadata, required=False)
        _, spec, keep = self._checked(patched, name)
        return self._store(current, spec, keep, dry_run=dry_run)

    def _store(self, current: dict[str, Any], spec: dict[str, Any], keep: dict[str, Any], *, dry_run: bool) -> dict:
        metadata = current["metadata"]
        old_keep = {k: metadata[k] for k in ("labels", "annotations") if metadata.get(k)}
        spec_changed = spec != current["spec"]
        if not spec_changed and keep == old_keep:
            return copy.deepcopy(current)  # nothing changed: same resourceVersion, nothing written
        updated = copy.deepcopy(current)
        updated["spec"] = spec
        new_meta = {k: v for k, v in metadata.items() if k not in ("labels", "annotations")}
        new_meta.update(keep)
        new_meta["resourceVersion"] = str(self.revision + 1) if dry_run else self._next_version()
        if spec_changed:
            new_meta["generation"] = int(metadata.get("generation", 1)) + 1
        updated["metadata"] = new_meta
        if not dry_run:
            self.objects[metadata["name"]] = updated
        return copy.deepcopy(updated)

    def delete(self, name: str, options: Any = None, *, dry_run: bool = False) -> dict[str, Any]:
        current = self.objects.get(name)
        if current is None:
            raise not_found(name)
        preconditions = options.get("preconditions") if isinstance(options, Mapping) else None
        self._check_preconditions(name, current, preconditions, required=False)
        if not dry_run:
            del self.objects[name]
            self._next_version()
        return copy.deepcopy(current)


def _model(obj: Mapping[str, Any]) -> InstanceTypeRecord:
    return check_instance_type(obj["metadata"]["name"], obj["spec"])


def merge_compute_instance_types(
    arm_types: Mapping[str, Any] | None, cluster: KubeCluster | None, default: dict[str, Any]
) -> dict[str, dict[str, Any]]:
    """The compute's ``instanceTypes``: what ARM was given, overridden by the cluster's objects (names match
    case-insensitively), and the built-in ``defaultinstancetype`` unless one of those defines it."""
    types: dict[str, dict[str, Any]] = dict(arm_types or {})
    for name, entry in (cluster.compute_instance_types() if cluster is not None else {}).items():
        for existing in [k for k in types if k.lower() == name.lower()]:
            del types[existing]
        types[name] = entry
    if not any(k.lower() == DEFAULT_NAME for k in types):
        types[DEFAULT_NAME] = default
    return types


def kubeconfig_document(cluster: str, server: str, ca_cert: str, token: str) -> dict[str, Any]:
    """A kubeconfig with one cluster, one user (bearer token) and one context, all named after the cluster."""
    user = f"{cluster}-admin"
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "preferences": {},
        "clusters": [{"name": cluster, "cluster": {"server": server, "certificate-authority": ca_cert}}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": cluster, "context": {"cluster": cluster, "user": user}}],
        "current-context": cluster,
    }


def write_kubeconfig(path: Path, document: dict[str, Any]) -> Path:
    """Write atomically and owner-only from the start: the file holds a bearer token."""
    return write_private(path, yaml.safe_dump(document, sort_keys=False))


# ------------------------------------------------------------------------------------------- routes
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
        major, minor = GIT_VERSION[1:].split(".")[:2]
        return web.json_response(
            {
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
        )

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

    @staticmethod
    def _group_json() -> dict[str, Any]:
        version = {"groupVersion": API_VERSION, "version": VERSION}
        return {"name": GROUP, "versions": [version], "preferredVersion": version}

    async def groups(self, request: web.Request) -> web.Response:
        return web.json_response({"kind": "APIGroupList", "apiVersion": "v1", "groups": [self._group_json()]})

    async def group(self, request: web.Request) -> web.Response:
        return web.json_response({"kind": "APIGroup", "apiVersion": "v1", **self._group_json()})

    async def resources(self, request: web.Request) -> web.Response:
        return web.json_response(
            {
                "kind": "APIResourceList",
                "apiVersion": "v1",
                "groupVersion": API_VERSION,
                "resources": [
                    {
                        "name": PLURAL,
                        "singularName": SINGULAR,
                        "namespaced": False,
                        "kind": KIND,
                        "verbs": _VERBS,
                        "storageVersionHash": "emulator",
                    }
                ],
            }
        )

    async def openapi_root(self, request: web.Request) -> web.Response:
        """``/openapi/v3``: where each group-version's document is. kubectl reads it before it validates."""
        cluster = request.match_info["cluster"]
        url = f"{K8S_PREFIX}{cluster}/openapi/v3/apis/{GROUP}/{VERSION}?hash={_OPENAPI_HASH}"
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
_OPENAPI_HASH = hashlib.sha256(json.dumps(OPENAPI_GROUP_DOCUMENT, sort_keys=True).encode()).hexdigest()[:32].upper()


def _method_not_allowed(request: web.Request) -> KubeError:
    return KubeError(405, "MethodNotAllowed", f"the server does not allow this method ({request.method}) here")
