"""The verdict ladder by tables: which witness decides a cancelled job, and what each rung refuses."""

from __future__ import annotations

import math

import pytest

from airflow_azureml import lifecycle
from airflow_azureml.hooks.rest import job_cancels
from airflow_azureml.lifecycle import BackOff, Limits, ResubmissionState, Resubmit
from airflow_azureml.lifecycle_verdict import EVIDENCE_RECHECK
from airflow_azureml.outcomes import ActivityEvidence, GaugeEvidence, JobSnapshot, Outcome, classify
from airflow_azureml.polling import GaugeReading, JobWatch, PollingPolicy

JOB = JobSnapshot(name="j", status="Canceled", compute="spot", instance_count=2)
WHOLE = GaugeEvidence().observe("spot", True, 0, 2).observe("spot", True, 2, 2)  # every node, while it ran
AFTER_END = GaugeEvidence().observe("spot", True, 0, 2).near_end(2)
LOGGED = ActivityEvidence(read=True, cancels=(("8f3e-person", 1_700_000_000.0),))
NOTHING_LOGGED = ActivityEvidence(read=True)
UNREADABLE = ActivityEvidence(read=False, note="no read access: the identity needs Reader on the resource group")


@pytest.mark.parametrize(
    ("kwargs", "outcome", "witness"),
    [
        ({}, Outcome.USER_CANCELED, "none"),  # no witness at all: ambiguous
        ({"activity": NOTHING_LOGGED}, Outcome.USER_CANCELED, "none"),  # nothing logged (yet) is no evidence
        ({"activity": UNREADABLE}, Outcome.USER_CANCELED, "none"),
        ({"activity": LOGGED}, Outcome.USER_CANCELED, "activity_log"),  # a person, for sure
        ({"gauge": WHOLE}, Outcome.PREEMPTED, "gauge"),
        ({"gauge": AFTER_END}, Outcome.PREEMPTED, "gauge_near_end"),  # weak: the lifecycle waits for the log
        # a person's request in the log outranks the gauge (a person's cancel followed by a preemption)
        ({"gauge": WHOLE, "activity": LOGGED}, Outcome.USER_CANCELED, "activity_log"),
        ({"gauge": AFTER_END, "activity": LOGGED}, Outcome.USER_CANCELED, "activity_log"),
        # Airflow's own record outranks everything: its cancel is in the log too, under its own identity
        ({"activity": LOGGED, "canceled_by_airflow": True}, Outcome.AIRFLOW_CANCELED, "airflow_record"),
        ({"gauge": WHOLE, "activity": NOTHING_LOGGED}, Outcome.PREEMPTED, "gauge"),
    ],
)
def test_the_ladder(kwargs: dict, outcome: Outcome, witness: str) -> None:
    verdict = classify(JOB, **kwargs)
    assert (verdict.outcome, verdict.witness) == (outcome, witness)
    assert verdict.ambiguous is (witness == "none")
    assert verdict.to_dict()["witness"] == witness


def test_the_message_names_the_caller_and_what_was_missing() -> None:
    assert "canceled by 8f3e-person" in classify(JOB, activity=LOGGED).reason
    own = ActivityEvidence(read=True, cancels=LOGGED.cancels, own_identity=("8f3e-person",))
    assert "this connection's own identity" in classify(JOB, activity=own).reason
    assert "shows no cancel request" in classify(JOB, activity=NOTHING_LOGGED).reason
    assert "could not be read (no read access" in classify(JOB, activity=UNREADABLE).reason
    assert "at a read near its end" in classify(JOB, gauge=AFTER_END).reason
    assert ActivityEvidence.from_dict(LOGGED.to_dict()) == LOGGED
    assert GaugeEvidence.from_dict(AFTER_END.to_dict()) == AFTER_END


def test_a_completed_or_failed_job_needs_no_witness() -> None:
    done = JobSnapshot(name="j", status="Completed")
    assert classify(done, activity=LOGGED).outcome is Outcome.SUCCEEDED


# ----------------------------------------------------------- the read just after the end
def _watch(interval: float = 100.0) -> JobWatch:
    watch = JobWatch(PollingPolicy(interval=interval, max_interval=interval, jitter=0, evidence_interval=10))
    watch.observe(JobSnapshot(name="j", status="Running", compute="spot"), now=0)
    return watch


def _read(taken: float, at: float, preempted: int, nodes: int | None = 2) -> GaugeReading:
    return GaugeReading("spot", True, preempted, taken, nodes, at=at)


