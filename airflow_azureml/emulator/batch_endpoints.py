"""Batch endpoints and deployments, and a deployment's batch settings.

``BatchEndpointStore`` is the part of ``Workspace`` that creates and changes batch endpoints (Microsoft
Entra tokens only) and deployments, checked as the service checks them when written: the compute, the
model, the code and its scoring script, on Kubernetes the deployment's own resources against its instance
type and an MLflow model's minimum resources, and the batch settings. ``BatchSettings`` reads those
settings (with an invoke's overrides) and refuses a bad value with a 400. ``BatchEndpointRoutes`` is the
part of ``Routes`` that serves both resources. The invoke that runs a deployment is ``emulator.invoke``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any

from aiohttp import web

from airflow_azureml.emulator.arm import PROVIDER, short_name
from airflow_azureml.emulator.azure_rules import (
    DEFAULT_NAME,
    RuleViolation,
    check_mlflow_minimum,
    check_output_file_name,
    check_resources,
    from_compute_entry,
)
from airflow_azureml.emulator.computes import check_resource_name
from airflow_azureml.emulator.errors import EmulatorError, method_not_allowed, not_found
from airflow_azureml.emulator.models import TrackedResource, parse_duration_seconds, utcnow
from airflow_azureml.emulator.registry import MLFLOW_TYPES, model_name_from_asset

# Resource names as Azure ML documents them (as computes.COMPUTE_NAME; the provider keeps its own rules).
ENDPOINT_NAME = re.compile(r"[A-Za-z][A-Za-z0-9-]{1,30}[A-Za-z0-9]")


class BatchEndpointStore:
    """The part of ``Workspace`` (emulator.workspace) that holds batch endpoints and deployments."""

    def put_endpoint(self, name: str, body: dict[str, Any]) -> tuple[TrackedResource, bool]:
        existing = self.endpoints.get(name)
        auth_mode = (body.get("properties") or {}).get("authMode", "AADToken")
        if (
            str(auth_mode).lower() != "aadtoken"
        ):  # batch endpoints take Microsoft Entra tokens only (the SDK sends aadToken)
            raise EmulatorError(400, "BadRequest", f"authMode {auth_mode!r} is not supported by batch endpoints")
        if existing is None:
            check_resource_name("batch endpoint", name, ENDPOINT_NAME, "3-32 characters: letters, digits and '-'")
        if existing is None:
            self.endpoints[name] = TrackedResource(name=name, body=body)
            return self.endpoints[name], True
        existing.body = body
        existing.modified = utcnow()
        return existing, False

    def put_deployment(self, endpoint: str, name: str, body: dict[str, Any]) -> tuple[TrackedResource, bool]:
        if endpoint not in self.endpoints:
            raise EmulatorError(404, "ResourceNotFound", f"Batch endpoint {endpoint!r} not found")
        props = body.get("properties") or {}
        compute_name = short_name(props.get("compute"))
        if not compute_name or compute_name not in self.computes:
            raise EmulatorError(400, "UserError", f"Compute {props.get('compute')!r} not found in the workspace")
        compute = self.computes[compute_name]
        if self.behaviour.validate_deployments:
            BatchSettings.from_deployment(props, {})  # refuse bad settings now, not at the first invoke
        resources = props.get("resources") or {}
        model = props.get("model") or {}
        asset = model.get("assetId") or ""
        model_name = model_name_from_asset(asset)
        if model_name and model_name not in self.models:
            raise EmulatorError(400, "UserError", f"Model {model_name!r} is not registered")
        code_configuration = props.get("codeConfiguration")
        if model_name and not code_configuration:
            self._check_no_code_model(model_name, asset)
        code_id = (code_configuration or {}).get("codeId")
        if code_id and self.codes.folder(code_id) is None:
            raise EmulatorError(400, "UserError", f"Code {code_id!r} was not found in the workspace")
        if code_configuration is not None:  # 2024-10-01 swagger: CodeConfiguration.scoringScript, required, minLength 1
            script = str(code_configuration.get("scoringScript") or "")
            if not script.strip():
                raise EmulatorError(400, "UserError", "codeConfiguration.scoringScript is required")
            if PurePosixPath(script.replace("\\", "/")).is_absolute() or ".." in PurePosixPath(script).parts:
                raise EmulatorError(400, "UserError", f"Scoring script {script!r} must be a path inside the code")
        if compute.compute_type == "Kubernetes":
            type_name = resources.get("instanceType") or DEFAULT_NAME
            entry = self.check_instance_type(compute, resources.get("instanceType"))
            own = (resources.get("properties") or {}).get("resources")  # the deployment's own requests/limits
            # source document 003: an MLflow model needs 2 CPU and 4 GB, or the deployment fails
            mlflow = bool(model_name) and not props.get("codeConfiguration") and self._is_mlflow(model_name, asset)
            if own or mlflow:  # the instance type is read only for a rule that needs it, as before own resources
                try:
                    itype = from_compute_entry(type_name, entry)
                    if own:
                        check_resources(own, itype)  # under the instance type's limits, as a command job's
                    if mlflow:
                        check_mlflow_minimum(own, itype)
                except RuleViolation as exc:
                    raise EmulatorError(400, "UserError", str(exc)) from None
        key = (endpoint, name)
        existing = self.deployments.get(key)
        if existing is None:
            self.deployments[key] = TrackedResource(name=name, body=body)
            return self.deployments[key], True
        existing.body = body
        existing.modified = utcnow()
        return existing, False

    def _chosen_versions(self, model_name: str, asset: str) -> list[dict[str, Any]]:
        """The version the deployment names, or (none named, or not found) every registered version."""
        versions = self.models.get(model_name) or {}
        version = asset.rsplit(":", 1)[-1] if asset.count(":") >= 2 else asset.rsplit("/versions/", 1)[-1]
        return [versions[version]] if version in versions else list(versions.values())

    def _is_mlflow(self, model_name: str, asset: str) -> bool:
        """Whether the deployment's model (any registered version, or the one named) is an MLflow model."""
        chosen = self._chosen_versions(model_name, asset)
        return any(str(v.get("modelType", "")).lower() in MLFLOW_TYPES for v in chosen)

    def _check_no_code_model(self, model_name: str, asset: str) -> None:
        """A deployment without a scoring script: only an MLflow model with a pyfunc flavour runs without one.

        "Batch deployments only support deploying MLflow models with a pyfunc flavor" (Microsoft Learn,
        *Deploy MLflow models in batch deployments*, "Flavor support"); any other model needs
        ``code_configuration`` and an environment (*CLI (v2) batch deployment YAML schema*: "not required
        if your model is in MLflow format"). Refused when written, not at the first job.
        """
        for version in self._chosen_versions(model_name, asset):
            if str(version.get("modelType", "")).lower() not in MLFLOW_TYPES:
                raise EmulatorError(
                    400,
                    "UserError",
                    f"Model {model_name!r} is of type {version.get('modelType')!r}: a batch deployment without "
                    "code_configuration (a scoring script) and an environment needs an MLflow model.",
                )
            flavors = version.get("flavors") or {}
            if flavors and "python_function" not in flavors:
                raise EmulatorError(
                    400,
                    "UserError",
                    f"Model {model_name!r} has no python_function (pyfunc) flavor (it has "
                    f"{', '.join(sorted(flavors))}): "
                    "batch deployments only support deploying MLflow models with a pyfunc flavor; deploy another "
                    "flavor with a scoring script.",
                )


