"""Outcome classification: the one place that decides what a finished job means."""

from __future__ import annotations

import pytest

from airflow_azureml.emulator.models import CAPACITY_LOST_MESSAGE, PREEMPTION_ERROR_MESSAGE
from airflow_azureml.outcomes import ComputeFacts, JobSnapshot, Outcome, classify

LOW_PRI_LOST_NODES = ComputeFacts(low_priority=True, preempted_node_count=3)
LOW_PRI_NO_LOSS = ComputeFacts(low_priority=True, preempted_node_count=0)
DEDICATED_LOST = ComputeFacts(low_priority=False, preempted_node_count=3)


def snap(status: str, error: str | None = None, warnings: tuple[str, ...] = (), cancel_requested: bool = False):
    return JobSnapshot(
        name="j", status=status, error_message=error, warnings=warnings, cancel_requested=cancel_requested
    )


@pytest.mark.parametrize(
    ("job", "kwargs", "expected"),
    [
        (snap("Running"), {}, Outcome.RUNNING),
        (snap("Queued"), {}, Outcome.RUNNING),
        (snap("CancelRequested"), {}, Outcome.RUNNING),
        (snap("Completed"), {}, Outcome.SUCCEEDED),
        # the field form users report: Failed with PreemptionError
        (snap("Failed", PREEMPTION_ERROR_MESSAGE), {}, Outcome.PREEMPTED),
        (snap("Failed", "PreemptionError: Nodes of this job got pre-empted."), {}, Outcome.PREEMPTED),
        (snap("Failed", "UserError: ZeroDivisionError in score.py line 4"), {}, Outcome.FAILED),
        (snap("Failed"), {}, Outcome.FAILED),
        # the documented form: Canceled for lost capacity
        (snap("Canceled", warnings=(CAPACITY_LOST_MESSAGE,)), {}, Outcome.PREEMPTED),
        (snap("Canceled"), {"compute": LOW_PRI_LOST_NODES, "preempted_baseline": 1}, Outcome.PREEMPTED),
        (snap("Canceled"), {"compute": LOW_PRI_LOST_NODES, "preempted_baseline": 3}, Outcome.USER_CANCELED),
        (snap("Canceled"), {"compute": LOW_PRI_NO_LOSS}, Outcome.USER_CANCELED),
        (snap("Canceled"), {"compute": DEDICATED_LOST, "preempted_baseline": 0}, Outcome.USER_CANCELED),
        (snap("Canceled", warnings=("Job was canceled by request.",)), {}, Outcome.USER_CANCELED),
        # a person's cancel on a cluster that also lost nodes is still a person's cancel
        (snap("Canceled", cancel_requested=True), {"compute": LOW_PRI_LOST_NODES}, Outcome.USER_CANCELED),
        # Airflow's own cancel (on_kill) is never a preemption, whatever the evidence
        (snap("Canceled", warnings=(CAPACITY_LOST_MESSAGE,)), {"canceled_by_airflow": True}, Outcome.USER_CANCELED),
        (snap("NotResponding"), {}, Outcome.FAILED),
    ],
)
def test_classify(job: JobSnapshot, kwargs: dict, expected: Outcome) -> None:
    assert classify(job, **kwargs).outcome is expected


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
            "properties": {"azureml.batch.outputUri": "azureml://datastores/d/paths/o/"},
        },
    }
    details = {"warnings": [{"source": "capacity", "message": CAPACITY_LOST_MESSAGE}], "error": None}
    snapshot = JobSnapshot.from_rest(arm, details)
    assert snapshot.compute == "low-pri-cluster"
    assert snapshot.output_uri == "azureml://datastores/d/paths/o/"
    assert JobSnapshot.from_dict(snapshot.to_dict()) == snapshot
    facts = ComputeFacts.from_rest(
        {"properties": {"properties": {"vmPriority": "LowPriority", "nodeStateCounts": {"preemptedNodeCount": 2}}}}
    )
    assert facts == ComputeFacts(low_priority=True, preempted_node_count=2)
