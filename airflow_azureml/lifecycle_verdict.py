"""What an ended job means for a unit, and the wait for late evidence before a weak verdict is acted on.

``verdict`` is ``outcomes.classify`` with Airflow's own cancel record; the evidence wait is what
``lifecycle.on_end`` and ``lifecycle.after_cancel`` spend when a preemption was seen only near the job's
end, or a cancel has no witness yet (a person's cancel shows in the Activity Log minutes late). Kept apart
from the other decisions because these rules weigh evidence; ``lifecycle`` decides what comes next. Pure.
"""

from __future__ import annotations

import logging

from airflow_azureml.lifecycle_actions import BackOff, Decision, Limits, Log, Steps, Wait
from airflow_azureml.lifecycle_state import ResubmissionState
from airflow_azureml.outcomes import ActivityEvidence, Classification, GaugeEvidence, JobSnapshot, Outcome, classify


def _ran_after_airflow_cancel(state: ResubmissionState, job: str) -> bool:
    """A wait saw the job Running after Airflow's cancel of it was recorded: the cancel did not take."""
    since = state.canceled_at.get(job)
    if job not in state.airflow_canceled or since is None or job in state.clear_cancels:
        return False
    for span in (state.usage or {}).get("spans") or []:
        statuses = span.get("statuses") or []
        if span.get("job") == job and any(status == "Running" and at > since for at, status in statuses):
            return True
    return False


def verdict(
    state: ResubmissionState,
    snapshot: JobSnapshot,
    gauge: GaugeEvidence | None,
    activity: ActivityEvidence | None = None,
) -> tuple[Decision, Classification]:
    """What an ended job means for this unit: ``outcomes.classify`` with Airflow's own cancel record.

    A job that ran after Airflow's cancel was recorded outlived that cancel, so a later cancel of it is
    not Airflow's (a person's, or a preemption); a job judged preempted once stays so (a back-off or a
    crash came between).
    """
    if snapshot.name in state.lost:  # (``counted``, and before a clear)
        return Decision(state, ()), Classification(Outcome.PREEMPTED, "preempted (judged so when it ended)")
    steps = Steps(state)
    if _ran_after_airflow_cancel(state, snapshot.name):
        steps.state.airflow_canceled.remove(snapshot.name)
        steps.state.canceled_at.pop(snapshot.name, None)
        steps.add(
            Log(logging.INFO, f"Job {snapshot.name} ran after Airflow's cancel; a later cancel of it is not Airflow's.")
        )
        steps.remember()
    airflows = snapshot.name in steps.state.airflow_canceled
    found = classify(snapshot, gauge=gauge, canceled_by_airflow=airflows, activity=activity)
    waited = steps.state.evidence_waited == snapshot.name and steps.state.evidence_reason
    if waited and found.outcome is Outcome.USER_CANCELED and found.ambiguous:
        # the weak evidence before the wait stands: no cancel request showed in the Activity Log since
        reason = f"{steps.state.evidence_reason}; no cancel request in the Activity Log after the wait"
        found = Classification(Outcome.PREEMPTED, reason, found.evidence, "gauge_near_end")
    return steps.done(), found


# The wait for late evidence looks again this often: a person's cancel is final as soon as the Activity Log
# shows it (minutes late), not when the whole wait is over; a preemption is resubmitted at the wait's end.
EVIDENCE_RECHECK = 120.0


def evidence_wait_left(state: ResubmissionState, job: str, limits: Limits, now: float | None) -> float:
    """Seconds of the wait for late evidence still to spend on ``job`` (0: spent, or none wanted)."""
    if limits.evidence_wait <= 0:
        return 0.0
    if state.evidence_waited != job:
        return limits.evidence_wait
    if now is None or state.evidence_until is None:
        return 0.0
    left = state.evidence_until - now
    return left if left > 1.0 else 0.0  # a crash or retry inside the wait waits the rest of it


def wait_for_evidence(
    state: ResubmissionState, job: str, reason: str, limits: Limits, seconds: float, now: float | None
) -> Decision:
    """A preemption seen only near the job's end (a read just after it, or while a cancel was requested): a
    person's cancel followed at once by a preemption looks the same, and the person's request shows in the
    Activity Log minutes late."""
    steps = Steps(state)
    message = (
        f"Job {job} looks preempted ({reason}), seen only near its end: reading the Activity Log again in "
        f"{min(seconds, EVIDENCE_RECHECK):.0f}s, for up to {seconds:.0f}s before resubmitting (a person's cancel "
        "there would be final)."
    )
    spend_evidence_wait(steps, job, reason, message, limits, seconds, now)
    return steps.done()


def spend_evidence_wait(
    steps: Steps, job: str, kept: str | None, message: str, limits: Limits, seconds: float, now: float | None
) -> None:
    """Remember the wait (its deadline, and ``kept``: the weak verdict's reason, which stands after it unless a
    person's cancel shows), then back off (``EVIDENCE_RECHECK`` at most) and look at the job again."""
    state = steps.state
    if state.evidence_waited != job or state.evidence_until is None:
        state.evidence_until = now + seconds if now is not None else None
    state.evidence_waited = job
    state.evidence_reason = kept
    steps.add(Log(logging.INFO, message))
    steps.remember()
    # without a clock there is no deadline to look again against: the whole wait at once
    chunk = min(seconds, EVIDENCE_RECHECK) if state.evidence_until is not None else seconds
    steps.add(BackOff(job, chunk, in_triggerer=limits.deferrable), Wait())
