"""The job lifecycle, decided in one place and without I/O: a state and an observation in, actions out.

The job operators (``operators/job_base.py``) gather the observations (the first look at a unit's
newest job, a job's end and its verdict, a queue-time limit passed, a spot-policy answer) and carry
out, in order, the actions returned here. Nothing in this module reads Azure or Airflow, so each
rule is tested by tables (``tests/unit/test_lifecycle.py``) as ``outcomes.classify`` is.

The state (``ResubmissionState``) is the one record of a unit of work that Airflow keeps between
tries (``task_state_store``); the actions are few: log, remember the state, cancel a job, record a
job on the spot cluster's shared history, ask the spot policy, back off, submit, wait, finish, raise.
"""

from __future__ import annotations

import copy
import logging
from dataclasses import dataclass, field, fields
from typing import Any, Literal

from airflow_azureml.outcomes import ActivityEvidence, Classification, GaugeEvidence, JobSnapshot, Outcome, classify

MAX_CHAIN = 1000  # upper bound on the job names one unit of work can have
MAX_BACKOFF = 600.0
MAX_RECORDED = 200  # jobs remembered as recorded in the shared spot history (a chain is far shorter)
# How long a job may stay out of the jobs LIST after it was created. Azure documents no bound (ARM
# lists are eventually consistent); the tests hold the emulator's LIST up to 60 s behind. A try that
# finds an earlier try's submit unfinished looks for its job this long before submitting again.
LIST_LAG_SECONDS = 90.0


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
        state.recorded = list(recalled.get("recorded") or [])  # a clear must not record a job twice
        state.canceled_at = dict(recalled.get("canceled_at") or {})
        submitting = recalled.get("submitting")
        state.submitting = dict(submitting) if isinstance(submitting, dict) else None  # kept across a clear too
        previous = recalled.get("max_tries")
        state.cleared = previous is not None and max_tries is not None and previous != max_tries
        if not state.cleared:
            state.preemptions = int(recalled.get("preemptions") or 0)
            state.counted = list(recalled.get("counted") or [])
            state.backoff_done = recalled.get("backoff_done")
            state.evidence_waited = recalled.get("evidence_waited")
            state.evidence_reason = recalled.get("evidence_reason")
            until = recalled.get("evidence_until")
            state.evidence_until = float(until) if isinstance(until, (int, float)) else None
            state.fallback_rule = recalled.get("fallback_rule")  # a clear gives spot another chance
            state.fallback_from = recalled.get("fallback_from")
        return state


@dataclass(frozen=True)
class Limits:
    """The operator's settings that the lifecycle reads (validated before any call)."""

    max_resubmits: int = 3
    loop_after: int = 2
    resubmit_backoff: float = 30.0
    fallback: str | None = None  # the fallback target's name; None: there is none
    deferrable: bool = False
    # A cancel no witness explains (``Classification.ambiguous``): "fail" takes it as a person's (final),
    # "resubmit" as lost capacity (counted against max_resubmits). Why "fail": docs/operators.md.
    on_ambiguous_cancel: Literal["fail", "resubmit"] = "fail"
    # With "resubmit": how long to wait for late evidence (a person's cancel shows in the Activity Log
    # minutes late) before resubmitting; spent in the triggerer when deferrable.
    evidence_wait: float = 900.0


# ------------------------------------------------------------------ actions
@dataclass(frozen=True)
class Log:
    level: int
    message: str


@dataclass(frozen=True)
class Remember:
    """Set these fields of the state, then store it (``task_state_store``): a crash after it leaves this record.

    A decision's changes take effect here and not before, so a record written earlier in the same
    decision (a spot history entry closed, say) never carries them ahead of their time.
    """

    changes: tuple[tuple[str, Any], ...] = ()


@dataclass(frozen=True)
class Cancel:
    """Cancel a job: Airflow's cancel, already recorded in the state. ``tolerant``: a failed cancel is
    logged (it is sent again later); else it fails the try, whose retry finds the job still running."""

    job: str
    tolerant: bool = True


@dataclass(frozen=True)
class Record:
    """What a job showed of the spot cluster goes to its shared history (``preempted`` / ``completed``),
    or its running entry is closed (``ended``)."""

    job: str
    kind: Literal["preempted", "completed", "ended"]


@dataclass(frozen=True)
class CheckFallback:
    """Before a unit's first job: the fallback exists and runs on dedicated compute."""


