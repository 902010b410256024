"""What the fault-matrix rows share: running the example DAG for a row's interval, waiting on conditions,
and the checks every row makes (no duplicate job, no lost or duplicated row, no secret left behind).

The matrix is split over four files so that pytest-xdist (``--dist loadfile``) runs them side by side,
each file on its own worker with its own deployment (the module fixture ``e2e``, stopped after the file):
every row injects its fault into its deployment's one emulator, so rows of one file run one after another.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import psutil

from airflow_azureml.polling import PollingPolicy
from tests import helpers
from tests.e2e.conftest import DAG_ID, E2E

CONF = {"partitions": 2, "files_per_partition": 3, "rows_per_file": 10}
CLUSTER = "low-pri-cluster"


def in_background(action: Callable[[], Any]) -> threading.Thread:
    thread = threading.Thread(target=action, daemon=True)
    thread.start()
    return thread


# Set once a row's run has ended: a fault thread still waiting gives up (and undoes its holds) then,
# instead of reaching into the next row on the session's one emulator.
ROW_OVER = threading.Event()


# A paced wait (``paced=True``) pauses LOOK_COST_FACTOR times what its last look took, up to a second: a round
# trip to another process (Airflow's REST API, its DB) then costs at most a tenth of the wait. Such waits looked
# every 50 ms and kept the API server, PostgreSQL and the pytest worker busy on the 2 cores the deployments under
# test need. Looks at the emulator's memory stay unpaced: on a loaded machine they can take tens of milliseconds
# too, and a job can be Running for about a second.
LOOK_COST_FACTOR = 10


def wait_until(
    condition: Callable[[], Any],
    timeout: float = 180,
    what: str = "condition",
    interval: float = 0.05,
    *,
    paced: bool = False,
) -> Any:
    """``condition()``'s first true value; ``interval`` between looks, or (``paced``, for REST and DB reads) ten
    times what the last look took if that is longer, up to 1 s."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ROW_OVER.is_set():
            raise TimeoutError(f"the row's run ended before {what}")
        started = time.monotonic()
        value = condition()
        if value:
            return value
        took = time.monotonic() - started
        time.sleep(max(interval, min(1.0, LOOK_COST_FACTOR * took)) if paced else interval)
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
    forget_spot_history(e2e)
    run_id = e2e.airflow.trigger(DAG_ID, logical_date, {**CONF, **(conf or {})})
    watcher = in_background(lambda: during(run_id, interval)) if during else None
    try:
        state = e2e.airflow.wait_for_run(DAG_ID, run_id, timeout)
    except TimeoutError:
        try:
            print(explain_run(e2e, run_id, interval))  # what it was doing when the row gave up
        except Exception as exc:  # the row's own failure is the one to report
            print(f"could not explain run {run_id}: {exc!r}")
        # fail the stuck run, so that it holds none of the DAG's max_active_runs slots in the next rows
        with contextlib.suppress(Exception):
            e2e.airflow.api("PATCH", f"/dags/{DAG_ID}/dagRuns/{run_id}", json={"state": "failed"})
        raise
    finally:
        ROW_OVER.set()
        if watcher:
            watcher.join(timeout=30)
        ROW_OVER.clear()
    e2e.emulator.clear_faults()
    if state != "success":
        print(explain_run(e2e, run_id, interval))  # shown by pytest only when the row fails
    return run_id, interval, state


def explain_run(e2e: E2E, run_id: str, interval: str) -> str:
    """What a row's run did, for a failed row: its tasks, its jobs, and the log tail of every try that failed."""
    lines = [f"run {run_id}:"]
    tis = e2e.airflow.task_instances(DAG_ID, run_id)
    for ti in tis:
        lines.append(f"  {ti['task_id']}[{ti['map_index']}] {ti['state']} try {ti['try_number']}")
    for job in sorted(e2e.jobs_for(interval), key=lambda j: j.created):
        lines.append(f"  job {job.name} on {job.compute}: {job.status} {job.created:%H:%M:%S.%f}-{job.ended}")
    unfinished = {(ti["task_id"], ti["map_index"]) for ti in tis if ti["state"] not in ("success", "skipped")}
    run_logs = e2e.airflow.logs / f"dag_id={DAG_ID}" / f"run_id={run_id}"
    for log in sorted(run_logs.glob("task_id=*/**/attempt=*")):  # a try's log, and its trigger's (Airflow 3)
        text = log.read_text(errors="replace")
        parts = {p.split("=", 1)[0]: p.split("=", 1)[1] for p in log.relative_to(run_logs).parts if "=" in p}
        key = (parts.get("task_id"), int(parts.get("map_index", "-1")))
        if '"level":"error"' in text or "Task failed" in text or "ERROR" in text or key in unfinished:
            lines.append(f"--- {log.relative_to(run_logs)} (last 60 lines)")
            lines.extend(text.splitlines()[-60:])
    return "\n".join(lines)