ENDED = JobSnapshot(name="j", status="Canceled", compute="spot", started_at=990, ended_at=1050)


@pytest.mark.parametrize(
    ("reads", "counts"),
    [
        ([(5, 1005, 0), (55, 1055, 2)], True),  # Azure cancelled before any read saw the loss; 5 s later every node
        ([(5, 1005, 0), (65, 1065, 2)], False),  # 15 s after the end: more than one evidence interval (10 s + 2 s)
        ([(5, 1005, 0), (55, 1055, 0), (58, 1058, 2)], False),  # only the first read after the end is looked at
        ([(5, 1005, 0, 2), (55, 1055, 1, 1)], False),  # the cluster shrank: our nodes may have been released
        ([(5, 1005, 0), (55, 1055, 1)], False),  # not every node
    ],
)
def test_the_first_read_after_the_end(reads: list[tuple], counts: bool) -> None:
    watch = _watch()
    for taken, at, preempted, *nodes in reads:
        watch.offer_gauge(_read(taken, at, preempted, *nodes), now=taken)
    watch.observe(ENDED, now=100)
    assert (watch.gauge.whole_cluster_preempted_near_end is not None) is counts
    assert watch.gauge.whole_cluster_preempted is None  # none of these reads was taken while the job ran


def test_the_read_at_the_end_is_the_first_after_it_when_none_came_before() -> None:
    watch = _watch(interval=5)
    watch.offer_gauge(_read(1, 1001, 0), now=1)
    watch.observe(JobSnapshot(name="j", status="Canceled", compute="spot", started_at=990, ended_at=1003), now=5)
    watch.offer_gauge(_read(5.2, 1005.2, 2), now=5.3)  # the wait's read at the end (hooks, poller)
    assert watch.gauge.whole_cluster_preempted_near_end == 2
    watch.offer_gauge(_read(9, 1009, 0), now=9)  # later reads change nothing
    assert watch.gauge.whole_cluster_preempted_near_end == 2


# ------------------------------------------------------------------ the lifecycle's waits
LIMITS = Limits(max_resubmits=3, loop_after=2, resubmit_backoff=30.0)


def _chain(**fields: object) -> ResubmissionState:
    return ResubmissionState(key="k", job_names=["j"], next_resubmission=1, **fields)  # type: ignore[arg-type]


def test_a_preemption_seen_only_after_the_end_waits_once_for_the_activity_log() -> None:
    weak = classify(JOB, gauge=AFTER_END)
    first = lifecycle.on_end(_chain(), "j", weak, LIMITS, watched=True)
    kinds = [type(a).__name__ for a in first.actions if not isinstance(a, lifecycle.Log)]
    assert kinds == ["Remember", "BackOff", "Wait"] and first.state.evidence_waited == "j"
    assert isinstance(first.actions[-2], BackOff) and first.actions[-2].seconds == LIMITS.evidence_wait
    assert first.state.preemptions == 0  # nothing counted before the wait
    stored = ResubmissionState.from_store("k", first.state.to_store(), None)
    # after the wait the read just after the end is not repeated: the kept reason stands unless a person shows
    _, found = lifecycle.verdict(stored, JOB, None, NOTHING_LOGGED)
    assert found.outcome is Outcome.PREEMPTED and "no cancel request in the Activity Log after the wait" in found.reason
    then = lifecycle.on_end(stored, "j", found, LIMITS, watched=False)
    assert isinstance(then.actions[-1], Resubmit) and then.state.preemptions == 1
    _, person = lifecycle.verdict(stored, JOB, None, LOGGED)
    assert person.outcome is Outcome.USER_CANCELED and person.witness == "activity_log"


def test_a_preemption_seen_while_the_job_ran_is_resubmitted_at_once() -> None:
    decision = lifecycle.on_end(_chain(), "j", classify(JOB, gauge=WHOLE), LIMITS, watched=True)
    assert isinstance(decision.actions[-1], Resubmit) and decision.state.evidence_waited is None


def test_no_wait_when_evidence_wait_is_zero() -> None:
    limits = Limits(max_resubmits=3, loop_after=2, resubmit_backoff=30.0, evidence_wait=0.0)
    decision = lifecycle.on_end(_chain(), "j", classify(JOB, gauge=AFTER_END), limits, watched=True)
    assert isinstance(decision.actions[-1], Resubmit)


# --------------------------------------------------------------------- the Activity Log's events
def _event(op: str, resource: str, caller: str, at: str, correlation: str, status: str = "Started") -> dict:
    return {
        "operationName": {"value": op, "localizedValue": "Cancel Job"},
        "resourceId": resource,
        "caller": caller,
        "eventTimestamp": at,
        "correlationId": correlation,
        "status": {"value": status},
    }


