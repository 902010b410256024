"""Code assets: what a deployment with a local ``code_configuration.code`` folder is registered as.

azure-ai-ml (``operations/_code_operations.py``) registers the folder as an anonymous code version
named after its content hash:

1. ``GET .../codes/{name}/versions?hash=<sha256>&hashVersion=<n>``: a version with that content
   already? Then it is reused, and nothing is uploaded.
2. ``POST .../codes/{name}/versions/{version}/startPendingUpload`` (``{"pendingUploadType":
   "TemporaryBlobReference"}``): the service answers where to upload, a container-level SAS
   (swagger 2024-10-01 ``PendingUploadResponseDto``); the SDK uploads there (``emulator.blobs``).
3. ``PUT .../codes/{name}/versions/{version}`` with ``codeUri`` (the uploaded folder) and the hash in
   ``properties``. Versions are create-only: the same body again is a 200, another ``codeUri`` under
   an existing version ``400 UserError`` "Asset paths cannot be updated." (the text azure-ai-ml turns
   into its ``AssetPathException``, ``_artifacts/_constants.ASSET_PATH_ERROR``).

The deployment then names the version by ARM id (``codeConfiguration.codeId``), and its jobs run the
scoring script from the uploaded copy (``emulator.scoring.script``).
"""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from aiohttp import web

from airflow_azureml.emulator.blobs import ACCOUNT, BlobStore
from airflow_azureml.emulator.errors import method_not_allowed
from airflow_azureml.emulator.models import system_data, utcnow

PROVIDER = "Microsoft.MachineLearningServices"
# CodeVersion (swagger 2024-10-01): codeUri and isAnonymous are the definition; description, tags,
# properties and isArchived may change.
_DEFINITION = ("codeUri", "isAnonymous")
_MUTABLE = ("description", "tags", "properties", "isArchived")


@dataclass
class CodeVersion:
    name: str
    version: str
    properties: dict[str, Any]
    created: dt.datetime = field(default_factory=utcnow)
    modified: dt.datetime = field(default_factory=utcnow)


class CodeConflict(Exception):
    pass


class CodeAssets:
    """The workspace's code versions and the uploads they came from. Runs on the emulator's loop."""

    def __init__(self, blobs: BlobStore) -> None:
        self.blobs = blobs
        self.versions: dict[tuple[str, str], CodeVersion] = {}
        self.pending_uploads: list[dict[str, str]] = []  # name, version, container of each startPendingUpload

    def put(self, name: str, version: str, body: dict[str, Any]) -> tuple[CodeVersion, bool]:
        props = dict(body.get("properties") or {})
        if isinstance(props.get("properties"), dict):  # Dict[str, str] in the swagger: the service keeps strings
            props["properties"] = {str(k): None if v is None else str(v) for k, v in props["properties"].items()}
        existing = self.versions.get((name, version))
        if existing is None:
            props.setdefault("isAnonymous", False)
            code = self.versions[(name, version)] = CodeVersion(name=name, version=version, properties=props)
            return code, True
        changed = [k for k in _DEFINITION if existing.properties.get(k) != props.get(k, existing.properties.get(k))]
        if changed:  # the service's words, as azure-ai-ml matches them (_artifacts/_constants.ASSET_PATH_ERROR)
            raise CodeConflict("Asset paths cannot be updated.")
        existing.properties.update({k: props[k] for k in _MUTABLE if k in props})
        existing.modified = utcnow()
        return existing, False

    def start_pending_upload(self, name: str, version: str) -> dict[str, Any]:
        container = self.blobs.create_container()
        self.pending_uploads.append({"name": name, "version": version, "container": container.name})
        return {
            "blobReferenceForConsumption": {
                "blobUri": self.blobs.container_url(container),
                "credential": {"credentialType": "SAS", "sasUri": self.blobs.sas_url(container)},
                "storageAccountArmId": None,  # filled in by the routes (it needs the workspace's scope)
            },
            "pendingUploadId": str(uuid.uuid4()),
            "pendingUploadType": "TemporaryBlobReference",
        }

    def folder(self, code_id: str) -> Path | None:
        """The uploaded folder of the code version an ARM id (``.../codes/{name}/versions/{v}``) names."""
        code = self.by_id(code_id)
        uri = str(code.properties.get("codeUri") or "") if code else ""
        return self.blobs.folder(uri) if uri else None

    def by_id(self, code_id: str) -> CodeVersion | None:
        text = str(code_id or "")
        if "/codes/" not in text or "/versions/" not in text:
            return None
        name, _, version = text.split("/codes/", 1)[1].partition("/versions/")
        return self.versions.get((name, version.strip("/")))


