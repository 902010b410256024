"""The one place that decides what a finished Azure ML job means, on evidence only.

Azure reports a lost low-priority cluster in two forms (the source documents, and the field
reports in Azure/MachineLearningNotebooks#1242, microsoft/MLOpsPython#346):
- ``Failed`` with Azure's own error, ``UserError: AzureMLCompute job failed. PreemptionError: Nodes
  of this job got pre-empted...``: the error *is* that text, it does not merely quote it;
- ``Canceled`` for lack of capacity, only when the whole cluster (or its single node) was preempted.
  Azure sends no message and no property for that cancel, so only the cluster's
  ``preemptedNodeCount`` gauge can tell it: sampled *while the job ran* (``GaugeEvidence``), it must
  have risen by this job's nodes, up to every node of the cluster.
Both are preemptions and may be resubmitted; a person's cancel and a code failure may not.

A word such as "preempt", "evict", "capacity" or "low priority" in a user error or a warning is not
evidence, nor is a read taken after the job ended (the gauge may be up by then for another job).
When in doubt, it is not a preemption: resubmitting what a person cancelled would override them and
pay twice.
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

# Azure's own error (field reports above). It counts only as the whole message, optionally after
# the "UserError: " code prefix: user code that prints or asserts on it elsewhere is a code failure.
_PREEMPTION_ERROR = re.compile(
    r"(?:UserError: )?AzureMLCompute job failed\. PreemptionError: Nodes of this job got pre-empted\b"
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
    # nodes the job holds, from the job resource (batch: compute.instanceCount; command: resources.instanceCount)
    instance_count: int | None = None

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
            "instance_count": self.instance_count,
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
            instance_count=_count(data.get("instance_count")),
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
            output_uri=_without_sas_signature(
                run_props.get("azureml.batch.outputUri") or ((props.get("outputs") or {}).get("score") or {}).get("uri")
            ),
            tags=dict(props.get("tags") or {}),
            properties={str(k): str(v) for k, v in run_props.items() if v is not None},
            instance_count=_count((props.get("compute") or {}).get("instanceCount"))
            or _count((props.get("resources") or {}).get("instanceCount")),
        )


def _count(value: Any) -> int | None:
    """A positive node count as the service sent it, else None (unknown is never a guess)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


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
    nodes are replaced, and on a shared cluster it also counts other jobs' nodes. Azure cancels a job
    for lack of capacity only when the whole cluster (or its single node) is preempted, so the evidence
    kept is the rise above the first sample at samples where every node of the cluster
    (``currentNodeCount``, which still counts preempted nodes) was preempted. Produced by the waits
    (sync and triggerer, shared compute reads), consumed by ``classify``. ``None`` means "not
    sampled", never zero.
    """

    compute: str | None = None
    low_priority: bool | None = None
    samples: int = 0  # compute reads taken while the job was Running
    first_while_running: int | None = None
    peak_while_running: int | None = None
    # A read taken after the job was seen ended: logged with the verdict, never evidence (by then the
    # gauge may be up for another job's nodes, on the deferred path minutes later).
    at_end: int | None = None
    # The largest rise above the first sample seen while every node of the cluster was preempted, and
    # whether at such a sample the rise covered all of the cluster's nodes (none was preempted before).
    whole_cluster_rise: int | None = None
    whole_cluster_rise_covers_cluster: bool = False

    def observe(self, compute: str, low_priority: bool, preempted: int, nodes: int | None = None) -> GaugeEvidence:
        """A new sample taken while the job was Running (``nodes``: the cluster's currentNodeCount, if sent)."""
        first = preempted if self.first_while_running is None else self.first_while_running
        peak = preempted if self.peak_while_running is None else max(self.peak_while_running, preempted)
        rise, covers = self.whole_cluster_rise, self.whole_cluster_rise_covers_cluster
        if self.samples >= 1 and nodes is not None and 0 < nodes <= preempted and preempted > first:
            rise = max(rise or 0, preempted - first)
            covers = covers or preempted - first >= nodes
        return GaugeEvidence(compute, low_priority, self.samples + 1, first, peak, self.at_end, rise, covers)

    def ended(self, preempted: int | None) -> GaugeEvidence:
        """The read taken when the job was first seen ended (None: the read failed). Logged, not evidence."""
        return replace(self, at_end=preempted)

    @property
    def rose_while_running(self) -> bool:
        """Any rise between two samples taken while the job ran (whoever's node it was)."""
        return (
            self.samples >= 2
            and self.first_while_running is not None
            and self.peak_while_running is not None
            and self.peak_while_running > self.first_while_running
        )

    def lost_nodes_of(self, instance_count: int | None) -> bool:
        """While the job ran, the whole low-priority cluster went preempted, by at least the job's nodes.

        With the job's node count unknown, the rise must cover every node of the cluster.
        """
        if not self.low_priority or self.whole_cluster_rise is None:
            return False
        if instance_count is None:
            return self.whole_cluster_rise_covers_cluster
        return self.whole_cluster_rise >= instance_count

    def to_dict(self) -> dict[str, Any]:
        return {
            "compute": self.compute,
            "low_priority": self.low_priority,
            "samples": self.samples,
            "first_while_running": self.first_while_running,
            "peak_while_running": self.peak_while_running,
            "at_end": self.at_end,
            "whole_cluster_rise": self.whole_cluster_rise,
            "whole_cluster_rise_covers_cluster": self.whole_cluster_rise_covers_cluster,
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
            whole_cluster_rise=data.get("whole_cluster_rise"),
            whole_cluster_rise_covers_cluster=bool(data.get("whole_cluster_rise_covers_cluster")),
        )


@dataclass(frozen=True)
class Classification:
    """A verdict and the evidence it rests on (logged, and returned in XCom)."""

    outcome: Outcome
    reason: str
    evidence: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"outcome": self.outcome.value, "reason": self.reason, "evidence": dict(self.evidence)}


