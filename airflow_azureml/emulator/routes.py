"""The emulator's HTTP face: one ``Routes`` object binds the workspace to every route it serves.

``Routes`` puts together the route parts of each concept's module (``arm``, ``computes``,
``batch_endpoints``, ``operations``, ``jobs``, ``activity_log``, ``datastores``, ``registry``,
``invoke``, ``control``) and holds what they share: the workspace, its ARM names and base URL, the
fault plan, the identity and the request log. ``add_to`` is the one table of every route; the workspace
resource itself, the discovery document and the public Retail Prices API are answered here.
"""

from __future__ import annotations

import uuid
from typing import Any

from aiohttp import web

from airflow_azureml.emulator.activity_log import ActivityLog, ActivityLogRoutes, token_principal
from airflow_azureml.emulator.arm import PROVIDER, ArmScope
from airflow_azureml.emulator.batch_endpoints import BatchEndpointRoutes
from airflow_azureml.emulator.computes import ComputeRoutes
from airflow_azureml.emulator.control import ControlRoutes
from airflow_azureml.emulator.datastores import DatastoreRoutes
from airflow_azureml.emulator.errors import arm_error
from airflow_azureml.emulator.invoke import InvokeRoutes
from airflow_azureml.emulator.jobs import JobRoutes
from airflow_azureml.emulator.models import utcnow
from airflow_azureml.emulator.operations import OperationRoutes
from airflow_azureml.emulator.pricing import PriceError, retail_prices
from airflow_azureml.emulator.registry import RegistryRoutes
from airflow_azureml.emulator.workspace import Workspace

# server.py imports arm_error and token_principal from here in one line; their homes are errors and activity_log.
__all__ = ["Routes", "arm_error", "token_principal"]


