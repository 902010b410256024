"""How fast a backfill goes on the distributed Airflow, against what the cluster itself allows.

One Celery deployment of the e2e harness (CeleryExecutor on Redis, two Celery workers, two triggerers, the
capacity pool: ``tests/e2e/test_backfill_celery.py``'s ``celery_e2e``), then ``airflow backfill create`` of
the example DAG over 10, 30 and 60 daily intervals (distinct date ranges), 4 partitions each, with node
evictions and whole-cluster preemptions injected at a fixed rate throughout. Everything is measured from the
emulator's job records and Airflow's metadata DB, not from the DAG's reports:

- wall time (the backfill's ``created_at`` to its last run's end) and intervals per hour;
- the cluster-bound ideal: node-seconds of the completed jobs' running time on the spot cluster divided by its
  nodes, i.e. the wall time a scheduler with no overhead at all would need; the ratio ideal / wall;
- Airflow's overhead per job: the scoring task's start -> its first job created in Azure, and
  the job's end -> the task's end (median and p95);
- the peak of Azure jobs queued (created, not running yet) and live (not ended) at one instant, against the
  cluster's capacity in jobs plus one partition.

After each backfill the exactly-once checks of the Celery rows: every run succeeded, every row of every interval
scored once (the datastore), jobs = partitions + resubmissions, the resubmissions are exactly the jobs the
preemptions ended, 0 duplicate jobs. Exits 1 when a check fails; a missed target is printed as MISS, not failed.

The emulator's jobs last a fraction of a second by default, so a job's Airflow overhead (seconds: Celery
dispatch, a task process, the triggerer's poll, the resume) would be all that is measured. ``--mini-batch-seconds``
and ``--files`` give each job a scoring time of tens of seconds instead (a real batch job's mini-batches take
seconds to minutes); the ideal is computed from the jobs' recorded running times whatever they are.

    python benchmarks/backfill.py [--intervals 10,30,60] [--partitions 4] [--nodes 16]
                                  [--plot docs/benchmarks_backfill.png]
    python benchmarks/backfill.py --quick   # a smoke run: 2 intervals of 2 partitions, short jobs

Needs PostgreSQL and redis-server (``make bench-backfill`` installs them as ``make test-distributed`` does).
The 60-interval run is the long variant of the Celery backfill row (docs/backfills.md).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import shutil
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the e2e harness lives in tests/
    sys.path.insert(0, str(ROOT))

from benchmarks.airflow_home import use_a_scratch_airflow_home  # noqa: E402

use_a_scratch_airflow_home()  # the e2e harness and the provider import Airflow

from tests.e2e import rows  # noqa: E402
from tests.e2e.conftest import DAG_ID, E2E, deployment  # noqa: E402
from tests.e2e.rows import CLUSTER, forget_spot_history, preempt_whole_cluster, sql, wait_until  # noqa: E402
from tests.e2e.test_backfill_celery import (  # noqa: E402
    active_backfills,
    backfill_runs,
    days,
    intervals,
    resubmissions,
)


@dataclass
class Config:
    intervals: list[int]
    partitions: int
    files: int
    rows_per_file: int
    nodes: int
    mini_batch_seconds: float
    evict_every: float
    preempt_every: float
    first_date: str
    max_active_runs: int
    queue_ahead: list[int] = field(default_factory=lambda: [1])


@dataclass
class Result:
    intervals: int
    wall_s: float
    ideal_s: float
    jobs: int
    resubmitted: int
    evicted: int
    preemptions: int
    submit_p50: float
    submit_p95: float
    finish_p50: float
    finish_p95: float
    peak_queued: int
    peak_live: int
    on_fallback: int
    lost_node_s: float
    running_node_s: float = 0.0  # the cluster's node-seconds within the wall that Running jobs held (preempted too)
    queued_node_s: float = 0.0  # its node-seconds within the wall left free while a submitted job was queued
    failures: list[str] = field(default_factory=list)
    queue_ahead: int = 0  # jobs the capacity pool let wait in Azure's queue beyond the cluster's capacity

    @property
    def per_hour(self) -> float:
        return self.intervals / self.wall_s * 3600 if self.wall_s else 0.0

    @property
    def ratio(self) -> float:
        return self.ideal_s / self.wall_s if self.wall_s else 0.0


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q / 100 * len(ordered)) - 1)]


def yaml_int(path: Path, key: str) -> int:
    """An integer field of the az ml CLI YAML (the benchmark reads what the DAG's tasks read)."""
    match = re.search(rf"^\s*{key}:\s*(\d+)\s*$", path.read_text(), re.MULTILINE)
    if match is None:
        raise SystemExit(f"no {key} in {path}")
    return int(match.group(1))


def size_cluster(e2e: E2E, nodes: int) -> tuple[int, int]:
    """The deployed copy of the cluster YAML gets ``nodes`` nodes, before any run creates the cluster: the
    capacity pool's sync and the cluster's creation read it at run time. Returns (nodes, nodes a job)."""
    cluster_yml = e2e.airflow.dags / "azureml" / "low-pri-cluster.yml"
    text = re.sub(r"^max_instances:\s*\d+", f"max_instances: {nodes}", cluster_yml.read_text(), flags=re.MULTILINE)
    cluster_yml.write_text(text)
    job_nodes = yaml_int(e2e.airflow.dags / "azureml" / "deployment.yml", "instance_count")
    return yaml_int(cluster_yml, "max_instances"), job_nodes


def inject_faults(e2e: E2E, keys: list[str], cfg: Config, stop: threading.Event, log: dict[str, list[str]]) -> None:
    """Node evictions and whole-cluster preemptions at a fixed rate while the backfill runs.

    An eviction takes one node of a job running on the cluster (its mini-batches are redone on the others); a
    preemption takes the whole cluster once every running job's wait has sampled it (``preempt_whole_cluster``,
    as the Celery row does), and the operator resubmits the jobs it ended."""
    workspace = e2e.emulator.workspace

    def ours(job: Any) -> bool:
        return job is not None and any(f"/input/{k}/" in str(job.input_uri or "") for k in keys)

    def evict_one() -> str | None:
        compute = workspace.computes.get(CLUSTER)
        for node in compute.nodes if compute is not None else []:
            job = workspace.jobs.get(node.job_name or "")
            if node.state == "running" and ours(job):
                workspace.evict_nodes(CLUSTER, 1)
                return str(job.name)
        return None

    next_evict = time.monotonic() + cfg.evict_every
    next_preempt = time.monotonic() + cfg.preempt_every
    while not stop.wait(0.2):
        now = time.monotonic()
        if cfg.evict_every > 0 and now >= next_evict:
            name = e2e.emulator.call(evict_one)
            if name:
                log["evicted"].append(name)
                next_evict = now + cfg.evict_every
        if cfg.preempt_every > 0 and now >= next_preempt:
            with contextlib.suppress(TimeoutError):  # no job of ours ran in time: try again next period
                log["ended"] += preempt_whole_cluster(e2e, ours, log["preempted"])
            next_preempt = time.monotonic() + cfg.preempt_every


def run_backfill(e2e: E2E, first: str, last: str, cfg: Config, max_active_runs: int) -> dict[str, Any]:
    """``airflow backfill create`` as docs/backfills.md shows it; returns the backfill once it completed."""
    conf = {"partitions": cfg.partitions, "files_per_partition": cfg.files, "rows_per_file": cfg.rows_per_file}
    e2e.airflow.airflow(
        *("backfill", "create", "--dag-id", DAG_ID, "--from-date", first, "--to-date", last),
        *("--max-active-runs", str(max_active_runs), "--reprocess-behavior", "none"),
        *("--dag-run-conf", json.dumps(conf)),
        timeout=300,
    )
    found = wait_until(lambda: active_backfills(e2e), timeout=120, what="the backfill", interval=1)[0]
    wait_until(lambda: not active_backfills(e2e), timeout=6 * 3600, what="the backfill to complete", interval=2)
    return dict(found)


def when(value: Any) -> float:
    if isinstance(value, datetime):
        return value.timestamp()
    return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()


def peak(spans: list[tuple[float, float]]) -> int:
    """The most spans open at one instant; an end sorts before a start at the same instant."""
    level = top = 0
    for _, step in sorted([(a, 1) for a, _ in spans] + [(b, -1) for _, b in spans]):
        level += step
        top = max(top, level)
    return top


def cluster_use(jobs: list[Any], job_nodes: int, nodes: int, start: float, end: float) -> tuple[float, float]:
    """Node-seconds of the cluster within ``[start, end]`` that held Running jobs, and that a queued job could
    have used: swept over time, at most ``nodes`` at once, queued ones only in the room the running left."""
    events: list[tuple[float, int, int]] = []  # (time, change of running jobs, change of queued jobs)
    for j in jobs:
        created = j.created.timestamp()
        started = j.started.timestamp() if j.started else None
        ended = j.ended.timestamp() if j.ended else end
        events += [(created, 0, 1), ((started if started is not None else ended), 0, -1)]
        if started is not None:
            events += [(started, 1, 0), (ended, -1, 0)]
    events.sort()
    running = queued = 0
    used = waiting = 0.0
    last = start
    for t, d_run, d_queue in events:
        a, b = max(last, start), min(t, end)
        if b > a:
            busy = min(nodes, running * job_nodes)
            used += busy * (b - a)
            waiting += min(nodes - busy, queued * job_nodes) * (b - a)
        last = max(last, t)
        running += d_run
        queued += d_queue
    if end > last:
        busy = min(nodes, running * job_nodes)
        used += busy * (end - max(last, start))
        waiting += min(nodes - busy, queued * job_nodes) * (end - max(last, start))
    return used, waiting


def measure(
    e2e: E2E, cfg: Config, count: int, first: str, max_active_runs: int, job_nodes: int, queue_ahead: int
) -> Result:
    """One backfill of ``count`` intervals from ``first`` under faults, its figures and its checks."""
    dates = days(first, count)
    keys = intervals(dates)
    forget_spot_history(e2e)
    log: dict[str, list[str]] = {"evicted": [], "preempted": [], "ended": []}
    stop = threading.Event()
    faults = threading.Thread(target=inject_faults, args=(e2e, keys, cfg, stop, log), daemon=True)
    faults.start()
    try:
        backfill = run_backfill(e2e, dates[0], dates[-1], cfg, max_active_runs)
    finally:
        stop.set()
        rows.ROW_OVER.set()  # a preemption still waiting for a running job gives up, and lets the cluster go
        faults.join(timeout=300)
        rows.ROW_OVER.clear()
    runs = backfill_runs(e2e, dates[0], dates[-1])
    failures: list[str] = []
    if [r["state"] for r in runs] != ["success"] * count:
        failures.append(f"runs not all success: {[r['state'] for r in runs]}")
    wall = max(when(r["end_date"]) for r in runs if r.get("end_date")) - when(backfill["created_at"])

    jobs = [j for k in keys for j in e2e.jobs_for(k)]
    done = [j for j in jobs if j.status == "Completed" and j.compute == CLUSTER and j.started and j.ended]
    ideal = sum((j.ended - j.started).total_seconds() * job_nodes for j in done) / cfg.nodes
    ended = [j for j in jobs if j.status != "Completed" and j.compute == CLUSTER and j.started and j.ended]
    wasted = sum((j.ended - j.started).total_seconds() * job_nodes for j in ended)  # preempted work, not in the ideal
    mine = [j for j in jobs if j.compute == CLUSTER]
    began = when(backfill["created_at"])
    running_node_s, queued_node_s = cluster_use(mine, job_nodes, cfg.nodes, began, began + wall)
    now = time.time()
    # queued: created, not running yet (a job that never ran is queued until its end)
    queued = [(j.created.timestamp(), (j.started or j.ended or j.created).timestamp()) for j in jobs]
    live = [(j.created.timestamp(), j.ended.timestamp() if j.ended else now) for j in jobs]

    # Airflow's side of each partition: the task's start -> its first job created; its last job ended -> task ended
    tis = sql(
        e2e,
        "SELECT dr.logical_date, ti.map_index, ti.start_date, ti.end_date FROM task_instance ti"
        " JOIN dag_run dr ON dr.dag_id = ti.dag_id AND dr.run_id = ti.run_id WHERE ti.dag_id = %s"
        " AND ti.task_id = 'score_partition' AND dr.logical_date >= %s AND dr.logical_date <= %s",
        DAG_ID,
        f"{dates[0]}T00:00:00Z",
        f"{dates[-1]}T00:00:00Z",
    )
    to_submit: list[float] = []
    to_finish: list[float] = []
    for logical, index, start, end in tis:
        key = e2e.interval_key(logical.isoformat())
        mine = sorted(
            (j for j in e2e.jobs_for(key) if f"/part-{index:03d}/" in str(j.input_uri or "")), key=lambda j: j.created
        )
        if not mine or end is None:
            continue
        # start_date is the first try's start (a resume from deferral keeps it; queued_dttm is the resume's)
        to_submit.append(mine[0].created.timestamp() - when(start))
        if mine[-1].ended is not None:
            to_finish.append(when(end) - mine[-1].ended.timestamp())

    # exactly once, from the emulator's records and the datastore
    resubmitted = 0
    for key in keys:
        result = e2e.record(f"backfill of {count}", key, "success", "benchmark")
        extra = resubmissions(e2e, [key])
        resubmitted += len(extra)
        rows_in, lost, duplicated = result.rows_in, result.rows_lost, result.rows_duplicated
        if result.duplicate_jobs or lost or duplicated or not rows_in:
            failures.append(f"{key}: {result.duplicate_jobs} duplicate jobs, {lost} rows lost, {duplicated} twice")
        if result.jobs_submitted != cfg.partitions + len(extra):
            failures.append(f"{key}: {result.jobs_submitted} jobs != {cfg.partitions} partitions + {len(extra)}")
    if resubmitted != len(log["ended"]):
        failures.append(f"{resubmitted} resubmissions, but the preemptions ended {len(log['ended'])} jobs")
    return Result(
        queue_ahead=queue_ahead,
        intervals=count,
        wall_s=wall,
        ideal_s=ideal,
        jobs=len(jobs),
        resubmitted=resubmitted,
        evicted=len(log["evicted"]),
        preemptions=len(log["preempted"]),
        submit_p50=statistics.median(to_submit) if to_submit else float("nan"),
        submit_p95=percentile(to_submit, 95),
        finish_p50=statistics.median(to_finish) if to_finish else float("nan"),
        finish_p95=percentile(to_finish, 95),
        peak_queued=peak(queued),
        peak_live=peak(live),
        on_fallback=sum(1 for j in jobs if j.compute != CLUSTER),
        lost_node_s=wasted,
        running_node_s=running_node_s,
        queued_node_s=queued_node_s,
        failures=failures,
    )


HEADER = (
    f"{'intervals':>9} {'jobs':>5} {'resub':>5} {'evict':>5} {'preempt':>7} {'wall s':>8} {'int/h':>7} "
    f"{'ideal s':>8} {'ratio':>6} {'submit p50/p95 s':>17} {'finish p50/p95 s':>17} {'peak queued':>11} "
    f"{'peak live':>9} {'ahead':>5}"
)


def row(r: Result) -> str:
    return (
        f"{r.intervals:>9} {r.jobs:>5} {r.resubmitted:>5} {r.evicted:>5} {r.preemptions:>7} {r.wall_s:>8.0f} "
        f"{r.per_hour:>7.1f} {r.ideal_s:>8.0f} {r.ratio:>6.2f} {r.submit_p50:>8.1f}/{r.submit_p95:<8.1f} "
        f"{r.finish_p50:>8.1f}/{r.finish_p95:<8.1f} {r.peak_queued:>11} {r.peak_live:>9} {r.queue_ahead:>5}"
    )


def parse_args(argv: list[str] | None = None) -> tuple[Config, argparse.Namespace]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--intervals", default="10,30,60", help="backfill sizes, comma-separated (default 10,30,60)")
    parser.add_argument("--partitions", type=int, default=4, help="partitions (jobs) per interval")
    parser.add_argument("--files", type=int, default=24, help="files per partition: 2 a mini-batch (deployment.yml)")
    parser.add_argument("--rows-per-file", type=int, default=10)
    parser.add_argument("--nodes", type=int, default=16, help="the spot cluster's max_instances (jobs take 2 each)")
    parser.add_argument("--mini-batch-seconds", type=float, default=12.0, help="the emulator's time per mini-batch")
    parser.add_argument("--evict-every", type=float, default=30.0, help="seconds between node evictions (0: none)")
    parser.add_argument("--preempt-every", type=float, default=600.0, help="seconds between cluster preemptions")
    parser.add_argument("--first-date", default="2025-01-01", help="the first interval; sizes follow one another")
    parser.add_argument(
        "--max-active-runs",
        type=int,
        default=0,
        help="the backfill's; default ceil((slots + queue_ahead) / partitions) + 1",
    )
    parser.add_argument(
        "--queue-ahead",
        default="1",
        help="the capacity pool's queue_ahead, comma-separated to run each size with each (default 1, as "
        "docs/backfills.md recommends for backfills of short jobs; 0: the pool holds exactly the capacity)",
    )
    parser.add_argument("--quick", action="store_true", help="smoke run: 2 intervals of 2 partitions, short jobs")
    parser.add_argument("--keep", type=Path, help="run in this folder and keep it (the services' logs), for a failure")
    parser.add_argument("--plot", type=Path, help="write the figure here (e.g. docs/benchmarks_backfill.png)")
    args = parser.parse_args(argv)
    if args.quick:
        args.intervals, args.partitions, args.files, args.mini_batch_seconds = "2", 2, 4, 1.0
        args.evict_every, args.preempt_every = 5.0, 60.0
    cfg = Config(
        intervals=[int(n) for n in args.intervals.split(",") if n.strip()],
        partitions=args.partitions,
        files=args.files,
        rows_per_file=args.rows_per_file,
        nodes=args.nodes,
        mini_batch_seconds=args.mini_batch_seconds,
        evict_every=args.evict_every,
        preempt_every=args.preempt_every,
        first_date=args.first_date,
        max_active_runs=args.max_active_runs,
        queue_ahead=[int(n) for n in args.queue_ahead.split(",") if n.strip().isdigit()],
    )
    given = [n.strip() for n in args.queue_ahead.split(",") if n.strip()]
    if not given or len(cfg.queue_ahead) != len(given) or any(not 0 <= a <= 8 for a in cfg.queue_ahead):
        parser.error(f"--queue-ahead must be whole numbers from 0 to 8, comma-separated, got {args.queue_ahead!r}")
    if not cfg.intervals:
        parser.error("--intervals names no backfill size")
    return cfg, args


def main(argv: list[str] | None = None) -> int:
    cfg, args = parse_args(argv)
    os.environ.pop("AZUREML_RELIABILITY_DIR", None)  # the rows this records are the benchmark's, not docs/'s
    base = args.keep or Path(tempfile.mkdtemp(prefix="backfill-bench-"))
    base.mkdir(parents=True, exist_ok=True)
    results: list[Result] = []
    lines: list[str] = []
    slots = 0
    try:
        started = time.monotonic()
        first = date.fromisoformat(cfg.first_date)
        for ahead in cfg.queue_ahead:
            # A deployment of its own for each queue_ahead: the value is the deployment's (every run's sync writes
            # the pool with it), and nothing of one measurement (spot history, pools) carries into the next.
            # The capacity pool, as the Celery rows run it: capacity waits in Airflow, not in Azure's queue.
            env = {"AZUREML_CAPACITY_POOL_CONN_ID": "airflow_api", "AZUREML_CAPACITY_QUEUE_AHEAD": str(ahead)}
            up = time.monotonic()
            (base / f"queue-ahead-{ahead}").mkdir(exist_ok=True)
            with deployment(base / f"queue-ahead-{ahead}", celery=True, extra_env=env) as e2e:
                nodes, job_nodes = size_cluster(e2e, cfg.nodes)
                slots = nodes // job_nodes
                # docs/backfills.md: enough runs to fill the pool (capacity + queue_ahead), plus one
                active = cfg.max_active_runs or math.ceil((slots + ahead) / cfg.partitions) + 1
                e2e.emulator.call(
                    lambda e2e=e2e: setattr(e2e.emulator.workspace.timing, "mini_batch", cfg.mini_batch_seconds)
                )
                e2e.emulator.set_behaviour(preempted_node_release_seconds=20.0)  # preempt_whole_cluster's reads
                print(
                    f"cluster {CLUSTER}: {nodes} nodes, {job_nodes} a job -> {slots} jobs at once + queue_ahead {ahead}"
                    f" (the capacity pool); {cfg.partitions} partitions x {cfg.files} files, mini-batch"
                    f" {cfg.mini_batch_seconds:g} s; --max-active-runs {active}; an eviction every"
                    f" {cfg.evict_every:g} s, a whole-cluster preemption every {cfg.preempt_every:g} s;"
                    f" deployment up in {time.monotonic() - up:.0f} s",
                    flush=True,
                )
                for count in cfg.intervals:
                    began = time.monotonic()
                    result = measure(e2e, cfg, count, first.isoformat(), active, job_nodes, ahead)
                    first += timedelta(days=count)
                    results.append(result)
                    print(
                        f"  {count} intervals, queue_ahead {ahead}: {time.monotonic() - began:.0f} s; {row(result)}",
                        flush=True,
                    )
                    for failure in result.failures:
                        print(f"  FAILED {failure}", flush=True)
        lines = report(results, slots, cfg)
        print("\n".join(lines))
        print(f"total {time.monotonic() - started:.0f} s with the deployments' starts and stops")
    finally:
        if args.keep is None:
            shutil.rmtree(base, ignore_errors=True)
    if args.plot and results:
        plot(lines, args.plot)
    return 1 if any(r.failures for r in results) else 0


def report(results: list[Result], slots: int, cfg: Config) -> list[str]:
    """The table and the verdicts, as pasted into docs/benchmarks.md (plot_tables.py reads them back)."""
    results = sorted(results, key=lambda r: (r.queue_ahead, r.intervals))
    lines = [HEADER, "-" * len(HEADER), *(row(r) for r in results), ""]
    bound = slots + 1  # the target: never more queued than the capacity plus one partition's job
    for r in results:
        once = "OK" if not r.failures else "FAILED"
        pool = slots + r.queue_ahead  # what the pool promises: no more jobs alive than its slots
        lines.append(
            f"{r.intervals} intervals, queue_ahead {r.queue_ahead}: exactly once {once}"
            f" ({r.jobs} jobs = {r.intervals * cfg.partitions} partitions"
            f" + {r.resubmitted} resubmissions, 0 duplicates: {'yes' if not r.failures else 'no'}); peak queued"
            f" {r.peak_queued} <= capacity + 1 partition = {bound}: {'OK' if r.peak_queued <= bound else 'MISS'};"
            f" peak live {r.peak_live} <= the pool's {pool} slots: {'OK' if r.peak_live <= pool else 'MISS'};"
            f" {r.on_fallback} jobs on the fallback; {r.lost_node_s:.0f} node-s run by preempted jobs"
            " (not in the ideal)"
        )
        capacity = r.wall_s * cfg.nodes
        if capacity > 0:  # where the cluster's node-seconds went: Azure running or queueing jobs, or no job at all
            running, queued = r.running_node_s / capacity, r.queued_node_s / capacity
            lines.append(
                f"  cluster use at {r.intervals} intervals (queue_ahead {r.queue_ahead}), its {cfg.nodes} nodes over"
                f" the wall: {running:.0%} held by"
                f" Running jobs ({r.lost_node_s / capacity:.0%} by jobs that did not complete), {queued:.0%} free while"
                f" a job was queued, {max(0.0, 1 - running - queued):.0%} free with no job queued (Airflow between a"
                " job's end and the next submit, and the backfill's start and end)"
            )
    most = max(r.intervals for r in results)
    for longest in [r for r in results if r.intervals == most]:
        verdict = "OK" if longest.ratio >= 0.8 else "MISS"
        lines.append(
            f"target at {longest.intervals} intervals, queue_ahead {longest.queue_ahead}: ratio to the ideal"
            f" {longest.ratio:.2f} (>= 0.8): {verdict}"
        )
    return lines


def plot(lines: list[str], path: Path) -> None:
    """The figure from the printed table (benchmarks/plot_tables.py draws the same from docs/benchmarks.md)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from plot_tables import draw_backfill

    try:
        draw_backfill([lines], path)
    except ImportError:
        print("matplotlib is not installed (pip install -e '.[bench]'): no plot", file=sys.stderr)
        return
    print(f"wrote {path}")


if __name__ == "__main__":
    raise SystemExit(main())
