"""Backfills on a distributed Airflow: CeleryExecutor on Redis, two Celery workers, two triggerers.

``airflow backfill create`` over a range of the example DAG's intervals, with node evictions and a
whole-cluster preemption during it, each reprocess behaviour, and a rolling restart of every worker and
triggerer plus a kill -9 of a worker in the middle of one. What counts is read from the emulator's records
and the datastore, not from the DAG's own reports: every row scored once, no job beyond partitions plus
resubmissions, none duplicated, none cancelled by a restart, and Azure's queue never longer than the
cluster's capacity plus one job (the capacity pool, docs/backfills.md).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from datetime import date, timedelta
from typing import Any

import psutil
import pytest

from tests.e2e.conftest import DAG_ID, E2E, deployment
from tests.e2e.rows import (
    CLUSTER,
    CONF,
    alive_triggerers,
    assert_exactly_once,
    forget_spot_history,
    preempt_whole_cluster,
    sql,
    wait_until,
)

pytestmark = [pytest.mark.e2e, pytest.mark.distributed, pytest.mark.timeout(900)]

# 2 nodes (the cluster YAML's max_instances), 2 a job (the deployment's instance_count): one job at a time
CAPACITY_JOBS = 1


@pytest.fixture(scope="module")
def celery_e2e(tmp_path_factory: pytest.TempPathFactory) -> Iterator[E2E]:
    # The capacity pool (docs/backfills.md): the scoring tasks wait for a slot in Airflow, not in Azure's queue.
    with deployment(
        tmp_path_factory.mktemp("e2e-celery"), celery=True, extra_env={"AZUREML_CAPACITY_POOL_CONN_ID": "airflow_api"}
    ) as running:
        yield running


def days(first: str, count: int) -> list[str]:
    start = date.fromisoformat(first)
    return [(start + timedelta(days=n)).isoformat() for n in range(count)]


def backfill(e2e: E2E, first: str, last: str, reprocess: str) -> subprocess.CompletedProcess[str]:
    """``airflow backfill create`` as docs/backfills.md shows it; its exit code is the caller's to check."""
    args = ["backfill", "create", "--dag-id", DAG_ID, "--from-date", first, "--to-date", last]
    args += ["--max-active-runs", "2", "--reprocess-behavior", reprocess, "--dag-run-conf", json.dumps(CONF)]
    try:
        return e2e.airflow.airflow(*args, timeout=120)
    except subprocess.CalledProcessError as exc:
        return subprocess.CompletedProcess(exc.cmd, exc.returncode, exc.stdout, exc.stderr)


def backfill_runs(e2e: E2E, first: str, last: str) -> list[dict[str, Any]]:
    runs = e2e.airflow.api(
        "GET",
        f"/dags/{DAG_ID}/dagRuns",
        params={"logical_date_gte": f"{first}T00:00:00Z", "logical_date_lte": f"{last}T00:00:00Z", "limit": 100},
    )["dag_runs"]
    return sorted(runs, key=lambda r: r["logical_date"])


def wait_for_backfill(e2e: E2E, timeout: float = 600) -> None:
    """Until the DAG has no backfill still going (Airflow allows one at a time)."""

    def done() -> bool:
        found = e2e.airflow.api("GET", "/backfills", params={"dag_id": DAG_ID, "limit": 100})["backfills"]
        return all(b.get("completed_at") for b in found)

    wait_until(done, timeout=timeout, what="the backfill to complete")


def intervals(dates: list[str]) -> list[str]:
    return [d.replace("-", "") + "T0000" for d in dates]


def peak_queued(e2e: E2E, keys: list[str]) -> int:
    """The most of these intervals' jobs that were ever created and not yet running at once (Azure's queue)."""
    jobs = [j for k in keys for j in e2e.jobs_for(k)]
    events = []
    for job in jobs:
        start = job.started or job.ended
        if start is not None and start > job.created:
            events += [(job.created.timestamp(), 1), (start.timestamp(), -1)]
    level = peak = 0
    for _, step in sorted(events):
        level += step
        peak = max(peak, level)
    return peak


