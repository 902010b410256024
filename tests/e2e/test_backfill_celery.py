"""Backfills on a distributed Airflow: CeleryExecutor on Redis, two Celery workers, two triggerers.

``airflow backfill create`` over a range of the example DAG's intervals, with node evictions and a
whole-cluster preemption during it, each reprocess behaviour, and a rolling restart of every worker and
triggerer plus a kill -9 of a worker in the middle of one, and a kill -9 of a worker holding tasks it
had taken but not started. What counts is read from the emulator's records and the datastore, not from
the DAG's own reports: every row scored once, no job beyond partitions plus the preempted ones'
resubmissions, none duplicated, none cancelled by a restart, and never more live Azure jobs than the
cluster holds (the capacity pool, docs/backfills.md).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import threading
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
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
    pid_owning_local_port,
    preempt_whole_cluster,
    sql,
    wait_until,
)

pytestmark = [pytest.mark.e2e, pytest.mark.distributed, pytest.mark.timeout(900)]

# 2 nodes (the cluster YAML's max_instances), 2 a job (the deployment's instance_count): one job at a time
CAPACITY_JOBS = 1
BACKFILL_CONF = {**CONF, "files_per_partition": 6}  # 3 mini-batches a job: time for a node to be evicted
WORKERS = ("worker-1", "worker-2")


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


def intervals(dates: list[str]) -> list[str]:
    return [d.replace("-", "") + "T0000" for d in dates]


def backfill(e2e: E2E, first: str, last: str, reprocess: str) -> subprocess.CompletedProcess[str]:
    """``airflow backfill create`` as docs/backfills.md shows it; its exit code is the caller's to check."""
    args = ["backfill", "create", "--dag-id", DAG_ID, "--from-date", first, "--to-date", last]
    args += ["--max-active-runs", "2", "--reprocess-behavior", reprocess, "--dag-run-conf", json.dumps(BACKFILL_CONF)]
    try:
        return e2e.airflow.airflow(*args, timeout=120)
    except subprocess.CalledProcessError as exc:
        return subprocess.CompletedProcess(exc.cmd, exc.returncode, exc.stdout, exc.stderr)


def active_backfills(e2e: E2E) -> list[dict[str, Any]]:
    found = e2e.airflow.api("GET", "/backfills", params={"dag_id": DAG_ID, "limit": 100})["backfills"]
    return [b for b in found if not b.get("completed_at")]


def wait_for_backfill(e2e: E2E, timeout: float = 600) -> None:
    """Until the DAG has no backfill still going (Airflow allows one at a time).

    On a timeout the error lists the task instances not yet done, with where and since when they are in
    their state: a stuck backfill is then diagnosed from CI's output alone."""
    try:
        wait_until(lambda: not active_backfills(e2e), timeout=timeout, what="the backfill to complete", interval=1)
    except TimeoutError as exc:
        rows = sql(
            e2e,
            "SELECT run_id, task_id, map_index, try_number, state, hostname, external_executor_id, queued_dttm,"
            " start_date, updated_at FROM task_instance WHERE dag_id = %s AND (state IS NULL OR state NOT IN"
            " ('success', 'skipped', 'failed', 'upstream_failed', 'removed')) ORDER BY run_id, task_id, map_index",
            DAG_ID,
        )
        # what Airflow did about lost tasks: heartbeat timeouts, requeues of stuck queued ones, state mismatches
        events = sql(
            e2e,
            "SELECT dttm, event, run_id, task_id, map_index, try_number FROM log WHERE dag_id = %s AND (event LIKE"
            " '%%heartbeat%%' OR event LIKE '%%stuck in queued%%' OR event LIKE '%%mismatch%%') ORDER BY dttm",
            DAG_ID,
        )
        lines = "\n".join(" ".join(str(v) for v in row) for row in rows)
        seen = "\n".join(" ".join(str(v) for v in row) for row in events)
        raise TimeoutError(
            f"{exc}; task instances not done (now {datetime.now(UTC).isoformat()}):\n{lines}\n"
            f"Airflow's log events of lost tasks:\n{seen}"
        ) from exc