@dataclass(frozen=True)
class AskSpotPolicy:
    """Ask the spot policy whether to move to the fallback, then ``moved_to_fallback`` with its answer.

    ``after``: the preempted job that asks (``None``: before a submit, after a failure, a cancel or a clear).
    """

    after: str | None = None


@dataclass(frozen=True)
class Resubmit:
    """Ask this module again (``resubmit``) once the spot policy has answered: its answer sets the back-off.

    Like ``CheckDuplicate``, a continuation: always a decision's last action.
    """

    job: str
    reason: str


@dataclass(frozen=True)
class CheckDuplicate:
    """Look up whether this cancelled job was cancelled as a duplicate of an older job of the unit (one
    LIST), then ask this module again (``after_cancel``). It comes after the job's record on the cluster."""

    job: str
    watched: bool
    # set when the cancel is ambiguous and ``on_ambiguous_cancel="resubmit"``: the verdict's reason
    resubmit: str | None = None


@dataclass(frozen=True)
class BackOff:
    """Wait before the next submit: in the triggerer when deferrable (then the try ends here), else in place."""

    job: str
    seconds: float
    in_triggerer: bool


@dataclass(frozen=True)
class Submit:
    """Submit the chain's next job. ``decided``: the spot policy has just been asked; ``after``: the preempted job."""

    decided: bool = False
    after: str | None = None
    reason: str = ""


@dataclass(frozen=True)
class Wait:
    """Wait for the chain's newest job (it changed: a duplicate's older job, or the fallback's move)."""


@dataclass(frozen=True)
class Finish:
    """The unit of work is done: this job's result is the task's."""

    job: str


@dataclass(frozen=True)
class Raise:
    """The task fails with this outcome's error (a retry or a clear decides what comes next)."""

    job: str
    kind: Literal["failed", "user_canceled", "budget_spent", "queue_timeout"]
    message: str = ""


Action = (
    Log
    | Remember
    | Cancel
    | Record
    | CheckFallback
    | AskSpotPolicy
    | Resubmit
    | CheckDuplicate
    | BackOff
    | Submit
    | Wait
    | Finish
    | Raise
)


@dataclass(frozen=True)
class Decision:
    """The actions to carry out, in order, and the state as they leave it (for tests: the operator takes
    the changes from the ``Remember`` actions, where they take effect)."""

    state: ResubmissionState
    actions: tuple[Action, ...]


def _copy(state: ResubmissionState) -> ResubmissionState:
    return copy.deepcopy(state)


class _Steps:
    """A decision being built: the state as it will be, and actions whose ``Remember``s carry the changes."""

    def __init__(self, state: ResubmissionState) -> None:
        self.state = _copy(state)
        self._stored = _copy(state)
        self.actions: list[Action] = []

    def add(self, *actions: Action) -> None:
        self.actions.extend(actions)

    def remember(self) -> None:
        changed = tuple(
            (f.name, copy.deepcopy(getattr(self.state, f.name)))
            for f in fields(ResubmissionState)
            if getattr(self.state, f.name) != getattr(self._stored, f.name)
        )
        self._stored = _copy(self.state)
        self.actions.append(Remember(changed))

    def done(self) -> Decision:
        return Decision(self.state, tuple(self.actions))


# ---------------------------------------------------------------- the chain
def merge_chain(listed: dict[int, str], listed_names: set[str], known: list[str]) -> dict[int, str]:
    """The unit's jobs by resubmission number: the LIST's, then those this run remembers but the LIST
    does not show yet (a duplicate that lost is listed, so it is not added again)."""
    chain = dict(listed)
    for name in known:
        if name not in listed_names:
            chain[max(chain, default=-1) + 1] = name
    return chain