def forget_spot_history(e2e: E2E) -> None:
    """Each row starts with no spot history: the spot policy shares what it saw on the cluster between
    runs (a blob in the storage account; a Variable where none is reachable), and one row's preemptions
    would otherwise steer the next row's jobs to the fallback deployment before its fault is injected."""
    import psycopg2

    e2e.emulator.forget_spot_histories()  # the blob store (the connection's spot_history_url)
    conn = psycopg2.connect(host="127.0.0.1", port=e2e.postgres.port, user="airflow", dbname="airflow")
    try:
        with conn, conn.cursor() as cur:
            cur.execute("DELETE FROM variable WHERE key LIKE 'azureml_spot_history%'")
    finally:
        conn.close()


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


def trigger_polled(e2e: E2E, run_id: str, interval: str, partition: int) -> bool:
    """Is this partition's trigger running: taken by a triggerer, which has since polled (asyncio client)?

    The poller reads one LIST for all waits on a workspace (or GETs a job), so either counts.
    """
    rows = sql(
        e2e,
        "SELECT t.triggerer_id FROM task_instance ti JOIN trigger t ON ti.trigger_id = t.id"
        " WHERE ti.dag_id = %s AND ti.run_id = %s AND ti.task_id = 'score_partition' AND ti.map_index = %s",
        DAG_ID,
        run_id,
        partition,
    )
    jobs = [j for j in e2e.jobs_for(interval) if f"/part-{partition:03d}/" in str(j.input_uri or "")]
    if not rows or rows[0][0] is None or not jobs:
        return False
    since = min(j.created for j in jobs).timestamp()
    names = {j.name for j in jobs}
    return any(
        r["ua"].endswith("(asyncio)")
        and r["t"] > since
        and (r["path"].endswith("/jobs") or r["path"].rsplit("/", 1)[-1] in names)
        for r in e2e.emulator.requests()
    )


def pid_owning_local_port(port: int) -> int | None:
    """The process whose connection to this test process's emulator has local port ``port``.

    The remote end must be a port this process listens on: Linux gives one local port number to
    connections to different peers, so matching the number alone once killed another xdist worker
    (its own client socket had the same number; `.ci/run` of fb9c063: "worker 'gw0' crashed")."""
    conns = psutil.net_connections(kind="tcp")
    me = os.getpid()
    listening = {c.laddr.port for c in conns if c.pid == me and c.status == psutil.CONN_LISTEN and c.laddr}
    for conn in conns:
        if not (conn.laddr and conn.raddr and conn.pid) or conn.pid == me:
            continue
        if conn.laddr.port == port and conn.raddr.port in listening:
            return int(conn.pid)
    return None


ENDPOINT = "heart-classifier-batch"
DEPLOYMENT = "classifier-mlflow"
MANY = {"partitions": 20, "files_per_partition": 1, "rows_per_file": 5}
TERMINAL = ("Completed", "Failed", "Canceled")


def scoring_tasks(e2e: E2E, run_id: str) -> dict[int, dict[str, Any]]:
    return {t["map_index"]: t for t in e2e.airflow.task_instances(DAG_ID, run_id) if t["task_id"] == "score_partition"}


def all_deferred(e2e: E2E, run_id: str, count: int) -> bool:
    tasks = scoring_tasks(e2e, run_id)
    return len(tasks) == count and all(t["state"] == "deferred" for t in tasks.values())


def partition_jobs(e2e: E2E, interval: str, partition: int) -> list[Any]:
    return [j for j in e2e.jobs_for(interval) if f"/part-{partition:03d}/" in str(j.input_uri or "")]


def sql(e2e: E2E, query: str, *args: Any) -> list[tuple[Any, ...]]:
    """Rows of a query on the deployment's metadata DB; a statement that returns none is committed."""
    import psycopg2

    conn = psycopg2.connect(host="127.0.0.1", port=e2e.postgres.port, user="airflow", dbname="airflow")
    try:
        with conn, conn.cursor() as cur:
            cur.execute(query, args)
            return list(cur.fetchall()) if cur.description is not None else []
    finally:
        conn.close()


def alive_triggerers(e2e: E2E) -> list[int]:
    rows = sql(
        e2e,
        "SELECT id FROM job WHERE job_type = 'TriggererJob' AND state = 'running'"
        " AND latest_heartbeat > now() - interval '5 seconds' ORDER BY id",
    )
    return [int(r[0]) for r in rows]


def faults_served(e2e: E2E, since: int, needle: str) -> int:
    return sum(1 for r in e2e.emulator.requests()[since:] if r.get("fault") and needle in r["path"])


def held_queued(e2e: E2E, run_id: str, interval: str, jobs: int) -> None:
    """No capacity until ``jobs`` jobs exist and every scoring task waits for its job in the triggerer."""
    wait_until(lambda: cluster_exists(e2e), what="cluster")
    e2e.emulator.set_capacity(CLUSTER, 0)
    wait_until(lambda: len(e2e.jobs_for(interval)) >= jobs, timeout=240, what=f"{jobs} jobs")
    wait_until(lambda: all_deferred(e2e, run_id, jobs), timeout=240, what=f"{jobs} deferred tasks", paced=True)


