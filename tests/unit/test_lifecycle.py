"""The job lifecycle by tables: a state and an observation in, the state and the actions out (no I/O)."""

from __future__ import annotations

import copy
from dataclasses import replace
from typing import Any

import pytest

from airflow_azureml import lifecycle
from airflow_azureml.lifecycle import (
    AskSpotPolicy,
    BackOff,
    Cancel,
    CheckDuplicate,
    Finish,
    Limits,
    Raise,
    Record,
    Remember,
    ResubmissionState,
    Resubmit,
    Submit,
)
from airflow_azureml.outcomes import Classification, GaugeEvidence, JobSnapshot, Outcome

NO_FALLBACK = Limits(max_resubmits=3, loop_after=2, resubmit_backoff=30.0)
WITH_FALLBACK = Limits(max_resubmits=3, loop_after=2, resubmit_backoff=30.0, fallback="dedicated")
DEFERRED = Limits(max_resubmits=3, loop_after=0, resubmit_backoff=5.0, deferrable=True)


def chain(*jobs: str, **fields: Any) -> ResubmissionState:
    return ResubmissionState(key="k", job_names=list(jobs), next_resubmission=len(jobs), **fields)


def ended(outcome: Outcome) -> Classification:
    return Classification(outcome, outcome.value)


def without_logs(decision: lifecycle.Decision) -> list[Any]:
    """The actions without logs, each Remember without its changes (``replayed`` checks those)."""
    return [Remember() if isinstance(a, Remember) else a for a in decision.actions if not isinstance(a, lifecycle.Log)]


def replayed(state: ResubmissionState, decision: lifecycle.Decision) -> ResubmissionState:
    """The state as the operator has it after carrying out the decision: its Remembers' changes, in order."""
    live = copy.deepcopy(state)
    for action in decision.actions:
        if isinstance(action, Remember):
            for name, value in action.changes:
                setattr(live, name, copy.deepcopy(value))
    assert live == decision.state, "every change of the decision is stored by one of its Remembers"
    continuations = [i for i, a in enumerate(decision.actions) if isinstance(a, (Resubmit, CheckDuplicate))]
    assert all(i == len(decision.actions) - 1 for i in continuations), "a continuation is the last action"
    return live


def changed_at(decision: lifecycle.Decision) -> list[tuple[str, set[str]]]:
    """The decision's actions by kind, each Remember with the names of the fields it sets."""
    return [
        (type(a).__name__, {name for name, _ in a.changes} if isinstance(a, Remember) else set())
        for a in decision.actions
        if not isinstance(a, lifecycle.Log)
    ]


# --------------------------------------------------------------- a job's end
@pytest.mark.parametrize(
    ("state", "outcome", "watched", "expected"),
    [
        # success: a watched job's hours go to the history, an unwatched one only closes its entry
        (chain("a"), Outcome.SUCCEEDED, True, [Record("a", "completed"), Finish("a")]),
        (chain("a"), Outcome.SUCCEEDED, False, [Record("a", "ended"), Finish("a")]),
        # a code failure fails the try that saw it; the next try (a retry, a clear) submits again
        (chain("a"), Outcome.FAILED, True, [Record("a", "ended"), Raise("a", "failed")]),
        (chain("a"), Outcome.FAILED, False, [Record("a", "ended"), Submit()]),
        (chain("a"), Outcome.AIRFLOW_CANCELED, True, [Record("a", "ended"), Submit()]),
        # a person's cancel: closed on the cluster first, then the LIST says whether it was a duplicate's
        (chain("a"), Outcome.USER_CANCELED, True, [Record("a", "ended"), CheckDuplicate("a", True)]),
        (chain("a"), Outcome.USER_CANCELED, False, [Record("a", "ended"), CheckDuplicate("a", False)]),
    ],
)
def test_on_end(state: ResubmissionState, outcome: Outcome, watched: bool, expected: list) -> None:
    decision = lifecycle.on_end(state, "a", ended(outcome), NO_FALLBACK, watched=watched)
    assert without_logs(decision) == expected
    replayed(state, decision)


