"""The workspace's model and environment registry: model versions and environment versions.

``AssetRegistry`` is the part of ``Workspace`` that registers models (the demo model at start-up) and
environment versions (whose definition never changes once created); ``RegistryRoutes`` the part of
``Routes`` that serves them as ARM does. Code versions, the third kind of versioned asset, live in
``emulator.codes`` with their uploads. ``version_key`` orders versions as Azure does (numbers first).
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from airflow_azureml.emulator.arm import PROVIDER
from airflow_azureml.emulator.errors import EmulatorError, method_not_allowed, not_found
from airflow_azureml.emulator.models import TrackedResource, system_data, utcnow

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
