"""Outcome classification: the one place that decides what a finished job means, on evidence only."""

from __future__ import annotations

import pytest

from airflow_azureml.emulator.models import CAPACITY_LOST_MESSAGE, PREEMPTION_ERROR_MESSAGE
from airflow_azureml.outcomes import ComputeFacts, GaugeEvidence, JobSnapshot, Outcome, classify

# The gauge as sampled while the job ran: (compute, low_priority, samples, first, peak).
# Both nodes of a 2-node cluster went preempted while the job ran (preempted, currentNodeCount).
ROSE_LOW_PRI = GaugeEvidence().observe("low-pri-cluster", True, 0, 2).observe("low-pri-cluster", True, 2, 2)
FLAT_AT_ONE = GaugeEvidence("low-pri-cluster", True, 4, 1, 1)  # another job's preempted node
ROSE_DEDICATED = GaugeEvidence().observe("dedicated-pool", False, 0, 2).observe("dedicated-pool", False, 2, 2)
ONE_SAMPLE = GaugeEvidence("low-pri-cluster", True, 1, 2, 2)
LOW_PRIORITY_NOTICE = "Cluster low-pri-cluster uses low priority VMs: nodes may be preempted or evicted at any time."


def snap(status: str, error: str | None = None, warnings: tuple[str, ...] = ()) -> JobSnapshot:
    return JobSnapshot(name="j", status=status, error_message=error, warnings=warnings)


@pytest.mark.parametrize(
    ("job", "kwargs", "expected"),
    [
        (snap("Running"), {}, Outcome.RUNNING),
        (snap("Queued"), {}, Outcome.RUNNING),
        (snap("CancelRequested"), {}, Outcome.RUNNING),
        # a stalled job may resume and write its output: never terminal
        (snap("NotResponding"), {}, Outcome.RUNNING),
        (snap("Paused"), {}, Outcome.RUNNING),
        (snap("Completed"), {}, Outcome.SUCCEEDED),
        # the field form users report: Failed with PreemptionError
        (snap("Failed", PREEMPTION_ERROR_MESSAGE), {}, Outcome.PREEMPTED),
        (snap("Failed", "UserError: ZeroDivisionError in score.py line 4"), {}, Outcome.FAILED),
        (snap("Failed"), {}, Outcome.FAILED),
        # the documented form: Canceled for lost capacity, told only by the gauge (Azure sends no message)
        (snap("Canceled"), {"gauge": ROSE_LOW_PRI}, Outcome.PREEMPTED),
        (snap("Canceled"), {}, Outcome.USER_CANCELED),
        (snap("Canceled"), {"gauge": ROSE_DEDICATED}, Outcome.USER_CANCELED),
        (snap("Canceled"), {"gauge": ONE_SAMPLE}, Outcome.USER_CANCELED),
        # a read after the end is not evidence: the gauge may be up by then for another job
        (snap("Canceled"), {"gauge": GaugeEvidence("low-pri-cluster", True, 1, 0, 0).ended(2)}, Outcome.USER_CANCELED),
        (snap("Canceled"), {"gauge": FLAT_AT_ONE.ended(1)}, Outcome.USER_CANCELED),
        # a read at the end with no sample while the job ran has no baseline: not evidence
        (snap("Canceled"), {"gauge": GaugeEvidence().ended(3)}, Outcome.USER_CANCELED),
        (snap("Canceled"), {"gauge": GaugeEvidence("dedicated-pool", False, 1, 0, 0).ended(2)}, Outcome.USER_CANCELED),
        (snap("Canceled", warnings=("Job was canceled by request.",)), {}, Outcome.USER_CANCELED),
        # Airflow's own cancel (on_kill) is never a preemption, whatever the evidence
        (snap("Canceled", warnings=(CAPACITY_LOST_MESSAGE,)), {"canceled_by_airflow": True}, Outcome.AIRFLOW_CANCELED),
        (snap("Canceled"), {"gauge": ROSE_LOW_PRI, "canceled_by_airflow": True}, Outcome.AIRFLOW_CANCELED),
    ],
)
def test_classify(job: JobSnapshot, kwargs: dict, expected: Outcome) -> None:
    assert classify(job, **kwargs).outcome is expected


