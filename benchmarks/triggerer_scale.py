"""How many Azure ML job waits one triggerer process can hold, and what they cost ARM.

For each N, N ``AzureMLJobTrigger``s run concurrently in this process's event loop, waiting on N
emulator jobs that finish at varied times. The emulator runs in a child process, so its CPU
does not count against this loop. Printed per N: peak RSS of this process, event-loop lag
(p50/p99 of a 50 ms ticker's overshoot), ARM requests per job and per poll interval, and how
late completions were observed. In the same run, the pattern other providers use (sync
``MLClient.jobs.get`` offloaded with ``asyncio.to_thread``, one poll per job per interval) is
measured at smaller N as the baseline, and the ratios are printed.

The history case (``--history 20000``) puts that many finished provider jobs in the workspace,
with some waited jobs older than all of them and the rest newer, and prints the LIST pages per
tick against the target ``ceil(waits / page size) + 1`` (the LIST is capped; older jobs are read
by GET).

    python benchmarks/triggerer_scale.py [--sizes 100 500 1000 2000] [--baseline-sizes 100 500]
    python benchmarks/triggerer_scale.py --sizes --baseline-sizes --history 20000 [--history-waits 20 180]
    python benchmarks/triggerer_scale.py --sizes --baseline-sizes --same-tick 64 [--details-latency 0.5]

The same-tick case ends that many jobs together while run history answers each details GET late, and prints
how late the waits see the ends with the tick's reads one at a time and ``CONCURRENT_READS`` at a time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import requests

from airflow_azureml.naming import UNIT_TAG

INTERVAL = 2.0  # poll interval for both patterns, seconds
DURATIONS = (4.0, 14.0)  # job run times are spread uniformly in this range


@dataclass
class Result:
    pattern: str
    n: int
    peak_rss_mb: float
    lag_p50_ms: float
    lag_p99_ms: float
    reads: int
    reads_per_job: float
    reads_per_interval: float
    observe_p50_s: float
    observe_max_s: float
    wall_s: float


class EmulatorProcess:
    def __init__(self, history: tuple[int, int, int] | None = None) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="triggerer-bench-"))
        command = [sys.executable, "-m", "airflow_azureml.emulator", "--data-dir", str(self.dir)]
        if history is not None:  # this file, in a child process: an emulator seeded with a job history
            command = [sys.executable, __file__, "--serve-history", str(self.dir), *map(str, history)]
        self.proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        info_path = self.dir / "emulator.json"
        deadline = time.monotonic() + 30
        while not info_path.exists():
            if time.monotonic() > deadline:
                raise SystemExit("emulator did not start")
            time.sleep(0.05)
        self.info = json.loads(info_path.read_text())
        from airflow_azureml import redaction

        redaction.mask(self.info["control_token"])  # the control API's secret: never in a log
        self.session = requests.Session()
        self.session.trust_env = False
        self.session.verify = self.info["ca_cert"]

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.info['control_token']}"}  # the control API's own token

    def control(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self.session.request(
            method, self.info["base_url"] + path, headers=self._headers(), timeout=120, **kwargs
        )
        response.raise_for_status()
        return response.json()

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=10)
        shutil.rmtree(self.dir, ignore_errors=True)


class Monitor:
    """Samples event-loop lag and this process's RSS while a stage runs."""

    def __init__(self) -> None:
        self.lags: list[float] = []
        self.peak_rss = 0
        self._process = psutil.Process()

    async def run(self, stop: asyncio.Event) -> None:
        tick = 0.05
        while not stop.is_set():
            started = time.perf_counter()
            await asyncio.sleep(tick)
            self.lags.append(max(0.0, time.perf_counter() - started - tick))
            self.peak_rss = max(self.peak_rss, self._process.memory_info().rss)


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


async def wait_with_triggers(names: list[str]) -> dict[str, float]:
    from airflow_azureml.triggers.job import AzureMLJobTrigger

    observed: dict[str, float] = {}
    policy = {"interval": INTERVAL, "max_interval": INTERVAL * 5, "jitter": 0.1}

    async def one(name: str) -> None:
        async for event in AzureMLJobTrigger(job_name=name, azure_ml_conn_id="azure_ml_default", polling=policy).run():
            assert event.payload["status"] == "terminal", event.payload
            observed[name] = time.time()

    await asyncio.gather(*(one(n) for n in names))
    return observed


async def wait_then_close(names: list[str]) -> tuple[dict[str, float], Any]:
    """``wait_with_triggers``, then let the shared poller close its client before the loop ends; with its stats."""
    from airflow_azureml.triggers.poller import WorkspacePoller

    waits = asyncio.ensure_future(wait_with_triggers(names))
    await asyncio.sleep(0)
    poller = WorkspacePoller.for_connection("azure_ml_default")
    observed = await waits
    if poller._task is not None:
        await poller._task
    return observed, poller.stats


