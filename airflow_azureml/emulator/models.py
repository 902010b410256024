"""In-memory resources of the emulated workspace and their ARM JSON shapes.

Shapes follow Microsoft's examples in ``shared/azureml-rest-spec`` (api-version 2024-10-01).
All mutation happens on the emulator's event-loop thread.
"""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass, field
from typing import Any

from airflow_azureml.emulator.kubernetes.attachment import merge_compute_instance_types
from airflow_azureml.emulator.kubernetes.store import KubeCluster

# NotResponding and Paused are not ends: a stalled job can resume (the SDK's stream treats them as terminal).
ACTIVE_JOB_STATES = frozenset(
    {
        "NotStarted",
        "Starting",
        "Provisioning",
        "Preparing",
        "Queued",
        "Running",
        "Finalizing",
        "CancelRequested",
        "NotResponding",
        "Paused",
    }
)
TERMINAL_JOB_STATES = frozenset({"Completed", "Failed", "Canceled"})

PREEMPTION_ERROR_MESSAGE = (
    "UserError: AzureMLCompute job failed. PreemptionError: Nodes of this job got pre-empted. "
    "Check if the run has failed or restarted. Reason: Received pre-emption warning signal"
)
# Azure documents the capacity-lost cancel but no message for it: sent only with the
# ``capacity_cancel_message`` behaviour switch (off by default), never by default.
CAPACITY_LOST_MESSAGE = (
    "Job was canceled: the low-priority cluster lost all its nodes to preemption and there is "
    "not enough capacity to continue. Resubmit the job."
)
# How Azure words a batch job whose runner failed (user process exit 42; MicrosoftDocs/azure-docs#105903).
RUNNER_FAILED_MESSAGE = (
    "Execution failed. User process '/azureml-envs/azureml_emulator/bin/python' exited with status code 42. "
    "Please check log file 'user_logs/std_log_0.txt' for error details. Error: {detail}"
)
# When no mini-batch succeeded (microsoft/MLOpsPython#328, Azure/MachineLearningNotebooks#1652).
NO_RESULT_MESSAGE = (
    "DriverException: There is no succeeded mini batch item returned from run(). "
    "Please check 'response: run()' in https://aka.ms/batch-inference-documentation"
)


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def iso(ts: dt.datetime | None) -> str | None:
    return ts.isoformat().replace("+00:00", "Z") if ts else None


def system_data(created: dt.datetime, modified: dt.datetime) -> dict[str, Any]:
    return {
        "createdAt": iso(created),
        "createdBy": "airflow-azureml-emulator",
        "createdByType": "Application",
        "lastModifiedAt": iso(modified),
        "lastModifiedBy": "airflow-azureml-emulator",
        "lastModifiedByType": "Application",
    }


def parse_duration_seconds(value: Any, default: float) -> float:
    """Parse ISO-8601 durations like ``PT5M`` / ``PT120S`` (and plain numbers)."""
    if value is None:
        return default
    if isinstance(value, (int, float)):
        return float(value)
    import isodate

    try:
        return float(isodate.parse_duration(str(value)).total_seconds())
    except (isodate.ISO8601Error, ValueError):
        return default


@dataclass
class Node:
    node_id: str
    state: str = "preparing"  # preparing | idle | running | leaving | preempted
    job_name: str | None = None
    preempted_at: float | None = None  # loop time of the eviction; the node is deallocated some time later