def first_sight(state: ResubmissionState, snapshot: JobSnapshot | None, now: float) -> Decision:
    """What this try's first look at the newest job says about the records of earlier tries."""
    steps = _Steps(state)
    state = steps.state
    changed = False
    ending = snapshot is not None and (snapshot.terminal or snapshot.status == "CancelRequested")
    cancelling = snapshot is not None and (
        snapshot.name == state.deferred_on or snapshot.name in state.airflow_canceled
    )
    if state.cleared and snapshot is not None and not ending and cancelling:
        # Cleared while Airflow was cancelling this job: deferred on it (the trigger's on_kill cancels it)
        # or running it in a worker (on_kill cancelled it, and Azure may still show it Running a while
        # after accepting that). The cancel is Airflow's, not a person's, even if this look comes before
        # it shows; it is sent again, in case the first did not get through. Then the next job runs: the
        # clear asked for the work to run again.
        message = (
            f"The task was cleared while Airflow was cancelling job {snapshot.name} ({snapshot.status}): "
            "cancelling it (Airflow's)."
        )
        steps.add(Log(logging.INFO, message))
        if snapshot.name not in state.airflow_canceled:
            state.airflow_canceled.append(snapshot.name)
        state.canceled_at.setdefault(snapshot.name, now)
        if snapshot.name not in state.clear_cancels:
            state.clear_cancels.append(snapshot.name)
        state.deferred_on = None
        steps.remember()
        steps.add(Cancel(snapshot.name))
        changed = True
    elif snapshot is not None and snapshot.name in state.airflow_canceled and not ending:
        # on_kill recorded its cancel, but the cancel never took: the job runs on, and a later cancel of
        # it is not Airflow's.
        message = f"Job {snapshot.name} outlived Airflow's cancel ({snapshot.status}); watching it."
        steps.add(Log(logging.INFO, message))
        state.airflow_canceled.remove(snapshot.name)
        changed = True
    if state.cleared:  # the jobs that had ended (or were ending) when the person cleared the task
        ended = state.job_names[:-1] + ([snapshot.name] if snapshot is not None and ending else [])
        state.before_clear = sorted(set(state.before_clear) | set(ended))
        state.cleared = False  # once per clear; stored now, so a retry of this try is no clear
        changed = True
    if changed:
        steps.remember()
    return steps.done()


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
    if snapshot.name in state.counted:
        return Decision(state, ()), Classification(Outcome.PREEMPTED, "preempted (judged so when it ended)")
    steps = _Steps(state)
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


# --------------------------------------------------------------- decisions
def _evidence_wait_left(state: ResubmissionState, job: str, limits: Limits, now: float | None) -> float:
    """Seconds of the wait for late evidence still to spend on ``job`` (0: spent, or none wanted)."""
    if limits.evidence_wait <= 0:
        return 0.0
    if state.evidence_waited != job:
        return limits.evidence_wait
    if now is None or state.evidence_until is None:
        return 0.0
    left = state.evidence_until - now
    return left if left > 1.0 else 0.0  # a crash or retry inside the wait waits the rest of it


def on_end(
    state: ResubmissionState,
    job: str,
    found: Classification,
    limits: Limits,
    *,
    watched: bool,
    now: float | None = None,
) -> Decision:
    """A terminal job becomes the task's result, its error, or the next job of the chain.

    ``watched``: this try waited for the job (else an earlier try or another run did).
    """
    outcome = found.outcome
    weak = outcome is Outcome.PREEMPTED and found.witness == "gauge_near_end"
    left = _evidence_wait_left(state, job, limits, now) if weak else 0.0
    if left > 0:
        return _wait_for_evidence(state, job, found.reason, limits, left, now)
    if outcome is Outcome.PREEMPTED:
        return on_preemption(state, job, found.reason, limits)
    steps = _Steps(state)
    state = steps.state
    if outcome is Outcome.SUCCEEDED:
        # this try saw it run: what it took, and that spot let it finish; else only its running entry closes
        steps.add(Record(job, "completed" if watched else "ended"), Finish(job))
        return steps.done()
    steps.add(Record(job, "ended"))  # whatever ended it, it no longer runs on the cluster; before any change
    if outcome is Outcome.FAILED:
        if watched:
            steps.add(Raise(job, "failed"))
        else:
            steps.add(Log(logging.INFO, f"Job {job} failed in an earlier try; submitting the next job of the chain."))
            steps.add(Submit())
        return steps.done()
    if outcome is Outcome.AIRFLOW_CANCELED:
        steps.add(Log(logging.INFO, f"Job {job} was cancelled by Airflow; submitting the next job of the chain."))
        steps.add(Submit())
        return steps.done()
    resubmit = found.reason if found.ambiguous and limits.on_ambiguous_cancel == "resubmit" else None
    steps.add(CheckDuplicate(job, watched, resubmit))  # a person's cancel, unless it was a duplicate's
    return steps.done()