def resubmissions(e2e: E2E, key: str) -> int:
    """Jobs that followed a job of the same unit of work that ended Failed or Canceled."""
    by_input: dict[str, list[Any]] = {}
    for job in e2e.jobs_for(key):
        by_input.setdefault(str(job.input_uri), []).append(job)
    return sum(len(jobs) - 1 for jobs in by_input.values())


def test_backfill_under_evictions_scores_each_interval_once_and_reprocessing_does_what_it_says(
    celery_e2e: E2E,
) -> None:
    e2e = celery_e2e
    dates = days("2026-09-01", 4)
    keys = intervals(dates)
    forget_spot_history(e2e)
    e2e.emulator.set_behaviour(preempted_node_release_seconds=20.0)
    preempted: list[str] = []
    created = backfill(e2e, dates[0], dates[-1], "none")
    assert created.returncode == 0, created.stderr[-2000:]
    try:
        # node evictions throughout, and one whole-cluster preemption once the second interval's jobs run
        wait_until(lambda: e2e.emulator.call(lambda: CLUSTER in e2e.emulator.workspace.computes), what="cluster")
        e2e.emulator.set_eviction_rate(CLUSTER, 0.3)
        # the preemption holds the cluster's running jobs until their waits have sampled it: only once the
        # second interval's job runs (holding the first interval's would keep the capacity pool's one slot)
        wait_until(
            lambda: any(j.status == "Running" for j in e2e.jobs_for(keys[1])), timeout=400, what="interval 2 running"
        )
        preempt_whole_cluster(e2e, lambda job: f"/input/{keys[1]}/" in str(job.input_uri or ""), preempted)
        wait_for_backfill(e2e)
    finally:
        e2e.emulator.set_eviction_rate(CLUSTER, 0.0)
    runs = backfill_runs(e2e, dates[0], dates[-1])
    assert [r["run_type"] for r in runs] == ["backfill"] * 4 and [r["state"] for r in runs] == ["success"] * 4, runs
    assert len(preempted) == 1
    results = [
        e2e.record(
            f"backfill on Celery, interval {n + 1} of 4",
            key,
            run["state"],
            "node evictions throughout; the whole cluster preempted once; 2 workers, 2 triggerers",
        )
        for n, (key, run) in enumerate(zip(keys, runs, strict=True))
    ]
    for key, result in zip(keys, results, strict=True):
        assert_exactly_once(result, jobs=CONF["partitions"] + resubmissions(e2e, key))
    assert sum(resubmissions(e2e, k) for k in keys) >= 1  # the preempted jobs were resubmitted
    assert sum(j.mini_batch_attempts - j.mini_batches_total for k in keys for j in e2e.jobs_for(k)) > 0  # evictions
    assert peak_queued(e2e, keys) <= CAPACITY_JOBS + 1

    jobs_before = sum(len(e2e.jobs_for(k)) for k in keys)
    # reprocess "none": every interval has a run, so the backfill runs none of them again
    again = backfill(e2e, dates[0], dates[-1], "none")
    assert again.returncode == 0, again.stderr[-2000:]
    wait_for_backfill(e2e)
    assert [r["end_date"] for r in backfill_runs(e2e, dates[0], dates[-1])] == [r["end_date"] for r in runs]
    # reprocess "failed": only the run marked failed runs again, and scores nothing new
    e2e.airflow.api("PATCH", f"/dags/{DAG_ID}/dagRuns/{runs[2]['dag_run_id']}", json={"state": "failed"})
    redo = backfill(e2e, dates[0], dates[-1], "failed")
    assert redo.returncode == 0, redo.stderr[-2000:]
    wait_for_backfill(e2e)
    after = backfill_runs(e2e, dates[0], dates[-1])
    assert [r["state"] for r in after] == ["success"] * 4
    assert [r["end_date"] != b["end_date"] for r, b in zip(after, runs, strict=True)] == [False, False, True, False]
    # reprocess "completed" (over the first two intervals, to keep the row short): every run again; the
    # checkpoints leave nothing to score
    every = backfill(e2e, dates[0], dates[1], "completed")
    assert every.returncode == 0, every.stderr[-2000:]
    wait_for_backfill(e2e)
    final = backfill_runs(e2e, dates[0], dates[-1])
    assert [r["state"] for r in final] == ["success"] * 4
    assert [r["end_date"] != b["end_date"] for r, b in zip(final, after, strict=True)] == [True, True, False, False]
    assert sum(len(e2e.jobs_for(k)) for k in keys) == jobs_before  # 0 new jobs over three reprocessings
    for key in keys:
        assert e2e.rows(key)[1:] == (0, 0)