@pytest.mark.parametrize(
    ("job", "kwargs", "expected"),
    [
        # a person's cancel, with a notice that the cluster is low priority
        (
            snap("Canceled", warnings=("Job was canceled by request.", LOW_PRIORITY_NOTICE)),
            {},
            Outcome.USER_CANCELED,
        ),
        # a person's cancel on a cluster whose gauge stays at 1 because of another job
        (snap("Canceled"), {"gauge": FLAT_AT_ONE}, Outcome.USER_CANCELED),
        # one compute read after the end, no baseline: not evidence (a missing baseline is not zero)
        (snap("Canceled"), {"compute": ComputeFacts(low_priority=True, preempted_node_count=1)}, Outcome.USER_CANCELED),
        # the user's own code mentioning preemption is a code failure
        (snap("Failed", "KeyError: column 'is_preempted' not found in input"), {}, Outcome.FAILED),
        (snap("Failed", "UserError: low priority quota exceeded; node evicted"), {}, Outcome.FAILED),
        # a warning about an unrelated eviction policy
        (snap("Canceled", warnings=("Dataset cache eviction policy set to LRU",)), {}, Outcome.USER_CANCELED),
        (snap("Failed", "ValueError: bad row", ("Dataset cache eviction policy set to LRU",)), {}, Outcome.FAILED),
    ],
)
def test_loose_patterns_are_not_preemptions(job: JobSnapshot, kwargs: dict, expected: Outcome) -> None:
    assert classify(job, **kwargs).outcome is expected


def test_not_terminal_states() -> None:
    assert not snap("NotResponding").terminal and not snap("Paused").terminal
    assert not snap("CancelRequested").terminal and snap("Canceled").terminal


def test_verdict_says_which_evidence_was_missing() -> None:
    verdict = classify(snap("Canceled"))
    assert "no lost-capacity message" in verdict.reason and "no read" in verdict.reason
    assert verdict.ambiguous and verdict.to_dict()["witness"] == "none"
    flat = classify(snap("Canceled"), gauge=FLAT_AT_ONE)
    assert "found every node preempted" in flat.reason
    assert flat.evidence["gauge"] == FLAT_AT_ONE.to_dict()
    rose = classify(snap("Canceled"), gauge=ROSE_LOW_PRI)
    assert rose.evidence["gauge_rose_while_running"] is True
    assert rose.to_dict()["outcome"] == "preempted" and rose.witness == "gauge" and not rose.ambiguous


def test_failed_reason_carries_service_message() -> None:
    verdict = classify(snap("Failed", "UserError: model file missing"))
    assert "model file missing" in verdict.reason


def test_snapshot_round_trip_and_rest_parsing() -> None:
    arm = {
        "name": "j1",
        "properties": {
            "status": "Canceled",
            "computeId": "/subscriptions/s/resourceGroups/r/providers/x/workspaces/w/computes/low-pri-cluster",
            "tags": {"a": "b"},
            "properties": {"azureml.batch.outputUri": "azureml://datastores/d/paths/o/", "airflow_azureml.unit": "k"},
        },
    }
    details = {"warnings": [{"source": "capacity", "message": CAPACITY_LOST_MESSAGE}], "error": None}
    snapshot = JobSnapshot.from_rest(arm, details)
    assert snapshot.compute == "low-pri-cluster" and snapshot.instance_count is None
    assert snapshot.output_uri == "azureml://datastores/d/paths/o/"
    assert snapshot.properties["airflow_azureml.unit"] == "k"
    assert JobSnapshot.from_dict(snapshot.to_dict()) == snapshot
    facts = ComputeFacts.from_rest(
        {"properties": {"properties": {"vmPriority": "LowPriority", "nodeStateCounts": {"preemptedNodeCount": 2}}}}
    )
    assert facts == ComputeFacts(low_priority=True, preempted_node_count=2)


