"""The workspace's model and environment registry: model versions and environment versions.

``AssetRegistry`` is the part of ``Workspace`` that registers models (the demo model at start-up, and
any model version a client PUTs, e.g. ``ml_client.models.create_or_update``) and environment versions
(whose definition never changes once created); ``RegistryRoutes`` the part of ``Routes`` that serves
them as ARM does. Code versions, the third kind of versioned asset, live in ``emulator.codes`` with
their uploads. ``version_key`` orders versions as Azure does (numbers first).

A model version's files must already be on a datastore (``modelUri`` ``azureml://datastores/...``): the
SDK uploads a local model folder to the workspace storage account's own host name
(``https://<account>.blob.core.windows.net``), which the emulator cannot answer, so a local ``path`` fails
in the SDK before any request reaches the emulator (docs/emulator.md, "Models"). An ``mlflow_model``
version's folder must hold an ``MLmodel`` file ("The folder must include the MLmodel file", Microsoft
Learn, *Deploy your MLflow model to a batch endpoint*); its flavours are read from it, as the service
shows them on the version (``ModelVersion.flavors``, swagger 2024-10-01).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from aiohttp import web

from airflow_azureml.emulator.arm import PROVIDER
from airflow_azureml.emulator.errors import EmulatorError, method_not_allowed, not_found
from airflow_azureml.emulator.models import TrackedResource, system_data, utcnow

# ModelVersion (swagger 2024-10-01): modelUri and modelType are the definition; these may change.
_MODEL_MUTABLE = ("description", "tags", "properties", "isArchived", "stage")
MLFLOW_TYPES = ("mlflow_model", "mlflowmodel")

# An environment version's create-only properties (swagger 2024-10-01, x-ms-mutability: create, read).
_ENVIRONMENT_DEFINITION = ("image", "condaFile", "build", "inferenceConfig", "osType", "autoRebuild")


def version_key(version: str) -> tuple[int, str]:
    return (int(version), "") if version.isdigit() else (-1, version)


def model_name_from_asset(asset: str) -> str | None:
    if not asset:
        return None
    if "/models/" in asset:
        return asset.split("/models/", 1)[1].split("/", 1)[0]
    text = asset[len("azureml:") :] if asset.startswith("azureml:") else asset
    return text.split(":", 1)[0].split("@", 1)[0]


class AssetRegistry:
    """The part of ``Workspace`` (emulator.workspace) that holds models and environment versions."""

    def register_model(self, name: str, version: str, *, scoring_module: str | None = None) -> None:
        now = utcnow().isoformat()
        self.models.setdefault(name, {})[version] = {
            "description": "demo model served by the emulator",
            "modelType": "mlflow_model",
            "flavors": {"python_function": {"data": {"loader_module": "mlflow.pyfunc.model"}}},
            "modelUri": f"azureml://datastores/workspaceblobstore/paths/models/{name}/{version}",
            "properties": {},
            "tags": {},
            "createdAt": now,
        }
        if scoring_module:
            self.scoring.register(name, scoring_module)

    def put_model_version(self, name: str, version: str, body: dict[str, Any]) -> bool:
        """Register a model version (True: created); its files must be on a datastore already.

        Versions are create-only, as code versions: the same ``modelUri`` again updates the description
        and tags (200), another one is refused with the service's "Asset paths cannot be updated."
        """
        props = body.get("properties") or {}
        uri = str(props.get("modelUri") or "")
        model_type = str(props.get("modelType") or "custom_model")
        existing = (self.models.get(name) or {}).get(version)
        if existing is not None:
            if existing.get("modelUri") != uri or str(existing.get("modelType")).lower() != model_type.lower():
                raise EmulatorError(400, "UserError", "Asset paths cannot be updated.")
            existing.update({k: props[k] for k in _MODEL_MUTABLE if k in props})
            return False
        if not uri.startswith("azureml://"):
            raise EmulatorError(
                400,
                "UserError",
                f"Model path {uri!r} is not on a datastore of this workspace: the emulator takes "
                "azureml://datastores/<name>/paths/<path> (upload the files there first).",
            )
        folder = self.resolve_uri(uri, existing=True)
        if not folder.exists():
            raise EmulatorError(400, "UserError", f"The model path {uri!r} does not exist in the workspace's storage.")
        flavors = props.get("flavors")
        if model_type.lower() in MLFLOW_TYPES:
            flavors = mlmodel_flavors(folder, uri)
        self.models.setdefault(name, {})[version] = {
            "description": props.get("description"),
            "modelType": model_type,
            "flavors": flavors or {},  # never null: azure-ai-ml reads .items() of what it gets
            "modelUri": uri,
            "properties": dict(props.get("properties") or {}),
            "tags": dict(props.get("tags") or {}),
            "createdAt": utcnow().isoformat(),
        }
        return True

    def put_environment_version(self, name: str, version: str, body: dict[str, Any]) -> tuple[TrackedResource, bool]:
        """Create an environment version, or update its description/tags; its definition never changes.

        The swagger (2024-10-01, ``EnvironmentVersion``) marks image, condaFile, build, inferenceConfig,
        osType and autoRebuild ``x-ms-mutability: [create, read]``: another definition under an existing
        version is refused (409, as the SDK's ``ResourceExistsError`` handling expects), the same one is a 200.
        """
        props = body.get("properties") or {}
        existing = self.environments.get((name, version))
        if existing is None:
            self.environments[(name, version)] = TrackedResource(name=version, body=body)
            return self.environments[(name, version)], True
        have = existing.body.get("properties") or {}
        changed = [k for k in _ENVIRONMENT_DEFINITION if have.get(k) != props.get(k)]
        if changed:
            raise EmulatorError(
                409,
                "UserError",
                f"Environment {name}:{version} already exists with another {', '.join(changed)}; "
                "an environment version cannot be changed, create a new version.",
            )
        mutable = {k: props[k] for k in ("description", "tags", "properties", "isArchived", "stage") if k in props}
        existing.body = {**existing.body, "properties": {**have, **mutable}}
        existing.modified = utcnow()
        return existing, False


def mlmodel_flavors(folder: Path, uri: str) -> dict[str, Any]:
    """The flavours of the MLflow model in ``folder`` (its ``MLmodel`` file), as ``ModelVersion.flavors``."""
    mlmodel = folder / "MLmodel" if folder.is_dir() else None
    if mlmodel is None or not mlmodel.is_file():
        raise EmulatorError(
            400,
            "UserError",
            f"No MLmodel file found in {uri!r}: a model of type mlflow_model is a folder with an MLmodel file "
            "at its root.",
        )
    try:
        text = yaml.safe_load(mlmodel.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise EmulatorError(400, "UserError", f"The MLmodel file in {uri!r} cannot be read: {exc}") from None
    flavors = (text or {}).get("flavors") if isinstance(text, dict) else None
    if not isinstance(flavors, dict) or not flavors:
        raise EmulatorError(400, "UserError", f"The MLmodel file in {uri!r} names no flavors.")
    return {
        str(k): {"data": {dk: str(dv) for dk, dv in (v or {}).items() if dv is not None and not isinstance(dv, dict)}}
        for k, v in flavors.items()
    }


class RegistryRoutes:
    """The part of ``Routes`` (emulator.routes) that serves models and environment versions."""

    def _model_version_json(self, name: str, version: str) -> dict[str, Any]:
        data = self.ws.models[name][version]
        props = {k: v for k, v in data.items() if k != "createdAt"}
        props.update({"isArchived": False, "stage": "Development", "provisioningState": "Succeeded"})
        return {
            "id": f"{self.ws_id}/models/{name}/versions/{version}",
            "name": version,
            "type": f"{PROVIDER}/workspaces/models/versions",
            "properties": props,
            "systemData": {"createdAt": data["createdAt"], "createdBy": "emulator", "createdByType": "Application"},
        }

    async def get_model_container(self, request: web.Request) -> web.Response:
        self._check_scope(request)
        name = request.match_info["name"]
        if name not in self.ws.models:
            return not_found("models", name)
        latest = max(self.ws.models[name], key=version_key)
        return web.json_response(
            {
                "id": f"{self.ws_id}/models/{name}",
                "name": name,
                "type": f"{PROVIDER}/workspaces/models",
                "properties": {
                    "latestVersion": latest,
                    "nextVersion": str(int(latest) + 1) if latest.isdigit() else None,
                    "isArchived": False,
                    "tags": {},
                    "properties": {},
                },
            }
        )

    async def list_model_versions(self, request: web.Request) -> web.Response:
        self._check_scope(request)
        name = request.match_info["name"]
        versions = sorted(self.ws.models.get(name, {}), key=version_key, reverse=True)
        if request.query.get("version"):
            versions = [v for v in versions if v == request.query["version"]]
        top = request.query.get("$top")
        if top:
            versions = versions[: int(top)]
        return web.json_response({"value": [self._model_version_json(name, v) for v in versions]})

    async def get_model_version(self, request: web.Request) -> web.Response:
        self._check_scope(request)
        name, version = request.match_info["name"], request.match_info["version"]
        if request.method == "PUT":
            created = self.ws.put_model_version(name, version, await request.json())
            return web.json_response(self._model_version_json(name, version), status=201 if created else 200)
        if request.method != "GET":
            return method_not_allowed()
        if version not in self.ws.models.get(name, {}):
            return not_found("models", f"{name}:{version}")
        return web.json_response(self._model_version_json(name, version))

    def _environment_json(self, name: str, version: str) -> dict[str, Any]:
        resource = self.ws.environments[(name, version)]
        props = dict(resource.body.get("properties") or {})
        for key, default in (("autoRebuild", "Disabled"), ("osType", "Linux"), ("isAnonymous", False)):
            props.setdefault(key, default)  # the swagger's defaults, as the service fills them in
        for key, empty in (("description", None), ("tags", {}), ("properties", {})):
            props.setdefault(key, empty)  # environment_version.put: sent even when not set
        props.update({"isArchived": False, "environmentType": "UserCreated", "provisioningState": "Succeeded"})
        return {
            "id": f"{self.ws_id}/environments/{name}/versions/{version}",
            "name": version,
            "type": f"{PROVIDER}/workspaces/environments/versions",
            "properties": props,
            "systemData": system_data(resource.created, resource.modified),
        }

    async def environment_version(self, request: web.Request) -> web.Response:
        """The SDK registers an inline environment (``CliV2AnonymousEnvironment``) here before a deployment."""
        self._check_scope(request)
        name, version = request.match_info["name"], request.match_info["version"]
        if request.method == "GET":
            if (name, version) not in self.ws.environments:
                return not_found("environments", f"{name}:{version}")
            return web.json_response(self._environment_json(name, version))
        if request.method == "PUT":
            _, created = self.ws.put_environment_version(name, version, await request.json())
            headers = {"Location": str(request.url)} if created else {}
            return web.json_response(
                self._environment_json(name, version), status=201 if created else 200, headers=headers
            )
        return method_not_allowed()
