"""The verdict ladder through the real operator, SDK and Airflow: which witness decides a cancelled job.

The emulator keeps an Activity Log of the cancels sent through ARM (with their caller, shown after an
ingestion lag), and lets a person cancel through a path it does not log (Studio's). Preemptions strike
at their least convenient: Azure cancels the job at once, or a few seconds after the loss and long
before the wait's next poll.
"""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path
from typing import Any

import pytest
import requests

from airflow_azureml.emulator import Emulator
from tests.conftest import xcom_value
from tests.helpers import evicted_nodes_released_on_resubmit
from tests.integration import test_exactly_once as exactly_once
from tests.integration.test_exactly_once import CLUSTER, person_cancels, try_numbers, when_sampled
from tests.integration.test_instance_types_k8s import arm

workspace = exactly_once.workspace  # the fixtures: a workspace with the example's data, a case of the invoke DAG
run_case = exactly_once.run_case
ACTIVITY = "/providers/Microsoft.Insights/eventtypes/management/values"


def activity_log(emulator: Emulator, filter_text: str | None = None, **params: str) -> requests.Response:
    token = emulator.call(lambda: emulator.identity.issue(emulator.client_id, f"{emulator.base_url}/.default"))
    now = dt.datetime.now(dt.timezone.utc)
    window = (
        f"eventTimestamp ge '{(now - dt.timedelta(hours=1)).strftime('%Y-%m-%dT%H:%M:%SZ')}' and "
        f"eventTimestamp le '{(now + dt.timedelta(hours=1)).strftime('%Y-%m-%dT%H:%M:%SZ')}'"
    )
    query = {"api-version": "2015-04-01", "$filter": window if filter_text is None else filter_text, **params}
    return requests.get(
        f"{emulator.base_url}/subscriptions/{emulator.subscription_id}{ACTIVITY}",
        params=query,
        headers={"Authorization": f"Bearer {token['access_token']}"},
        verify=emulator.ca_cert,
        timeout=30,
    )


def synthetic_job(emulator: Emulator, prefix: str, seconds: float = 120) -> str:
    (name,) = emulator.call(lambda: emulator.workspace.create_synthetic_jobs(prefix, [seconds], 0.0, {}))
    return name