@pytest.mark.parametrize(
    ("watched", "superseded", "expected"),
    [
        # a completed job another run or try saw end, whose deployment now runs another model: run it again
        (False, "the deployment now runs model 2", [Record("a", "ended"), Submit()]),
        (False, None, [Record("a", "ended"), Finish("a")]),
        # the job this try submitted and watched is its result, whatever changed meanwhile
        (True, "the deployment now runs model 2", [Record("a", "completed"), Finish("a")]),
    ],
)
def test_a_completed_job_of_a_superseded_deployment(watched: bool, superseded: str | None, expected: list) -> None:
    state = chain("a")
    decision = lifecycle.on_end(
        state, "a", ended(Outcome.SUCCEEDED), NO_FALLBACK, watched=watched, superseded=superseded
    )
    assert without_logs(decision) == expected
    replayed(state, decision)


@pytest.mark.parametrize(
    ("state", "may"),
    [
        (chain("a"), True),  # another DAG run's job (this run never knew it): a re-run, a backfill
        (chain("a", known=["a"]), False),  # this run's own: a retry reuses it whatever changed
        (chain("a", known=["a"], before_clear=["a"]), True),  # ended before a person cleared the task
    ],
)
def test_may_supersede(state: ResubmissionState, may: bool) -> None:
    assert lifecycle.may_supersede(state, "a") is may


@pytest.mark.parametrize(
    ("state", "watched", "kept", "expected"),
    [
        # a person's cancel is final for the try that watched it...
        (chain("a"), True, None, [Remember(), Raise("a", "user_canceled")]),
        # ...known to this run but first seen ended now: still final
        (chain("a", known=["a"]), False, None, [Remember(), Raise("a", "user_canceled")]),
        # ...but not after a clear, nor after a try already failed on it, nor in another run (a backfill)
        (chain("a", before_clear=["a"]), True, None, [Submit()]),
        (chain("a", reported_cancels=["a"]), True, None, [Submit()]),
        (chain("a"), False, None, [Submit()]),
        # cancelled as a duplicate of an older job of the unit: follow that one
        (chain("a"), True, "old", [Remember(), lifecycle.Wait()]),
    ],
)
def test_after_cancel(state: ResubmissionState, watched: bool, kept: str | None, expected: list) -> None:
    decision = lifecycle.after_cancel(state, "a", watched=watched, kept_instead=kept)
    assert without_logs(decision) == expected
    replayed(state, decision)


# ------------------------------------------------------- an ambiguous cancel
RESUBMIT_AMBIGUOUS = Limits(max_resubmits=1, loop_after=2, resubmit_backoff=30.0, on_ambiguous_cancel="resubmit")
AMBIGUOUS = Classification(Outcome.USER_CANCELED, "no witness", witness="none")
WITNESSED = Classification(Outcome.USER_CANCELED, "a person", witness="activity_log")


@pytest.mark.parametrize(
    ("found", "limits", "expected"),
    [
        # the default: an ambiguous cancel is a person's (final after the duplicate check)
        (AMBIGUOUS, NO_FALLBACK, [Record("a", "ended"), CheckDuplicate("a", True)]),
        # "resubmit": the reason travels with the duplicate check, which comes first
        (AMBIGUOUS, RESUBMIT_AMBIGUOUS, [Record("a", "ended"), CheckDuplicate("a", True, "no witness")]),
        # a cancel a witness explains is never resubmitted by the policy
        (WITNESSED, RESUBMIT_AMBIGUOUS, [Record("a", "ended"), CheckDuplicate("a", True)]),
    ],
)
def test_on_end_of_a_cancel_by_its_witness(found: Classification, limits: Limits, expected: list) -> None:
    decision = lifecycle.on_end(chain("a"), "a", found, limits, watched=True)
    assert without_logs(decision) == expected
    replayed(chain("a"), decision)