def running_a_task(e2e: E2E, worker: str) -> bool:
    """The Celery worker runs a task now: below its pool's processes, a task's supervisor (a grandchild)."""
    try:
        pool = psutil.Process(e2e.airflow.procs[worker].pid).children()
        return any(child.children() for child in pool)
    except psutil.NoSuchProcess:
        return False


def triggers_held(e2e: E2E) -> dict[int, int]:
    """Trigger id -> the triggerer (job id) that runs it now."""
    rows = sql(e2e, "SELECT id, triggerer_id FROM trigger WHERE triggerer_id IS NOT NULL")
    return {int(t): int(h) for t, h in rows}


def test_rolling_restart_and_a_killed_worker_mid_backfill(celery_e2e: E2E) -> None:
    e2e = celery_e2e
    dates = days("2026-09-11", 4)
    keys = intervals(dates)
    forget_spot_history(e2e)
    created = backfill(e2e, dates[0], dates[-1], "none")
    assert created.returncode == 0, created.stderr[-2000:]
    airflow = e2e.airflow

    # each worker in turn, SIGTERM'd while it runs a task (a rolling deploy's stop: it finishes the task first)
    for worker in ("worker-1", "worker-2"):
        wait_until(lambda worker=worker: running_a_task(e2e, worker), timeout=300, what=f"{worker} running a task")
        airflow.terminate(worker)
        airflow.start_service(worker)
    # each triggerer in turn, and on until one was stopped while it held a wait: that wait must go on elsewhere
    moved, stopped = 0, []
    for name in ["triggerer", "triggerer-2"] * 3:
        if moved and len(stopped) >= 2:
            break
        held = wait_until(lambda: triggers_held(e2e), timeout=300, what="a wait held by a triggerer")
        alive = set(alive_triggerers(e2e))
        airflow.terminate(name)
        stopped.append(name)
        gone = alive - set(alive_triggerers(e2e))
        theirs = [t for t, holder in held.items() if holder in gone]

        def settled(theirs: list[int] = theirs, gone: set[int] = gone) -> tuple[dict[int, int]] | None:
            """Each of the stopped triggerer's waits either runs in another triggerer now or has ended."""
            now = triggers_held(e2e)
            pending = {t for t in theirs if t in now and now[t] in gone}
            orphaned = {t for t in theirs if t not in now} & {int(r[0]) for r in sql(e2e, "SELECT id FROM trigger")}
            return None if pending or orphaned else (now,)  # a tuple: no trigger left at all is an answer too

        (now,) = wait_until(settled, timeout=180, what="the stopped triggerer's waits going on elsewhere")
        moved += sum(1 for t in theirs if t in now)
        airflow.start_service(name)
        wait_until(lambda alive=alive: len(alive_triggerers(e2e)) >= len(alive), timeout=120, what=f"{name} back")
    # then a crash: kill -9 of a worker and its task processes while it runs a task
    wait_until(lambda: running_a_task(e2e, "worker-1"), timeout=300, what="worker-1 running a task")
    airflow.kill("worker-1")
    airflow.start_service("worker-1")
    wait_for_backfill(e2e)
    runs = backfill_runs(e2e, dates[0], dates[-1])
    assert [r["state"] for r in runs] == ["success"] * 4, runs
    assert moved >= 1 and stopped[:2] == ["triggerer", "triggerer-2"], (moved, stopped)
    for key, run in zip(keys, runs, strict=True):
        result = e2e.record(
            "rolling restart mid-backfill (Celery)",
            key,
            run["state"],
            f"SIGTERM to each of 2 workers while it ran a task, to the triggerers in turn ({moved} held waits "
            "that went on in the other), then kill -9 of a worker running a task",
        )
        assert_exactly_once(result, jobs=CONF["partitions"])  # no resubmission: nothing was cancelled
        assert not [j.name for j in e2e.jobs_for(key) if j.status == "Canceled"]
