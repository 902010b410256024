"""Route handlers: ARM control plane, batch data plane, run history, discovery and the control API."""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import html
import json
import uuid
from typing import Any
from urllib.parse import urlencode

from aiohttp import web

from airflow_azureml.emulator.activity_log import PAGE_SIZE as ACTIVITY_PAGE_SIZE
from airflow_azureml.emulator.activity_log import ActivityLog
from airflow_azureml.emulator.azure_rules import is_datastore_name
from airflow_azureml.emulator.errors import arm_error, method_not_allowed
from airflow_azureml.emulator.faults import FaultRule
from airflow_azureml.emulator.models import ACTIVE_JOB_STATES, Job, system_data, utcnow
from airflow_azureml.emulator.pricing import PriceError, retail_prices
from airflow_azureml.emulator.runtime import EmulatorError, Workspace

PROVIDER = "Microsoft.MachineLearningServices"
JOBS_PAGE_SIZE = 100


def token_principal(token: str) -> dict[str, str]:
    """Who sent a request: the token's application (client) id and object id, for the request log."""
    try:
        payload = token.split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    except (IndexError, ValueError, binascii.Error):
        return {}
    if not isinstance(claims, dict):
        return {}
    return {k: str(claims[c]) for k, c in (("client_id", "appid"), ("oid", "oid")) if claims.get(c)}