def test_an_ambiguous_cancel_resubmitted_spends_the_budget_and_teaches_the_history_no_preemption() -> None:
    waited = chain("a", evidence_waited="a")  # the wait for late evidence was spent (see the next test)
    first = lifecycle.after_cancel(
        waited, "a", watched=True, kept_instead=None, limits=RESUBMIT_AMBIGUOUS, resubmit="no witness"
    )
    assert changed_at(first) == [("Remember", {"preemptions", "counted", "lost"}), ("Resubmit", set())]
    assert not any(isinstance(a, Record) for a in first.actions)  # closed as "ended" already, never "preempted"
    assert any("on_ambiguous_cancel" in a.message for a in first.actions if isinstance(a, lifecycle.Log))
    replayed(waited, first)
    second = lifecycle.after_cancel(
        chain("a", "b", preemptions=1, counted=["a"], evidence_waited="b"),
        "b",
        watched=True,
        kept_instead=None,
        limits=RESUBMIT_AMBIGUOUS,
        resubmit="no witness",
    )
    assert without_logs(second)[-1] == Raise("b", "budget_spent", second.actions[-1].message)
    # a duplicate's cancel is followed, whatever the policy
    dup = lifecycle.after_cancel(
        chain("a"), "a", watched=True, kept_instead="o", limits=RESUBMIT_AMBIGUOUS, resubmit="no witness"
    )
    assert without_logs(dup) == [Remember(), lifecycle.Wait()]


@pytest.mark.parametrize("limits", [RESUBMIT_AMBIGUOUS, replace(RESUBMIT_AMBIGUOUS, deferrable=True)])
def test_an_ambiguous_cancel_waits_once_for_late_evidence_before_it_is_resubmitted(limits: Limits) -> None:
    """A person's cancel shows in the Activity Log minutes late: "resubmit" looks again after the wait."""
    first = lifecycle.after_cancel(chain("a"), "a", watched=True, kept_instead=None, limits=limits, resubmit="x")
    assert without_logs(first) == [Remember(), BackOff("a", 900.0, in_triggerer=limits.deferrable), lifecycle.Wait()]
    assert changed_at(first)[0] == ("Remember", {"evidence_waited"})  # stored before the wait: spent once
    stored = ResubmissionState.from_store("k", first.state.to_store(), None)
    assert stored.evidence_waited == "a"
    again = lifecycle.after_cancel(stored, "a", watched=False, kept_instead=None, limits=limits, resubmit="x")
    assert isinstance(again.actions[-1], Resubmit)
    no_wait = lifecycle.after_cancel(
        chain("a"), "a", watched=True, kept_instead=None, limits=replace(limits, evidence_wait=0.0), resubmit="x"
    )
    assert isinstance(no_wait.actions[-1], Resubmit)


def test_a_persons_cancel_is_stored_after_the_cluster_record() -> None:
    """A history write that fails (or a crash in it) must not leave the cancel stored as reported: the
    retry would take it as already failed on, and resubmit what a person cancelled."""
    decision = lifecycle.on_end(chain("a"), "a", ended(Outcome.USER_CANCELED), NO_FALLBACK, watched=True)
    assert changed_at(decision) == [("Record", set()), ("CheckDuplicate", set())], "no change before the record"
    final = lifecycle.after_cancel(decision.state, "a", watched=True, kept_instead=None)
    assert changed_at(final) == [("Remember", {"reported_cancels"}), ("Raise", set())]


def test_a_duplicate_is_closed_on_the_cluster_before_the_chain_follows_the_kept_job() -> None:
    state = chain("a", fallback_rule="x", fallback_from=1)  # a spot job, then a move to the fallback
    decision = lifecycle.on_end(state, "a", ended(Outcome.USER_CANCELED), NO_FALLBACK, watched=True)
    assert changed_at(decision)[0] == ("Record", set()) and not decision.state.on_fallback("a")
    followed = lifecycle.after_cancel(decision.state, "a", watched=True, kept_instead="o")
    assert changed_at(followed) == [("Remember", {"job_names"}), ("Wait", set())]


