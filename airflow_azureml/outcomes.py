"""The one place that decides what a finished Azure ML job means, on evidence only.

Azure reports a lost low-priority cluster in two forms (the source documents, and the field
reports in Azure/MachineLearningNotebooks#1242, microsoft/MLOpsPython#346):
- ``Failed`` with Azure's own error, ``UserError: AzureMLCompute job failed. PreemptionError: Nodes
  of this job got pre-empted...``: the error *is* that text, it does not merely quote it;
- ``Canceled`` for lack of capacity, only when the whole cluster (or its single node) was preempted.
  Azure sends no message and no property for that cancel, so only the cluster's
  ``preemptedNodeCount`` gauge can tell it: a read taken *while the job ran* (between the start and
  end times run history records, ``GaugeEvidence``) found every node of the cluster preempted, at
  least the job's own nodes.
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
    # when the job ran, as run history records it (startTimeUtc, endTimeUtc; epoch seconds): read for an ended
    # job, it says which of the wait's compute reads were taken while the job ran, and floors its bill
    started_at: float | None = None
    ended_at: float | None = None

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
            "started_at": self.started_at,
            "ended_at": self.ended_at,
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
            instance_count=node_count(data.get("instance_count")),
            started_at=_epoch(data.get("started_at")),
            ended_at=_epoch(data.get("ended_at")),
        )

    @classmethod
    def from_rest(cls, arm_job: dict[str, Any], run_details: dict[str, Any] | None = None) -> JobSnapshot:
        """Build from the ARM job resource and (optionally) the run-history details document."""
        props = arm_job.get("properties") or {}
        compute_id = props.get("computeId") or ""
        run_props = props.get("properties") or {}
        # run history's details are best effort (a completed job's are only for the bill): a body of another
        # shape than documented gives no details rather than failing the wait
        details = run_details if isinstance(run_details, dict) else {}
        error = _message(_message_holder(details.get("error")))
        found = details.get("warnings")
        warnings = tuple(m for m in (_message(w) for w in (found if isinstance(found, list) else ())) if m)
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
            instance_count=node_count((props.get("compute") or {}).get("instanceCount"))
            or node_count((props.get("resources") or {}).get("instanceCount")),
            started_at=utc_epoch(details.get("startTimeUtc")),
            ended_at=utc_epoch(details.get("endTimeUtc")),
        )


def _message_holder(error: Any) -> Any:
    """Run history's ``error`` is ``{"error": {"message": ...}}``: the inner object, or None."""
    return error.get("error") if isinstance(error, dict) else None


def _message(item: Any) -> str | None:
    """The ``message`` of an error or warning object; None for anything else."""
    message = item.get("message") if isinstance(item, dict) else None
    return message if isinstance(message, str) and message else None