@contextlib.contextmanager
def backfill_cancelled_on_failure(e2e: E2E) -> Iterator[None]:
    """A row that fails leaves no backfill running into the next row (Airflow refuses a second one)."""
    try:
        yield
    except BaseException:
        for found in active_backfills(e2e):
            with contextlib.suppress(Exception):
                e2e.airflow.api("PUT", f"/backfills/{found['id']}/cancel")
        raise


def backfill_runs(e2e: E2E, first: str, last: str) -> list[dict[str, Any]]:
    runs = e2e.airflow.api(
        "GET",
        f"/dags/{DAG_ID}/dagRuns",
        params={"logical_date_gte": f"{first}T00:00:00Z", "logical_date_lte": f"{last}T00:00:00Z", "limit": 100},
    )["dag_runs"]
    return sorted(runs, key=lambda r: r["logical_date"])


def jobs_of(e2e: E2E, keys: list[str]) -> list[Any]:
    return [j for k in keys for j in e2e.jobs_for(k)]


def peak_live_jobs(e2e: E2E, keys: list[str]) -> int:
    """The most of these intervals' jobs that Azure held at once, from creation to end (queued or running)."""
    events = []
    for job in jobs_of(e2e, keys):
        events += [(job.created.timestamp(), 1), ((job.ended or job.created).timestamp(), -1)]
    level = peak = 0
    for _, step in sorted(events):  # an end sorts before a creation at the same instant
        level += step
        peak = max(peak, level)
    return peak


def resubmissions(e2e: E2E, keys: list[str]) -> list[str]:
    """Jobs created after a job of the same unit of work (its input folder) had ended Failed or Canceled."""
    by_input: dict[str, list[Any]] = {}
    for job in jobs_of(e2e, keys):
        by_input.setdefault(str(job.input_uri), []).append(job)
    return [
        job.name
        for jobs in by_input.values()
        for job in jobs
        if any(e.status in ("Failed", "Canceled") and e.ended is not None and e.ended <= job.created for e in jobs)
    ]


def evict_a_node_of_each_job(e2e: E2E, keys: list[str], stop: threading.Event, evicted: list[str]) -> None:
    """Node evictions throughout: one node of each job of these intervals, while the job runs a mini-batch."""
    workspace = e2e.emulator.workspace

    def step() -> None:
        compute = workspace.computes.get(CLUSTER)
        for node in compute.nodes if compute is not None else []:
            job = workspace.jobs.get(node.job_name or "")
            ours = job is not None and any(f"/input/{k}/" in str(job.input_uri or "") for k in keys)
            if node.state == "running" and ours and job.name not in evicted:
                workspace.evict_nodes(CLUSTER, 1)
                evicted.append(job.name)
                return

    while not stop.is_set():
        e2e.emulator.call(step)
        stop.wait(0.05)