class Routes(
    ArmScope,
    ComputeRoutes,
    BatchEndpointRoutes,
    OperationRoutes,
    JobRoutes,
    ActivityLogRoutes,
    DatastoreRoutes,
    RegistryRoutes,
    InvokeRoutes,
    ControlRoutes,
):
    """Binds the workspace to HTTP. One instance per emulator."""

    def __init__(
        self,
        ws: Workspace,
        *,
        base_url: str,
        subscription_id: str,
        resource_group: str,
        workspace: str,
        location: str,
        lro_retry_after: str,
        plan: Any,
        identity: Any,
        request_log: list[dict[str, Any]],
    ) -> None:
        self.ws = ws
        self.base_url = base_url
        self.sub = subscription_id
        self.rg = resource_group
        self.workspace = workspace
        self.location = location
        self.lro_retry_after = lro_retry_after
        self.plan = plan
        self.identity = identity
        self.request_log = request_log
        self.operations: dict[str, tuple[str, str]] = {}  # op id -> (kind, name)
        self.activity = ActivityLog(subscription_id, getattr(identity, "tenant_id", ""))

    def add_to(self, app: web.Application) -> None:
        w = "/subscriptions/{sub}/resourceGroups/{rg}/providers/" + PROVIDER + "/workspaces/{ws}"
        r = app.router
        r.add_get(w, self.get_workspace)
        r.add_get(w + "/computes", self.list_computes)
        r.add_route("*", w + "/computes/{name}", self.compute)
        r.add_get(w + "/batchEndpoints", self.list_endpoints)
        r.add_route("*", w + "/batchEndpoints/{ep}", self.endpoint)
        r.add_get(w + "/batchEndpoints/{ep}/deployments", self.list_deployments)
        r.add_route("*", w + "/batchEndpoints/{ep}/deployments/{name}", self.deployment)
        r.add_get(w + "/jobs", self.list_jobs)
        r.add_route("*", w + "/jobs/{name}", self.job)
        r.add_post(w + "/jobs/{name}/cancel", self.cancel_job)
        r.add_get("/subscriptions/{sub}/providers/Microsoft.Insights/eventtypes/management/values", self.activity_log)
        r.add_get(w + "/datastores", self.list_datastores)
        r.add_get(w + "/datastores/{name}", self.get_datastore)
        r.add_get(w + "/models/{name}", self.get_model_container)
        r.add_get(w + "/models/{name}/versions", self.list_model_versions)
        r.add_route("*", w + "/models/{name}/versions/{version}", self.get_model_version)
        r.add_route("*", w + "/environments/{name}/versions/{version}", self.environment_version)
        r.add_get(
            "/subscriptions/{sub}/providers/" + PROVIDER + "/locations/{loc}/mfeOperationsStatus/{op}",
            self.operation_status,
        )
        r.add_get(
            "/subscriptions/{sub}/providers/" + PROVIDER + "/locations/{loc}/computeOperationsStatus/{op}",
            self.compute_operation_status,
        )
        r.add_get(
            "/subscriptions/{sub}/providers/" + PROVIDER + "/locations/{loc}/mfeOperationResults/{op}",
            self.operation_result,
        )
        r.add_post("/inference/batch/{ep}/jobs", self.invoke)
        r.add_get("/discovery", self.discovery)  # properties.discoveryUrl: <region>.api.azureml.ms/discovery
        r.add_get("/api/retail/prices", self.retail_prices)  # public, as prices.azure.com is (no auth)
        history = "/history/v1.0" + w
        r.add_get(history + "/runs/{run}/details", self.run_details)
        r.add_get(history + "/experiments/{exp}/runs/{run}/details", self.run_details)
        r.add_get(history + "/experimentids/{exp}/runs/{run}/details", self.run_details)
        r.add_get("/_emulator/jobs", self.control_jobs)
        r.add_get("/_emulator/jobs/{name}", self.control_job)
        r.add_get("/_emulator/studio/jobs/{name}", self.studio_job_page)  # the task's Studio link; no token
        r.add_post("/_emulator/synthetic-jobs", self.control_synthetic_jobs)
        r.add_get("/_emulator/requests", self.control_requests)
        r.add_post("/_emulator/faults", self.control_faults)
        r.add_delete("/_emulator/faults", self.control_clear_faults)
        r.add_post("/_emulator/clusters/{name}/{action}", self.control_cluster)
        r.add_post("/_emulator/tokens/expire", self.control_expire_tokens)
        r.add_route("*", "/_emulator/behaviour", self.control_behaviour)
        r.add_post("/_emulator/batchEndpoints/{ep}/deployments/{name}/behaviour", self.control_deployment_behaviour)
        r.add_post("/_emulator/jobs/{name}/stall", self.control_stall)
        r.add_post("/_emulator/jobs/{name}/cancel", self.control_cancel_unlogged)
        r.add_get("/_emulator/bill", self.control_bill)
        r.add_route("*", "/_emulator/prices", self.control_prices)

    async def get_workspace(self, request: web.Request) -> web.Response:
        self._check_scope(request)
        return web.json_response(self.workspace_json())

    def workspace_json(self) -> dict[str, Any]:
        now = utcnow()
        rg_id = f"/subscriptions/{self.sub}/resourceGroups/{self.rg}"
        return {
            "id": self.ws_id,
            "name": self.workspace,
            "type": f"{PROVIDER}/workspaces",
            "location": self.location,
            "kind": "Default",
            "tags": {},
            "identity": {
                "type": "SystemAssigned",
                "principalId": str(uuid.UUID(int=1)),
                "tenantId": self.identity.tenant_id,
            },
            "sku": {"name": "Basic", "tier": "Basic"},
            "properties": {
                "friendlyName": self.workspace,
                "description": "airflow-azureml local emulator",
                "discoveryUrl": f"{self.base_url}/discovery",
                "workspaceId": self._workspace_guid(),
                "provisioningState": "Succeeded",
                "storageAccount": f"{rg_id}/providers/Microsoft.Storage/storageAccounts/emulatorstore",
                "keyVault": f"{rg_id}/providers/Microsoft.KeyVault/vaults/emulatorkv",
                "applicationInsights": None,
                "containerRegistry": None,
                "hbiWorkspace": False,
                "publicNetworkAccess": "Enabled",
                "v1LegacyMode": False,
                "mlFlowTrackingUri": f"azureml://{self.location}.api.azureml.ms/mlflow/v1.0{self.ws_id}",
                "notebookInfo": {  # workspace.get: the notebooks' storage, named by its ARM id
                    "fqdn": f"ml-{self.workspace}-{self.location}.notebooks.azure.net",
                    "isPrivateLinkEnabled": False,
                    "notebookPreparationError": None,
                    "resourceId": self._workspace_guid().replace("-", ""),
                },
            },
            "systemData": {"createdAt": now.isoformat(), "createdBy": "emulator", "createdByType": "Application"},
        }

    async def discovery(self, request: web.Request) -> web.Response:
        base = self.base_url
        return web.json_response(
            {
                "api": base,
                "catalog": base,
                "experimentation": base,
                "gallery": base,
                "history": base,
                "hyperdrive": base,
                "labeling": base,
                "modelmanagement": base,
                "pipelines": base,
                "studio": f"{base}/_emulator",
            }
        )

    async def retail_prices(self, request: web.Request) -> web.Response:
        """The Azure Retail Prices API (emulator.pricing); a bad $filter is a 400 (its body is a guess)."""
        try:
            return web.json_response(retail_prices(self.ws.prices, dict(request.query), self.base_url))
        except PriceError as exc:
            return web.json_response({"Error": {"Code": "BadRequest", "Message": str(exc)}}, status=400)