def test_job_cancels_matches_the_job_and_the_operation_in_any_casing_once_per_request() -> None:
    job_id = "/subscriptions/s/resourcegroups/rg/providers/microsoft.machinelearningservices/workspaces/w/jobs/j"
    upper = job_id.replace("microsoft.machinelearningservices", "MICROSOFT.MACHINELEARNINGSERVICES")
    op = "Microsoft.MachineLearningServices/workspaces/jobs/cancel/action"
    events = [
        _event(op, upper, "p1", "2026-12-03T10:00:01.1234567Z", "c1", "Accepted"),
        _event(op, upper, "p1", "2026-12-03T10:00:00.9000000Z", "c1"),  # the same request's other event
        _event(op, upper + "x", "p2", "2026-12-03T10:00:00Z", "c2"),  # another job
        _event("Microsoft.MachineLearningServices/workspaces/jobs/write", upper, "p3", "2026-12-03T10:00:00Z", "c3"),
        _event(op.upper(), job_id, "p4", "2026-12-03T10:05:00Z", "c4"),
        "not an event",
    ]
    found = job_cancels(events, job_id)
    assert [caller for caller, _ in found] == ["p1", "p4"]
    assert found[0][1] == pytest.approx(1796292000.9, abs=0.01)  # the request's first event


def test_a_cluster_that_shrank_after_a_persons_cancel_is_not_a_preemption() -> None:
    """Another job's node stays preempted; ours is released after a person's cancel. The read after the end
    finds the one node left preempted: every node of the cluster, but not ours (seen once, in .ci's hang)."""
    watch = _watch(interval=100)
    watch.offer_gauge(_read(0.2, 1000.2, 1, 2), now=0.3)  # counted at once: the read that follows a Running poll
    watch.observe(JobSnapshot(name="j", status="Canceled", compute="spot", started_at=990, ended_at=1003), now=5)
    watch.offer_gauge(_read(5.2, 1005.2, 1, 1), now=5.3)
    assert watch.gauge.whole_cluster_preempted_near_end is None
    assert classify(JobSnapshot(name="j", status="Canceled", instance_count=1), gauge=watch.gauge).ambiguous


def test_another_jobs_preempted_node_left_alone_near_the_end_is_no_loss() -> None:
    """Another job's node is preempted before ours runs, and stays so; a person cancels ours, whose node goes.
    A read that only run history's times place in the run then finds every node left preempted: the same one
    node, not ours (a .ci/run hang). The cluster shrank from the read before: ours were released."""
    watch = _watch(interval=100)
    watch.offer_gauge(_read(0.2, 1000.2, 1, 2), now=0.3)  # taken while it ran: 1 of 2 already preempted
    watch.offer_gauge(_read(4.0, 1002.0, 1, 1), now=4.0)
    watch.observe(JobSnapshot(name="j", status="Canceled", compute="spot", started_at=990, ended_at=1003), now=5)
    assert watch.gauge.first_while_running == 1
    assert watch.gauge.whole_cluster_preempted_near_end is None
    assert classify(JobSnapshot(name="j", status="Canceled"), gauge=watch.gauge).witness == "none"


def test_a_loss_beyond_the_nodes_already_preempted_still_counts_near_the_end() -> None:
    """Nodes preempted already, and then the whole cluster, the cluster no smaller: still evidence near the end."""
    watch = _watch(interval=100)
    watch.offer_gauge(_read(0.2, 1000.2, 1, 3), now=0.3)  # 1 of 3 preempted (another job's) while ours ran
    watch.offer_gauge(_read(4.0, 1002.0, 3, 3), now=4.0)  # then every node, placed in the run by its times only
    watch.observe(JobSnapshot(name="j", status="Canceled", compute="spot", started_at=990, ended_at=1003), now=5)
    assert watch.gauge.whole_cluster_preempted_near_end == 3


