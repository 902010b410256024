"""The one record of a unit of work that Airflow keeps between tries, and how it is stored.

``ResubmissionState`` is what ``lifecycle`` decides on and what ``task_state_store`` holds (``to_store`` /
``from_store``). Kept apart from the decisions so that the record's fields and their meaning across a
retry or a clear read in one place. Pure: no Airflow, no Azure.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

MAX_RECORDED = 200  # jobs remembered as recorded in the shared spot history (a chain is far shorter)


@dataclass
class ResubmissionState:
    """Where one unit of work stands for this run of the task.

    ``airflow_canceled`` holds the jobs whose cancel is Airflow's, recorded by ``on_kill`` (or the
    queue-time limit) *before* the cancel was sent: Azure sends nothing that tells such a cancel
    from a person's. The record holds only if the next try first sees the job ``CancelRequested`` or
    ``Canceled``; a job still running then (the cancel failed) is dropped from it and watched.
    ``before_clear`` holds the jobs that had ended, or were being cancelled, when the task was last
    cleared: the clear is the request to run the work again, so their cancel is never final. A job
    still running at the clear is not in it: the try watches it, and a person's cancel is final.
    """

    key: str
    job_names: list[str] = field(default_factory=list)  # the chain, oldest first, as Azure named the jobs
    next_resubmission: int = 0
    preemptions: int = 0  # counted against this run of the task's budget
    counted: list[str] = field(default_factory=list)  # preempted jobs already counted (a retry counts none twice)
    # the chain's jobs judged lost capacity (preempted, or an ambiguous cancel resubmitted), for its bill and its
    # verdicts: ``counted`` and those of earlier budgets (a clear keeps them)
    lost: list[str] = field(default_factory=list)
    reported_preemptions: int = 0  # of ``lost``, how many the preemptions counter has counted (job_cost.report)
    airflow_canceled: list[str] = field(default_factory=list)
    reported_cancels: list[str] = field(default_factory=list)  # a person's cancels a try already failed on
    before_clear: list[str] = field(default_factory=list)
    known: list[str] = field(default_factory=list)  # jobs this run of the task had seen before this try
    backoff_done: str | None = None  # preempted job whose back-off was already spent in the triggerer
    fallback_rule: str | None = None  # the rule that moved this run of the task to the fallback (then it stays)
    fallback_from: int | None = None  # the first resubmission number sent to the fallback
    recorded: list[str] = field(default_factory=list)  # jobs already in the cluster's shared history
    canceled_at: dict[str, float] = field(default_factory=dict)  # when each of Airflow's cancels was recorded
    deferred_on: str | None = None  # the job a try deferred on and has not come back from
    # Jobs a cleared try found Airflow cancelling (its on_kill's, or its trigger's) and cancelled again: the
    # clear asked for the work to run again, so a Running read after that cancel is the cancel not shown yet.
    clear_cancels: list[str] = field(default_factory=list)
    max_tries: int | None = None
    cleared: bool = False
    usage: dict[str, Any] = field(default_factory=dict)  # the chain's node counts, every wait's (cost.py)
    # Written before a submit is sent, cleared once its job is recorded: {"n": resubmission, "at": epoch s}.
    # Found set by the next try, the submit may have created a job that neither its name nor the LIST shows yet.
    submitting: dict[str, Any] | None = None
    # An ambiguous cancel whose wait for late evidence (the Activity Log's lag) was spent: resubmitted next.
    evidence_waited: str | None = None
    # Its verdict before the wait, when that was a preemption on weak evidence (a read just after the job's
    # end): kept, as that read is not repeated; an Activity Log cancel found after the wait overrides it.
    evidence_reason: str | None = None
    evidence_until: float | None = None  # when that wait ends (epoch s): a retry within it waits the rest

    def __post_init__(self) -> None:
        self.lost += [job for job in self.counted if job not in self.lost]  # every counted job is lost

    @property
    def current(self) -> str | None:
        return self.job_names[-1] if self.job_names else None

    @property
    def resubmits(self) -> int:
        return max(0, len(self.job_names) - 1)

    def on_fallback(self, job_name: str) -> bool:
        """The job was sent to the fallback (the switch may be recorded while an older spot job still waits)."""
        if not self.fallback_rule:
            return False
        if self.fallback_from is None or job_name not in self.job_names:
            return True
        return self.job_names.index(job_name) >= self.fallback_from

    def record_airflow_cancel(self, job_name: str, now: float) -> None:
        """Airflow is about to cancel this job: written *before* the cancel, for the next try to read."""
        if job_name not in self.airflow_canceled:
            self.airflow_canceled.append(job_name)
        self.canceled_at[job_name] = now

    def to_store(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "job": self.current,
            "jobs": list(self.job_names),
            "preemptions": self.preemptions,
            "counted": list(self.counted),
            "lost": list(self.lost),
            "reported_preemptions": self.reported_preemptions,
            "airflow_canceled": list(self.airflow_canceled),
            "reported_cancels": list(self.reported_cancels),
            "before_clear": list(self.before_clear),
            "backoff_done": self.backoff_done,
            "fallback_rule": self.fallback_rule,
            "fallback_from": self.fallback_from,
            "recorded": list(self.recorded[-MAX_RECORDED:]),
            "canceled_at": dict(self.canceled_at),
            "deferred_on": self.deferred_on,
            "clear_cancels": list(self.clear_cancels),
            "max_tries": self.max_tries,
            "usage": self.usage,
            "submitting": self.submitting,
            "evidence_waited": self.evidence_waited,
            "evidence_reason": self.evidence_reason,
            "evidence_until": self.evidence_until,
        }

    @classmethod
    def from_store(cls, key: str, recalled: dict[str, Any] | None, max_tries: int | None) -> ResubmissionState:
        """This run of the task's state from what an earlier try stored.

        A new DAG run, or a clear (Airflow raises ``max_tries``), starts a fresh resubmission budget;
        automatic retries share it. A record of another unit of work (the inputs changed) is ignored.
        """
        recalled = recalled or {}
        state = cls(key=key, max_tries=max_tries)
        if recalled.get("key") != key:
            return state
        state.known = [str(n) for n in (recalled.get("jobs") or [recalled.get("job")]) if n]
        state.airflow_canceled = list(recalled.get("airflow_canceled") or [])
        state.reported_cancels = list(recalled.get("reported_cancels") or [])
        state.before_clear = list(recalled.get("before_clear") or [])
        state.deferred_on = recalled.get("deferred_on")
        state.clear_cancels = list(recalled.get("clear_cancels") or [])
        state.usage = dict(recalled.get("usage") or {})  # a retry or a clear keeps what the chain has cost
        # ... and which of its attempts preemption lost (a record from before 2026-12-07 has only "counted")
        state.lost = [str(n) for n in (recalled.get("lost") or recalled.get("counted") or [])]
        reported = recalled.get("reported_preemptions")
        counted = isinstance(reported, int) and not isinstance(reported, bool)
        state.reported_preemptions = max(0, reported) if counted else 0
        state.recorded = list(recalled.get("recorded") or [])  # a clear must not record a job twice
        state.canceled_at = dict(recalled.get("canceled_at") or {})
        submitting = recalled.get("submitting")
        state.submitting = dict(submitting) if isinstance(submitting, dict) else None  # kept across a clear too
        previous = recalled.get("max_tries")
        state.cleared = previous is not None and max_tries is not None and previous != max_tries
        if not state.cleared:
            state.preemptions = int(recalled.get("preemptions") or 0)
            state.counted = list(recalled.get("counted") or [])
            state.lost += [job for job in state.counted if job not in state.lost]  # holds every counted job
            state.backoff_done = recalled.get("backoff_done")
            state.evidence_waited = recalled.get("evidence_waited")
            state.evidence_reason = recalled.get("evidence_reason")
            until = recalled.get("evidence_until")
            state.evidence_until = float(until) if isinstance(until, (int, float)) else None
            state.fallback_rule = recalled.get("fallback_rule")  # a clear gives spot another chance
            state.fallback_from = recalled.get("fallback_from")
        return state