def _wait_for_evidence(
    state: ResubmissionState, job: str, reason: str, limits: Limits, seconds: float, now: float | None
) -> Decision:
    """A preemption seen only near the job's end (a read just after it, or while a cancel was requested): a
    person's cancel followed at once by a preemption looks the same, and the person's request shows in the
    Activity Log minutes late."""
    steps = _Steps(state)
    message = (
        f"Job {job} looks preempted ({reason}), seen only near its end: reading the Activity Log again in "
        f"{seconds:.0f}s before resubmitting (a person's cancel there would be final)."
    )
    _spend_evidence_wait(steps, job, reason, message, limits, seconds, now)
    return steps.done()


def _spend_evidence_wait(
    steps: _Steps, job: str, kept: str | None, message: str, limits: Limits, seconds: float, now: float | None
) -> None:
    """Remember the wait (its deadline, and ``kept``: the weak verdict's reason, which stands after it unless a
    person's cancel shows), then back off and look at the job again."""
    state = steps.state
    if state.evidence_waited != job or state.evidence_until is None:
        state.evidence_until = now + seconds if now is not None else None
    state.evidence_waited = job
    state.evidence_reason = kept
    steps.add(Log(logging.INFO, message))
    steps.remember()
    steps.add(BackOff(job, seconds, in_triggerer=limits.deferrable), Wait())


def after_cancel(
    state: ResubmissionState,
    job: str,
    *,
    watched: bool,
    kept_instead: str | None,
    limits: Limits | None = None,
    resubmit: str | None = None,
    now: float | None = None,
) -> Decision:
    """A person's cancel, once the LIST said whether it was a duplicate's (``kept_instead``: the older
    job of the unit it was cancelled in favour of). ``resubmit``: an ambiguous cancel that the operator's
    ``on_ambiguous_cancel="resubmit"`` runs again, as a preemption (``limits`` then needed)."""
    steps = _Steps(state)
    state = steps.state
    if kept_instead is not None:  # cancelled as a duplicate of an older job of the unit: follow that one
        state.job_names[state.job_names.index(job)] = kept_instead
        steps.add(Log(logging.WARNING, f"Job {job} was cancelled as a duplicate of job {kept_instead}; following it."))
        steps.remember()
        steps.add(Wait())
        return steps.done()
    if job in state.before_clear or job in state.reported_cancels or (not watched and job not in state.known):
        # The task was cleared after this job started, or a try already failed on this cancel (so this try
        # follows a clear), or the job is unknown to this run of the task (a new DAG run, a backfill):
        # running the work again is the request.
        message = (
            f"Job {job} was cancelled by a person earlier; this run asks for the work again: "
            "submitting the next job of the chain."
        )
        steps.add(Log(logging.INFO, message), Submit())
        return steps.done()
    left = _evidence_wait_left(state, job, limits, now) if resubmit is not None and limits is not None else 0.0
    if left > 0 and limits is not None:
        # A person's cancel shows in the Activity Log minutes late: wait for it before overriding anyone.
        message = (
            f"Job {job} was cancelled and no witness tells by whom yet; on_ambiguous_cancel='resubmit': looking "
            f"at the Activity Log again in {left:.0f}s before resubmitting."
        )
        _spend_evidence_wait(steps, job, None, message, limits, left, now)
        return steps.done()
    if resubmit is not None and limits is not None:
        message = (
            f"Job {job}: {resubmit}. No witness tells this cancel from lost capacity, and "
            "on_ambiguous_cancel='resubmit' runs the work again (a person's cancel is overridden; "
            "'fail' makes it final)."
        )
        steps.add(Log(logging.WARNING, message))
        _count_and_resubmit(steps, job, "an ambiguous cancel, resubmitted by on_ambiguous_cancel", limits, "ended")
        return steps.done()
    state.reported_cancels.append(job)  # stored after the job's record on the cluster: a retry fails on it again
    steps.remember()
    steps.add(Raise(job, "user_canceled"))
    return steps.done()


def on_preemption(state: ResubmissionState, job: str, reason: str, limits: Limits) -> Decision:
    """Count the preemption once and record it on the cluster, spend the budget, ask the policy, resubmit.

    The back-off comes after the policy's answer (``resubmit``): a move to the fallback ends it.
    """
    steps = _Steps(state)
    _count_and_resubmit(steps, job, reason, limits, "preempted")
    return steps.done()