def test_backfill_under_evictions_scores_each_interval_once_and_reprocessing_does_what_it_says(
    celery_e2e: E2E,
) -> None:
    e2e = celery_e2e
    dates = days("2026-09-01", 4)
    keys = intervals(dates)
    forget_spot_history(e2e)
    e2e.emulator.set_behaviour(preempted_node_release_seconds=20.0)
    preempted: list[str] = []
    evicted: list[str] = []
    stop = threading.Event()
    # evictions in intervals 1, 3 and 4; the second interval's job is preempted with the whole cluster
    evictions = threading.Thread(
        target=evict_a_node_of_each_job, args=(e2e, [keys[0], *keys[2:]], stop, evicted), daemon=True
    )
    with backfill_cancelled_on_failure(e2e):
        created = backfill(e2e, dates[0], dates[-1], "none")
        assert created.returncode == 0, created.stderr[-2000:]
        evictions.start()
        try:
            # the preemption holds the cluster's running jobs until their waits have sampled it: only once the
            # second interval's job runs (holding the first interval's would keep the capacity pool's one slot)
            wait_until(
                lambda: any(j.status == "Running" for j in e2e.jobs_for(keys[1])),
                timeout=400,
                what="interval 2 running",
                interval=0.2,
            )
            lost = preempt_whole_cluster(e2e, lambda job: f"/input/{keys[1]}/" in str(job.input_uri or ""), preempted)
            wait_for_backfill(e2e)
        finally:
            stop.set()
            evictions.join(timeout=30)
    runs = backfill_runs(e2e, dates[0], dates[-1])
    assert [r["run_type"] for r in runs] == ["backfill"] * 4 and [r["state"] for r in runs] == ["success"] * 4, runs
    redone = sum(j.mini_batch_attempts - j.mini_batches_total for j in jobs_of(e2e, keys))
    results = [
        e2e.record(
            f"backfill on Celery, interval {n + 1} of 4",
            key,
            run["state"],
            f"{len(evicted)} nodes evicted in intervals 1, 3, 4 ({redone} mini-batches redone); the whole cluster "
            f"preempted once in interval 2 ({len(lost)} job ended); 2 workers, 2 triggerers",
        )
        for n, (key, run) in enumerate(zip(keys, runs, strict=True))
    ]
    # jobs = partitions + resubmissions, and the resubmissions are exactly the jobs the preemption ended
    assert lost and sorted(lost) == sorted(
        next(e.name for e in jobs_of(e2e, keys) if e.input_uri == j.input_uri and e.created < j.created)
        for j in jobs_of(e2e, keys)
        if j.name in resubmissions(e2e, keys)
    )
    for key, result in zip(keys, results, strict=True):
        assert_exactly_once(result, jobs=CONF["partitions"] + len(resubmissions(e2e, [key])))
    assert len(resubmissions(e2e, keys)) == len(lost)
    assert len(evicted) >= 3, evicted  # at least one node of a job of each evicted interval
    # capacity waits in Airflow (the pool's slot), not in Azure's queue: never more live jobs than the cluster holds
    assert peak_live_jobs(e2e, keys) <= CAPACITY_JOBS

    jobs_before = len(jobs_of(e2e, keys))
    with backfill_cancelled_on_failure(e2e):
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
    assert len(jobs_of(e2e, keys)) == jobs_before  # 0 new jobs over three reprocessings
    for key in keys:
        assert e2e.rows(key)[1:] == (0, 0)


def tasks_running_on(e2e: E2E, worker: str) -> list[tuple[str, str, int, int]]:
    """(run, task, map index, try) of the task instances whose process is below this Celery worker now."""
    try:
        main = psutil.Process(e2e.airflow.procs[worker].pid)
        below = {p.pid for p in main.children(recursive=True)}
    except psutil.NoSuchProcess:
        return []
    rows = sql(
        e2e,
        "SELECT run_id, task_id, map_index, try_number, pid FROM task_instance WHERE dag_id = %s AND state = 'running'",
        DAG_ID,
    )
    return [(r, t, int(m), int(n)) for r, t, m, n, pid in rows if pid in below]


def triggers_held(e2e: E2E) -> dict[int, int]:
    """Trigger id -> the triggerer (job id) that runs it now."""
    rows = sql(e2e, "SELECT id, triggerer_id FROM trigger WHERE triggerer_id IS NOT NULL")
    return {int(t): int(h) for t, h in rows}