async def wait_with_threads(names: list[str], ml_client: Any) -> dict[str, float]:
    """The anchors' pattern: a sync SDK call per job per interval, offloaded to the default thread pool."""
    observed: dict[str, float] = {}

    async def one(name: str) -> None:
        await asyncio.sleep(random.uniform(0, INTERVAL))
        while True:
            job = await asyncio.to_thread(ml_client.jobs.get, name)
            if str(getattr(job.status, "value", job.status)) in ("Completed", "Failed", "Canceled"):
                observed[name] = time.time()
                return
            await asyncio.sleep(INTERVAL)

    await asyncio.gather(*(one(n) for n in names))
    return observed


def run_stage(emulator: EmulatorProcess, pattern: str, n: int, ml_client: Any = None) -> Result:
    rng = random.Random(n)
    durations = [round(rng.uniform(*DURATIONS), 2) for _ in range(n)]
    prefix = f"{pattern}-{n}-{int(time.time())}"
    # Every job carries the unit property, as the provider's jobs do: the poller's LIST filters on it.
    body = {"prefix": prefix, "durations": durations, "properties": {UNIT_TAG: prefix}}
    names = emulator.control("POST", "/_emulator/synthetic-jobs", json=body)["jobs"]
    since = time.time()
    monitor = Monitor()

    async def main() -> dict[str, float]:
        stop = asyncio.Event()
        watcher = asyncio.create_task(monitor.run(stop))
        try:
            if pattern == "triggers":
                return await wait_with_triggers(names)
            return await wait_with_threads(names, ml_client)
        finally:
            stop.set()
            await watcher

    started = time.monotonic()
    observed = asyncio.run(main())
    wall = time.monotonic() - started
    jobs = {j["name"]: j for j in emulator.control("GET", "/_emulator/jobs") if j["name"].startswith(prefix)}
    delays = [observed[name] - jobs[name]["ended"] for name in names]
    log = emulator.control("GET", "/_emulator/requests", params={"since": since, "last": 10_000_000})
    workspace_gets = [
        r for r in log if r["method"] == "GET" and f"/workspaces/{emulator.info['workspace']}/" in r["path"]
    ]
    # run history (an ended job's details) is its own host in Azure, not Resource Manager: counted apart
    reads = [r for r in workspace_gets if not r["path"].startswith("/history/")]
    kinds: dict[str, int] = {"run details GET (run history)": len(workspace_gets) - len(reads)}
    for r in reads:
        tail = r["path"].split(f"/workspaces/{emulator.info['workspace']}/", 1)[1].split("?")[0]
        kind = "job LIST" if tail == "jobs" else "job GET" if tail.startswith("jobs/") else tail.split("/")[0] + " GET"
        kinds[kind] = kinds.get(kind, 0) + 1
    print(f"  {pattern} N={n} reads by kind: {dict(sorted(kinds.items()))}", file=sys.stderr)
    return Result(
        pattern=pattern,
        n=n,
        peak_rss_mb=monitor.peak_rss / 2**20,
        lag_p50_ms=percentile(monitor.lags, 50) * 1000,
        lag_p99_ms=percentile(monitor.lags, 99) * 1000,
        reads=len(reads),
        reads_per_job=len(reads) / n,
        reads_per_interval=len(reads) / max(1.0, wall / INTERVAL),
        observe_p50_s=statistics.median(delays),
        observe_max_s=max(delays),
        wall_s=wall,
    )


def print_table(results: list[Result]) -> None:
    header = (
        f"{'pattern':<10}{'N':>6}{'peak RSS MB':>13}{'lag p50 ms':>12}{'lag p99 ms':>12}{'ARM reads':>11}"
        f"{'reads/job':>11}{'reads/intvl':>13}{'seen p50 s':>12}{'seen max s':>12}{'wall s':>9}"
    )
    print(header)
    print("-" * len(header))
    for r in results:
        print(
            f"{r.pattern:<10}{r.n:>6}{r.peak_rss_mb:>13.0f}{r.lag_p50_ms:>12.1f}{r.lag_p99_ms:>12.1f}{r.reads:>11}"
            f"{r.reads_per_job:>11.2f}{r.reads_per_interval:>13.1f}{r.observe_p50_s:>12.2f}{r.observe_max_s:>12.2f}"
            f"{r.wall_s:>9.1f}"
        )


HISTORY_JOB_SECONDS = 20.0  # how long the waited jobs of the history case run