def test_gauge_evidence_needs_two_samples_while_running() -> None:
    gauge = GaugeEvidence().observe("c", True, 1)
    assert not gauge.rose_while_running
    gauge = gauge.observe("c", True, 1)
    assert not gauge.rose_while_running
    gauge = gauge.observe("c", True, 2)
    assert gauge.rose_while_running and GaugeEvidence.from_dict(gauge.to_dict()) == gauge


# ----------------------------------------------- review 9: the gauge covers this job's nodes, read while it ran
def test_a_read_after_the_end_is_not_evidence() -> None:
    # one sample while the job ran (0), then the end read (1): another team's node, evicted after our cancel
    gauge = GaugeEvidence().observe("low-pri-cluster", True, 0).ended(1)
    assert classify(snap("Canceled"), gauge=gauge).outcome is Outcome.USER_CANCELED


def test_another_jobs_node_preempted_while_ours_ran_is_not_our_preemption() -> None:
    gauge = GaugeEvidence().observe("low-pri-cluster", True, 0).observe("low-pri-cluster", True, 1)
    assert classify(snap("Canceled"), gauge=gauge).outcome is Outcome.USER_CANCELED


@pytest.mark.parametrize(
    ("message", "expected"),
    [
        (PREEMPTION_ERROR_MESSAGE, Outcome.PREEMPTED),
        (
            "AzureMLCompute job failed. PreemptionError: Nodes of this job got pre-empted. Check if the run",
            Outcome.PREEMPTED,
        ),
        ("AssertionError: expected 'PreemptionError: Nodes of this job got pre-empted' in log", Outcome.FAILED),
        (f"ValueError: retry after {PREEMPTION_ERROR_MESSAGE}", Outcome.FAILED),
        ("PreemptionError: Nodes of this job got pre-empted.", Outcome.FAILED),  # not Azure's whole text
    ],
)
def test_failed_is_a_preemption_only_on_azures_own_error(message: str, expected: Outcome) -> None:
    assert classify(snap("Failed", message)).outcome is expected


@pytest.mark.parametrize(
    "job",
    [
        snap(
            "Canceled",
            warnings=("Low priority VMs: your job may be canceled when there is not enough capacity in the region",),
        ),
        snap("Canceled", "User canceled the job due to lack of capacity planning"),
        snap("Canceled", warnings=("Retry canceled: lost all its nodes? no, just testing",)),
        # even the emulator's invented capacity text: Azure documents no message for that cancel
        snap("Canceled", warnings=(CAPACITY_LOST_MESSAGE,)),
    ],
)
def test_no_message_makes_a_cancel_a_preemption(job: JobSnapshot) -> None:
    assert classify(job).outcome is Outcome.USER_CANCELED


@pytest.mark.parametrize(
    ("samples", "instance_count", "expected"),
    [
        # (preempted, currentNodeCount) per sample while the job ran
        ([(0, 2), (2, 2)], None, Outcome.PREEMPTED),  # the whole cluster went while it ran
        ([(0, 2), (2, 2)], 2, Outcome.PREEMPTED),
        ([(0, 1), (1, 1)], 1, Outcome.PREEMPTED),  # a single-node cluster lost its node
        ([(0, 2), (1, 2)], 1, Outcome.USER_CANCELED),  # one of two nodes: another job's, or requeued mini-batches
        ([(0, 3), (2, 3)], 2, Outcome.USER_CANCELED),  # not the whole cluster
        # another job's node was preempted before ours ran; then the rest went
        ([(1, 3), (3, 3)], 2, Outcome.PREEMPTED),
        ([(1, 3), (3, 3)], None, Outcome.PREEMPTED),  # job size unknown: every node went, the job's too
        ([(0, None), (2, None)], 2, Outcome.USER_CANCELED),  # the node count not sent: in doubt
        # every node preempted at the first read while it ran (the preemption came before it): its nodes too
        ([(2, 2)], 2, Outcome.PREEMPTED),
        ([(2, 2), (2, 2)], 2, Outcome.PREEMPTED),
        ([(0, 2), (2, 2)], 3, Outcome.USER_CANCELED),  # fewer nodes preempted than the job's own
        ([(0, 0), (0, 0)], None, Outcome.USER_CANCELED),  # no nodes at all: nothing to have preempted
    ],
)
def test_cancel_is_a_preemption_when_the_whole_cluster_went_while_it_ran(
    samples: list[tuple[int, int | None]], instance_count: int | None, expected: Outcome
) -> None:
    gauge = GaugeEvidence()
    for preempted, nodes in samples:
        gauge = gauge.observe("low-pri-cluster", True, preempted, nodes)
    job = JobSnapshot(name="j", status="Canceled", instance_count=instance_count)
    assert classify(job, gauge=gauge).outcome is expected
    assert (
        classify(JobSnapshot.from_dict(job.to_dict()), gauge=GaugeEvidence.from_dict(gauge.to_dict())).outcome
        is expected
    )