def assert_no_secret_material(e2e: E2E) -> None:
    """No client secret, token or token payload in any log, XCom or trigger row this deployment wrote."""
    import psycopg2

    secret = e2e.emulator.client_secret
    tokens = list(e2e.emulator.call(lambda: list(e2e.emulator.identity.issued)))
    assert tokens, "the suite issued tokens"
    needles = [secret, e2e.emulator.control_token, *tokens, *(t.split(".")[1] for t in tokens)]
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


# Two evidence reads (PollingPolicy's default interval, which the example keeps) and one poll at the e2e
# deployment's AZUREML_MAX_POLL_SECONDS (conftest.py): how long preempt_whole_cluster holds the lost jobs at least.
HOLD_AT_LEAST = 2 * PollingPolicy().evidence_interval + 3.0


def preempt_whole_cluster(e2e: E2E, belongs: Callable[[Any], bool], preempted: list[str], times: int = 1) -> list[str]:
    """Preempt the whole spot cluster ``times`` times while jobs that ``belongs`` picks run there, each time once
    every running job's wait has read the gauge at 0 twice; appends the first preempted job's name each time,
    and returns the names of every job the preemptions ended.
    Set the emulator's ``preempted_node_release_seconds`` (20 s) first, so that the waits can read the gauge up."""
    emulator = e2e.emulator
    gauge_zero_since: list[float] = []  # when the cluster last showed no preempted node

    def read_twice_since(job: Any, since: float) -> bool:
        """The job's wait read it, then the cluster, twice over since ``since`` (``helpers.read_twice_since``;
        here on the emulator's loop, so its log is read directly)."""
        return helpers.read_twice_since(emulator.request_log, job.name, CLUSTER, since)

    def preempt_once_every_running_job_sampled() -> tuple[str, float, list[str]] | None:
        # Preempt only once the wait of EVERY job running on the cluster has read the gauge at 0 (reads
        # after the job started and after the last preemption's nodes were deallocated): a job that
        # starts running just before the cluster goes has no baseline, and a job first sampled while
        # the previous preemption's nodes still counted sees the gauge flat (2 -> 2) as its own nodes
        # go; both are, safely, taken as a person's cancel (docs/operators.md). The cluster is held
        # (its Running jobs take no work), so a job cannot end before its wait has read it; checked
        # and done in one step on the emulator's loop, so no job starts running in between.
        compute = emulator.workspace.computes.get(CLUSTER)
        if compute is None:  # the DAG has not created it yet (this row first in its e2e deployment)
            return None
        if any(n.state == "preempted" for n in compute.nodes):
            gauge_zero_since.clear()
            return None
        if not gauge_zero_since:
            gauge_zero_since.append(time.time())
            return None
        running = [
            j for j in emulator.workspace.jobs.values() if belongs(j) and j.status == "Running" and j.compute == CLUSTER
        ]  # a job the policy moved to the fallback deployment runs on dedicated compute, never preempted
        fresh = [j for j in running if j.name not in preempted]

        def since(job: Any) -> float:
            return max(job.started.timestamp() if job.started is not None else time.time(), gauge_zero_since[0])

        # and no job is getting nodes (a job with nodes still preparing is cancelled too, unsampled)
        holders = {n.job_name for n in compute.nodes if n.job_name}
        if not fresh or not all(read_twice_since(j, since(j)) for j in running):
            return None
        if holders - {j.name for j in running}:
            return None
        at = time.time()
        # hold_nodes: the nodes count as preempted until the jobs end, and 20 s more, so that a wait
        # that has not read them up within the 60 s below still sees them at its read after the end
        # (on a loaded machine a run of this row stalled when the gauge fell before the jobs ended:
        # no witness, and the verdict waited the example's evidence_wait of 900 s)
        lost = emulator.workspace.preempt_cluster(CLUSTER, "canceled", hold_end=True, hold_nodes=True)
        return fresh[0].name, at, lost

    ended: list[str] = []
    emulator.hold_cluster(CLUSTER)
    try:
        for _ in range(times):
            name, at, lost = wait_until(
                lambda: emulator.call(preempt_once_every_running_job_sampled), what="a sampled run"
            )
            preempted.append(name)
            ended.extend(lost)

            # Azure sends no message for this cancel: the service ends the jobs a while after their
            # nodes went (capacity gone meanwhile); here, once each wait has read the gauge up while its
            # job still ran (or after 60 s, and the row shows what the provider made of it).
            # The request log cannot tell one wait's reads from another's: with many waits on the cluster
            # (a backfill), other processes' reads met the condition within 0.1 s, and Azure's cancel came
            # before a wait had read anything (benchmarks/backfill.py). So the hold also lasts two of the
            # waits' evidence reads and one poll at the e2e deployment's longest interval.
            def read_up(at: float = at, lost: list[str] = lost) -> bool:
                held_long_enough = time.time() - at >= HOLD_AT_LEAST
                return held_long_enough and all(read_twice_since(emulator.workspace.jobs[n], at) for n in lost)

            with contextlib.suppress(TimeoutError):
                wait_until(lambda: emulator.call(read_up), timeout=60, what="the waits reading the gauge up")
            emulator.call(lambda: emulator.workspace.end_held_preemption(CLUSTER))
    finally:
        emulator.hold_cluster(CLUSTER, held=False)
    return ended