def serve_history(data_dir: str, old: int, history: int, new: int) -> None:
    """Child process: an emulator whose workspace holds ``old`` running provider jobs, then ``history``
    finished ones, then ``new`` running ones (newest last, as created); all carry ``naming.UNIT_TAG``."""
    import signal
    import threading

    from airflow_azureml.emulator import Emulator
    from airflow_azureml.emulator.models import Job
    from airflow_azureml.naming import UNIT_TAG

    def mark(job: Any) -> None:
        job.properties["properties"] = {UNIT_TAG: f"bench-{job.name}"}

    def seed(workspace: Any) -> list[str]:
        waited = workspace.create_synthetic_jobs("old", [HISTORY_JOB_SECONDS] * old)
        for index in range(history):
            job = Job(name=f"history-{index:05d}", job_type="Command", compute="", properties={})
            mark(job)
            job.set_status("Completed")
            workspace.jobs[job.name] = job
        waited += workspace.create_synthetic_jobs("new", [HISTORY_JOB_SECONDS] * new)
        for name in waited:
            mark(workspace.jobs[name])
        return waited

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with Emulator(data_dir) as emulator:
        waited = emulator.call(lambda: seed(emulator.workspace))
        (Path(data_dir) / "waited.json").write_text(json.dumps(waited))
        stop.wait()


def run_history_case(old: int, history: int, new: int) -> None:
    """Pages per tick when the workspace holds a long history of the provider's own finished jobs."""
    import logging

    logging.getLogger("azure").setLevel(logging.WARNING)  # request logs would drown the figures
    emulator = EmulatorProcess((old, history, new))
    os.environ["AIRFLOW_CONN_AZURE_ML_DEFAULT"] = emulator.info["airflow_conn_json"]
    try:
        waited_file = emulator.dir / "waited.json"
        while not waited_file.exists():
            time.sleep(0.05)
        names = json.loads(waited_file.read_text())
        since = time.time()

        started = time.monotonic()
        _, stats = asyncio.run(wait_then_close(names))
        wall = time.monotonic() - started
        log = emulator.control("GET", "/_emulator/requests", params={"since": since, "last": 10_000_000})
    finally:
        emulator.stop()
    lists = [r for r in log if r["method"] == "GET" and r["path"].endswith("/jobs")]
    gets = [r for r in log if r["method"] == "GET" and "/jobs/" in r["path"]]
    page_size = 100  # the emulator's (and Azure's) jobs page
    target = math.ceil(len(names) / page_size) + 1
    per_tick = stats.list_pages / max(1, stats.list_ticks)
    print(
        f"\nhistory case: {history} finished provider jobs, {len(names)} waits ({old} older than the whole history, "
        f"{new} newer), poll interval {INTERVAL:.0f}s, wall {wall:.1f}s"
    )
    print(
        f"  LIST ticks {stats.list_ticks}, pages {stats.list_pages} ({len(lists)} seen by the emulator): "
        f"{per_tick:.2f} pages per tick, max {stats.max_pages_per_tick}; target <= ceil({len(names)}/{page_size})+1 "
        f"= {target}: {'OK' if stats.max_pages_per_tick <= target else 'MISSED'}"
    )
    print(
        f"  job GETs {len(gets)} ({stats.job_gets} by the poller), compute reads {stats.compute_gets}; "
        f"without the cap every tick would page through {math.ceil((history + len(names)) / page_size)} pages"
    )


SAME_TICK_SECONDS = 6.0  # how long the jobs of the same-tick case run (all of them: they end together)


def run_same_tick_case(n: int, latency: float) -> None:
    """``n`` waits whose jobs end on the same tick, with run history answering each details GET ``latency`` s
    late: how late the waits see the ends when the tick reads one job at a time (``CONCURRENT_READS = 1``, the
    poller before 2026-12-07) and when it reads ``CONCURRENT_READS`` at a time, in the same run. After a
    warm-up (not reported), the two run in the order one, many, many, one, so that neither gains from going
    second; "seen" includes the wait for the first poll after the end, which both share."""
    import logging

    from airflow_azureml.triggers import poller as poller_module

    logging.getLogger("azure").setLevel(logging.WARNING)
    concurrent = poller_module.CONCURRENT_READS
    emulator = EmulatorProcess()
    os.environ["AIRFLOW_CONN_AZURE_ML_DEFAULT"] = emulator.info["airflow_conn_json"]
    rows: list[tuple[int, float, float, float]] = []
    try:
        fault = {"kind": "latency", "seconds": latency, "path": r"/runs/[^/]+/details$", "count": None}
        emulator.control("POST", "/_emulator/faults", json=fault)
        for stage, (reads, count) in enumerate(((concurrent, 8), (1, n), (concurrent, n), (concurrent, n), (1, n))):
            poller_module.CONCURRENT_READS = reads
            prefix = f"same-tick-{stage}-{int(time.time())}"
            body = {"prefix": prefix, "durations": [SAME_TICK_SECONDS] * count, "properties": {UNIT_TAG: prefix}}
            names = emulator.control("POST", "/_emulator/synthetic-jobs", json=body)["jobs"]
            started = time.monotonic()
            observed, _ = asyncio.run(wait_then_close(names))
            wall = time.monotonic() - started
            jobs = {j["name"]: j for j in emulator.control("GET", "/_emulator/jobs") if j["name"].startswith(prefix)}
            delays = [observed[name] - jobs[name]["ended"] for name in names]
            if stage:  # the first is the warm-up
                rows.append((reads, statistics.median(delays), max(delays), wall))
    finally:
        poller_module.CONCURRENT_READS = concurrent
        emulator.stop()
    print(f"\nsame-tick case: {n} jobs end together, run history answers each details GET {latency:.1f}s late")
    print(f"  {'reads at a time':<17}{'reads alone s':>15}{'seen p50 s':>12}{'seen max s':>12}{'wall s':>9}")
    for reads, p50, worst, wall in rows:
        print(f"  {reads:<17}{math.ceil(n / reads) * latency:>15.1f}{p50:>12.2f}{worst:>12.2f}{wall:>9.1f}")
    one = statistics.mean(worst for reads, _, worst, _ in rows if reads == 1)
    many = statistics.mean(worst for reads, _, worst, _ in rows if reads == concurrent)
    print(f"  last end seen {one:.2f}s -> {many:.2f}s after it ended (mean of two runs each): {one / many:.1f}x sooner")


