"""The one place that decides what a finished Azure ML job means, on evidence only.

Azure reports a lost low-priority cluster in two forms (the source documents, and the field
reports in Azure/MachineLearningNotebooks#1242, microsoft/MLOpsPython#346):
- ``Canceled`` for lack of capacity, when the whole (or a single-node) cluster was preempted;
- ``Failed`` with ``PreemptionError: Nodes of this job got pre-empted``.
Both are preemptions and may be resubmitted; a person's cancel and a code failure may not.

Evidence counts only when it is what Azure says: those two messages, or the cluster's
``preemptedNodeCount`` gauge rising *while the job ran* (``GaugeEvidence``). A word such as
"preempt", "evict" or "low priority" in a user error or a warning is not evidence, and Azure
sends nothing that tells a person's cancel from a platform cancel. When in doubt, it is not a
preemption: resubmitting what a person cancelled would override them and pay twice.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, field, replace
from typing import Any

QUEUED_STATES = frozenset({"NotStarted", "Starting", "Provisioning", "Preparing", "Queued"})
# NotResponding and Paused are not terminal: the job may resume and still write its output,
# so nothing may start a second job while it is in either state.
TERMINAL_STATES = frozenset({"Completed", "Failed", "Canceled"})

# Azure's own wording (field reports above), as the job's error, never in a warning.
_PREEMPTION_ERROR = re.compile(r"\bPreemptionError: Nodes of this job got pre-?empted\b")
# The documented lost-capacity cancel: one message that says the job was cancelled *because*
# the cluster lost its nodes / capacity. "low priority" or "preempt" alone does not match.
_CAPACITY_CANCEL = re.compile(
    r"\bcancel+ed\b[^.]*?\b(?:lost all (?:of )?its nodes|lack of capacity|not enough capacity)\b", re.IGNORECASE
)


class Outcome(str, enum.Enum):
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    PREEMPTED = "preempted"
    USER_CANCELED = "user_canceled"
    AIRFLOW_CANCELED = "airflow_canceled"  # Airflow's on_kill cancelled it (recorded before the cancel)


@dataclass(frozen=True)
class JobSnapshot:
    """What we know about a job at one poll: ARM status plus, when finished, the run-history details."""

    name: str
    status: str
    compute: str | None = None
    error_message: str | None = None
    warnings: tuple[str, ...] = ()
    output_uri: str | None = None
    tags: dict[str, str] = field(default_factory=dict)
    properties: dict[str, str] = field(default_factory=dict)  # the job's (immutable) user properties

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
            "output_uri": self.output_uri,
            "tags": dict(self.tags),
            "properties": dict(self.properties),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JobSnapshot:
        return cls(
            name=data["name"],
            status=data["status"],
            compute=data.get("compute"),
            error_message=data.get("error_message"),
            warnings=tuple(data.get("warnings") or ()),
            output_uri=data.get("output_uri"),
            tags=dict(data.get("tags") or {}),
            properties=dict(data.get("properties") or {}),
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
        return cls(
            name=arm_job.get("name", ""),
            status=props.get("status") or "Unknown",
            compute=compute_id.rstrip("/").rsplit("/", 1)[-1] or None,
            error_message=error,
            warnings=warnings,
            output_uri=run_props.get("azureml.batch.outputUri")
            or ((props.get("outputs") or {}).get("score") or {}).get("uri"),
            tags=dict(props.get("tags") or {}),
            properties={str(k): str(v) for k, v in run_props.items() if v is not None},
        )


@dataclass(frozen=True)
class ComputeFacts:
    """One read of a cluster: is it low priority, and how many nodes are preempted *right now*.

    A single read is not evidence about a job; the waits turn reads taken while a job ran into
    ``GaugeEvidence``.
    """

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
    # One read taken as soon as the wait saw the job end Canceled. With a sample taken while the job
    # ran, it bounds the run: Azure cancels a job whose cluster lost its nodes at once, and the nodes
    # stay counted as preempted until they are deallocated.
    at_end: int | None = None

    def observe(self, compute: str, low_priority: bool, preempted: int) -> GaugeEvidence:
        """A new sample taken while the job was Running."""
        first = preempted if self.first_while_running is None else self.first_while_running
        peak = preempted if self.peak_while_running is None else max(self.peak_while_running, preempted)
        return GaugeEvidence(compute, low_priority, self.samples + 1, first, peak, self.at_end)

    def ended(self, preempted: int | None) -> GaugeEvidence:
        """The read taken when the job was first seen ended (None: the read failed)."""
        return replace(self, at_end=preempted)

    @property
    def rose_by_end(self) -> bool:
        """The gauge was higher right after the job ended than while it ran."""
        return (
            self.samples >= 1
            and None not in (self.first_while_running, self.at_end)
            and (
                self.at_end > self.first_while_running  # type: ignore[operator]
            )
        )

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
            "at_end": self.at_end,
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
            at_end=data.get("at_end"),
        )


@dataclass(frozen=True)
class Classification:
    """A verdict and the evidence it rests on (logged, and returned in XCom)."""

    outcome: Outcome
    reason: str
    evidence: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"outcome": self.outcome.value, "reason": self.reason, "evidence": dict(self.evidence)}


def _gauge_says(gauge: GaugeEvidence | None) -> str:
    if gauge is None or gauge.samples == 0:
        return "the cluster's preemptedNodeCount was not sampled while the job ran"
    if gauge.samples < 2 and gauge.at_end is None:
        return "the cluster's preemptedNodeCount was sampled only once while the job ran, and not at its end"
    if not gauge.low_priority:
        return f"compute {gauge.compute} is not low priority"
    return (
        f"the cluster's preemptedNodeCount did not rise while the job ran "
        f"({gauge.first_while_running} -> peak {gauge.peak_while_running}, {gauge.samples} samples, "
        f"{gauge.at_end if gauge.at_end is not None else 'not read'} at its end)"
    )


def classify(
    job: JobSnapshot,
    *,
    gauge: GaugeEvidence | None = None,
    canceled_by_airflow: bool = False,
    compute: ComputeFacts | None = None,
) -> Classification:
    """Decide what a job's state means, from what Azure said and the gauge sampled while it ran.

    ``compute`` (one read, usually after the job ended) is accepted for callers' convenience but is
    never evidence: the gauge may be up because of another job, and a missing baseline is not zero.
    """
    del compute  # deliberately unused, see above
    status = job.status
    evidence: dict[str, Any] = {"status": status, "gauge": gauge.to_dict() if gauge is not None else None}
    if status not in TERMINAL_STATES:
        return Classification(Outcome.RUNNING, f"job is {status}", evidence)
    if status == "Completed":
        return Classification(Outcome.SUCCEEDED, "job completed", evidence)
    message = job.error_message or ""
    if status == "Failed":
        if _PREEMPTION_ERROR.search(message):
            evidence["preemption_error"] = message
            return Classification(Outcome.PREEMPTED, f"failed with Azure's preemption error: {message}", evidence)
        return Classification(Outcome.FAILED, message or "job failed without an error message", evidence)
    # Canceled
    if canceled_by_airflow:
        evidence["canceled_by_airflow"] = True
        return Classification(Outcome.AIRFLOW_CANCELED, "canceled by Airflow (task killed or cleared)", evidence)
    capacity = next((m for m in (*job.warnings, message) if m and _CAPACITY_CANCEL.search(m)), None)
    rose = gauge is not None and bool(gauge.low_priority) and (gauge.rose_while_running or gauge.rose_by_end)
    evidence["capacity_message"] = capacity
    evidence["gauge_rose_while_running"] = rose
    if capacity:
        return Classification(Outcome.PREEMPTED, f"canceled by Azure for lost capacity: {capacity}", evidence)
    if rose:
        assert gauge is not None
        top = max(gauge.peak_while_running or 0, gauge.at_end or 0)
        return Classification(
            Outcome.PREEMPTED,
            f"canceled as low-priority cluster {gauge.compute} lost nodes "
            f"(preemptedNodeCount {gauge.first_while_running} while the job ran -> {top} by its end)",
            evidence,
        )
    return Classification(
        Outcome.USER_CANCELED,
        f"canceled, and not by Airflow: no lost-capacity message, and {_gauge_says(gauge)}; taken as a person's cancel",
        evidence,
    )


def exception_for(job: JobSnapshot, verdict: Classification) -> Exception:
    """The typed exception for a job that did not succeed."""
    from airflow_azureml.exceptions import (
        AzureMLJobCanceledError,
        AzureMLJobFailedError,
        AzureMLJobPreemptedError,
    )

    if verdict.outcome in (Outcome.USER_CANCELED, Outcome.AIRFLOW_CANCELED):
        return AzureMLJobCanceledError(
            f"Job {job.name} was {verdict.reason}. Not resubmitting: a person's cancel is final. "
            "To run the work again, clear the task.",
            job_name=job.name,
            status=job.status,
        )
    if verdict.outcome is Outcome.PREEMPTED:
        return AzureMLJobPreemptedError(
            f"Job {job.name} was preempted: {verdict.reason}", job_name=job.name, status=job.status
        )
    return AzureMLJobFailedError(f"Job {job.name} failed: {verdict.reason}", job_name=job.name, status=job.status)