def test_a_persons_cancel_is_remembered_so_the_next_try_submits() -> None:
    first = lifecycle.after_cancel(chain("a"), "a", watched=True, kept_instead=None)
    assert first.state.reported_cancels == ["a"]
    again = lifecycle.after_cancel(first.state, "a", watched=True, kept_instead=None)
    assert isinstance(again.actions[-1], Submit)


def test_following_the_kept_duplicate_replaces_it_in_the_chain() -> None:
    state = chain("x", "a")
    decision = lifecycle.after_cancel(state, "a", watched=True, kept_instead="o")
    assert decision.state.job_names == ["x", "o"]
    assert state.job_names == ["x", "a"], "the input state is not changed"


# ---------------------------------------------------------------- preemption
@pytest.mark.parametrize(
    ("state", "limits", "expected"),
    [
        # counted once, recorded once, then resubmitted (the back-off is decided after the policy's answer)
        (chain("a"), NO_FALLBACK, [Remember(), Record("a", "preempted"), Resubmit("a", "r")]),
        # judged before a crash: not counted or recorded again
        (chain("a", preemptions=1, counted=["a"]), NO_FALLBACK, [Resubmit("a", "r")]),
        # the budget: the fourth preemption with max_resubmits=3 fails the task
        (chain("a", preemptions=3), NO_FALLBACK, [Remember(), Record("a", "preempted"), Raise("a", "budget_spent")]),
        # with a fallback, the policy answers first
        (chain("a"), WITH_FALLBACK, [Remember(), Record("a", "preempted"), AskSpotPolicy("a"), Resubmit("a", "r")]),
        # already on the fallback: nothing to ask
        (chain("a", fallback_rule="x"), WITH_FALLBACK, [Remember(), Record("a", "preempted"), Resubmit("a", "r")]),
    ],
)
def test_on_preemption(state: ResubmissionState, limits: Limits, expected: list) -> None:
    decision = lifecycle.on_end(state, "a", Classification(Outcome.PREEMPTED, "r"), limits, watched=True)
    got = without_logs(decision)
    replayed(state, decision)
    if isinstance(expected[-1], Raise):  # the message is the user's; the kind is the decision
        assert [type(a) for a in got] == [type(a) for a in expected] and got[-1].kind == expected[-1].kind
        assert "max_resubmits=3" in got[-1].message
    else:
        assert got == expected


@pytest.mark.parametrize(
    ("state", "limits", "expected"),
    [
        (chain("a", preemptions=1), NO_FALLBACK, [Submit(decided=True, after="a", reason="r")]),
        # a loop (third preemption, loop_after=2) backs off in place
        (chain("a", preemptions=3), NO_FALLBACK, [BackOff("a", 30.0, False), Submit(True, "a", "r")]),
        # deferrable: the back-off is spent in the triggerer, and stored first so that it is spent once
        (chain("a", preemptions=1), DEFERRED, [Remember(), BackOff("a", 5.0, True), Submit(True, "a", "r")]),
        (chain("a", preemptions=1, backoff_done="a"), DEFERRED, [Submit(True, "a", "r")]),
        # moved to the fallback by the policy's answer: no back-off
        (chain("a", preemptions=3, fallback_rule="x"), NO_FALLBACK, [Submit(True, "a", "r")]),
    ],
)
def test_resubmit(state: ResubmissionState, limits: Limits, expected: list) -> None:
    decision = lifecycle.resubmit(state, "a", "r", limits)
    assert without_logs(decision) == expected
    replayed(state, decision)


