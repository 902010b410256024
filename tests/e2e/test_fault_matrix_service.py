"""The fault matrix on a real Airflow deployment, part 2: the service misbehaves (expired tokens, no
capacity, a job that stops answering, 429 storms, 5xx, dropped connections).

Each test runs the example DAG for its own data interval, so results are independent; the last test
checks that nothing this deployment wrote holds secret material. A file of its own, so that another
pytest-xdist worker runs it on a deployment of its own (docs/benchmarks.md, "Test suite").
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.e2e.conftest import E2E
from tests.e2e.rows import (
    CLUSTER,
    CONF,
    assert_exactly_once,
    assert_no_secret_material,
    cluster_exists,
    run_example,
    running_jobs,
    wait_until,
)

# A row waits on conditions, never on luck; on a loaded 2-core machine a row may take minutes.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]


def test_expired_token(e2e: E2E) -> None:
    expired: list[int] = []

    def fault(run_id: str, interval: str) -> None:
        wait_until(lambda: running_jobs(e2e, interval), what="a running job")
        expired.append(e2e.emulator.expire_tokens())

    _, interval, state = run_example(e2e, "2026-11-11T00:00:00+00:00", during=fault)
    result = e2e.record(
        "every issued token expired mid-run",
        interval,
        state,
        f"{expired[0] if expired else 0} tokens revoked; clients fetched new ones (REST: on 401)",
    )
    assert expired and state == "success"
    assert_exactly_once(result, jobs=2)


def test_no_capacity_beyond_max_queue_time(e2e: E2E) -> None:
    def fault(run_id: str, interval: str) -> None:
        wait_until(lambda: cluster_exists(e2e), what="cluster")
        e2e.emulator.set_capacity(CLUSTER, 0)

    try:
        _, interval, state = run_example(e2e, "2026-11-12T00:00:00+00:00", {"max_queue_seconds": 6}, fault, timeout=500)
    finally:
        e2e.emulator.set_capacity(CLUSTER, None)  # the example DAG keeps its cluster: lift the fault here
    jobs = e2e.jobs_for(interval)
    spot = [j for j in jobs if j.compute == CLUSTER]
    fallback = [j for j in jobs if j.compute != CLUSTER]
    result = e2e.record(
        "no spot capacity beyond `max_queue_time`",
        interval,
        state,
        "each queued spot job cancelled (never ran) and its work moved to the fallback deployment on "
        "dedicated compute; no failure",
    )
    assert state == "success"
    assert spot and all(j.status == "Canceled" and j.started is None for j in spot), "cancelled, never ran"
    assert len(fallback) == len(spot) and all(j.status == "Completed" for j in fallback)
    assert_exactly_once(result, jobs=2 * len(spot))


@pytest.mark.timeout(600)
def test_job_not_responding_then_resuming(e2e: E2E) -> None:
    stalled: list[str] = []

    def fault(run_id: str, interval: str) -> None:
        def stall_a_running_job() -> Any:  # found and stalled in one step on the emulator's loop: a job of about
            # 1 s could otherwise end between the two on a loaded machine (stall_job refuses an ended job)
            for job in e2e.emulator.workspace.jobs.values():
                if job.status == "Running" and e2e.is_for(job, interval):
                    return e2e.emulator.workspace.stall_job(job.name, 8)
            return None

        job = wait_until(lambda: e2e.emulator.call(stall_a_running_job), what="a running job")
        stalled.append(job.name)

    _, interval, state = run_example(e2e, "2026-11-21T00:00:00+00:00", during=fault)
    job = e2e.emulator.job(stalled[0]) if stalled else None
    result = e2e.record(
        "a job goes `NotResponding` for 8 s, then resumes",
        interval,
        state,
        "the wait kept waiting; no second job started while the first might still write",
    )
    assert job is not None and job.status == "Completed", job
    assert state == "success"
    assert_exactly_once(result, jobs=CONF["partitions"])


@pytest.mark.parametrize(
    ("fault", "rules", "note"),
    [
        (
            "429 storms",
            [
                {
                    "kind": "status",
                    "status": 429,
                    "retry_after": 1,
                    "probability": 0.25,
                    "count": 40,
                    "path": "/workspaces/",
                }
            ],
            "Retry-After honoured by the SDK and by our pollers",
        ),
        (
            "5xx",
            [
                {"kind": "status", "status": 503, "probability": 0.25, "count": 20, "path": "/workspaces/"},
                {"kind": "status", "status": 500, "probability": 0.25, "count": 20, "path": "/workspaces/"},
            ],
            "retried; never counted as a poll",
        ),
        (
            "dropped connections",
            [{"kind": "drop", "probability": 0.3, "count": 25, "path": "/workspaces/"}],
            "connection errors retried",
        ),
    ],
)
def test_http_faults(e2e: E2E, fault: str, rules: list[dict[str, Any]], note: str) -> None:
    dates = {"429 storms": "2026-11-08", "5xx": "2026-11-09", "dropped connections": "2026-11-10"}

    def inject(run_id: str, interval: str) -> None:
        for rule in rules:
            e2e.emulator.add_fault(**rule)

    before = len(e2e.emulator.requests())
    _, interval, state = run_example(e2e, f"{dates[fault]}T00:00:00+00:00", during=inject)
    hits = sum(1 for r in e2e.emulator.requests()[before:] if r.get("fault"))
    result = e2e.record(fault, interval, state, f"{note}; {hits} faults injected")
    assert state == "success"
    assert_exactly_once(result, jobs=2)


def test_no_secret_or_token_in_logs_xcom_or_trigger_rows(e2e: E2E) -> None:
    assert_no_secret_material(e2e)
