"""The job lifecycle, decided in one place and without I/O: a state and an observation in, actions out.

The job operators (``operators/job_base.py``) gather the observations (the first look at a unit's
newest job, a job's end and its verdict, a queue-time limit passed, a spot-policy answer) and carry
out, in order, the actions returned here. Nothing in this module reads Azure or Airflow, so each
rule is tested by tables (``tests/unit/test_lifecycle.py``) as ``outcomes.classify`` is.

The state (``ResubmissionState``) is the one record of a unit of work that Airflow keeps between
tries (``task_state_store``); the actions are few: log, remember the state, cancel a job, record a
job on the spot cluster's shared history, ask the spot policy, back off, submit, wait, finish, raise.

The decisions are here; what they read and return is ``lifecycle_actions`` (the limits, the actions, a
decision being built), the record is ``lifecycle_state``, and the weighing of an ended job's evidence
(``verdict``, the wait for late evidence) is ``lifecycle_verdict``. Their names are importable from here
(``X as X`` imports: the tests, the benchmarks and the operators import them as ``lifecycle.X``).
"""

from __future__ import annotations

import logging

from airflow_azureml.lifecycle_actions import (
    Action,
    AskSpotPolicy,
    BackOff,
    Cancel,
    CheckDeadline,
    CheckDuplicate,
    CheckFallback,
    Decision,
    Finish,
    Limits,
    Log,
    Raise,
    Record,
    Resubmit,
    Steps,
    Submit,
    Wait,
)
from airflow_azureml.lifecycle_actions import Remember as Remember  # re-exported: imported from here
from airflow_azureml.lifecycle_state import MAX_RECORDED as MAX_RECORDED  # re-exported: imported from here
from airflow_azureml.lifecycle_state import ResubmissionState
from airflow_azureml.lifecycle_verdict import (
    EVIDENCE_RECHECK,
    evidence_wait_left,
    spend_evidence_wait,
    wait_for_evidence,
)
from airflow_azureml.lifecycle_verdict import verdict as verdict  # re-exported: imported from here
from airflow_azureml.outcomes import Classification, JobSnapshot, Outcome

MAX_CHAIN = 1000  # upper bound on the job names one unit of work can have
MAX_BACKOFF = 600.0
# How long a job may stay out of the jobs LIST after it was created. Azure documents no bound (ARM
# lists are eventually consistent); the tests hold the emulator's LIST up to 60 s behind. A try that
# finds an earlier try's submit unfinished looks for its job this long before submitting again.
LIST_LAG_SECONDS = 90.0


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
    steps = Steps(state)
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


def may_supersede(state: ResubmissionState, job: str) -> bool:
    """May a completed job that this try did not watch give way to a new one, if what runs the work changed?
    Only when it is not this run's own result: another DAG run's (a re-run, a backfill) or one that had ended
    when a person cleared the task. A retry of this run reuses its job whatever changed meanwhile."""
    return job in state.before_clear or job not in state.known


# --------------------------------------------------------------- decisions
def on_end(
    state: ResubmissionState,
    job: str,
    found: Classification,
    limits: Limits,
    *,
    watched: bool,
    now: float | None = None,
    superseded: str | None = None,
) -> Decision:
    """A terminal job becomes the task's result, its error, or the next job of the chain.

    ``watched``: this try waited for the job (else an earlier try or another run did). ``superseded``: why a
    completed job that this try did not watch is no longer the work's result (its deployment now runs
    another model, code or environment): the work runs again.
    """
    outcome = found.outcome
    if outcome is Outcome.PREEMPTED and job in state.before_clear:
        return _rerun_after_clear(state, job, found.reason)
    weak = outcome is Outcome.PREEMPTED and found.witness == "gauge_near_end"
    left = evidence_wait_left(state, job, limits, now) if weak else 0.0
    if left > 0:
        return wait_for_evidence(state, job, found.reason, limits, left, now)
    if outcome is Outcome.PREEMPTED:
        return on_preemption(state, job, found.reason, limits)
    steps = Steps(state)
    state = steps.state
    if outcome is Outcome.SUCCEEDED:
        # this try saw it run: what it took, and that spot let it finish; else only its running entry closes
        if superseded is not None and not watched:
            message = f"Job {job} completed, but {superseded}: submitting the next job of the chain to run it again."
            steps.add(Record(job, "ended"), Log(logging.INFO, message), Submit())
            return steps.done()
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
    steps = Steps(state)
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
    left = evidence_wait_left(state, job, limits, now) if resubmit is not None and limits is not None else 0.0
    if left > 0 and limits is not None:
        # A person's cancel shows in the Activity Log minutes late: wait for it before overriding anyone.
        message = (
            f"Job {job} was cancelled and no witness tells by whom yet; on_ambiguous_cancel='resubmit': looking "
            f"at the Activity Log again in {min(left, EVIDENCE_RECHECK):.0f}s, for up to {left:.0f}s before "
            "resubmitting."
        )
        spend_evidence_wait(steps, job, None, message, limits, left, now)
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


def _rerun_after_clear(state: ResubmissionState, job: str, reason: str) -> Decision:
    """A job preempted before a person cleared the task: the clear asks for the work again, with a fresh
    budget that this earlier preemption does not spend (``max_resubmits=0`` would else fail the clear at
    once). Its attempt stays lost in the bill, and the cluster's history learns it once."""
    steps = Steps(state)
    if job not in steps.state.lost:  # first judged now (Azure's PreemptionError): the history learns it once
        steps.state.lost.append(job)
        steps.remember()
        steps.add(Record(job, "preempted"))
    message = (
        f"Job {job} ended before the task was cleared, its capacity lost ({reason}); the clear asks for the work "
        "again: submitting the next job of the chain (not counted against the fresh resubmission budget)."
    )
    steps.add(Log(logging.INFO, message), Submit())
    return steps.done()


def on_preemption(state: ResubmissionState, job: str, reason: str, limits: Limits) -> Decision:
    """Count the preemption once and record it on the cluster, spend the budget, ask the policy, resubmit.

    The back-off comes after the policy's answer (``resubmit``): a move to the fallback ends it.
    """
    steps = Steps(state)
    _count_and_resubmit(steps, job, reason, limits, "preempted")
    return steps.done()


def _count_and_resubmit(steps: Steps, job: str, reason: str, limits: Limits, record: str | None) -> None:
    """``record``: what the spot history learns ("preempted"; None or "ended": already closed as ended)."""
    state = steps.state
    if job not in state.counted:
        state.preemptions += 1
        state.counted.append(job)
        if job not in state.lost:
            state.lost.append(job)
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
    steps = Steps(state)
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
    """What comes before a submit: the deadline and the fallback checked before a unit's first job, and,
    unless the caller has just asked (after a preemption), the spot policy: before the first job, and
    after a failure, a cancel or a clear."""
    first = not state.job_names
    # not while an earlier try's submit is still to be found (its job may run: failing now would orphan it)
    check = first and state.submitting is None and limits.deadline is not None
    deadline: list[Action] = [CheckDeadline()] if check else []
    if limits.fallback is None:
        return tuple(deadline)
    actions: list[Action] = [*deadline, CheckFallback()] if first else []
    if not decided and not state.fallback_rule:
        actions.append(AskSpotPolicy())
    return tuple(actions)


def moved_to_fallback(state: ResubmissionState, use_fallback: bool, rule: str) -> Decision:
    """The spot policy's answer: a move to the fallback is stored before anything is sent, and then stays."""
    if not use_fallback or state.fallback_rule:
        return Decision(state, ())
    steps = Steps(state)
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
    steps = Steps(state)
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