# ------------------------------------------------------------------ the emulator's Activity Log
def test_a_cancel_through_arm_shows_in_the_activity_log_with_its_caller_after_the_lag(emulator: Emulator) -> None:
    # "Not ingested yet" holds only for a read answered within the lag of the cancel: a busy machine can take
    # longer than the lag between the two, so such a read proves nothing and the case runs again, lag doubled.
    lag, earlier = 1.5, []  # earlier: the logged jobs of cases whose read came too late (their events show)

    def this_case(value: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [e for e in value if not any(e["resourceId"].lower().endswith(f"/jobs/{j}") for j in earlier)]

    while True:
        emulator.set_behaviour(activity_log_lag_seconds=lag)
        case = len(earlier)
        logged, unlogged = synthetic_job(emulator, f"logged{case}"), synthetic_job(emulator, f"unlogged{case}")
        sent = time.monotonic()
        assert arm(emulator, "POST", f"/jobs/{logged}/cancel").status_code == 202
        emulator.cancel_unlogged(unlogged)  # Studio's path: no event
        first = activity_log(emulator)
        if time.monotonic() - sent < lag:
            break
        assert lag < 60, "never read the Activity Log within the lag of a cancel"
        earlier.append(logged)
        lag *= 2
    assert first.status_code == 200 and this_case(first.json()["value"]) == [], "not ingested yet"
    deadline = time.monotonic() + 30 + lag
    while not (events := this_case(activity_log(emulator).json()["value"])):
        assert time.monotonic() < deadline, "the event never showed"
        time.sleep(0.2)
    assert [e["status"]["value"] for e in events] in (["Accepted", "Started"], ["Started", "Accepted"])
    assert {e["caller"] for e in events} == {emulator.client_id}  # the token's object id
    assert all(e["resourceId"].lower().endswith(f"/jobs/{logged}") for e in events)
    assert {e["operationName"]["value"] for e in events} == {
        "Microsoft.MachineLearningServices/workspaces/jobs/cancel/action"
    }
    assert not any(unlogged in e["resourceId"] for e in events)
    now = dt.datetime.now(dt.timezone.utc)
    window = (
        f"eventTimestamp ge '{(now - dt.timedelta(hours=1)).isoformat()}' and "
        f"eventTimestamp le '{(now + dt.timedelta(hours=1)).isoformat()}'"
    )
    mine = activity_log(emulator, f"{window} and resourceGroupName eq '{emulator.resource_group}'").json()
    assert this_case(mine["value"]) == events
    assert activity_log(emulator, f"{window} and resourceGroupName eq 'another-rg'").json() == {"value": []}


@pytest.mark.parametrize(
    "filter_text",
    [
        "",
        "eventTimestamp ge '2026-12-01T00:00:00Z'",
        "eventTimestamp ge 'x' and eventTimestamp le 'y'",
        "eventTimestamp ge '2026-01-01T00:00:00Z' and eventTimestamp le '2026-12-01T00:00:00Z'",
        "eventTimestamp ge '2026-12-01T00:00:00Z' and eventTimestamp le '2026-12-02T00:00:00Z' and caller eq 'x'",
    ],
)
def test_the_activity_log_refuses_a_filter_azure_refuses(emulator: Emulator, filter_text: str) -> None:
    refused = activity_log(emulator, filter_text)
    assert refused.status_code == 400 and refused.json()["error"]["code"] == "BadRequest"


def test_the_activity_log_needs_read_access_and_its_own_api_version(emulator: Emulator) -> None:
    assert activity_log(emulator, **{"api-version": "2024-10-01"}).status_code == 400
    emulator.set_behaviour(activity_log_reader=False)
    forbidden = activity_log(emulator)
    assert forbidden.status_code == 403 and forbidden.json()["error"]["code"] == "AuthorizationFailed"


# ------------------------------------------------------------------ the operator's ladder
def verdict_of(run: Any) -> dict[str, Any]:
    return xcom_value(run, "invoke", key="azureml_verdict")


@pytest.mark.parametrize("deferrable", [False, True], ids=["polling", "deferred"])
def test_a_logged_persons_cancel_names_its_caller(workspace: Emulator, run_case, deferrable: bool) -> None:
    workspace.set_behaviour(activity_log_lag_seconds=0)
    with when_sampled(workspace, person_cancels, sampled=False) as cancelled:
        run, failures = run_case({"retries": 2, "deferrable": deferrable, "on_ambiguous_cancel": "resubmit"})
    assert str(run.state) == "failed" and len(cancelled) == 1 and try_numbers(run) == 1
    assert [f["type"] for f in failures] == ["AzureMLJobCanceledError"]
    verdict = verdict_of(run)
    assert verdict["witness"] == "activity_log", verdict
    assert f"canceled by {workspace.client_id}" in verdict["reason"] and "own identity" in verdict["reason"]
    assert [j.status for j in workspace.jobs()] == ["Canceled"], "a logged cancel is never resubmitted"


def unlogged_cancel(emulator: Emulator, job: str) -> None:
    emulator.cancel_unlogged(job)


def test_an_unlogged_cancel_is_ambiguous_and_fails_by_default(workspace: Emulator, run_case) -> None:
    with when_sampled(workspace, unlogged_cancel, sampled=False):
        run, failures = run_case({"retries": 2})
    assert str(run.state) == "failed" and [f["type"] for f in failures] == ["AzureMLJobCanceledError"]
    verdict = verdict_of(run)
    assert verdict["witness"] == "none" and "no witness tells it from lost capacity" in verdict["reason"]
    assert len(workspace.jobs()) == 1


@pytest.mark.parametrize("deferrable", [False, True], ids=["polling", "deferred"])
def test_on_ambiguous_cancel_resubmit_waits_for_late_evidence_then_runs_the_work_again(
    workspace: Emulator,
    run_case,
    deferrable: bool,
) -> None:
    case = {"deferrable": deferrable, "on_ambiguous_cancel": "resubmit", "evidence_wait": 2}
    with when_sampled(workspace, unlogged_cancel, sampled=False):
        run, failures = run_case(case)
    assert str(run.state) == "success", failures
    result = xcom_value(run, "invoke")
    assert [j.status for j in workspace.jobs()] == ["Canceled", "Completed"] and result["preemptions"] == 1


def test_a_logged_cancel_that_shows_during_the_wait_is_final(workspace: Emulator, run_case) -> None:
    workspace.set_behaviour(activity_log_lag_seconds=2)  # not there when the job is first seen cancelled
    with when_sampled(workspace, person_cancels, sampled=False):
        run, failures = run_case({"on_ambiguous_cancel": "resubmit", "evidence_wait": 8})
    assert str(run.state) == "failed" and [f["type"] for f in failures] == ["AzureMLJobCanceledError"]
    assert verdict_of(run)["witness"] == "activity_log"
    assert len(workspace.jobs()) == 1, "the person's cancel was found after the wait: nothing resubmitted"


def preempt_now(emulator: Emulator, _job: str) -> None:
    emulator.preempt_cluster(CLUSTER, form="canceled")


@pytest.mark.parametrize("deferrable", [False, True], ids=["polling", "deferred"])
def test_a_preemption_azure_cancels_at_once_is_seen_just_after_the_end(
    workspace: Emulator,
    run_case,
    deferrable: bool,
) -> None:
    """Azure cancels the job the moment its nodes go, before any read; the nodes stay preempted a while.
    The read just after the end sees the whole cluster preempted; the Activity Log, read again after the
    wait, shows no person's cancel: resubmitted. (Before the ladder: a person's cancel, the DAG red.)"""
    workspace.set_behaviour(capacity_cancel_after_seconds=0, preempted_node_release_seconds=30)
    case = {"deferrable": deferrable, "evidence_wait": 1, "polling": {"interval": 0.5, "max_interval": 0.5}}
    with (
        evicted_nodes_released_on_resubmit(workspace, CLUSTER),
        when_sampled(workspace, preempt_now, sampled=False) as preempted,
    ):
        run, failures = run_case(case)
    assert str(run.state) == "success", failures
    assert len(preempted) == 1 and xcom_value(run, "invoke")["preemptions"] == 1
    assert [j.status for j in workspace.jobs()] == ["Canceled", "Completed"]


@pytest.mark.parametrize("deferrable", [False, True], ids=["polling", "deferred"])
def test_a_preemption_that_ends_the_job_before_its_wait_begins_is_read_at_the_end(
    workspace: Emulator,
    run_case,
    deferrable: bool,
) -> None:
    """The invoke's answer arrives only after Azure has cancelled the preempted job, so the look that comes
    before deferring (or the sync wait's first poll) already finds it Canceled: the read of the cluster just
    after the end must still be taken. (Seen failing first, deferred: the look returned with no read and the
    preemption was judged a person's cancel; a loaded machine made the same happen by chance.)"""
    workspace.set_behaviour(capacity_cancel_after_seconds=0, preempted_node_release_seconds=30)
    workspace.add_fault(kind="latency", seconds=4, when="after", route="invoke")  # the job runs meanwhile
    stamps: list[float] = []

    def preempt_and_stamp(emulator: Emulator, job: str) -> None:
        preempt_now(emulator, job)
        stamps.append(time.time())

    case = {"deferrable": deferrable, "evidence_wait": 1, "polling": {"interval": 0.5, "max_interval": 0.5}}
    with (
        evicted_nodes_released_on_resubmit(workspace, CLUSTER),
        when_sampled(workspace, preempt_and_stamp, sampled=False) as preempted,
    ):
        run, failures = run_case(case)
    (invoke,) = [e for e in workspace.requests() if e["method"] == "POST" and e.get("fault", "").startswith("latency")]
    answered = invoke["t"] + invoke["ms"] / 1000
    # the condition this test is about; a machine too slow to run the job within the latency proves nothing
    assert stamps and stamps[0] < answered, "the job was not yet cancelled when the invoke answered"
    assert str(run.state) == "success", failures
    assert len(preempted) == 1 and xcom_value(run, "invoke")["preemptions"] == 1
    assert [j.status for j in workspace.jobs()] == ["Canceled", "Completed"]


def test_a_retry_whose_trigger_event_was_lost_reads_the_cluster_just_after_the_end(
    workspace: Emulator, run_case, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Azure cancels the preempted job at once; the trigger sees the end and fires, but Airflow fails that try
    instead of resuming it (its executor's late report of the deferral: apache/airflow#67287, #72716; seen in
    the e2e deployment), so the event, and the gauge evidence in it, is lost. The retry starts in ``execute``
    moments after the end: it reads the cluster as the wait would have. (Seen failing first: the retry judged
    the job with no evidence, a person's cancel, and the DAG went red.) Before Airflow 3.3 (no
    ``task_state_store``) no try knows the jobs of an earlier one: the retry takes the cancelled job for
    another run's and runs the work again (``lifecycle.after_cancel``), so the lost event costs nothing there."""
    from airflow_azureml import compat

    lost = tmp_path / "lost-events"
    monkeypatch.setenv("AZUREML_TEST_LOST_EVENTS", str(lost))
    workspace.set_behaviour(capacity_cancel_after_seconds=0, preempted_node_release_seconds=30)
    case = {
        "deferrable": True,
        "retries": 1,
        "lose_first_event": True,
        "evidence_wait": 1,
        # the retry's read must come within one evidence interval of the end, however loaded the machine
        "polling": {"interval": 0.5, "max_interval": 0.5, "evidence_interval": 60},
    }
    # once the trigger has read the cluster while the job ran: the first try has deferred on this job
    with evicted_nodes_released_on_resubmit(workspace, CLUSTER), when_sampled(workspace, preempt_now) as preempted:
        run, failures = run_case(case)
    first = sorted(workspace.jobs(), key=lambda j: j.created)[0].name
    assert lost.read_text().split() == [first], "the first try's lost event was not the preempted job's"
    assert try_numbers(run) == 2
    if not compat.has_task_state_store():
        assert str(run.state) == "success", failures
        assert [j.status for j in workspace.jobs()] == ["Canceled", "Completed"]
        return
    assert str(run.state) == "success", failures
    assert len(preempted) == 1 and xcom_value(run, "invoke")["preemptions"] == 1
    assert [j.status for j in workspace.jobs()] == ["Canceled", "Completed"]


@pytest.mark.parametrize("deferrable", [False, True], ids=["polling", "deferred"])
def test_a_preemption_between_two_polls_is_seen_at_the_evidence_cadence(
    workspace: Emulator,
    run_case,
    deferrable: bool,
) -> None:
    """The loss comes seconds after a poll that saw the job Running and Azure cancels 4 s later, long before
    the next poll (12 s): only the reads between polls can see it. (Before: no read while it ran.)"""
    workspace.set_behaviour(capacity_cancel_after_seconds=4, preempted_node_release_seconds=8)
    polling = {"interval": 12, "max_interval": 12, "jitter": 0, "evidence_interval": 1}
    with when_sampled(workspace, preempt_now) as preempted:
        run, failures = run_case({"deferrable": deferrable, "polling": polling})
    assert str(run.state) == "success", failures
    assert len(preempted) == 1 and xcom_value(run, "invoke")["preemptions"] == 1
    assert [j.status for j in workspace.jobs()] == ["Canceled", "Completed"]