def test_rolling_restart_and_a_killed_worker_mid_backfill(celery_e2e: E2E) -> None:
    e2e = celery_e2e
    dates = days("2026-09-11", 4)
    keys = intervals(dates)
    forget_spot_history(e2e)
    airflow = e2e.airflow
    stopped_mid_task: list[tuple[str, str, int, int]] = []
    moved = 0
    killed: list[str] = []
    with backfill_cancelled_on_failure(e2e):
        created = backfill(e2e, dates[0], dates[-1], "none")
        assert created.returncode == 0, created.stderr[-2000:]

        # 1. each worker in turn, SIGTERM'd while it runs a task (a rolling deploy's stop: to the main process,
        #    which finishes its running tasks first, then exits)
        for worker in WORKERS:
            running = wait_until(
                lambda worker=worker: tasks_running_on(e2e, worker), timeout=300, what=f"{worker} running a task"
            )
            airflow.terminate(worker)
            stopped_mid_task.extend(running)
            airflow.start_service(worker)

        # 2. each triggerer in turn, while a wait cannot end: the cluster's running job is held, so the one wait
        #    (the capacity pool's one slot) stays with its triggerer until that one stops, then must go on in the
        #    other. Whichever held it first, one of the two stops moves it.
        wait_until(
            lambda: any(j.status == "Running" for j in jobs_of(e2e, keys)) and triggers_held(e2e),
            timeout=300,
            what="a running job's wait held by a triggerer",
            interval=0.5,
        )
        e2e.emulator.hold_cluster(CLUSTER)
        try:
            for name in ("triggerer", "triggerer-2"):
                held = wait_until(lambda: triggers_held(e2e), timeout=180, what="the held job's wait", interval=0.5)
                alive = set(alive_triggerers(e2e))
                airflow.terminate(name)
                gone = alive - set(alive_triggerers(e2e))
                theirs = [t for t, holder in held.items() if holder in gone]

                def elsewhere(theirs: list[int] = theirs, gone: set[int] = gone) -> bool:
                    now = triggers_held(e2e)
                    return all(t in now and now[t] not in gone for t in theirs)

                wait_until(elsewhere, timeout=180, what=f"{name}'s waits going on in the other triggerer", interval=1)
                moved += len(theirs)
                airflow.start_service(name)
                wait_until(
                    lambda alive=alive: len(alive_triggerers(e2e)) >= len(alive),
                    timeout=120,
                    what=f"{name} back",
                    interval=1,
                )
        finally:
            e2e.emulator.hold_cluster(CLUSTER, held=False)

        # 3. a crash: kill -9 of the worker (and everything below it) whose task has just submitted its job
        def kill_the_submitters_worker(entry: dict[str, Any]) -> None:
            pid = pid_owning_local_port(entry["peer_port"])
            for worker in WORKERS:
                proc = airflow.procs[worker]
                with contextlib.suppress(psutil.NoSuchProcess):
                    below = {p.pid for p in psutil.Process(proc.pid).children(recursive=True)}
                    if pid in below and pid != os.getpid() and not killed:
                        killed.append(worker)
                        airflow.kill_tree(worker)

        e2e.emulator.after_response(
            lambda e: e["method"] == "POST" and e["path"].startswith("/inference/batch/") and e["status"] == 201,
            kill_the_submitters_worker,
        )
        try:
            wait_until(lambda: killed, timeout=300, what="a worker killed right after its task's submit", interval=0.5)
        finally:
            e2e.emulator.clear_faults()
        airflow.start_service(killed[0])
        wait_for_backfill(e2e)

    runs = backfill_runs(e2e, dates[0], dates[-1])
    assert [r["state"] for r in runs] == ["success"] * 4, runs
    for key, run in zip(keys, runs, strict=True):
        result = e2e.record(
            f"rolling restart mid-backfill on Celery, interval {key}",
            key,
            run["state"],
            f"SIGTERM to each of 2 workers while it ran a task ({len(stopped_mid_task)} tasks, each finished in "
            f"its try), to each triggerer in turn ({moved} held waits went on in the other), then kill -9 of "
            f"{killed[0]} right after its task submitted a job",
        )
        assert_exactly_once(result, jobs=CONF["partitions"])  # no resubmission: nothing was cancelled
        assert not [j.name for j in e2e.jobs_for(key) if j.status == "Canceled"]
    assert moved >= 1
    # every task a SIGTERM'd worker was running finished in the same try: the stop let it end, nothing retried it
    for run_id, task_id, map_index, try_number in stopped_mid_task:
        state, now = sql(
            e2e,
            "SELECT state, try_number FROM task_instance WHERE dag_id = %s AND run_id = %s AND task_id = %s"
            " AND map_index = %s",
            DAG_ID,
            run_id,
            task_id,
            map_index,
        )[0]
        assert (state, int(now)) == ("success", try_number), (run_id, task_id, map_index, state, now)