def node_count(value: Any) -> int | None:
    """A positive node count as the service (or a span) gave it, else None: unknown is never a guess, and a
    JSON ``true`` is not 1. The one check for every node count read (job, deployment, cost span)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def _epoch(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def utc_epoch(value: Any) -> float | None:
    """Run history's ISO 8601 UTC time as epoch seconds; None for anything else (Azure's recordings hold
    the string "null" where a time is unset)."""
    if not isinstance(value, str) or not value or value == "null":
        return None
    from datetime import datetime, timezone

    # Python 3.10 reads neither "Z" nor the 7 fraction digits .NET writes
    text = re.sub(r"(\.\d{6})\d+", r"\1", value.strip()).replace("Z", "+00:00")
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        return None
    return (parsed if parsed.tzinfo else parsed.replace(tzinfo=timezone.utc)).timestamp()


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
    """The cluster's ``preemptedNodeCount`` gauge as read *while this job ran*.

    The gauge counts nodes in preempted state right now (2024-10-01 swagger); it falls again as
    nodes are replaced, and on a shared cluster it also counts other jobs' nodes. Azure cancels a job
    for lack of capacity only when the whole cluster (or its single node) is preempted, so the
    evidence kept is a read where every node of the cluster (``currentNodeCount``, which still counts
    preempted nodes) was preempted: the job's own nodes among them. A read counts as taken while the
    job ran when the wait saw the job Running before and after it, or when it falls between the start
    and end times run history records (``polling.JobWatch`` decides). Produced by the waits (sync and
    triggerer, shared compute reads), consumed by ``classify``. ``None`` means "not read", never zero.
    """

    compute: str | None = None
    low_priority: bool | None = None
    samples: int = 0  # compute reads taken while the job ran
    first_while_running: int | None = None
    peak_while_running: int | None = None
    # A read taken after the job was seen ended: logged with the verdict, never evidence (by then the
    # gauge may be up for another job's nodes, on the deferred path minutes later).
    at_end: int | None = None
    # The most nodes preempted at a read, taken while the job ran, at which every node of the cluster was.
    whole_cluster_preempted: int | None = None
    # Every node of the cluster preempted (this many) at a read near the job's end: the first after run
    # history's end time (within one evidence interval, no fewer nodes than before), one within a second
    # before that end time, or one that only the run times place in the run (``polling.JobWatch``). Weak.
    whole_cluster_preempted_near_end: int | None = None

    def observe(self, compute: str, low_priority: bool, preempted: int, nodes: int | None = None) -> GaugeEvidence:
        """A read taken while the job ran (``nodes``: the cluster's currentNodeCount, if sent)."""
        first = preempted if self.first_while_running is None else self.first_while_running
        peak = preempted if self.peak_while_running is None else max(self.peak_while_running, preempted)
        whole = self.whole_cluster_preempted
        if nodes is not None and 0 < nodes <= preempted:
            whole = max(whole or 0, preempted)
        return replace(
            self,
            compute=compute,
            low_priority=low_priority,
            samples=self.samples + 1,
            first_while_running=first,
            peak_while_running=peak,
            whole_cluster_preempted=whole,
        )

    def near_end(self, preempted: int) -> GaugeEvidence:
        """Every node of the cluster preempted at the first read after the job's end (see the field)."""
        return replace(self, low_priority=True, whole_cluster_preempted_near_end=preempted)

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
        """While the job ran (or at the read just after its end), every node of the low-priority cluster was
        preempted, at least the job's own."""
        if not self.low_priority:
            return False
        seen = [n for n in (self.whole_cluster_preempted, self.whole_cluster_preempted_near_end) if n is not None]
        return any(instance_count is None or n >= instance_count for n in seen)

    def to_dict(self) -> dict[str, Any]:
        return {
            "compute": self.compute,
            "low_priority": self.low_priority,
            "samples": self.samples,
            "first_while_running": self.first_while_running,
            "peak_while_running": self.peak_while_running,
            "at_end": self.at_end,
            "whole_cluster_preempted": self.whole_cluster_preempted,
            "whole_cluster_preempted_near_end": self.whole_cluster_preempted_near_end,
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
            whole_cluster_preempted=data.get("whole_cluster_preempted"),
            whole_cluster_preempted_near_end=data.get("whole_cluster_preempted_near_end"),
        )


@dataclass(frozen=True)
class ActivityEvidence:
    """What the Azure Activity Log said about a job's cancel: who sent one through Azure Resource Manager.

    ARM logs every action sent through it with its caller, so a cancel found here is a person's (or a
    program's) for sure; a cancel through Studio's path is not logged, and events show minutes late, so
    finding none is not evidence of anything. ``read`` False: the log could not be read (``note``).
    """

    read: bool
    cancels: tuple[tuple[str, float], ...] = ()  # (caller, when: epoch seconds) of each cancel request
    own_identity: tuple[str, ...] = ()  # the callers among them that are this connection's own identity
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "read": self.read,
            "cancels": [list(c) for c in self.cancels],
            "own_identity": list(self.own_identity),
            "note": self.note,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> ActivityEvidence | None:
        if not data:
            return None
        cancels = tuple((str(c[0]), float(c[1])) for c in data.get("cancels") or () if len(c) == 2)
        own = tuple(str(c) for c in data.get("own_identity") or ())
        return cls(bool(data.get("read")), cancels, own, str(data.get("note") or ""))


@dataclass(frozen=True)
class Classification:
    """A verdict and the evidence it rests on (logged, and returned in XCom)."""

    outcome: Outcome
    reason: str
    evidence: dict[str, Any] = field(default_factory=dict)
    # What decided (the log says it): "status" (Completed, or Failed with another error), "azure_error"
    # (Azure's PreemptionError text), "airflow_record" (on_kill's cancel record), "activity_log" (a cancel
    # request the Azure Activity Log records, with its caller), "gauge" (every node of the cluster preempted at
    # a read while the job ran), "gauge_near_end" (at the first read just after its end: a person's cancel
    # followed at once by a preemption looks the same, so the Activity Log is read again after a wait),
    # "none" (a cancel no witness explains: ambiguous).
    witness: str = "status"

    @property
    def ambiguous(self) -> bool:
        """A cancel that no witness tells from a person's or from lost capacity (``on_ambiguous_cancel``)."""
        return self.witness == "none"

    def to_dict(self) -> dict[str, Any]:
        return {
            "outcome": self.outcome.value,
            "reason": self.reason,
            "evidence": dict(self.evidence),
            "witness": self.witness,
        }


def _gauge_says(gauge: GaugeEvidence | None, instance_count: int | None) -> str:
    if gauge is None or gauge.samples == 0:
        return "no read of the cluster's preemptedNodeCount was taken while the job ran"
    if not gauge.low_priority:
        return f"compute {gauge.compute} is not low priority"
    seen = (
        f"({gauge.samples} read(s) while the job ran, {gauge.first_while_running} -> peak "
        f"{gauge.peak_while_running}; {gauge.at_end if gauge.at_end is not None else 'not read'} after its end, "
        "not evidence)"
    )
    if gauge.whole_cluster_preempted is not None:
        return (
            f"every node of the cluster was preempted at a read while the job ran, but only "
            f"{gauge.whole_cluster_preempted}, fewer than the job's {instance_count} {seen}"
        )
    return f"no read of the cluster's preemptedNodeCount while the job ran found every node preempted {seen}"


def classify(
    job: JobSnapshot,
    *,
    gauge: GaugeEvidence | None = None,
    canceled_by_airflow: bool = False,
    compute: ComputeFacts | None = None,
    activity: ActivityEvidence | None = None,
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
            return Classification(
                Outcome.PREEMPTED, f"failed with Azure's preemption error: {message}", evidence, "azure_error"
            )
        return Classification(Outcome.FAILED, message or "job failed without an error message", evidence)
    # Canceled. Azure sends no message for a capacity cancel (nor anything that tells it from a person's).
    if canceled_by_airflow:
        evidence["canceled_by_airflow"] = True
        return Classification(
            Outcome.AIRFLOW_CANCELED, "canceled by Airflow (task killed or cleared)", evidence, "airflow_record"
        )
    if activity is not None:
        evidence["activity_log"] = activity.to_dict()
    if activity is not None and activity.cancels:
        callers = sorted({caller or "an unnamed caller" for caller, _ in activity.cancels})
        own = (
            " (this connection's own identity: Airflow's cancel whose record was lost, or someone using the "
            "same credential)"
        )
        return Classification(
            Outcome.USER_CANCELED,
            f"canceled by {', '.join(callers)}: the Azure Activity Log records the cancel request"
            + (own if activity.own_identity else ""),
            evidence,
            "activity_log",
        )
    lost = gauge is not None and gauge.lost_nodes_of(job.instance_count)
    evidence["instance_count"] = job.instance_count
    evidence["gauge_rose_while_running"] = gauge is not None and gauge.rose_while_running
    evidence["whole_cluster_preempted_while_running"] = lost
    if lost:
        assert gauge is not None
        size = job.instance_count or "unknown"
        while_running = gauge.whole_cluster_preempted is not None and (
            job.instance_count is None or gauge.whole_cluster_preempted >= job.instance_count
        )
        if while_running:
            when = (
                f"preemptedNodeCount {gauge.whole_cluster_preempted} = every node of the cluster, at one of "
                f"{gauge.samples} read(s) taken while it ran"
            )
        else:
            when = (
                f"preemptedNodeCount {gauge.whole_cluster_preempted_near_end} = every node of the cluster "
                "at a read near its end: the first after it, one within a second before it, or one that only "
                "run history's times place in the run"
            )
        return Classification(
            Outcome.PREEMPTED,
            f"canceled as low-priority cluster {gauge.compute} was wholly preempted ({when}; job size {size})",
            evidence,
            "gauge" if while_running else "gauge_near_end",
        )
    log_says = ""
    if activity is not None:
        log_says = (
            "; the Activity Log shows no cancel request (yet: events show minutes late, and a cancel from Studio "
            "is not logged)"
            if activity.read
            else f"; the Activity Log could not be read ({activity.note})"
        )
    return Classification(
        Outcome.USER_CANCELED,
        "canceled, and not by Airflow: no lost-capacity message (Azure sends none), and "
        f"{_gauge_says(gauge, job.instance_count)}{log_says}; no witness tells it from lost capacity, "
        "taken as a person's cancel",
        evidence,
        "none",
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