def test_a_back_off_in_the_triggerer_is_spent_once() -> None:
    counted = lifecycle.on_end(chain("a"), "a", Classification(Outcome.PREEMPTED, "r"), DEFERRED, watched=True)
    stored = ("Remember", {"preemptions", "counted", "lost"})
    assert changed_at(counted)[0] == stored, "the back-off is not stored early"
    decision = lifecycle.resubmit(counted.state, "a", "r", DEFERRED)
    assert changed_at(decision)[0] == ("Remember", {"backoff_done"}), "stored before deferring"
    resumed = lifecycle.on_end(decision.state, "a", Classification(Outcome.PREEMPTED, "r"), DEFERRED, watched=False)
    assert without_logs(resumed) == [Resubmit("a", "r")]
    assert without_logs(lifecycle.resubmit(resumed.state, "a", "r", DEFERRED)) == [Submit(True, "a", "r")]


@pytest.mark.parametrize(
    ("preemptions", "loop_after", "fallback_rule", "expected"),
    [
        (0, 2, None, 0.0),
        (2, 2, None, 0.0),
        (3, 2, None, 30.0),
        (4, 2, None, 60.0),
        (40, 2, None, 600.0),
        (5, 2, "x", 0.0),
    ],
)
def test_loop_backoff(preemptions: int, loop_after: int, fallback_rule: str | None, expected: float) -> None:
    state = chain("a", preemptions=preemptions, fallback_rule=fallback_rule)
    limits = Limits(max_resubmits=100, loop_after=loop_after, resubmit_backoff=30.0)
    assert lifecycle.loop_backoff(state, limits) == expected


# ------------------------------------------------------------ before a submit
@pytest.mark.parametrize(
    ("state", "limits", "decided", "expected"),
    [
        (chain(), NO_FALLBACK, False, ()),
        (chain(), WITH_FALLBACK, False, (lifecycle.CheckFallback(), AskSpotPolicy())),
        (chain("a"), WITH_FALLBACK, False, (AskSpotPolicy(),)),
        (chain("a"), WITH_FALLBACK, True, ()),
        (chain("a", fallback_rule="x"), WITH_FALLBACK, False, ()),  # once on the fallback, it stays
    ],
)
def test_before_submit(state: ResubmissionState, limits: Limits, decided: bool, expected: tuple) -> None:
    assert lifecycle.before_submit(state, limits, decided=decided) == expected


def test_a_move_to_the_fallback_is_stored_once_and_stays() -> None:
    moved = lifecycle.moved_to_fallback(chain("a", "b"), True, "expected_cost")
    assert (moved.state.fallback_rule, moved.state.fallback_from) == ("expected_cost", 2)
    assert changed_at(moved) == [("Remember", {"fallback_rule", "fallback_from"})], "stored before anything is sent"
    assert lifecycle.moved_to_fallback(moved.state, True, "other").state.fallback_rule == "expected_cost"
    assert lifecycle.moved_to_fallback(chain("a"), False, "stay").actions == ()
    assert moved.state.on_fallback("c") and not moved.state.on_fallback("a")


# --------------------------------------------------------------- queue time
@pytest.mark.parametrize(
    ("use_fallback", "last_try", "expected"),
    [
        (True, False, [Remember(), Cancel("a", tolerant=False), lifecycle.Wait()]),
        (False, True, [Remember(), Cancel("a", tolerant=False), Raise("a", "queue_timeout")]),
        (False, False, [Raise("a", "queue_timeout")]),  # left queued: a retry re-attaches, no second job
    ],
)
def test_on_queue_timeout(use_fallback: bool, last_try: bool, expected: list) -> None:
    decision = lifecycle.on_queue_timeout(
        chain("a"), "a", "queued 60 s", WITH_FALLBACK, use_fallback=use_fallback, last_try=last_try, now=5.0
    )
    got = without_logs(decision)
    assert [type(a) for a in got] == [type(a) for a in expected] and got[:-1] == expected[:-1]
    replayed(chain("a"), decision)
    cancelled = any(isinstance(a, Cancel) for a in decision.actions)
    assert (decision.state.airflow_canceled == ["a"]) is cancelled, "Airflow's cancel is recorded before it is sent"


# ---------------------------------------------------------- the first look
RUNNING = JobSnapshot(name="a", status="Running")
CANCELED = JobSnapshot(name="a", status="Canceled")