@dataclass
class BatchSettings:
    mini_batch_size: int
    instance_count: int
    max_concurrency: int
    max_retries: int
    timeout: float
    output_action: str
    output_file_name: str
    error_threshold: int

    @classmethod
    def from_deployment(cls, dep: dict[str, Any], invoke: dict[str, Any]) -> BatchSettings:
        """The deployment's settings with the invoke's overrides; a bad value is a 400, as the service answers."""
        retry = {**(dep.get("retrySettings") or {}), **(invoke.get("retrySettings") or {})}
        action = str(dep.get("outputAction") or "AppendRow")
        if action.lower() not in ("appendrow", "append_row", "summaryonly", "summary_only"):
            raise _bad_setting("outputAction", action, "AppendRow or SummaryOnly")
        timeout = parse_duration_seconds(retry.get("timeout"), -1.0) if retry.get("timeout") is not None else 30.0
        if timeout <= 0:
            raise _bad_setting("retrySettings.timeout", retry.get("timeout"), "a positive ISO 8601 duration")
        return cls(
            mini_batch_size=_int_setting("miniBatchSize", invoke.get("miniBatchSize"), dep.get("miniBatchSize"), 10, 1),
            instance_count=_int_setting(
                "resources.instanceCount",
                (invoke.get("compute") or {}).get("instanceCount"),
                (dep.get("resources") or {}).get("instanceCount"),
                1,
                1,
            ),
            max_concurrency=_int_setting("maxConcurrencyPerInstance", None, dep.get("maxConcurrencyPerInstance"), 1, 1),
            max_retries=_int_setting("retrySettings.maxRetries", None, retry.get("maxRetries"), 3, 0),
            timeout=timeout,
            output_action="append_row" if action.lower() in ("appendrow", "append_row") else "summary_only",
            output_file_name=_output_file_name(invoke.get("outputFileName") or dep.get("outputFileName")),
            error_threshold=_int_setting(
                "errorThreshold", invoke.get("errorThreshold"), dep.get("errorThreshold"), -1, -1
            ),
        )


def _output_file_name(value: Any) -> str:
    try:
        return check_output_file_name("predictions.csv" if value is None or value == "" else value)
    except RuleViolation as exc:
        raise EmulatorError(400, "UserError", str(exc)) from None


