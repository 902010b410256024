"""Long-running operations (LRO): the headers that start one and the polls that follow it.

A PUT or DELETE of a compute, endpoint or deployment answers with ``Azure-AsyncOperation`` (and
``Location``) as azure-ai-ml's recordings show; the poll reads the resource's state now
(``computeOperationsStatus``, ``mfeOperationsStatus``), scoped to its subscription. A job cancel's poll
(``mfeOperationResults``) answers 202 while the job is active. ``OperationRoutes`` is that part of
``Routes``; ``operations`` (op id -> kind and name) is set in ``Routes.__init__``.
"""

from __future__ import annotations

import uuid
from typing import Any

from aiohttp import web

from airflow_azureml.emulator.arm import PROVIDER
from airflow_azureml.emulator.errors import arm_error
from airflow_azureml.emulator.models import ACTIVE_JOB_STATES


class OperationRoutes:
    """The part of ``Routes`` (emulator.routes) that starts and answers long-running operations."""

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
