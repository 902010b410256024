"""Computes: AmlCompute clusters and attached Kubernetes computes, as ARM resources.

``ComputeStore`` is the part of ``Workspace`` that creates, changes and deletes computes by Azure's
rules (name, vmPriority and vmSize fixed once created, provisioning that takes a while), attaches a
Kubernetes cluster and checks an instance type against it; ``ComputeRoutes`` the part of ``Routes`` that
serves them. What happens to a cluster's nodes is ``emulator.nodes``; the Kubernetes clusters themselves
are ``emulator.kubernetes``.
"""

from __future__ import annotations

import asyncio
import re
from typing import Any

from aiohttp import web

from airflow_azureml.emulator.azure_rules import DEFAULT_NAME
from airflow_azureml.emulator.errors import EmulatorError, method_not_allowed, not_found
from airflow_azureml.emulator.kubernetes.store import KubeCluster
from airflow_azureml.emulator.models import ACTIVE_JOB_STATES, Compute, utcnow

# Resource names as Azure ML documents them (emulator's own copy; the provider keeps its own rules).
COMPUTE_NAME = re.compile(r"[A-Za-z][A-Za-z0-9-]{1,22}[A-Za-z0-9]")  # 3-24 (the compute cluster how-to)


def check_resource_name(kind: str, name: str, rule: re.Pattern[str], says: str) -> None:
    if not rule.fullmatch(name):
        raise EmulatorError(400, "BadRequest", f"Invalid {kind} name {name!r}: {says}, not ending with '-'")


class ComputeStore:
    """The part of ``Workspace`` (emulator.workspace) that holds the computes."""

    def kube_cluster(self, name: str) -> KubeCluster:
        """The Kubernetes cluster ``name`` (created on first use: a cluster exists before it is attached)."""
        cluster = self.kube_clusters.get(name)
        if cluster is None:
            cluster = self.kube_clusters[name] = KubeCluster(name=name)
        return cluster

    def put_compute(self, name: str, body: dict[str, Any]) -> tuple[Compute, bool]:
        props = dict(body.get("properties") or {})
        compute_type = props.get("computeType", "AmlCompute")
        if compute_type not in ("AmlCompute", "Kubernetes"):
            raise EmulatorError(400, "BadRequest", f"computeType {compute_type!r} is not supported here")
        existing = self.computes.get(name)
        if existing is None:
            check_resource_name("compute", name, COMPUTE_NAME, "3-24 characters: letters, digits, '-'; a letter first")
        if existing is not None and existing.compute_type != compute_type:
            raise EmulatorError(409, "Conflict", f"Compute {name!r} exists with type {existing.compute_type}")
        inner = dict(props.get("properties") or {})
        if compute_type == "AmlCompute":
            scale = inner.get("scaleSettings") or {}
            lo, hi = int(scale.get("minNodeCount", 0)), int(scale.get("maxNodeCount", 1))
            if lo > hi:
                raise EmulatorError(400, "BadRequest", "minNodeCount cannot exceed maxNodeCount")
            if existing is not None and existing.low_priority != (
                str(inner.get("vmPriority", "Dedicated")).lower() == "lowpriority"
            ):
                raise EmulatorError(409, "Conflict", "vmPriority of an existing cluster cannot be changed")
            old_size = str((existing.body.get("properties") or {}).get("vmSize", "")).lower() if existing else ""
            if old_size and str(inner.get("vmSize", "")).lower() != old_size:
                raise EmulatorError(409, "Conflict", "vmSize of an existing cluster cannot be changed")
        props.pop("provisioningState", None)
        created = existing is None
        if existing is None:
            existing = Compute(
                name=name, compute_type=compute_type, location=body.get("location") or "eastus", body=props
            )
            existing.preempted_gauge = self.behaviour.preempted_gauge
            self.computes[name] = existing
            if compute_type == "Kubernetes":  # attach: the cluster's InstanceType objects become the compute's
                existing.kube = self.kube_cluster(name)
        else:
            existing.body = props
            existing.modified = utcnow()
            existing.provisioning_state = "Updating"
        self._spawn(self._finish_provisioning(existing))
        return existing, created

    async def _finish_provisioning(self, compute: Compute) -> None:
        await asyncio.sleep(self.timing.provisioning)
        compute.provisioning_state = "Succeeded"
        compute.modified = utcnow()

    def delete_compute(self, name: str) -> bool:
        compute = self.computes.pop(name, None)
        if compute is None:
            return False
        self.billing.close(name)
        for job in self.jobs.values():
            if job.compute == name and job.status in ACTIVE_JOB_STATES:
                self._end_job(job, "Failed", error={"code": "UserError", "message": "Compute was deleted"})
        return True

    def check_instance_type(self, compute: Compute, instance_type: str | None) -> dict[str, Any]:
        types = compute.instance_types()
        chosen = instance_type or DEFAULT_NAME
        lowered = {k.lower(): v for k, v in types.items()}
        if chosen.lower() not in lowered:
            raise EmulatorError(
                400,
                "UserError",
                f"Instance type {chosen!r} is not defined on Kubernetes compute {compute.name!r}; "
                f"known: {sorted(types)}",
            )
        return lowered[chosen.lower()]

    def _cluster(self, name: str) -> Compute:
        compute = self.computes.get(name)
        if compute is None or compute.compute_type != "AmlCompute":
            raise EmulatorError(404, "ResourceNotFound", f"AmlCompute cluster {name!r} not found")
        return compute


class ComputeRoutes:
    """The part of ``Routes`` (emulator.routes) that serves the computes."""

    async def list_computes(self, request: web.Request) -> web.Response:
        self._check_scope(request)
        return web.json_response({"value": [c.to_arm(self.ws_id) for c in self.ws.computes.values()]})

    async def compute(self, request: web.Request) -> web.Response:
        self._check_scope(request)
        name = request.match_info["name"]
        if request.method == "GET":
            compute = self.ws.computes.get(name)
            if compute is None:
                return not_found("computes", name)
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
