"""The fault matrix on a real Airflow deployment: after each fault, no duplicate job and no lost row.

Each test runs the example DAG for its own data interval, so results are independent.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable
from typing import Any

import psutil
import pytest

from tests.e2e.conftest import DAG_ID, E2E

pytestmark = pytest.mark.e2e
CONF = {"partitions": 2, "files_per_partition": 3, "rows_per_file": 10}
CLUSTER = "low-pri-cluster"


def in_background(action: Callable[[], Any]) -> threading.Thread:
    thread = threading.Thread(target=action, daemon=True)
    thread.start()
    return thread


def wait_until(condition: Callable[[], Any], timeout: float = 180, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(0.05)
    raise TimeoutError(f"timed out waiting for {what}")


def cluster_exists(e2e: E2E) -> bool:
    return bool(e2e.emulator.call(lambda: CLUSTER in e2e.emulator.workspace.computes))


def running_jobs(e2e: E2E, interval: str) -> list[Any]:
    return [j for j in e2e.jobs_for(interval) if j.status == "Running"]


def run_example(
    e2e: E2E,
    logical_date: str,
    conf: dict[str, Any] | None = None,
    during: Callable[[str, str], Any] | None = None,
    timeout: float = 400,
) -> tuple[str, str, str]:
    interval = e2e.interval_key(logical_date)
    run_id = e2e.airflow.trigger(DAG_ID, logical_date, {**CONF, **(conf or {})})
    watcher = in_background(lambda: during(run_id, interval)) if during else None
    state = e2e.airflow.wait_for_run(DAG_ID, run_id, timeout)
    if watcher:
        watcher.join(timeout=30)
    e2e.emulator.clear_faults()
    return run_id, interval, state


def assert_exactly_once(result: Any, jobs: int | None = None) -> None:
    assert result.duplicate_jobs == 0, result
    assert result.rows_lost == 0 and result.rows_duplicated == 0 and result.rows_in > 0, result
    if jobs is not None:
        assert result.jobs_submitted == jobs, result


def deferred_scoring_task(e2e: E2E, run_id: str) -> dict[str, Any] | None:
    return next(
        (
            t
            for t in e2e.airflow.task_instances(DAG_ID, run_id)
            if t["task_id"] == "score_partition" and t["state"] == "deferred"
        ),
        None,
    )


def trigger_polled(e2e: E2E, interval: str, partition: int) -> bool:
    """Has the triggerer polled this partition's job (asyncio client), i.e. is its trigger running?"""
    names = {
        j.name
        for j in e2e.jobs_for(interval)
        if f"/part-{partition:03d}/" in str(j.input_uri or "")
    }
    return any(r["ua"].endswith("(asyncio)") and r["path"].rsplit("/", 1)[-1] in names for r in e2e.emulator.requests())


def pid_owning_local_port(port: int) -> int | None:
    for conn in psutil.net_connections(kind="tcp"):
        if conn.laddr and conn.laddr.port == port and conn.pid:
            return int(conn.pid)
    return None


def test_kill9_task_right_after_invoke_post(e2e: E2E) -> None:
    killed: list[str] = []
    seen: list[str] = []

    def kill_submitter(entry: dict[str, Any]) -> None:
        try:
            pid = pid_owning_local_port(entry["peer_port"])
            seen.append(f"port {entry['peer_port']} -> pid {pid}")
            if pid and pid != os.getpid() and not killed:
                killed.append(" ".join(psutil.Process(pid).cmdline())[:80])
                os.kill(pid, signal.SIGKILL)
        except Exception as exc:  # surfaced by the assertion below
            seen.append(repr(exc))

    e2e.emulator.after_response(
        lambda e: e["method"] == "POST" and e["path"].startswith("/inference/batch/") and e["status"] == 200,
        kill_submitter,
    )
    _, interval, state = run_example(e2e, "2026-11-02T00:00:00+00:00")
    result = e2e.record(
        "`kill -9` of the task process right after the invoke POST returned",
        interval,
        state,
        "the retry found the job by its deterministic name and re-attached",
    )
    assert killed, f"the fault never fired: {seen}"
    assert state == "success"
    assert_exactly_once(result, jobs=2)


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


def test_task_marked_failed_while_deferred_cancels_the_job(e2e: E2E) -> None:
    marked: list[str] = []

    def fault(run_id: str, interval: str) -> None:
        wait_until(lambda: cluster_exists(e2e), what="cluster")
        e2e.emulator.set_capacity(CLUSTER, 0)
        try:
            ti = wait_until(lambda: deferred_scoring_task(e2e, run_id), what="a deferred scoring task")
            # Airflow runs on_kill only for a trigger the triggerer has started: wait until it polls.
            wait_until(lambda: trigger_polled(e2e, interval, ti["map_index"]), what="the trigger polling its job")
            e2e.airflow.set_task_state(DAG_ID, run_id, "score_partition", ti["map_index"], "failed")
            marked.append(str(ti["map_index"]))
            wait_until(lambda: any(j.cancel_requested for j in e2e.jobs_for(interval)), timeout=60, what="cancel")
        finally:
            e2e.emulator.set_capacity(CLUSTER, None)  # never leave the run hanging, whatever happened

    run_id, interval, state = run_example(e2e, "2026-11-04T00:00:00+00:00", during=fault)
    cancelled = [j for j in e2e.jobs_for(interval) if j.cancel_requested]
    assert marked and state == "failed"
    assert len(cancelled) == 1 and cancelled[0].status == "Canceled"
    # nothing is lost: clearing the run scores the cancelled partition with a new job, and only that one
    e2e.airflow.clear_run(DAG_ID, run_id)
    state = e2e.airflow.wait_for_run(DAG_ID, run_id, 300)
    result = e2e.record(
        "a deferred task marked failed by a person",
        interval,
        state,
        "trigger on_kill cancelled its job; after a clear only that partition ran again",
    )
    assert state == "success"
    assert_exactly_once(result, jobs=3)