def _bad_setting(field_name: str, value: Any, wanted: str) -> EmulatorError:
    return EmulatorError(400, "UserError", f"Invalid value {value!r} for {field_name}: expected {wanted}.")


def _int_setting(field_name: str, override: Any, value: Any, default: int, minimum: int) -> int:
    chosen = override if override is not None else value
    if chosen is None:
        return default
    if isinstance(chosen, bool) or not isinstance(chosen, (int, str)) or not str(chosen).lstrip("-").isdigit():
        raise _bad_setting(field_name, chosen, f"an integer >= {minimum}")
    if int(chosen) < minimum:
        raise _bad_setting(field_name, chosen, f"an integer >= {minimum}")
    return int(chosen)


class BatchEndpointRoutes:
    """The part of ``Routes`` (emulator.routes) that serves batch endpoints and deployments."""

    async def list_endpoints(self, request: web.Request) -> web.Response:
        self._check_scope(request)
        return web.json_response({"value": [self._endpoint_json(n) for n in self.ws.endpoints]})

    def _endpoint_json(self, name: str) -> dict[str, Any]:
        ep = self.ws.endpoints[name]
        defaults = (ep.body.get("properties") or {}).get("defaults") or {}
        return ep.to_arm(
            f"{self.ws_id}/batchEndpoints/{name}",
            f"{PROVIDER}/workspaces/batchEndpoints",
            {
                "scoringUri": f"{self.base_url}/inference/batch/{name}/jobs",
                "swaggerUri": f"{self.base_url}/inference/batch/{name}/swagger.json",
                "authMode": (ep.body.get("properties") or {}).get("authMode", "AADToken"),
                # batch_endpoint.get: defaults.deploymentName is sent, and stays null unless set, even once
                # the endpoint has deployments
                "defaults": {"deploymentName": None, **defaults},
            },
            tenant_id=self.identity.tenant_id,
        )

    async def endpoint(self, request: web.Request) -> web.Response:
        self._check_scope(request)
        name = request.match_info["ep"]
        if request.method == "GET":
            if name not in self.ws.endpoints:
                return not_found("batchEndpoints", name)
            return web.json_response(self._endpoint_json(name))
        if request.method in ("PUT", "PATCH"):
            body = await request.json()
            if request.method == "PATCH":
                if name not in self.ws.endpoints:
                    return not_found("batchEndpoints", name)
                merged = dict(self.ws.endpoints[name].body)
                merged_props = dict(merged.get("properties") or {})
                merged_props.update(body.get("properties") or {})
                merged["properties"] = merged_props
                body = merged
            _, created = self.ws.put_endpoint(name, body)
            return web.json_response(
                self._endpoint_json(name),
                status=201 if created else 200,
                headers=self._lro_headers("endpoint", name, str(request.url)),
            )
        if request.method == "DELETE":
            if self.ws.endpoints.pop(name, None) is None:
                return web.Response(status=204)
            for key in [k for k in self.ws.deployments if k[0] == name]:
                del self.ws.deployments[key]
            return web.Response(status=202, headers=self._lro_headers("deleted", name))
        return method_not_allowed()

    async def list_deployments(self, request: web.Request) -> web.Response:
        self._check_scope(request)
        ep = request.match_info["ep"]
        return web.json_response({"value": [self._deployment_json(ep, n) for (e, n) in self.ws.deployments if e == ep]})

    def _deployment_json(self, ep: str, name: str) -> dict[str, Any]:
        deployment = self.ws.deployments[(ep, name)]
        variables = (deployment.body.get("properties") or {}).get("environmentVariables") or {}
        return deployment.to_arm(
            f"{self.ws_id}/batchEndpoints/{ep}/deployments/{name}",
            f"{PROVIDER}/workspaces/batchEndpoints/deployments",
            {"environmentVariables": variables},  # batch_deployment.get: an object, {} when none
            tenant_id=self.identity.tenant_id,
        )

    async def deployment(self, request: web.Request) -> web.Response:
        self._check_scope(request)
        ep, name = request.match_info["ep"], request.match_info["name"]
        if request.method == "GET":
            if (ep, name) not in self.ws.deployments:
                return not_found("deployments", name)
            return web.json_response(self._deployment_json(ep, name))
        if request.method == "PUT":
            _, created = self.ws.put_deployment(ep, name, await request.json())
            return web.json_response(
                self._deployment_json(ep, name),
                status=201 if created else 200,
                headers=self._lro_headers("deployment", f"{ep}/{name}", str(request.url)),
            )
        if request.method == "DELETE":
            if self.ws.deployments.pop((ep, name), None) is None:
                return web.Response(status=204)
            return web.Response(status=202, headers=self._lro_headers("deleted", name))
        return method_not_allowed()
