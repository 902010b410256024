"""How many Azure ML job waits one triggerer process can hold, and what they cost ARM.

For each N, N ``AzureMLJobTrigger``s run concurrently in this process's event loop, waiting on N
emulator jobs that finish at varied times. The emulator runs in a child process, so its CPU
does not count against this loop. Printed per N: peak RSS of this process, event-loop lag
(p50/p99 of a 50 ms ticker's overshoot), ARM requests per job and per poll interval, and how
late completions were observed. In the same run, the pattern other providers use (sync
``MLClient.jobs.get`` offloaded with ``asyncio.to_thread``, one poll per job per interval) is
measured at smaller N as the baseline, and the ratios are printed.

    python benchmarks/triggerer_scale.py [--sizes 100 500 1000 2000] [--baseline-sizes 100 500]
"""

from __future__ import annotations

import argparse
import asyncio
import json
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
    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="triggerer-bench-"))
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "airflow_azureml.emulator", "--data-dir", str(self.dir)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        info_path = self.dir / "emulator.json"
        deadline = time.monotonic() + 30
        while not info_path.exists():
            if time.monotonic() > deadline:
                raise SystemExit("emulator did not start")
            time.sleep(0.05)
        self.info = json.loads(info_path.read_text())
        from azure.identity import ClientSecretCredential

        self.credential = ClientSecretCredential(
            self.info["tenant_id"],
            self.info["client_id"],
            self.info["client_secret"],
            authority=self.info["base_url"],
            connection_verify=self.info["ca_cert"],
            disable_instance_discovery=True,
        )
        self.session = requests.Session()
        self.session.trust_env = False
        self.session.verify = self.info["ca_cert"]

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.credential.get_token(self.info['base_url'] + '/.default').token}"}

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
    names = emulator.control("POST", "/_emulator/synthetic-jobs", json={"prefix": prefix, "durations": durations})[
        "jobs"
    ]
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
    reads = [r for r in log if r["method"] == "GET" and f"/workspaces/{emulator.info['workspace']}/" in r["path"]]
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[100, 500, 1000, 2000])
    parser.add_argument("--baseline-sizes", type=int, nargs="*", default=[100, 500])
    args = parser.parse_args()
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
