"""Outcome classification: the one place that decides what a finished job means, on evidence only."""

from __future__ import annotations

import pytest

from airflow_azureml.emulator.models import CAPACITY_LOST_MESSAGE, PREEMPTION_ERROR_MESSAGE
from airflow_azureml.outcomes import ComputeFacts, GaugeEvidence, JobSnapshot, Outcome, classify

# The gauge as sampled while the job ran: (compute, low_priority, samples, first, peak).
ROSE_LOW_PRI = GaugeEvidence("low-pri-cluster", True, 3, 0, 2)
FLAT_AT_ONE = GaugeEvidence("low-pri-cluster", True, 4, 1, 1)  # another job's preempted node
ROSE_DEDICATED = GaugeEvidence("dedicated-pool", False, 3, 0, 2)
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
        (snap("Failed", "PreemptionError: Nodes of this job got pre-empted."), {}, Outcome.PREEMPTED),
        (snap("Failed", "UserError: ZeroDivisionError in score.py line 4"), {}, Outcome.FAILED),
        (snap("Failed"), {}, Outcome.FAILED),
        # the documented form: Canceled for lost capacity
        (snap("Canceled", warnings=(CAPACITY_LOST_MESSAGE,)), {}, Outcome.PREEMPTED),
        (snap("Canceled"), {"gauge": ROSE_LOW_PRI}, Outcome.PREEMPTED),
        (snap("Canceled"), {}, Outcome.USER_CANCELED),
        (snap("Canceled"), {"gauge": ROSE_DEDICATED}, Outcome.USER_CANCELED),
        (snap("Canceled"), {"gauge": ONE_SAMPLE}, Outcome.USER_CANCELED),
        # Azure cancels at once when the cluster lost its nodes: the read at the end bounds the run
        (snap("Canceled"), {"gauge": GaugeEvidence("low-pri-cluster", True, 1, 0, 0).ended(2)}, Outcome.PREEMPTED),
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
    assert "no lost-capacity message" in verdict.reason and "not sampled" in verdict.reason
    flat = classify(snap("Canceled"), gauge=FLAT_AT_ONE)
    assert "did not rise" in flat.reason
    assert flat.evidence["gauge"] == FLAT_AT_ONE.to_dict()
    rose = classify(snap("Canceled"), gauge=ROSE_LOW_PRI)
    assert rose.evidence["gauge_rose_while_running"] is True
    assert rose.to_dict()["outcome"] == "preempted"


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
    assert snapshot.compute == "low-pri-cluster"
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