def _count_and_resubmit(steps: _Steps, job: str, reason: str, limits: Limits, record: str | None) -> None:
    """``record``: what the spot history learns ("preempted"; None or "ended": already closed as ended)."""
    state = steps.state
    if job not in state.counted:
        state.preemptions += 1
        state.counted.append(job)
        steps.remember()
        if record == "preempted":
            steps.add(Record(job, "preempted"))
    if state.preemptions > limits.max_resubmits:
        message = (
            f"Job {job} was preempted ({reason}); {state.preemptions} preemption(s) in this run of the task, "
            f"resubmission budget max_resubmits={limits.max_resubmits} spent. Clearing the task starts a fresh "
            "budget and continues the same job chain."
        )
        steps.add(Raise(job, "budget_spent", message))
        return
    if limits.fallback is not None and not state.fallback_rule:
        steps.add(AskSpotPolicy(after=job))
    steps.add(Resubmit(job, reason))


def resubmit(state: ResubmissionState, job: str, reason: str, limits: Limits) -> Decision:
    """After a counted preemption (and the policy's answer): back off if in a loop, then submit."""
    steps = _Steps(state)
    delay = loop_backoff(steps.state, limits)
    if steps.state.backoff_done != job and delay > 0:
        message = f"Preemption {steps.state.preemptions} of job {job} ({reason}). Resubmitting in {delay:.1f}s."
        steps.add(Log(logging.WARNING, message))
        if limits.deferrable:  # the back-off is spent in the triggerer, not in a worker slot: once
            steps.state.backoff_done = job
            steps.remember()
        steps.add(BackOff(job, delay, in_triggerer=limits.deferrable))
    steps.add(Submit(decided=True, after=job, reason=reason))
    return steps.done()


def loop_backoff(state: ResubmissionState, limits: Limits) -> float:
    """No fixed back-off: a job resubmitted after a preemption waits in Azure's queue at no cost.

    Only a loop of preemptions backs off (``resubmit_backoff``, doubling, from preemption
    ``loop_after + 1`` on), and never on the fallback, which is not preempted for capacity.
    """
    loops = state.preemptions - limits.loop_after
    if loops < 1 or state.fallback_rule:
        return 0.0
    return min(MAX_BACKOFF, limits.resubmit_backoff * (2 ** (loops - 1)))


def before_submit(state: ResubmissionState, limits: Limits, *, decided: bool) -> tuple[Action, ...]:
    """What comes before a submit: the fallback checked before a unit's first job, and, unless the
    caller has just asked (after a preemption), the spot policy: before the first job, and after a
    failure, a cancel or a clear."""
    if limits.fallback is None:
        return ()
    actions: list[Action] = [CheckFallback()] if not state.job_names else []
    if not decided and not state.fallback_rule:
        actions.append(AskSpotPolicy())
    return tuple(actions)


def moved_to_fallback(state: ResubmissionState, use_fallback: bool, rule: str) -> Decision:
    """The spot policy's answer: a move to the fallback is stored before anything is sent, and then stays."""
    if not use_fallback or state.fallback_rule:
        return Decision(state, ())
    steps = _Steps(state)
    steps.state.fallback_rule = rule
    steps.state.fallback_from = steps.state.next_resubmission
    steps.remember()
    return steps.done()


def on_queue_timeout(
    state: ResubmissionState, job: str, message: str, limits: Limits, *, use_fallback: bool, last_try: bool, now: float
) -> Decision:
    """No capacity for too long. With a fallback (``spot_policy.on_queue_timeout`` said so), that is the
    normal answer: the queued job is cancelled (recorded as Airflow's first) and the next job goes to
    the fallback. Without one (or already on it), the task fails: a retry re-attaches to the still
    queued job (no second job); on the last try the job is cancelled so that it does not start, and
    bill, after we stopped."""
    steps = _Steps(state)
    if not use_fallback and not last_try:
        steps.add(Raise(job, "queue_timeout", message + "; left it queued for the next try to re-attach"))
        return steps.done()
    steps.state.record_airflow_cancel(job, now)
    steps.remember()
    steps.add(Cancel(job, tolerant=False))
    if use_fallback:
        steps.add(Wait())
    else:
        steps.add(Raise(job, "queue_timeout", message + "; last try, cancelled the job"))
    return steps.done()