@pytest.mark.parametrize(
    ("state", "snapshot", "cancels", "airflow_canceled", "before_clear"),
    [
        # nothing recorded: nothing to do
        (chain("a"), RUNNING, [], [], []),
        # on_kill recorded a cancel that never took: the job runs on, a later cancel is not Airflow's
        (chain("a", airflow_canceled=["a"]), RUNNING, [], [], []),
        (chain("a", airflow_canceled=["a"]), CANCELED, [], ["a"], []),
        # cleared while deferred on it: the trigger's on_kill cancels it; the cancel is Airflow's, sent again
        (chain("a", cleared=True, deferred_on="a"), RUNNING, ["a"], ["a"], []),
        # cleared after it ended: its cancel, whoever's, is not final
        (chain("x", "a", cleared=True), CANCELED, [], [], ["a", "x"]),
        (chain("x", "a", cleared=True), RUNNING, [], [], ["x"]),
    ],
)
def test_first_sight(
    state: ResubmissionState, snapshot: JobSnapshot, cancels: list, airflow_canceled: list, before_clear: list
) -> None:
    decision = lifecycle.first_sight(state, snapshot, now=10.0)
    assert [a.job for a in decision.actions if isinstance(a, Cancel)] == cancels
    assert decision.state.airflow_canceled == airflow_canceled
    assert decision.state.before_clear == before_clear
    assert not decision.state.cleared, "a clear is taken once"
    replayed(state, decision)  # a changed record is stored


# ------------------------------------------------------------ the verdict
def test_a_job_judged_preempted_stays_preempted() -> None:
    _, found = lifecycle.verdict(chain("a", counted=["a"]), CANCELED, None)
    assert found.outcome is Outcome.PREEMPTED


def test_airflows_cancel_that_the_job_outlived_is_not_airflows() -> None:
    usage = {"spans": [{"job": "a", "statuses": [[100.0, "Running"]]}]}
    state = chain("a", airflow_canceled=["a"], canceled_at={"a": 50.0}, usage=usage)
    decision, found = lifecycle.verdict(state, CANCELED, None)
    assert found.outcome is Outcome.USER_CANCELED and decision.state.airflow_canceled == []
    before = chain("a", airflow_canceled=["a"], canceled_at={"a": 150.0}, usage=usage)  # Running only before it
    assert lifecycle.verdict(before, CANCELED, None)[1].outcome is Outcome.AIRFLOW_CANCELED


def test_the_verdict_reads_the_gauge() -> None:
    rose = GaugeEvidence().observe("c", True, 0, 2).observe("c", True, 2, 2)
    assert lifecycle.verdict(chain("a"), CANCELED, rose)[1].outcome is Outcome.PREEMPTED


# ----------------------------------------------------------- state record
def test_the_record_round_trips_and_a_clear_starts_a_fresh_budget() -> None:
    state = chain("a", "b", preemptions=2, counted=["a"], fallback_rule="x", fallback_from=1, max_tries=1)
    stored = state.to_store()
    retry = ResubmissionState.from_store("k", stored, max_tries=1)
    assert (retry.known, retry.preemptions, retry.fallback_rule, retry.cleared) == (["a", "b"], 2, "x", False)
    cleared = ResubmissionState.from_store("k", stored, max_tries=3)  # Airflow raises max_tries on a clear
    assert (cleared.preemptions, cleared.counted, cleared.fallback_rule, cleared.cleared) == (0, [], None, True)
    assert ResubmissionState.from_store("other", stored, max_tries=1).known == [], "another unit's record"


def test_merge_chain_adds_remembered_jobs_the_list_does_not_show() -> None:
    assert lifecycle.merge_chain({0: "a"}, {"a"}, ["a", "b"]) == {0: "a", 1: "b"}
    assert lifecycle.merge_chain({0: "a"}, {"a", "dup"}, ["dup"]) == {0: "a"}, "a duplicate that lost is listed"