def main() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from benchmarks.airflow_home import use_a_scratch_airflow_home

    use_a_scratch_airflow_home()  # the masking and the trigger below import Airflow; so do the processes it starts
    if len(sys.argv) > 1 and sys.argv[1] == "--serve-history":
        data_dir, old, history, new = sys.argv[2], *map(int, sys.argv[3:6])
        serve_history(data_dir, old, history, new)
        return
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="*", default=[100, 500, 1000, 2000])
    parser.add_argument("--baseline-sizes", type=int, nargs="*", default=[100, 500])
    parser.add_argument("--history", type=int, default=0, help="finished provider jobs in the history case (0: skip)")
    parser.add_argument("--history-waits", type=int, nargs=2, default=[20, 180], metavar=("OLDER", "NEWER"))
    parser.add_argument("--same-tick", type=int, default=0, help="waits in the same-tick case (0: skip)")
    parser.add_argument("--details-latency", type=float, default=0.5, help="run history's delay in the same-tick case")
    args = parser.parse_args()
    if args.history:
        run_history_case(args.history_waits[0], args.history, args.history_waits[1])
    if args.same_tick:
        run_same_tick_case(args.same_tick, args.details_latency)
    if not args.sizes:
        return
    emulator = EmulatorProcess()
    os.environ["AIRFLOW_CONN_AZURE_ML_DEFAULT"] = emulator.info["airflow_conn_json"]
    results: list[Result] = []
    try:
        for n in args.sizes:
            results.append(run_stage(emulator, "triggers", n))
            print(f"  triggers N={n} done in {results[-1].wall_s:.1f}s", flush=True)
        if args.baseline_sizes:
            from airflow_azureml.hooks.azure_ml import AzureMLHook

            ml_client = AzureMLHook().get_conn()
            for n in args.baseline_sizes:
                results.append(run_stage(emulator, "to_thread", n, ml_client))
                print(f"  to_thread N={n} done in {results[-1].wall_s:.1f}s", flush=True)
    finally:
        emulator.stop()
    print()
    print(
        f"poll interval {INTERVAL:.0f}s, job run times {DURATIONS[0]:.0f}-{DURATIONS[1]:.0f}s, "
        f"{psutil.cpu_count()} CPUs; emulator in a child process"
    )
    print_table(results)
    by_key = {(r.pattern, r.n): r for r in results}
    ratios = []
    for n in args.baseline_sizes:
        ours, theirs = by_key.get(("triggers", n)), by_key.get(("to_thread", n))
        if ours and theirs:
            ratios.append(
                f"N={n}: ARM reads x{theirs.reads / max(1, ours.reads):.1f} fewer, "
                f"loop lag p99 {theirs.lag_p99_ms / max(0.1, ours.lag_p99_ms):.1f}x lower, "
                f"observation delay p50 {theirs.observe_p50_s:.2f}s -> {ours.observe_p50_s:.2f}s"
            )
    if ratios:
        print("\ntriggers vs to_thread baseline (same run):")
        for line in ratios:
            print("  " + line)
    biggest = max((r for r in results if r.pattern == "triggers"), key=lambda r: r.n)
    print(
        f"\ntargets at N={biggest.n}: loop lag p99 {biggest.lag_p99_ms:.0f} ms (<= 250), peak RSS "
        f"{biggest.peak_rss_mb:.0f} MB (<= 400), ARM reads per interval {biggest.reads_per_interval:.1f} "
        f"(one GET per job would be {biggest.n})"
    )


if __name__ == "__main__":
    main()