def test_person_cancel_with_another_jobs_node_counted_stays_a_person_cancel() -> None:
    # the gauge is 1 because of another job's node, all through our run; our job of 1 node is cancelled
    gauge = GaugeEvidence().observe("low-pri-cluster", True, 1, 2).observe("low-pri-cluster", True, 1, 2)
    verdict = classify(JobSnapshot(name="j", status="Canceled", instance_count=1), gauge=gauge.ended(1))
    assert verdict.outcome is Outcome.USER_CANCELED and "found every node preempted" in verdict.reason


def test_instance_count_comes_from_the_job_resource() -> None:
    batch = {"name": "b", "properties": {"status": "Canceled", "compute": {"target": "x", "instanceCount": 2}}}
    command = {"name": "c", "properties": {"status": "Canceled", "resources": {"instanceCount": 3}}}
    assert JobSnapshot.from_rest(batch).instance_count == 2
    assert JobSnapshot.from_rest(command).instance_count == 3
    odd = {"name": "d", "properties": {"status": "Canceled", "resources": {"instanceCount": True}}}
    assert JobSnapshot.from_rest(odd).instance_count is None


def test_the_waits_pass_the_clusters_node_count() -> None:
    from airflow_azureml.polling import GaugeReading, JobWatch, PollingPolicy

    def arm(preempted: int, current: int) -> dict:
        counts = {"preemptedNodeCount": preempted}
        inner = {"vmPriority": "LowPriority", "currentNodeCount": current, "nodeStateCounts": counts}
        return {"properties": {"properties": inner}}

    watch = JobWatch(PollingPolicy(interval=1, max_interval=1))
    watch.observe(JobSnapshot(name="j", status="Running", compute="c"), now=0)
    watch.offer_gauge(GaugeReading.from_rest("c", arm(0, 2), taken=1))
    watch.offer_gauge(GaugeReading.from_rest("c", arm(2, 2), taken=2))
    assert not watch.gauge.lost_nodes_of(None)  # not yet known to be while it ran: the next poll says
    watch.observe(JobSnapshot(name="j", status="Running", compute="c"), now=3)
    assert watch.gauge.lost_nodes_of(None) and watch.gauge.lost_nodes_of(2)


@pytest.mark.parametrize(
    "details",
    [
        {"error": {"error": "text"}, "startTimeUtc": "2026-12-07T00:00:00Z"},
        {"error": "text", "warnings": ["text", {"message": 3}, None]},
        {"warnings": {"message": "m"}},
        [1],
        "details",
    ],
)
def test_run_details_of_another_shape_give_no_details_rather_than_an_error(details: object) -> None:
    """Run history's details are best effort for a completed job (its bill): a body of another shape than
    documented must not fail its wait."""
    arm = {"name": "j", "properties": {"status": "Completed"}}
    snapshot = JobSnapshot.from_rest(arm, details)  # type: ignore[arg-type]
    assert snapshot.status == "Completed" and snapshot.error_message is None and snapshot.warnings == ()