@pytest.mark.parametrize("polled_before", [False, True], ids=["pending", "taken"])
def test_every_node_preempted_within_a_second_of_the_end_is_evidence_near_the_end(polled_before: bool) -> None:
    """Azure ended the job 0.08 s after a read found every node preempted (benchmarks/backfill.py, 7 jobs of a
    busy cluster at once). The read is too close to run history's end time to count as taken while the job ran
    (CLOCK_MARGIN), and the first read after the end found a queued job's new nodes beside the preempted ones
    (14 of 16): the loss fell between the two rules. A read within the margin of the end is a read near it."""
    watch = _watch(interval=100)
    watch.offer_gauge(_read(0.2, 1000.2, 0, 14), now=0.3)  # taken while it ran: 14 nodes, none preempted
    if polled_before:  # a poll saw it Running just before the read (the read that follows a poll is taken)
        watch.observe(JobSnapshot(name="j", status="Running", compute="spot"), now=2.5)
    watch.offer_gauge(_read(3.0, 1002.76, 14, 14), now=3.0)  # every node preempted, 0.08 s before the end
    watch.observe(JobSnapshot(name="j", status="Canceled", compute="spot", started_at=990, ended_at=1002.84), now=4)
    watch.offer_gauge(_read(5.0, 1004.45, 14, 16), now=5.0)  # the first read after: two new nodes beside them
    assert watch.gauge.whole_cluster_preempted is None  # not strong: it may have been taken after the end
    assert watch.gauge.whole_cluster_preempted_near_end == 14
    assert classify(JobSnapshot(name="j", status="Canceled", instance_count=2), gauge=watch.gauge).witness == (
        "gauge_near_end"
    )


def test_a_persons_cancel_of_a_job_that_never_started_is_not_a_loss_within_a_second_of_its_end() -> None:
    """A person cancels a queued job while other jobs' nodes fill the cluster, all preempted: a read within a
    second before its end is no evidence (it held no nodes), and the read after the end shows none left."""
    watch = JobWatch(PollingPolicy(interval=100, max_interval=100, jitter=0, evidence_interval=10))
    watch.observe(JobSnapshot(name="j", status="Queued", compute="spot"), now=0)
    watch.offer_gauge(_read(5.0, 1005.0, 2, 2), now=5.0)
    watch.offer_gauge(_read(15.0, 1015.0, 2, 2), now=15.0)
    watch.observe(JobSnapshot(name="j", status="Canceled", compute="spot", started_at=None, ended_at=1015.5), now=16)
    watch.offer_gauge(_read(17.0, 1017.0, 0, 0), now=17.0)
    assert watch.gauge.whole_cluster_preempted_near_end is None


def test_every_node_preempted_between_polls_asks_for_a_poll_at_once() -> None:
    watch = _watch(interval=100)
    watch.offer_gauge(_read(5, 1005, 0), now=5)
    assert not watch.wants_poll_now()
    watch.offer_gauge(_read(15, 1015, 2), now=15)
    assert watch.wants_poll_now()  # is the job still Running? Then the read is strong evidence
    watch.observe(JobSnapshot(name="j", status="Running", compute="spot"), now=15.2)
    assert not watch.wants_poll_now() and watch.gauge.whole_cluster_preempted == 2


def test_a_read_after_run_historys_end_never_counts_even_between_two_running_polls() -> None:
    """ARM may show an accepted cancel late: Running, Running, then Canceled with an end before the read."""
    watch = _watch(interval=10)
    watch.offer_gauge(_read(5, 1005, 2), now=5)
    watch.observe(JobSnapshot(name="j", status="Running", compute="spot"), now=10)  # stale: it ended at 1003
    assert watch.gauge.whole_cluster_preempted == 2
    watch.observe(JobSnapshot(name="j", status="Canceled", compute="spot", started_at=990, ended_at=1003), now=20)
    assert watch.gauge.whole_cluster_preempted is None


# ------------------------------------------------------------------ the review's fixes
def test_a_retry_inside_the_evidence_wait_waits_the_rest_of_it() -> None:
    weak = classify(JOB, gauge=AFTER_END)
    first = lifecycle.on_end(_chain(), "j", weak, LIMITS, watched=True, now=1000.0)
    assert first.state.evidence_until == 1000.0 + LIMITS.evidence_wait
    stored = ResubmissionState.from_store("k", first.state.to_store(), None)
    _, again = lifecycle.verdict(stored, JOB, None, NOTHING_LOGGED)  # a crash 100 s in: the retry
    retry = lifecycle.on_end(stored, "j", again, LIMITS, watched=False, now=1100.0)
    backoff = next(a for a in retry.actions if isinstance(a, BackOff))
    assert retry.state.evidence_until == 1000.0 + LIMITS.evidence_wait  # the rest, not nothing, not all
    assert backoff.seconds == pytest.approx(min(LIMITS.evidence_wait - 100, EVIDENCE_RECHECK))
    done = lifecycle.on_end(stored, "j", again, LIMITS, watched=False, now=1000.0 + LIMITS.evidence_wait)
    assert isinstance(done.actions[-1], Resubmit)