PREEMPTION_ERROR = (
    "UserError: AzureMLCompute job failed. PreemptionError: Nodes of this job got pre-empted. Check if the run "
    "has failed or restarted. Reason: Received pre-emption warning signal"
)


@pytest.mark.parametrize("max_resubmits", [0, 1])
@pytest.mark.parametrize(
    "found_again",
    [
        JobSnapshot(name="r0", status="Canceled"),  # the evidence of its verdict is not read again
        JobSnapshot(name="r0", status="Failed", error_message=PREEMPTION_ERROR),  # Azure's own words are
    ],
    ids=["canceled", "preemption-error"],
)
def test_a_preemption_before_a_clear_does_not_spend_the_fresh_budget(
    max_resubmits: int, found_again: JobSnapshot
) -> None:
    """The budget is spent on r0's preemption and the task fails; a person clears it. The cleared try finds
    r0 again: the clear is the request to run the work, so the next job goes out and the fresh budget is
    whole (before, a PreemptionError was counted again: with max_resubmits=0 the clear failed at once)."""
    limits = Limits(max_resubmits=max_resubmits, loop_after=2, resubmit_backoff=30.0)
    state = chain("r0", max_tries=1)
    for _ in range(max_resubmits):  # earlier preemptions of the chain spent the budget up to r0
        name = f"p{len(state.job_names)}"
        state = lifecycle.on_preemption(replace(state, job_names=[name, *state.job_names]), name, "lost", limits).state
    spent = lifecycle.on_preemption(state, "r0", "every node preempted", limits)
    assert any(isinstance(a, Raise) and a.kind == "budget_spent" for a in spent.actions)

    cleared = ResubmissionState.from_store("k", spent.state.to_store(), max_tries=2)
    cleared.job_names = list(spent.state.job_names)
    cleared = lifecycle.first_sight(cleared, found_again, now=0.0).state
    assert "r0" in cleared.before_clear and cleared.preemptions == 0

    _, found = lifecycle.verdict(cleared, found_again, None)
    assert found.outcome is Outcome.PREEMPTED  # judged so before the clear: no evidence needed again
    decision = lifecycle.on_end(cleared, "r0", found, limits, watched=False)
    assert without_logs(decision)[-1] == Submit() and not any(isinstance(a, Raise) for a in decision.actions)
    after = replayed(cleared, decision)
    assert after.preemptions == 0 and after.counted == [] and "r0" in after.lost


@pytest.mark.parametrize("cleared", [False, True])
def test_a_record_from_before_the_lost_field_takes_its_lost_jobs_from_counted(cleared: bool) -> None:
    """An in-flight task's record written before 2026-12-07 has no "lost": its counted preemptions are the
    chain's lost attempts (a clear then resets only the budget)."""
    old = chain("r0", "r1", counted=["r0"], preemptions=1, max_tries=1).to_store()
    del old["lost"]
    state = ResubmissionState.from_store("k", old, max_tries=2 if cleared else 1)
    assert state.lost == ["r0"]
    assert (state.counted, state.preemptions) == (([], 0) if cleared else (["r0"], 1))


def test_a_job_lost_before_a_clear_teaches_the_history_only_once() -> None:
    """Judged before the clear (in ``lost``): recorded then, or closed as a fallback's or an ambiguous cancel's
    end; the cleared try records nothing. Judged first after the clear (Azure's PreemptionError): once."""
    known = chain("r0", before_clear=["r0"], lost=["r0"])
    found = Classification(Outcome.PREEMPTED, "preempted (judged so when it ended)")
    assert not any(
        isinstance(a, Record) for a in lifecycle.on_end(known, "r0", found, NO_FALLBACK, watched=False).actions
    )
    new = chain("r0", before_clear=["r0"])
    decision = lifecycle.on_end(new, "r0", Classification(Outcome.PREEMPTED, "error"), NO_FALLBACK, watched=False)
    assert [a for a in decision.actions if isinstance(a, Record)] == [Record("r0", "preempted")]
    assert replayed(new, decision).lost == ["r0"]