class CodeRoutes:
    """ARM routes of code versions, and the storage account's blob site."""

    def __init__(self, codes: CodeAssets, routes: Any) -> None:
        self.codes = codes
        self.routes = routes  # emulator.routes.Routes: the workspace's ARM id and scope check

    def add_to(self, app: web.Application) -> None:
        w = "/subscriptions/{sub}/resourceGroups/{rg}/providers/" + PROVIDER + "/workspaces/{ws}"
        app.router.add_get(w + "/codes/{name}/versions", self.list_versions)
        app.router.add_route("*", w + "/codes/{name}/versions/{version}", self.version)
        app.router.add_post(w + "/codes/{name}/versions/{version}/startPendingUpload", self.start_pending_upload)

    def _json(self, code: CodeVersion) -> dict[str, Any]:
        props = {"description": None, "tags": {}, "properties": {}, "isArchived": False, **code.properties}
        props["provisioningState"] = "Succeeded"
        return {
            "id": f"{self.routes.ws_id}/codes/{code.name}/versions/{code.version}",
            "name": code.version,
            "type": f"{PROVIDER}/workspaces/codes/versions",
            "properties": props,
            "systemData": system_data(code.created, code.modified),
        }

    async def list_versions(self, request: web.Request) -> web.Response:
        """Filtered by ``hash``/``hashVersion`` (the asset's ``hash_sha256``/``hash_version`` properties)."""
        self.routes._check_scope(request)
        name = request.match_info["name"]
        found = [c for (n, _), c in self.codes.versions.items() if n == name]
        want_hash, want_version = request.query.get("hash"), request.query.get("hashVersion")
        if want_hash is not None:
            found = [c for c in found if (c.properties.get("properties") or {}).get("hash_sha256") == want_hash]
        if want_version is not None:
            found = [c for c in found if (c.properties.get("properties") or {}).get("hash_version") == want_version]
        found.sort(key=lambda c: c.created, reverse=True)
        top = request.query.get("$top")
        if top and top.isdigit():
            found = found[: int(top)]
        return web.json_response({"value": [self._json(c) for c in found]})

    async def version(self, request: web.Request) -> web.Response:
        self.routes._check_scope(request)
        name, version = request.match_info["name"], request.match_info["version"]
        if request.method == "GET":
            code = self.codes.versions.get((name, version))
            if code is None:
                return _error(404, "ResourceNotFound", f"The resource 'codes/{name}:{version}' was not found.")
            return web.json_response(self._json(code))
        if request.method == "PUT":
            body = await request.json()
            uri = str((body.get("properties") or {}).get("codeUri") or "")
            if uri.startswith(self.codes.blobs.base_url + f"/{ACCOUNT}/") and self.codes.blobs.folder(uri) is None:
                return _error(400, "UserError", f"The code path {uri!r} does not exist in the workspace's storage.")
            try:
                code, created = self.codes.put(name, version, body)
            except CodeConflict as exc:
                return _error(400, "UserError", str(exc))
            headers = {"Location": str(request.url)} if created else {}  # a created version's 201 names itself
            return web.json_response(self._json(code), status=201 if created else 200, headers=headers)
        return method_not_allowed()

    async def start_pending_upload(self, request: web.Request) -> web.Response:
        self.routes._check_scope(request)
        body = await request.json() if request.can_read_body else {}
        kind = (body or {}).get("pendingUploadType", "TemporaryBlobReference")
        if kind != "TemporaryBlobReference":
            return _error(400, "UserError", f"pendingUploadType {kind!r} is not supported: TemporaryBlobReference.")
        answer = self.codes.start_pending_upload(request.match_info["name"], request.match_info["version"])
        scope = self.routes.ws_id.split("/providers/", 1)[0]
        answer["blobReferenceForConsumption"]["storageAccountArmId"] = (
            f"{scope}/providers/Microsoft.Storage/storageAccounts/{ACCOUNT}"
        )
        return web.json_response(answer)


def _error(status: int, code: str, message: str) -> web.Response:
    return web.json_response({"error": {"code": code, "message": message, "details": []}}, status=status)