def test_the_evidence_wait_looks_again_and_a_logged_person_ends_it_early() -> None:
    """The wait reads the Activity Log every EVIDENCE_RECHECK: a person's cancel that shows 5 min late is final
    then, not after the whole 900 s; with nothing logged, the work is resubmitted at the wait's end, not before."""
    state, now, looks = _chain(), 1000.0, 0
    decision = lifecycle.on_end(state, "j", classify(JOB, gauge=AFTER_END), LIMITS, watched=True, now=now)
    while not isinstance(decision.actions[-1], Resubmit):
        backoff = next(a for a in decision.actions if isinstance(a, BackOff))
        assert backoff.seconds <= EVIDENCE_RECHECK
        now += backoff.seconds
        looks += 1
        state = ResubmissionState.from_store("k", decision.state.to_store(), None)
        _, found = lifecycle.verdict(state, JOB, None, NOTHING_LOGGED)
        decision = lifecycle.on_end(state, "j", found, LIMITS, watched=False, now=now)
    assert now >= 1000.0 + LIMITS.evidence_wait - 1.0 and looks == math.ceil(LIMITS.evidence_wait / EVIDENCE_RECHECK)
    # the same wait, with the person's cancel in the log from 300 s on
    state, now = _chain(), 1000.0
    decision = lifecycle.on_end(state, "j", classify(JOB, gauge=AFTER_END), LIMITS, watched=True, now=now)
    while True:
        now += next(a for a in decision.actions if isinstance(a, BackOff)).seconds
        state = ResubmissionState.from_store("k", decision.state.to_store(), None)
        _, found = lifecycle.verdict(state, JOB, None, LOGGED if now - 1000.0 >= 300 else NOTHING_LOGGED)
        if found.outcome is Outcome.USER_CANCELED:
            break
        decision = lifecycle.on_end(state, "j", found, LIMITS, watched=False, now=now)
        assert not isinstance(decision.actions[-1], Resubmit), "resubmitted before the log was read again"
    assert found.witness == "activity_log" and now - 1000.0 <= 300 + EVIDENCE_RECHECK


def test_a_kill_during_the_evidence_wait_records_no_cancel_of_the_ended_job() -> None:
    from unittest import mock

    from airflow_azureml.operators import AzureMLInvokeBatchEndpointOperator

    op = AzureMLInvokeBatchEndpointOperator(
        task_id="t", endpoint_name="e", deployment_name="d", inputs={"x": "azureml://datastores/d/paths/p/"}
    )
    hook = mock.Mock()
    op.__dict__["hook"] = hook
    op._context = {}
    for state in (_chain(evidence_waited="j"), _chain(counted=["j"], preemptions=1)):
        op._state = state
        op.on_kill()
        assert state.airflow_canceled == [] and not hook.cancel_job.called
    op._state = _chain()  # a job still running: recorded, then cancelled
    op.on_kill()
    assert op._state.airflow_canceled == ["j"] and hook.cancel_job.call_args == mock.call("j")


def test_a_look_during_the_evidence_wait_bills_nothing_more() -> None:
    """Each look of the wait reads the compute again; the ended job's nodes were counted when it was first seen
    ended, and a reading minutes later (another job's nodes, maybe) must not be bridged onto its bill."""
    from airflow_azureml import cost
    from airflow_azureml.operators import AzureMLInvokeBatchEndpointOperator

    op = AzureMLInvokeBatchEndpointOperator(
        task_id="t", endpoint_name="e", deployment_name="d", inputs={"x": "azureml://datastores/d/paths/p/"}
    )
    point = {"computes": {}, "spans": [{"job": "j", "compute": "spot", "points": [[1000.0, [0, 4, 0, 0, 0, 0]]]}]}
    waiting = _chain(evidence_waited="j")
    before = waiting.usage
    op._add_usage({}, waiting, point)
    assert waiting.usage == before
    running = _chain()
    op._add_usage({}, running, point)
    assert running.usage == cost.merge(before, point) != before


def test_a_cancel_arm_refused_is_not_a_persons_cancel() -> None:
    job_id = "/subscriptions/s/resourcegroups/rg/providers/microsoft.machinelearningservices/workspaces/w/jobs/j"
    op = "Microsoft.MachineLearningServices/workspaces/jobs/cancel/action"
    failed = _event(op, job_id, "reader", "2026-12-03T10:00:00Z", "c1", "Failed")
    assert job_cancels([failed], job_id) == []