def _gauge_says(gauge: GaugeEvidence | None, instance_count: int | None) -> str:
    if gauge is None or gauge.samples == 0:
        return "the cluster's preemptedNodeCount was not sampled while the job ran"
    if gauge.samples < 2:
        return (
            "the cluster's preemptedNodeCount was sampled only once while the job ran "
            "(a read after its end is not evidence)"
        )
    if not gauge.low_priority:
        return f"compute {gauge.compute} is not low priority"
    seen = (
        f"({gauge.first_while_running} -> peak {gauge.peak_while_running}, {gauge.samples} samples, "
        f"{gauge.at_end if gauge.at_end is not None else 'not read'} after its end, not evidence)"
    )
    if not gauge.rose_while_running:
        return f"the cluster's preemptedNodeCount did not rise while the job ran {seen}"
    nodes = f"the job's {instance_count} node(s)" if instance_count else "every node of the cluster (job size unknown)"
    return (
        f"the cluster's preemptedNodeCount rose while the job ran {seen}, but not with the whole cluster "
        f"preempted by {nodes}: another job's nodes may have gone"
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
        if _PREEMPTION_ERROR.match(message.strip()):
            evidence["preemption_error"] = message
            return Classification(Outcome.PREEMPTED, f"failed with Azure's preemption error: {message}", evidence)
        return Classification(Outcome.FAILED, message or "job failed without an error message", evidence)
    # Canceled. Azure sends no message for a capacity cancel (nor anything that tells it from a person's).
    if canceled_by_airflow:
        evidence["canceled_by_airflow"] = True
        return Classification(Outcome.AIRFLOW_CANCELED, "canceled by Airflow (task killed or cleared)", evidence)
    lost = gauge is not None and gauge.lost_nodes_of(job.instance_count)
    evidence["instance_count"] = job.instance_count
    evidence["gauge_rose_while_running"] = gauge is not None and gauge.rose_while_running
    evidence["whole_cluster_preempted_while_running"] = lost
    if lost:
        assert gauge is not None
        return Classification(
            Outcome.PREEMPTED,
            f"canceled as low-priority cluster {gauge.compute} was wholly preempted while the job ran "
            f"(preemptedNodeCount {gauge.first_while_running} -> {gauge.peak_while_running}, a rise of "
            f"{gauge.whole_cluster_rise} node(s), job size {job.instance_count or 'unknown'})",
            evidence,
        )
    return Classification(
        Outcome.USER_CANCELED,
        "canceled, and not by Airflow: no lost-capacity message (Azure sends none), and "
        f"{_gauge_says(gauge, job.instance_count)}; taken as a person's cancel",
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


def _without_sas_signature(uri: Any) -> str | None:
    """An output URI as it may be logged, raised and put in XCom: a SAS signature never travels on."""
    if not uri:
        return None
    from airflow_azureml.redaction import safe_uri

    return safe_uri(str(uri))
