"""The one place that decides what a finished Azure ML job means.

Azure reports a lost low-priority cluster in two forms (see the source documents and the
field reports in Azure/MachineLearningNotebooks#1242, microsoft/MLOpsPython#346):
- ``Canceled`` with a lost-capacity message, when the whole cluster was preempted;
- ``Failed`` with ``PreemptionError: Nodes of this job got pre-empted``.
Both are preemptions and may be resubmitted; a user's cancel and a code failure may not.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field
from typing import Any

QUEUED_STATES = frozenset({"NotStarted", "Starting", "Provisioning", "Preparing", "Queued"})
TERMINAL_STATES = frozenset({"Completed", "Failed", "Canceled", "NotResponding", "Paused"})

_PREEMPTION_ERROR = re.compile(r"preemption\s*error|pre-?empted|pre-?emption warning", re.IGNORECASE)
_CAPACITY_LOST = re.compile(
    r"pre-?empt|lost (all )?(its )?(nodes|capacity)|not enough capacity|lack of capacity|low[- ]priority|evict",
    re.IGNORECASE,
)


class Outcome(str, enum.Enum):
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    PREEMPTED = "preempted"
    USER_CANCELED = "user_canceled"


@dataclass(frozen=True)
class JobSnapshot:
    """What we know about a job at one poll: ARM status plus, when finished, the run-history details."""

    name: str
    status: str
    compute: str | None = None
    error_message: str | None = None
    warnings: tuple[str, ...] = ()
    cancel_requested: bool = False
    output_uri: str | None = None
    tags: dict[str, str] = field(default_factory=dict)

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL_STATES

    @property
    def queued(self) -> bool:
        return self.status in QUEUED_STATES

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status,
            "compute": self.compute,
            "error_message": self.error_message,
            "warnings": list(self.warnings),
            "cancel_requested": self.cancel_requested,
            "output_uri": self.output_uri,
            "tags": dict(self.tags),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JobSnapshot:
        return cls(
            name=data["name"],
            status=data["status"],
            compute=data.get("compute"),
            error_message=data.get("error_message"),
            warnings=tuple(data.get("warnings") or ()),
            cancel_requested=bool(data.get("cancel_requested")),
            output_uri=data.get("output_uri"),
            tags=dict(data.get("tags") or {}),
        )

    @classmethod
    def from_rest(cls, arm_job: dict[str, Any], run_details: dict[str, Any] | None = None) -> JobSnapshot:
        """Build from the ARM job resource and (optionally) the run-history details document."""
        props = arm_job.get("properties") or {}
        compute_id = props.get("computeId") or ""
        run_props = props.get("properties") or {}
        details = run_details or {}
        error = ((details.get("error") or {}).get("error") or {}).get("message")
        warnings = tuple(w.get("message", "") for w in details.get("warnings") or () if w.get("message"))
        cancel_requested = str((details.get("properties") or {}).get("azureml.cancelRequested", "")).lower() == "true"
        return cls(
            name=arm_job.get("name", ""),
            status=props.get("status") or "Unknown",
            compute=compute_id.rstrip("/").rsplit("/", 1)[-1] or None,
            error_message=error,
            warnings=warnings,
            cancel_requested=cancel_requested,
            output_uri=run_props.get("azureml.batch.outputUri")
            or ((props.get("outputs") or {}).get("score") or {}).get("uri"),
            tags=dict(props.get("tags") or {}),
        )


@dataclass(frozen=True)
class ComputeFacts:
    """The cluster facts classification needs: is it low priority, and did it lose nodes."""

    low_priority: bool
    preempted_node_count: int

    @classmethod
    def from_rest(cls, arm_compute: dict[str, Any] | None) -> ComputeFacts | None:
        if not arm_compute:
            return None
        inner = (arm_compute.get("properties") or {}).get("properties") or {}
        counts = inner.get("nodeStateCounts") or {}
        return cls(
            low_priority=str(inner.get("vmPriority", "")).lower() == "lowpriority",
            preempted_node_count=int(counts.get("preemptedNodeCount") or 0),
        )


@dataclass(frozen=True)
class GaugeEvidence:
    """The cluster's ``preemptedNodeCount`` gauge as sampled *while this job was Running*.

    The gauge counts nodes in preempted state right now (2024-10-01 swagger); it falls again as
    nodes are replaced. Only a rise between two samples taken while the job ran says anything
    about this job. Produced by the waits (sync and triggerer, shared compute reads), consumed by
    ``classify``. ``None`` fields mean "not sampled", never zero.
    """

    compute: str | None = None
    low_priority: bool | None = None
    samples: int = 0  # compute reads taken while the job was Running
    first_while_running: int | None = None
    peak_while_running: int | None = None

    def observe(self, compute: str, low_priority: bool, preempted: int) -> GaugeEvidence:
        """A new sample taken while the job was Running."""
        first = preempted if self.first_while_running is None else self.first_while_running
        peak = preempted if self.peak_while_running is None else max(self.peak_while_running, preempted)
        return GaugeEvidence(compute, low_priority, self.samples + 1, first, peak)

    @property
    def rose_while_running(self) -> bool:
        return (
            self.samples >= 2
            and self.first_while_running is not None
            and self.peak_while_running is not None
            and self.peak_while_running > self.first_while_running
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "compute": self.compute,
            "low_priority": self.low_priority,
            "samples": self.samples,
            "first_while_running": self.first_while_running,
            "peak_while_running": self.peak_while_running,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> GaugeEvidence:
        data = data or {}
        return cls(
            compute=data.get("compute"),
            low_priority=data.get("low_priority"),
            samples=int(data.get("samples") or 0),
            first_while_running=data.get("first_while_running"),
            peak_while_running=data.get("peak_while_running"),
        )


@dataclass(frozen=True)
class Classification:
    outcome: Outcome
    reason: str


def classify(
    job: JobSnapshot,
    *,
    compute: ComputeFacts | None = None,
    preempted_baseline: int | None = None,
    canceled_by_airflow: bool = False,
) -> Classification:
    """Decide what a job's state means.

    ``preempted_baseline`` is the cluster's ``preemptedNodeCount`` when the job was submitted;
    a rise since then is evidence that this job's nodes were taken back.
    """
    status = job.status
    if status not in TERMINAL_STATES:
        return Classification(Outcome.RUNNING, f"job is {status}")
    if status == "Completed":
        return Classification(Outcome.SUCCEEDED, "job completed")
    message = job.error_message or ""
    if status == "Failed":
        if _PREEMPTION_ERROR.search(message):
            return Classification(Outcome.PREEMPTED, f"failed with a preemption error: {message}")
        return Classification(Outcome.FAILED, message or "job failed without an error message")
    if status == "Canceled":
        if canceled_by_airflow:
            return Classification(Outcome.USER_CANCELED, "canceled by Airflow")
        capacity_message = next((w for w in job.warnings if _CAPACITY_LOST.search(w)), None)
        nodes_lost = (
            compute is not None and compute.low_priority and compute.preempted_node_count > (preempted_baseline or 0)
        )
        if capacity_message or (nodes_lost and not job.cancel_requested):
            why = capacity_message or (
                f"cluster preempted {compute.preempted_node_count - (preempted_baseline or 0)} node(s)"  # type: ignore[union-attr]
            )
            return Classification(Outcome.PREEMPTED, f"canceled by the platform: {why}")
        return Classification(Outcome.USER_CANCELED, "canceled by a user")
    return Classification(Outcome.FAILED, f"job ended in state {status}: {message or 'no message'}")


def exception_for(job: JobSnapshot, verdict: Classification) -> Exception:
    """The typed exception for a job that did not succeed."""
    from airflow_azureml.exceptions import (
        AzureMLJobCanceledError,
        AzureMLJobFailedError,
        AzureMLJobPreemptedError,
    )

    if verdict.outcome is Outcome.USER_CANCELED:
        return AzureMLJobCanceledError(
            f"Job {job.name} was {verdict.reason}; not resubmitting.", job_name=job.name, status=job.status
        )
    if verdict.outcome is Outcome.PREEMPTED:
        return AzureMLJobPreemptedError(
            f"Job {job.name} was preempted: {verdict.reason}", job_name=job.name, status=job.status
        )
    return AzureMLJobFailedError(f"Job {job.name} failed: {verdict.reason}", job_name=job.name, status=job.status)