class Routes:
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

    # ------------------------------------------------------------------ ids
    @property
    def ws_id(self) -> str:
        return f"/subscriptions/{self.sub}/resourceGroups/{self.rg}/providers/{PROVIDER}/workspaces/{self.workspace}"

    def _check_scope(self, request: web.Request) -> None:
        info = request.match_info
        if info.get("sub") != self.sub or info.get("rg", "").lower() != self.rg.lower():
            raise EmulatorError(404, "ResourceGroupNotFound", f"Resource group '{info.get('rg')}' could not be found.")
        if info.get("ws") != self.workspace:
            raise EmulatorError(
                404, "ResourceNotFound", f"The Resource '{PROVIDER}/workspaces/{info.get('ws')}' was not found."
            )

    def _lro_headers(self, kind: str, name: str, resource_url: str | None = None) -> dict[str, str]:
        """An LRO's headers as azure-ai-ml's recordings show them (tests/integration/azure_shapes/).

        Computes: only ``Azure-AsyncOperation``, to ``computeOperationsStatus`` (compute.put.201,
        compute.delete). Endpoints and deployments: ``Azure-AsyncOperation`` to ``mfeOperationsStatus``,
        ``Location`` the resource itself, and ``x-ms-async-operation-timeout`` (batch_endpoint.put,
        batch_deployment.put). ``Retry-After`` Azure does not send: the emulator adds it so that the SDK
        polls every second instead of after its default interval (a known difference, in the test).
        """
        op = uuid.uuid4().hex
        self.operations[op] = (kind, name)
        base = f"{self.base_url}/subscriptions/{self.sub}/providers/{PROVIDER}/locations/{self.location}"
        if kind in ("compute", "compute-deleted"):
            url = f"{base}/computeOperationsStatus/{op}?api-version=2024-10-01&service=new"
            return {"Azure-AsyncOperation": url, "Retry-After": self.lro_retry_after}
        headers = {
            "Azure-AsyncOperation": f"{base}/mfeOperationsStatus/{op}?api-version=2024-10-01",
            "x-ms-async-operation-timeout": "PT30M",
            "Retry-After": self.lro_retry_after,
        }
        if resource_url is not None:
            headers["Location"] = resource_url
        return headers

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
        r.add_get(w + "/models/{name}/versions/{version}", self.get_model_version)
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

    # -------------------------------------------------------------- workspace
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

    # ---------------------------------------------------------------- computes
    async def list_computes(self, request: web.Request) -> web.Response:
        self._check_scope(request)
        return web.json_response({"value": [c.to_arm(self.ws_id) for c in self.ws.computes.values()]})

    async def compute(self, request: web.Request) -> web.Response:
        self._check_scope(request)
        name = request.match_info["name"]
        if request.method == "GET":
            compute = self.ws.computes.get(name)
            if compute is None:
                return _not_found("computes", name)
            return web.json_response(compute.to_arm(self.ws_id))
        if request.method == "PUT":
            body = await request.json()
            compute, created = self.ws.put_compute(name, body)
            return web.json_response(
                compute.to_arm(self.ws_id), status=201 if created else 200, headers=self._lro_headers("compute", name)
            )
        if request.method == "DELETE":
            existed = self.ws.delete_compute(name)
            if not existed:
                return web.Response(status=204)
            return web.Response(status=202, headers=self._lro_headers("compute-deleted", name))
        return method_not_allowed()

    # ----------------------------------------------------- batch endpoints
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
                "defaults": defaults,
            },
            tenant_id=self.identity.tenant_id,
        )

    async def endpoint(self, request: web.Request) -> web.Response:
        self._check_scope(request)
        name = request.match_info["ep"]
        if request.method == "GET":
            if name not in self.ws.endpoints:
                return _not_found("batchEndpoints", name)
            return web.json_response(self._endpoint_json(name))
        if request.method in ("PUT", "PATCH"):
            body = await request.json()
            if request.method == "PATCH":
                if name not in self.ws.endpoints:
                    return _not_found("batchEndpoints", name)
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
        return self.ws.deployments[(ep, name)].to_arm(
            f"{self.ws_id}/batchEndpoints/{ep}/deployments/{name}",
            f"{PROVIDER}/workspaces/batchEndpoints/deployments",
            tenant_id=self.identity.tenant_id,
        )

    async def deployment(self, request: web.Request) -> web.Response:
        self._check_scope(request)
        ep, name = request.match_info["ep"], request.match_info["name"]
        if request.method == "GET":
            if (ep, name) not in self.ws.deployments:
                return _not_found("deployments", name)
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

    def _operation(self, request: web.Request) -> tuple[str, str, str] | None:
        """``(kind, name, status)`` of an operation this subscription started; None for any other."""
        op = self.operations.get(request.match_info["op"])
        if op is None or request.match_info["sub"] != self.sub:  # a poll is scoped to its subscription
            return None
        kind, name = op
        status = "Succeeded"
        if kind == "compute":
            compute = self.ws.computes.get(name)
            if compute is None:
                status = "Failed"
            elif compute.provisioning_state in ("Creating", "Updating"):
                status = "InProgress"
        elif kind == "compute-deleted":
            status = "Succeeded" if name not in self.ws.computes else "InProgress"
        return kind, name, status

    def _status_response(self, body: dict[str, Any]) -> web.Response:
        """An operation's poll answer; one still in progress asks to be polled again after ``Retry-After``."""
        if body["status"] == "InProgress":
            return web.json_response(body, headers={"Retry-After": self.lro_retry_after})
        return web.json_response(body)

    async def operation_status(self, request: web.Request) -> web.Response:
        """``mfeOperationsStatus``: ``id``, ``name`` and ``status`` only (operation_status.get)."""
        found = self._operation(request)
        if found is None:
            return arm_error(404, "NotFound", "Operation not found")
        _, name, status = found
        body: dict[str, Any] = {"id": request.path, "name": request.match_info["op"], "status": status}
        if status == "Failed":
            body["error"] = {"code": "ResourceNotFound", "message": f"The resource {name!r} no longer exists."}
        return self._status_response(body)

    async def compute_operation_status(self, request: web.Request) -> web.Response:
        """``computeOperationsStatus``: ``status``, and ``percentComplete`` once it succeeded
        (compute_operation_status.get); a failure carries ``error``, as ARM's async-operation contract says."""
        found = self._operation(request)
        if found is None:
            return arm_error(404, "NotFound", "Operation not found")
        _, name, status = found
        body: dict[str, Any] = {"status": status}
        if status == "Succeeded":
            body["percentComplete"] = 100.0
        elif status == "Failed":
            body["error"] = {"code": "ResourceNotFound", "message": f"Compute {name!r} no longer exists."}
        return self._status_response(body)

    # ------------------------------------------------------------------- jobs
    async def list_jobs(self, request: web.Request) -> web.Response:
        self._check_scope(request)
        q = request.query
        jobs = list(reversed(self.ws.jobs.values()))  # newest first, as the service lists them
        lag = self.ws.behaviour.list_lag_seconds
        if lag > 0:  # an index that lags behind the resource store
            cutoff = utcnow() - dt.timedelta(seconds=lag)
            jobs = [j for j in jobs if j.created <= cutoff]
        if q.get("jobType"):
            jobs = [j for j in jobs if j.job_type.lower() == q["jobType"].lower()]
        if q.get("tag"):
            jobs = [j for j in jobs if q["tag"] in (j.properties.get("tags") or {})]
        if q.get("properties") and not self.ws.behaviour.list_ignores_properties_filter:
            for pair in q["properties"].split(","):
                key, _, value = pair.partition("=")
                jobs = [
                    j
                    for j in jobs
                    if (j.to_arm(self.ws_id)["properties"].get("properties") or {}).get(key) == value
                    or (not value and key in (j.properties.get("properties") or {}))
                ]
        if q.get("statuses"):  # emulator extension, not in the 2024-10-01 swagger
            wanted = {s.strip() for s in q["statuses"].split(",")}
            jobs = [j for j in jobs if j.status in wanted]
        if q.get("listViewType", "ActiveOnly") == "ArchivedOnly":
            jobs = []
        skip = int(q.get("$skip", "0") or 0)
        page = jobs[skip : skip + JOBS_PAGE_SIZE]
        body: dict[str, Any] = {"value": [j.to_arm(self.ws_id) for j in page]}
        if skip + JOBS_PAGE_SIZE < len(jobs):
            params = {k: v for k, v in q.items() if k != "$skip"}
            params["$skip"] = str(skip + JOBS_PAGE_SIZE)
            body["nextLink"] = f"{self.base_url}{request.path}?{urlencode(params)}"
        return web.json_response(body)

    async def job(self, request: web.Request) -> web.Response:
        self._check_scope(request)
        name = request.match_info["name"]
        if request.method == "GET":
            job = self.ws.jobs.get(name)
            if job is None:
                return arm_error(404, "UserError", f"Job {name} not found in workspace {self.workspace}")
            return web.json_response(job.to_arm(self.ws_id))
        if request.method == "PUT":
            try:
                job, created = self.ws.put_command_job(name, await request.json())
            except EmulatorError as exc:  # immutability errors carry MFE's messageParameters/innerError
                return arm_error(exc.status, exc.code, exc.message, exc.extra)
            headers = {"Location": str(request.url)} if created else {}  # a created job's 201 names itself
            return web.json_response(job.to_arm(self.ws_id), status=201 if created else 200, headers=headers)
        return method_not_allowed()

    def _workspace_guid(self) -> str:
        return str(uuid.uuid5(uuid.NAMESPACE_URL, self.ws_id))  # the workspace JSON's properties.workspaceId

    async def cancel_job(self, request: web.Request) -> web.Response:
        """202 with the JSON ``null``, ``Location`` to ``mfeOperationResults/jc:<workspace id>:<job>`` and a
        one-hour timeout (job.cancel)."""
        self._check_scope(request)
        name = request.match_info["name"]
        self.ws.cancel_job(name)
        auth = request.headers.get("Authorization", "")
        caller = token_principal(auth[7:] if auth.startswith("Bearer ") else "").get("oid", "")
        self.activity.job_cancel(  # ARM logs the action with its caller (emulator.activity_log)
            resource_id=f"{self.ws_id}/jobs/{name}",
            resource_group=self.rg,
            caller=caller,
            lag_seconds=self.ws.behaviour.activity_log_lag_seconds,
        )
        loc = (
            f"{self.base_url}/subscriptions/{self.sub}/providers/{PROVIDER}/locations/{self.location}"
            f"/mfeOperationResults/jc:{self._workspace_guid()}:{name}?api-version=2024-10-01"
        )
        headers = {"Location": loc, "x-ms-async-operation-timeout": "PT1H", "Retry-After": self.lro_retry_after}
        return web.json_response(None, status=202, headers=headers)

    async def activity_log(self, request: web.Request) -> web.Response:
        """Activity Logs - List: the events the ``$filter`` selects, newest first, 50 a page (emulator.activity_log)."""
        if request.match_info["sub"] != self.sub:
            return arm_error(
                404, "SubscriptionNotFound", f"The subscription '{request.match_info['sub']}' could not be found."
            )
        if not self.ws.behaviour.activity_log_reader:
            return arm_error(
                403,
                "AuthorizationFailed",
                "The client does not have authorization to perform action 'Microsoft.Insights/eventtypes/values/read' "
                f"over scope '/subscriptions/{self.sub}'.",
            )
        events = self.activity.query(request.query.get("$filter", ""))
        skip = int(request.query.get("$skiptoken", "0"))
        page = events[skip : skip + ACTIVITY_PAGE_SIZE]
        body: dict[str, Any] = {"value": page}
        if skip + ACTIVITY_PAGE_SIZE < len(events):
            query = {k: v for k, v in request.query.items() if k != "$skiptoken"}
            query["$skiptoken"] = str(skip + ACTIVITY_PAGE_SIZE)
            body["nextLink"] = f"{self.base_url}{request.path}?{urlencode(query)}"
        return web.json_response(body)

    async def control_cancel_unlogged(self, request: web.Request) -> web.Response:
        """Test control: a person's cancel through a path the Activity Log does not see (Studio's, run history's)."""
        job = self.ws.cancel_job(request.match_info["name"])
        return web.json_response({"name": job.name, "status": job.status})

    async def operation_result(self, request: web.Request) -> web.Response:
        """A job cancel's poll: 202 ``{}`` (``Location`` itself) while the job is active, then 200, no body
        (job.cancel_poll.202, job.cancel_poll)."""
        op = request.match_info["op"]
        prefix = f"jc:{self._workspace_guid()}:"
        job = self.ws.jobs.get(op[len(prefix) :]) if op.startswith(prefix) else None
        if job is None or request.match_info["sub"] != self.sub:
            return arm_error(404, "NotFound", "Operation not found")
        if job.status in ACTIVE_JOB_STATES:
            headers = {"Location": str(request.url), "Retry-After": self.lro_retry_after}
            return web.json_response({}, status=202, headers=headers)
        return web.Response(status=200)

    # ------------------------------------------------------------- datastores
    def _datastore_json(self, name: str) -> dict[str, Any]:
        return {
            "id": f"{self.ws_id}/datastores/{name}",
            "name": name,
            "type": f"{PROVIDER}/workspaces/datastores",
            "properties": {
                "datastoreType": "AzureBlob",
                "accountName": "emulatorstore",
                "containerName": name,
                "endpoint": "core.windows.net",
                "protocol": "https",
                "isDefault": name == "workspaceblobstore",
                "credentials": {"credentialsType": "None"},
                "serviceDataAccessAuthIdentity": "None",
                "description": f"local folder {self.ws.datastore_root(name, create=False)}",
                "tags": {},
                "properties": {},
            },
            "systemData": system_data(self.ws.created, self.ws.created),  # datastore.get: sent
        }

    async def list_datastores(self, request: web.Request) -> web.Response:
        self._check_scope(request)
        root = self.ws.data_dir / "datastores"
        folders = (
            {p.name for p in root.iterdir() if p.is_dir() and is_datastore_name(p.name)} if root.exists() else set()
        )
        names = sorted({"workspaceblobstore", *folders})
        if request.query.get("isDefault", "").lower() == "true":
            names = ["workspaceblobstore"]
        return web.json_response({"value": [self._datastore_json(n) for n in names]})

    async def get_datastore(self, request: web.Request) -> web.Response:
        """A datastore is a folder under ``DIR/datastores/``; reading one never creates it, and a name Azure
        refuses (``..``, ``a.b``, ``Store``) is a 400 before it is ever used as a path."""
        self._check_scope(request)
        name = request.match_info["name"]
        root = self.ws.datastore_root(name, create=False)  # EmulatorError 400 for a name Azure refuses
        if name != "workspaceblobstore" and not root.is_dir():
            return _not_found("datastores", name)
        return web.json_response(self._datastore_json(name))

    # ----------------------------------------------------------------- models
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
            return _not_found("models", name)
        latest = max(self.ws.models[name], key=_version_key)
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
        versions = sorted(self.ws.models.get(name, {}), key=_version_key, reverse=True)
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
            return _not_found("models", f"{name}:{version}")
        return web.json_response(self._model_version_json(name, version))

    # ----------------------------------------------------------- environments
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
                return _not_found("environments", f"{name}:{version}")
            return web.json_response(self._environment_json(name, version))
        if request.method == "PUT":
            _, created = self.ws.put_environment_version(name, version, await request.json())
            headers = {"Location": str(request.url)} if created else {}
            return web.json_response(
                self._environment_json(name, version), status=201 if created else 200, headers=headers
            )
        return method_not_allowed()

    # ------------------------------------------------------------ data plane
    async def invoke(self, request: web.Request) -> web.Response:
        body = await request.json()
        job = self.ws.invoke_batch(
            request.match_info["ep"],
            request.headers.get("azureml-model-deployment"),
            body,
            request.headers.get("repeatability-request-id"),
        )
        return self._invoke_response(job, body)

    def _invoke_response(self, job: Job, body: dict[str, Any]) -> web.Response:
        """201, the job as the data plane shows it, and ``Location`` to the deployment on the workspace host
        (batch_endpoint.invoke: Azure's invoke answer, not the ARM job)."""
        props = body.get("properties") or {}
        deployment = self.ws.deployments.get((job.endpoint or "", job.deployment or ""))
        dep = (deployment.body.get("properties") if deployment else None) or {}
        retry = dep.get("retrySettings") or {}
        arm = job.to_arm(self.ws_id)
        path = f"{self.ws_id}/batchEndpoints/{job.endpoint}/deployments/{job.deployment}"
        studio = f"{self.base_url}/_emulator/studio/jobs/{job.name}"
        answer = {
            "id": f"{path}/jobs/{job.name}",
            "name": job.name,
            "type": "Microsoft.MachineLearningServices/workspaces/batchEndpoints/deployments/jobs",
            "properties": {
                "provisioningState": "Succeeded",
                "inputData": {
                    key: {
                        "description": None,
                        "uri": value.get("uri"),
                        "mode": value.get("mode") or "ReadOnlyMount",
                        "jobInputType": value.get("jobInputType"),
                    }
                    for key, value in (props.get("inputData") or {}).items()
                    if isinstance(value, dict)
                },
                "compute": {
                    "target": f"{self.ws_id}/computes/{job.compute}",
                    "instanceCount": None,
                    "isLocal": False,
                    "location": None,
                    "instanceType": None,
                    "properties": None,
                },
                "output": {"datastoreId": None, "path": None},
                "retrySettings": {
                    "maxRetries": int(retry.get("maxRetries", 3)),
                    "timeout": str(retry.get("timeout") or "PT30S"),
                },
                "status": job.status,
                "interactionEndpoints": {
                    name: {"jobEndpointType": name, "port": None, "endpoint": url, "properties": None}
                    for name, url in (
                        ("Studio", studio),
                        ("Tracking", f"azureml://{self.base_url.split('://')[1]}/mlflow"),
                    )
                },
                "tags": dict(props.get("tags") or {}),
                "properties": {k: str(v) for k, v in (props.get("properties") or {}).items()},
                "name": job.name,
            },
            "systemData": {
                k: arm["systemData"][k] for k in ("createdAt", "createdBy", "lastModifiedAt", "lastModifiedBy")
            },
        }
        location = f"{self.base_url}/mferp/managementfrontend{path}?api-version=2020-09-01-dataplanepreview"
        return web.json_response(answer, status=201, headers={"Location": location})

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

    async def run_details(self, request: web.Request) -> web.Response:
        self._check_scope(request)
        job = self.ws.jobs.get(request.match_info["run"])
        if job is None:
            return arm_error(404, "UserError", f"Run {request.match_info['run']} not found")
        return web.json_response(job.to_run_details())

    # ----------------------------------------------------------- retail prices
    async def retail_prices(self, request: web.Request) -> web.Response:
        """The Azure Retail Prices API (emulator.pricing); a bad $filter is a 400 (its body is a guess)."""
        try:
            return web.json_response(retail_prices(self.ws.prices, dict(request.query), self.base_url))
        except PriceError as exc:
            return web.json_response({"Error": {"Code": "BadRequest", "Message": str(exc)}}, status=400)

    # ------------------------------------------------------------ control API
    async def control_bill(self, request: web.Request) -> web.Response:
        """The emulator's own bill (emulator.billing): per cluster, per tier and in total."""
        return web.json_response(self.ws.bill())

    async def control_prices(self, request: web.Request) -> web.Response:
        """``GET`` every size's Spot / Low Priority ratio; ``POST {armSkuName, spot?, low_priority?}`` sets one."""
        if request.method == "GET":
            return web.json_response([self.ws.prices.ratios(sku) for sku in self.ws.prices.spot_ratio])
        if request.method != "POST":
            return method_not_allowed()
        data = await request.json()
        if not isinstance(data, dict) or not data.get("armSkuName"):
            return arm_error(400, "BadRequest", "body must be {armSkuName, spot?, low_priority?}")
        ratios = self.ws.set_price_ratio(
            str(data["armSkuName"]), spot=data.get("spot"), low_priority=data.get("low_priority")
        )
        return web.json_response(ratios)

    async def control_job(self, request: web.Request) -> web.Response:
        job = self.ws.jobs.get(request.match_info["name"])
        if job is None:
            return arm_error(404, "NotFound", "no such job")
        return web.json_response({"job": job.to_arm(self.ws_id), "runDetails": job.to_run_details()})

    async def studio_job_page(self, request: web.Request) -> web.Response:
        """What Studio's job page is to a person: name, status, compute, times, rows. A browser sends no
        bearer token, so this page needs none; it shows nothing a token would guard beyond the job's state."""
        job = self.ws.jobs.get(request.match_info["name"])
        if job is None:
            return arm_error(404, "NotFound", "no such job")
        rows = [
            ("Job", job.name),
            ("Status", job.status),
            ("Compute", job.compute or ""),
            ("Created", job.created.isoformat()),
            ("Ended", job.ended.isoformat() if job.ended else ""),
            ("Rows scored", "" if job.rows_scored is None else str(job.rows_scored)),
            ("Error", (job.error or {}).get("message") or ""),
        ]
        cells = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(str(v))}</td></tr>" for k, v in rows)
        page = (
            f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(job.name)}</title></head>"
            f"<body><h1>Azure ML emulator: job {html.escape(job.name)}</h1><table>{cells}</table>"
            "<p>A local emulator's page, in place of Azure ML Studio.</p></body></html>"
        )
        return web.Response(text=page, content_type="text/html")

    async def control_jobs(self, request: web.Request) -> web.Response:
        return web.json_response(
            [
                {
                    "name": j.name,
                    "status": j.status,
                    "compute": j.compute,
                    "created": j.created.isoformat(),
                    "ended": j.ended.timestamp() if j.ended else None,
                    "error": (j.error or {}).get("message"),
                    "warnings": [w["message"] for w in j.warnings],
                    "rows_scored": j.rows_scored,
                    "mini_batch_attempts": j.mini_batch_attempts,
                }
                for j in self.ws.jobs.values()
            ]
        )

    async def control_synthetic_jobs(self, request: web.Request) -> web.Response:
        data = await request.json()
        properties = {str(k): str(v) for k, v in (data.get("properties") or {}).items()}
        names = self.ws.create_synthetic_jobs(
            str(data.get("prefix", "synthetic")),
            list(data["durations"]),
            float(data.get("queue_seconds", 0)),
            properties,
        )
        return web.json_response({"jobs": names})

    async def control_requests(self, request: web.Request) -> web.Response:
        since = float(request.query.get("since", "0"))
        entries = [e for e in self.request_log if e["t"] >= since] if since else self.request_log
        return web.json_response(entries[-int(request.query.get("last", "1000")) :])

    async def control_faults(self, request: web.Request) -> web.Response:
        data = await request.json()
        rules = data if isinstance(data, list) else [data]
        try:
            for rule in rules:
                self.plan.add(FaultRule.from_dict(rule))
        except (TypeError, ValueError) as exc:
            return arm_error(400, "BadRequest", str(exc))
        return web.json_response({"rules": len(self.plan.rules)})

    async def control_clear_faults(self, request: web.Request) -> web.Response:
        self.plan.clear()
        return web.json_response({"rules": 0})

    async def control_cluster(self, request: web.Request) -> web.Response:
        name, action = request.match_info["name"], request.match_info["action"]
        data = await request.json() if request.can_read_body else {}
        if action == "preempt":
            return web.json_response({"ended": self.ws.preempt_cluster(name, data.get("form", "canceled"))})
        if action == "evict":
            return web.json_response({"evicted": self.ws.evict_nodes(name, int(data.get("count", 1)))})
        if action == "capacity":
            self.ws.set_capacity(name, data.get("nodes"))
            return web.json_response({"capacity": data.get("nodes")})
        if action == "eviction-rate":
            self.ws.set_eviction_rate(name, float(data.get("rate", 0)))
            return web.json_response({"rate": data.get("rate", 0)})
        return arm_error(404, "NotFound", f"unknown action {action!r}")

    async def control_expire_tokens(self, request: web.Request) -> web.Response:
        return web.json_response({"expired": self.identity.expire_all()})

    async def control_behaviour(self, request: web.Request) -> web.Response:
        """``GET`` the behaviour switches; ``POST {switch: value}`` changes some (400 for unknown ones)."""
        if request.method == "POST":
            return web.json_response(self.ws.set_behaviour(await request.json()))
        if request.method == "GET":
            return web.json_response(self.ws.behaviour.to_dict())
        return method_not_allowed()

    async def control_deployment_behaviour(self, request: web.Request) -> web.Response:
        ep, name = request.match_info["ep"], request.match_info["name"]
        return web.json_response(self.ws.set_deployment_behaviour(ep, name, await request.json()))

    async def control_stall(self, request: web.Request) -> web.Response:
        data = await request.json() if request.can_read_body else {}
        job = self.ws.stall_job(request.match_info["name"], float(data.get("seconds", 30)))
        return web.json_response({"name": job.name, "status": job.status})


def _not_found(kind: str, name: str) -> web.Response:
    return arm_error(404, "ResourceNotFound", f"The resource '{kind}/{name}' was not found.")


def _version_key(version: str) -> tuple[int, str]:
    return (int(version), "") if version.isdigit() else (-1, version)
