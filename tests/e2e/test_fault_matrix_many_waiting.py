"""The fault matrix on a real Airflow deployment, part 4: 20 tasks wait in the triggerer through a
`kill -9` of it, a 403 on one job, and a 2-minute token outage.

Each test runs the example DAG for its own data interval, so results are independent; the last test
checks that nothing this deployment wrote holds secret material. A file of its own, so that another
pytest-xdist worker runs it on a deployment of its own (docs/benchmarks.md, "Test suite").
"""

from __future__ import annotations

import threading
import time

import pytest

from airflow_azureml.naming import UNIT_TAG
from tests.e2e.conftest import E2E
from tests.e2e.rows import (
    CLUSTER,
    MANY,
    assert_exactly_once,
    assert_no_secret_material,
    cluster_exists,
    faults_served,
    held_queued,
    partition_jobs,
    run_example,
    scoring_tasks,
    wait_until,
)

# A row waits on conditions, never on luck; on a loaded 2-core machine a row may take minutes.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]


def test_kill9_triggerer_while_20_jobs_wait(e2e: E2E) -> None:
    restarted: list[int] = []

    def fault(run_id: str, interval: str) -> None:
        wait_until(lambda: cluster_exists(e2e), what="cluster")
        e2e.emulator.set_capacity(CLUSTER, 0)  # keep all 20 jobs waiting
        wait_until(lambda: len(e2e.jobs_for(interval)) >= 20, timeout=240, what="20 jobs")
        time.sleep(3)  # let every task defer
        e2e.airflow.kill("triggerer")
        e2e.emulator.set_capacity(CLUSTER, None)
        time.sleep(3)
        e2e.airflow.start_service("triggerer")
        restarted.append(1)

    _, interval, state = run_example(e2e, "2026-11-03T00:00:00+00:00", {"partitions": 20}, fault, timeout=600)
    result = e2e.record(
        "`kill -9` of the triggerer while 20 jobs wait, then a restart",
        interval,
        state,
        "waits resumed in the new triggerer; no job cancelled or resubmitted",
    )
    assert restarted and state == "success"
    assert_exactly_once(result, jobs=20)
    assert not any(j.cancel_requested for j in e2e.jobs_for(interval))


@pytest.mark.timeout(900)
def test_403_on_one_job_among_20_waiting(e2e: E2E) -> None:
    denied: list[str] = []
    before = len(e2e.emulator.requests())

    def fault(run_id: str, interval: str) -> None:
        try:
            held_queued(e2e, run_id, interval, MANY["partitions"])
            # 250 newer finished jobs of the provider's: the waited ones fall past the LIST's page cap,
            # so the poller reads each by GET (issue 9's "read whatever remains by GET")
            history = e2e.emulator.call(
                lambda: e2e.emulator.workspace.create_synthetic_jobs(f"history-{interval}", [0.01] * 250)
            )

            def mark() -> None:
                for name in history:
                    e2e.emulator.workspace.jobs[name].properties.setdefault("properties", {})[UNIT_TAG] = "history"

            e2e.emulator.call(mark)
            victim = partition_jobs(e2e, interval, 0)[0].name
            # RBAC denies reading this one job (ARM and run history); the others are readable
            e2e.emulator.add_fault(
                kind="status", status=403, path=f"/(jobs|runs)/{victim}(/details)?$", methods=["GET"], count=None
            )
            denied.append(victim)
        finally:
            e2e.emulator.set_capacity(CLUSTER, None)

    run_id, interval, state = run_example(e2e, "2026-11-16T00:00:00+00:00", MANY, fault, timeout=600)
    states = sorted(t["state"] for t in scoring_tasks(e2e, run_id).values())
    served = faults_served(e2e, before, denied[0]) if denied else 0
    result = e2e.record(
        "a 403 on one job among 20 waiting",
        interval,
        state,
        f"only that wait failed ({served} 403s served); the other 19 completed",
    )
    assert denied and served > 0, "the 403 was never served: no wait read that job"
    assert states == ["failed"] + ["success"] * 19, states
    assert result.duplicate_jobs == 0 and result.jobs_submitted == 20, result


@pytest.mark.timeout(900)
def test_token_endpoint_down_for_2_minutes_while_20_jobs_wait(e2e: E2E) -> None:
    before = len(e2e.emulator.requests())
    outage: list[float] = []
    ended = threading.Event()  # the run ended: end the outage too, never in a later row

    def fault(run_id: str, interval: str) -> None:
        try:
            held_queued(e2e, run_id, interval, MANY["partitions"])
            e2e.emulator.add_fault(kind="status", status=503, route="token", count=None)
            e2e.emulator.expire_tokens()  # every client needs a new token during the outage
            outage.append(time.monotonic())
        finally:
            e2e.emulator.set_capacity(CLUSTER, None)
        if not ended.wait(120):
            outage.append(time.monotonic())
        e2e.emulator.clear_faults()

    try:
        _, interval, state = run_example(e2e, "2026-11-17T00:00:00+00:00", MANY, fault, timeout=900)
    finally:
        ended.set()
    served = faults_served(e2e, before, "/oauth2/")
    result = e2e.record(
        "the token endpoint down for 2 minutes while 20 jobs wait (all tokens expired)",
        interval,
        state,
        f"{served} token requests failed with 503; the waits kept going and all completed",
    )
    assert outage, "the fault never started"
    assert served > 0, "no token request failed: the emulator does not take its token endpoint down"
    assert len(outage) == 2, "the run ended during the token outage, without new tokens"
    assert state == "success"
    assert_exactly_once(result, jobs=20)


def test_no_secret_or_token_in_logs_xcom_or_trigger_rows(e2e: E2E) -> None:
    assert_no_secret_material(e2e)