@dataclass
class Compute:
    name: str
    compute_type: str  # AmlCompute | Kubernetes
    location: str
    body: dict[str, Any]  # the ARM ``properties`` object as last written by a client
    created: dt.datetime = field(default_factory=utcnow)
    modified: dt.datetime = field(default_factory=utcnow)
    provisioning_state: str = "Creating"
    nodes: list[Node] = field(default_factory=list)
    preempted_node_count: int = 0  # evictions ever (legacy counter, shown only with preempted_gauge off)
    preempted_gauge: bool = True  # behaviour switch: preemptedNodeCount is the nodes in preempted state now
    replacements_wanted: int = 0  # nodes jobs wait for that capacity cannot give yet (targetNodeCount)
    capacity_override: int | None = None  # fault: how many nodes Azure can give right now
    locked: bool = False  # fault: a resource-group lock keeps the cluster at "resizing 0 -> 0"
    kube: KubeCluster | None = None  # Kubernetes computes: the attached cluster and its InstanceType objects

    @property
    def inner(self) -> dict[str, Any]:
        return self.body.setdefault("properties", {}) or {}

    @property
    def low_priority(self) -> bool:
        return str(self.inner.get("vmPriority", "Dedicated")).lower() == "lowpriority"

    @property
    def max_nodes(self) -> int:
        return int((self.inner.get("scaleSettings") or {}).get("maxNodeCount", 1))

    @property
    def min_nodes(self) -> int:
        return int((self.inner.get("scaleSettings") or {}).get("minNodeCount", 0))

    @property
    def capacity(self) -> int:
        if self.locked:
            return 0
        if self.capacity_override is not None:
            return min(self.capacity_override, self.max_nodes)
        return self.max_nodes

    def instance_types(self) -> dict[str, dict[str, Any]]:
        """ARM ``instanceTypes``: as written, overridden by the cluster's objects, plus the built-in default."""
        return merge_compute_instance_types(self.inner.get("instanceTypes"), self.kube, default_instance_type())

    def to_arm(self, ws_id: str) -> dict[str, Any]:
        props = dict(self.body)
        props.update(
            {
                "computeType": self.compute_type,
                "provisioningState": self.provisioning_state,
                "createdOn": iso(self.created),
                "modifiedOn": iso(self.modified),
                "isAttachedCompute": self.compute_type == "Kubernetes",
                "disableLocalAuth": props.get("disableLocalAuth", True),
            }
        )
        props.setdefault("description", None)  # amlcompute.get: sent, null when not set
        if self.compute_type == "AmlCompute":
            props.setdefault("resourceId", None)  # amlcompute.get, compute.put.201: null for a created cluster
        inner = dict(self.inner)
        if self.compute_type == "AmlCompute":
            counts = {s: 0 for s in ("idle", "running", "preparing", "unusable", "leaving", "preempted")}
            for node in self.nodes:
                if node.state in counts:
                    counts[node.state] += 1
            current = len(self.nodes)  # preempted nodes count until they are deallocated
            target = current - counts["preempted"] + self.replacements_wanted
            preempted = counts["preempted"] if self.preempted_gauge else self.preempted_node_count
            inner.setdefault("vmSize", "STANDARD_DS3_V2")  # the service's default size
            inner.setdefault("vmPriority", "Dedicated")
            inner.setdefault("osType", "Linux")
            inner.setdefault("virtualMachineImage", None)
            inner.setdefault("subnet", None)  # not in a VNet
            inner.setdefault("isolatedNetwork", False)
            inner.setdefault("remoteLoginPortPublicAccess", "NotSpecified")
            inner.setdefault("enableNodePublicIp", True)
            inner.setdefault(
                "scaleSettings", {"maxNodeCount": 1, "minNodeCount": 0, "nodeIdleTimeBeforeScaleDown": "PT2M"}
            )
            inner.update(
                {
                    "allocationState": "Resizing"
                    if counts["preparing"] or counts["preempted"] or target != current or self.locked
                    else "Steady",
                    "allocationStateTransitionTime": iso(self.modified),
                    "errors": None,
                    "currentNodeCount": current,
                    "targetNodeCount": target,
                    "nodeStateCounts": {
                        "preparingNodeCount": counts["preparing"],
                        "runningNodeCount": counts["running"],
                        "idleNodeCount": counts["idle"],
                        "unusableNodeCount": counts["unusable"],
                        "leavingNodeCount": counts["leaving"],
                        "preemptedNodeCount": preempted,
                    },
                }
            )
        else:
            inner.setdefault("namespace", "default")
            # set by the Azure ML extension on a real cluster; null/"stable" until then
            for key in ("relayConnectionString", "serviceBusConnectionString", "extensionPrincipalId", "vcName"):
                inner.setdefault(key, None)
            inner.setdefault("extensionInstanceReleaseTrain", "stable")
            inner["defaultInstanceType"] = "defaultinstancetype"
            inner["instanceTypes"] = self.instance_types()
        props["properties"] = inner
        return {
            "id": f"{ws_id}/computes/{self.name}",
            "name": self.name,
            "type": "Microsoft.MachineLearningServices/workspaces/computes",
            "location": self.location,
            "tags": {},
            "properties": props,
            "systemData": system_data(self.created, self.modified),
        }


def default_instance_type() -> dict[str, Any]:
    """What the Azure ML extension creates when a Kubernetes cluster is attached."""
    return {
        "nodeSelector": None,
        "resources": {
            "requests": {"cpu": "100m", "memory": "2Gi"},
            "limits": {"cpu": "2", "memory": "2Gi", "nvidia.com/gpu": None},
        },
    }


@dataclass
class TrackedResource:
    """A batch endpoint or deployment: stored as the body the client sent, plus bookkeeping."""

    name: str
    body: dict[str, Any]
    created: dt.datetime = field(default_factory=utcnow)
    modified: dt.datetime = field(default_factory=utcnow)
    provisioning_state: str = "Succeeded"

    def to_arm(
        self, resource_id: str, type_name: str, extra: dict[str, Any] | None = None, *, tenant_id: str | None = None
    ) -> dict[str, Any]:
        props = dict(self.body.get("properties") or {})
        props["provisioningState"] = self.provisioning_state
        props.setdefault("description", None)  # batch_endpoint.get, batch_deployment.get: sent, null when not set
        props["properties"] = dict(props.get("properties") or {})
        if extra:
            props.update(extra)
        identity = dict(self.body.get("identity") or {"type": "SystemAssigned"})
        if "SystemAssigned" in str(identity.get("type")):  # Azure reports the system identity's principal
            identity.setdefault("principalId", str(uuid.uuid5(uuid.NAMESPACE_URL, resource_id)))
            if tenant_id:
                identity.setdefault("tenantId", tenant_id)
        return {
            "id": resource_id,
            "name": self.name,
            "type": type_name,
            "location": self.body.get("location", "eastus"),
            "kind": self.body.get("kind"),
            "tags": self.body.get("tags") or {},
            "identity": identity,
            "properties": props,
            "systemData": system_data(self.created, self.modified),
        }