def test_clear_after_success_submits_nothing(e2e: E2E) -> None:
    run_id, interval, state = run_example(e2e, "2026-11-05T00:00:00+00:00")
    assert state == "success"
    before = len(e2e.jobs_for(interval))
    e2e.airflow.clear_run(DAG_ID, run_id)
    time.sleep(2)
    state = e2e.airflow.wait_for_run(DAG_ID, run_id, 300)
    result = e2e.record(
        "the whole run cleared after success", interval, state, "every partition was a finished checkpoint: no new job"
    )
    assert state == "success"
    assert_exactly_once(result, jobs=before)


def test_whole_cluster_preempted_twice(e2e: E2E) -> None:
    preempted: list[str] = []

    def fault(run_id: str, interval: str) -> None:
        for _ in range(2):
            job = wait_until(
                lambda: next((j for j in running_jobs(e2e, interval) if j.name not in preempted), None),
                what="a running job",
            )
            preempted.append(job.name)
            e2e.emulator.preempt_cluster(CLUSTER, "canceled")

    _, interval, state = run_example(e2e, "2026-11-06T00:00:00+00:00", during=fault)
    ended = [j for j in e2e.jobs_for(interval) if j.status == "Canceled"]  # every job running on the cluster
    result = e2e.record(
        "whole-cluster preemption twice in a row",
        interval,
        state,
        f"{len(ended)} jobs ended by the 2 preemptions, each resubmitted once",
    )
    assert len(preempted) == 2 and state == "success" and len(ended) >= 2
    assert_exactly_once(result, jobs=2 + len(ended))


def test_node_evictions_during_a_run(e2e: E2E) -> None:
    def fault(run_id: str, interval: str) -> None:
        wait_until(lambda: cluster_exists(e2e), what="cluster")
        e2e.emulator.set_eviction_rate(CLUSTER, 0.8)

    _, interval, state = run_example(e2e, "2026-11-07T00:00:00+00:00", {"files_per_partition": 8}, fault)
    jobs = e2e.jobs_for(interval)
    redone = sum(j.mini_batch_attempts - j.mini_batches_total for j in jobs)
    result = e2e.record(
        "random node evictions during a run",
        interval,
        state,
        f"{redone} mini-batch(es) redone on other nodes; jobs still completed",
    )
    assert state == "success"
    assert_exactly_once(result, jobs=2)


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

    run_id, interval, state = run_example(
        e2e, "2026-11-12T00:00:00+00:00", {"max_queue_seconds": 6}, fault, timeout=500
    )
    jobs = e2e.jobs_for(interval)
    assert state == "failed"
    assert len(jobs) == 2, "retries must re-attach to the queued job, not submit another"
    assert all(j.status == "Canceled" and j.started is None for j in jobs), "cancelled on the last try, never ran"
    # capacity is back (the cluster is recreated by the next setup): clearing the run loses nothing
    e2e.airflow.clear_run(DAG_ID, run_id)
    state = e2e.airflow.wait_for_run(DAG_ID, run_id, 300)
    result = e2e.record(
        "no capacity beyond `max_queue_time`",
        interval,
        state,
        "failed with AzureMLJobQueueTimeoutError after its retries (queued jobs cancelled, never "
        "ran); a clear later scored everything",
    )
    assert state == "success"
    assert_exactly_once(result, jobs=4)


def test_no_secret_or_token_in_logs_xcom_or_trigger_rows(e2e: E2E) -> None:
    import psycopg2

    secret = e2e.emulator.client_secret
    tokens = list(e2e.emulator.call(lambda: list(e2e.emulator.identity.issued)))
    assert tokens, "the suite issued tokens"
    needles = [secret, *tokens, *(t.split(".")[1] for t in tokens)]
    files = [p for p in e2e.airflow.home.rglob("*") if p.is_file() and p.suffix in (".log", ".json", "")]
    files = [p for p in files if p.name != "airflow.cfg" and "dags" not in p.parts]
    scanned = 0
    for path in files:
        text = path.read_text(errors="replace")
        scanned += 1
        for needle in needles:
            assert needle not in text, f"secret material in {path}"
    conn = psycopg2.connect(host="127.0.0.1", port=e2e.postgres.port, user="airflow", dbname="airflow")
    try:
        with conn.cursor() as cur:
            cur.execute("SELECT value::text FROM xcom")
            xcoms = [row[0] or "" for row in cur.fetchall()]
            cur.execute("SELECT kwargs::text FROM trigger")
            triggers = [row[0] or "" for row in cur.fetchall()]
            cur.execute(
                "SELECT count(*) FROM task_instance WHERE task_id = 'score_partition' AND next_method IS NOT NULL"
            )
    finally:
        conn.close()
    assert xcoms and scanned > 5
    for text in xcoms + triggers:
        for needle in needles:
            assert needle not in text