def taken_by(e2e: E2E, worker: str, run_id: str) -> dict[str, str]:
    """Celery task id -> task id of this run's queued task instances whose message the worker has taken
    (its log's ``received`` line: Airflow queues each task under a Celery id it chose first)."""
    rows = sql(
        e2e,
        "SELECT external_executor_id, task_id FROM task_instance WHERE dag_id = %s AND run_id = %s"
        " AND state = 'queued' AND external_executor_id IS NOT NULL",
        DAG_ID,
        run_id,
    )
    log = (e2e.airflow.home / f"{worker}.log").read_text(errors="replace")
    return {celery_id: task for celery_id, task in rows if f"execute_workload[{celery_id}] received" in log}


def test_a_task_a_killed_worker_took_but_never_started_is_requeued_and_runs_once(celery_e2e: E2E) -> None:
    """kill -9 of a Celery worker holding a task it has not started: the message stays unacknowledged in Redis
    for a day (``task_acks_late``), the task instance ``queued``. The scheduler's queued timeout requeues it
    (docs/backfills.md); the run then succeeds with one job per partition."""
    e2e = celery_e2e
    airflow = e2e.airflow
    dates = days("2026-10-20", 1)
    (key,) = intervals(dates)
    forget_spot_history(e2e)
    airflow.terminate("worker-2")  # worker-1 takes every task
    stuck: dict[str, str] = {}
    pool: list[psutil.Process] = []
    try:
        # Celery's prefork pool runs what the worker's main process takes: stopped, the worker takes tasks
        # and starts none, deterministically (a task that had started would be the heartbeat timeout's case)
        pool = psutil.Process(airflow.procs["worker-1"].pid).children()
        assert len(pool) >= 4, pool  # worker_concurrency's processes (and the worker's log server)
        for child in pool:
            child.suspend()
        with backfill_cancelled_on_failure(e2e):
            created = backfill(e2e, dates[0], dates[-1], "none")
            assert created.returncode == 0, created.stderr[-2000:]
            (run,) = wait_until(lambda: backfill_runs(e2e, dates[0], dates[-1]), timeout=120, what="the run")
            stuck = wait_until(
                lambda: taken_by(e2e, "worker-1", run["dag_run_id"]), timeout=180, what="a task taken", interval=0.5
            )
            airflow.kill_tree("worker-1")
            # its log is final now: every task it took, also one taken between the look above and the kill
            stuck.update(taken_by(e2e, "worker-1", run["dag_run_id"]))
            # still queued: nothing ran them, and nothing but the scheduler's timeout will
            states = sql(
                e2e,
                "SELECT state FROM task_instance WHERE external_executor_id = ANY(%s)",
                list(stuck),
            )
            assert [s for (s,) in states] == ["queued"] * len(stuck), states
            airflow.start_service("worker-1")
            airflow.start_service("worker-2")
            wait_for_backfill(e2e)
    finally:
        for child in pool:  # the worker's own pool, if the row failed before it killed them
            with contextlib.suppress(psutil.NoSuchProcess):
                child.resume()
        for name in WORKERS:
            if airflow.procs[name].poll() is not None:
                airflow.start_service(name)

    (run,) = backfill_runs(e2e, dates[0], dates[-1])
    result = e2e.record(
        "kill -9 of a Celery worker holding tasks it had not started",
        key,
        run["state"],
        f"{len(stuck)} task(s) taken from Redis and never started ({', '.join(sorted(stuck.values()))}): requeued "
        "by the scheduler's task_queued_timeout",
    )
    assert run["state"] == "success", run
    assert_exactly_once(result, jobs=CONF["partitions"])
    requeued = sql(
        e2e,
        "SELECT DISTINCT task_id FROM log WHERE dag_id = %s AND run_id = %s AND event = 'stuck in queued reschedule'",
        DAG_ID,
        run["dag_run_id"],
    )
    assert sorted(t for (t,) in requeued) == sorted(set(stuck.values())), requeued
    done = sql(
        e2e,
        "SELECT task_id, state FROM task_instance WHERE dag_id = %s AND run_id = %s AND task_id = ANY(%s)",
        DAG_ID,
        run["dag_run_id"],
        list(set(stuck.values())),
    )
    assert {state for _, state in done} == {"success"}, done