@dataclass
class Job:
    """A job as ARM and run history see it. Batch invocations appear as pipeline jobs, as in Azure."""

    name: str
    job_type: str  # Pipeline (batch invoke) | Command
    compute: str
    properties: dict[str, Any]
    experiment_name: str = "Default"
    status: str = "NotStarted"
    created: dt.datetime = field(default_factory=utcnow)
    modified: dt.datetime = field(default_factory=utcnow)
    started: dt.datetime | None = None
    ended: dt.datetime | None = None
    error: dict[str, Any] | None = None
    warnings: list[dict[str, str]] = field(default_factory=list)
    run_uuid: str = field(default_factory=lambda: str(uuid.uuid4()))
    cancel_requested: bool = False  # Python-side only (tests): Azure sends nothing that tells who canceled
    repeatability_id: str | None = None
    submitted: dict[str, Any] | None = None  # the ``properties`` a client PUT, to enforce immutability
    input_uri: str | None = None
    stalled: bool = False
    # batch bookkeeping, visible through run-history properties
    endpoint: str | None = None
    deployment: str | None = None
    output_uri: str | None = None
    mini_batches_total: int = 0
    mini_batches_done: int = 0
    mini_batch_attempts: int = 0
    rows_scored: int = 0

    def set_status(self, status: str) -> None:
        self.status = status
        self.modified = utcnow()
        if status == "Running" and self.started is None:
            self.started = self.modified
        if status in TERMINAL_JOB_STATES:
            self.ended = self.modified

    def to_arm(self, ws_id: str) -> dict[str, Any]:
        props = dict(self.properties)
        props.update(
            {
                "status": self.status,
                "jobType": self.job_type,
                "experimentName": self.experiment_name,
                "computeId": f"{ws_id}/computes/{self.compute}" if self.compute else None,
                "services": {
                    "Studio": {
                        "jobServiceType": "Studio",
                        "port": None,
                        "endpoint": f"/_emulator/studio/jobs/{self.name}",
                        "status": None,
                        "errorMessage": None,
                        "properties": None,
                    }
                },
            }
        )
        props.setdefault("displayName", self.name)
        props.setdefault("description", None)
        props.setdefault("tags", {})
        props.setdefault("isArchived", False)
        props["properties"] = dict(props.get("properties") or {})
        for key in ("inputs", "outputs"):  # every job input/output has a (nullable) description
            if isinstance(props.get(key), dict):
                props[key] = {
                    k: {"description": None, **v} if isinstance(v, dict) else v for k, v in props[key].items()
                }
        props["services"]["Studio"]["nodes"] = None
        props.setdefault("identity", None)  # command_job.get, batch_job.get: sent, null when not set
        if self.job_type == "Command":
            props.setdefault("codeId", None)  # command_job.get: sent, null for a job without code
            props.setdefault("environmentVariables", {})  # command_job.get: an object, {} when none
        if self.job_type == "Pipeline":
            # batch_job.get: Azure's one recording (a job read while Preparing, then cancelled) has these
            # null; the emulator shows them filled, and the provider falls back to outputs.score.uri
            # (outcomes.py): an open question for a real workspace (docs/emulator.md, "Conformance")
            props.setdefault("settings", {})
            props.setdefault("jobs", {})
            props.setdefault("inputs", {})
            props.setdefault("outputs", {})
        else:
            props.setdefault("limits", None)
            props.setdefault("distribution", None)  # command_job.get: an object for a distributed job
            props["resources"] = {  # command_job.get: the service fills the job's resources in
                "instanceCount": 1,
                "instanceType": None,
                "properties": {},
                "shmSize": "2g",
                "dockerArgs": None,
                **(props.get("resources") or {}),
            }
        return {
            "id": f"{ws_id}/jobs/{self.name}",
            "name": self.name,
            "type": "Microsoft.MachineLearningServices/workspaces/jobs",
            "properties": props,
            "systemData": system_data(self.created, self.modified),
        }

    def to_run_details(self) -> dict[str, Any]:
        details: dict[str, Any] = {
            "runId": self.name,
            "runUuid": self.run_uuid,
            "rootRunId": self.name,
            "target": self.compute,
            "status": self.status,
            "createdTimeUtc": iso(self.created),
            "startTimeUtc": iso(self.started),
            "endTimeUtc": iso(self.ended),
            "warnings": self.warnings,
            "tags": dict(self.properties.get("tags") or {}),
            "properties": dict(self.properties.get("properties") or {}),
            "runDefinition": {},
            "logFiles": {},
        }
        if self.error:
            details["error"] = {"error": self.error}
        return details
