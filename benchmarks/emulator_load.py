"""Load test of the Azure ML emulator: many clients polling batch-job status at once.

Run ``python benchmarks/emulator_load.py [--seconds 10] [--pollers 200] [--jobs 5]``.

The emulator runs in this (parent) process, exactly as tests and the demo use it: its aiohttp
server lives in a background thread. The client load runs in a separate *spawned* process
(``multiprocessing``), so the pollers' TLS and JSON work does not compete with the server for
this process's GIL; the parent's main thread only waits. (A spawned rather than forked child:
forking a process that has a running event-loop thread is unsafe.)

Set-up (parent, over HTTPS with a bearer token): an AmlCompute cluster, a batch endpoint, a
deployment, ``--jobs`` batch jobs scored to completion, so that every poll reads the same
kind of finished job. Then two phases of ``--seconds`` each, in the child process:

* baseline: 1 poller alone;
* load: ``--pollers`` concurrent pollers (asyncio + aiohttp), each with its own bearer token
  and its own keep-alive TLS connection trusting the emulator's certificate.

Every poller repeatedly GETs ``jobs/{name}`` (round-robin over the jobs) until its phase's
deadline; the script stops by itself. Only 127.0.0.1 is contacted.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import platform
import ssl
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import requests

from airflow_azureml.emulator import Emulator
from airflow_azureml.emulator.scoring.data import write_heart_csvs

API = "2024-10-01"
PHASE_TIMEOUT_SLACK = 60.0  # seconds on top of --seconds before a phase counts as hung


# --------------------------------------------------------------------------------------- child process
def _percentile(sorted_values: list[float], pct: float) -> float:
    """Nearest-rank percentile of an ascending list (NaN when empty)."""
    if not sorted_values:
        return float("nan")
    rank = max(1, round(pct / 100 * len(sorted_values)))
    return sorted_values[min(rank, len(sorted_values)) - 1]


async def _token(session: Any, info: dict[str, Any]) -> str:
    form = {
        "grant_type": "client_credentials",
        "client_id": info["client_id"],
        "client_secret": info["client_secret"],
        "scope": f"{info['base_url']}/.default",  # the emulator's ARM audience
    }
    async with session.post(f"{info['base_url']}/{info['tenant_id']}/oauth2/v2.0/token", data=form) as resp:
        resp.raise_for_status()
        return (await resp.json())["access_token"]


async def _phase(info: dict[str, Any], job_urls: list[str], pollers: int, seconds: float) -> dict[str, Any]:
    ssl_ctx = ssl.create_default_context(cafile=info["ca_cert"])
    timeout = aiohttp.ClientTimeout(total=10)
    sessions = [
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ssl_ctx, limit=1), timeout=timeout, trust_env=False)
        for _ in range(pollers)
    ]
    latencies: list[float] = []
    errors: dict[str, int] = {}
    try:
        tokens = await asyncio.gather(*(_token(s, info) for s in sessions))
        start = asyncio.Event()

        async def poll(index: int, session: aiohttp.ClientSession, token: str) -> None:
            headers = {"Authorization": f"Bearer {token}"}
            params = {"api-version": API}
            n = index
            await start.wait()
            while time.monotonic() < deadline:
                url = job_urls[n % len(job_urls)]
                n += 1
                sent = time.perf_counter()
                try:
                    async with session.get(url, headers=headers, params=params) as resp:
                        await resp.read()
                        ok = resp.status == 200
                        kind = f"HTTP {resp.status}"
                except (aiohttp.ClientError, asyncio.TimeoutError) as exc:
                    ok, kind = False, type(exc).__name__
                if ok:
                    latencies.append(time.perf_counter() - sent)
                else:
                    errors[kind] = errors.get(kind, 0) + 1

        tasks = [asyncio.create_task(poll(i, s, t)) for i, (s, t) in enumerate(zip(sessions, tokens, strict=True))]
        await asyncio.sleep(0.2)  # let every poller reach the start line
        began_wall, began, began_cpu = time.time(), time.monotonic(), time.process_time()
        deadline = began + seconds
        start.set()
        await asyncio.gather(*tasks)
        elapsed = time.monotonic() - began
        client_cpu = (time.process_time() - began_cpu) / elapsed
    finally:
        await asyncio.gather(*(s.close() for s in sessions))
    latencies.sort()
    total = len(latencies) + sum(errors.values())
    return {
        "pollers": pollers,
        "requests": total,
        "rps": total / elapsed,
        "p50": _percentile(latencies, 50) * 1000,
        "p95": _percentile(latencies, 95) * 1000,
        "p99": _percentile(latencies, 99) * 1000,
        "errors": sum(errors.values()),
        "error_kinds": errors,
        "window": (began_wall, began_wall + elapsed),
        "client_cpu": client_cpu,
    }


def _child(info: dict[str, Any], job_urls: list[str], pollers: int, seconds: float, out: Any) -> None:
    try:
        out.send(("ok", asyncio.run(_phase(info, job_urls, pollers, seconds))))
    except BaseException as exc:  # reported by the parent
        out.send(("error", f"{type(exc).__name__}: {exc}"))
    finally:
        out.close()


def run_phase(info: dict[str, Any], job_urls: list[str], pollers: int, seconds: float) -> dict[str, Any]:
    ctx = mp.get_context("spawn")
    receiver, sender = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_child, args=(info, job_urls, pollers, seconds, sender), name=f"pollers-{pollers}")
    proc.start()
    sender.close()
    try:
        if not receiver.poll(seconds + PHASE_TIMEOUT_SLACK):
            raise RuntimeError(f"the {pollers}-poller phase did not finish in time")
        status, result = receiver.recv()
    finally:
        proc.join(timeout=10)
        if proc.is_alive():
            proc.terminate()
            proc.join(timeout=5)
    if status != "ok":
        raise RuntimeError(f"the {pollers}-poller phase failed: {result}")
    return result


# ----------------------------------------------------------------------------------------- set-up
def set_up(emulator: Emulator, jobs: int) -> list[str]:
    """Cluster, endpoint, deployment and ``jobs`` finished batch jobs; returns the jobs' ARM URLs."""
    info = emulator.connection_info()
    session = requests.Session()
    session.trust_env = False  # REQUESTS_CA_BUNDLE would otherwise replace ``verify``
    session.verify = info["ca_cert"]

    def token(scope: str) -> str:
        form = {"grant_type": "client_credentials", "scope": scope}
        form.update(client_id=info["client_id"], client_secret=info["client_secret"])
        resp = session.post(f"{info['base_url']}/{info['tenant_id']}/oauth2/v2.0/token", data=form, timeout=30)
        resp.raise_for_status()
        return str(resp.json()["access_token"])

    session.headers["Authorization"] = f"Bearer {token(info['base_url'] + '/.default')}"  # the ARM audience
    scoring_auth = f"Bearer {token(info['aml_resource_id'] + '/.default')}"  # invoke: the ML audience
    ws = (
        f"{info['base_url']}/subscriptions/{info['subscription_id']}/resourceGroups/{info['resource_group']}"
        f"/providers/Microsoft.MachineLearningServices/workspaces/{info['workspace']}"
    )

    def call(method: str, url: str, **kwargs: Any) -> Any:
        resp = session.request(method, url, params={"api-version": API}, timeout=30, **kwargs)
        if resp.status_code >= 300:
            raise RuntimeError(f"{method} {url}: {resp.status_code} {resp.text}")
        return resp.json()

    call(
        "PUT",
        f"{ws}/computes/cpu-cluster",
        json={
            "location": "eastus",
            "properties": {
                "computeType": "AmlCompute",
                "properties": {
                    "vmSize": "STANDARD_DS3_V2",
                    "vmPriority": "LowPriority",
                    "scaleSettings": {"minNodeCount": 0, "maxNodeCount": 4},
                },
            },
        },
    )
    endpoint = call("PUT", f"{ws}/batchEndpoints/heart", json={"location": "eastus", "properties": {}})
    call(
        "PUT",
        f"{ws}/batchEndpoints/heart/deployments/blue",
        json={
            "location": "eastus",
            "properties": {
                "compute": "azureml:cpu-cluster",
                "model": {"referenceType": "Id", "assetId": "azureml:heart-classifier:1"},
                "miniBatchSize": 2,
                "maxConcurrencyPerInstance": 2,
                "resources": {"instanceCount": 1},
            },
        },
    )
    write_heart_csvs(emulator.datastore_path("in"), files=4, rows_per_file=10)
    names = [f"load-job-{i}" for i in range(jobs)]
    for name in names:
        call(
            "POST",
            endpoint["properties"]["scoringUri"],
            headers={"azureml-model-deployment": "blue", "Authorization": scoring_auth},
            json={
                "properties": {
                    "name": name,
                    "inputData": {
                        "x": {"jobInputType": "UriFolder", "uri": "azureml://datastores/workspaceblobstore/paths/in/"}
                    },
                }
            },
        )
    deadline = time.monotonic() + 60
    for name in names:
        while call("GET", f"{ws}/jobs/{name}")["properties"]["status"] not in ("Completed", "Failed", "Canceled"):
            if time.monotonic() > deadline:
                raise RuntimeError(f"job {name} did not finish during set-up")
            time.sleep(0.05)
    return [f"{ws}/jobs/{name}" for name in names]


def server_p50_ms(emulator: Emulator, window: tuple[float, float]) -> float:
    """Median in-server handling time of the job GETs made during ``window`` (from the request log)."""
    times = sorted(
        r["ms"]
        for r in emulator.requests()
        if r["method"] == "GET" and "/jobs/" in r["path"] and "ms" in r and window[0] <= r["t"] <= window[1]
    )
    return _percentile(times, 50)


# ------------------------------------------------------------------------------------------------ main
def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="duration of each phase (default 10)")
    parser.add_argument("--pollers", type=int, default=200, help="concurrent pollers in the load phase")
    parser.add_argument("--jobs", type=int, default=5, help="batch jobs to create and poll")
    args = parser.parse_args(argv)
    if args.seconds <= 0 or args.pollers < 1 or args.jobs < 1:
        parser.error("--seconds must be > 0, --pollers and --jobs >= 1")

    with tempfile.TemporaryDirectory(prefix="emulator-load-") as data_dir, Emulator(Path(data_dir)) as emulator:
        print(f"emulator {emulator.base_url} (server thread in pid {os.getpid()}); setting up...", flush=True)
        job_urls = set_up(emulator, args.jobs)
        results = []
        for pollers in (1, args.pollers):
            print(f"polling with {pollers} poller(s) for {args.seconds:g} s...", flush=True)
            cpu = time.process_time()  # this process: its main thread only waits, so this is the server
            result = run_phase(emulator.connection_info(), job_urls, pollers, args.seconds)
            # includes issuing the pollers' tokens just before the window: a slight overestimate
            result["server_cpu"] = (time.process_time() - cpu) / (result["window"][1] - result["window"][0])
            result["server_p50"] = server_p50_ms(emulator, result["window"])
            results.append(result)

    baseline, load = results
    print()
    print(
        f"GET jobs/{{name}} over HTTPS, {args.jobs} finished batch jobs, {args.seconds:g} s per phase; "
        f"Python {platform.python_version()}, {os.cpu_count()} CPUs; emulator in-process, clients in a child process"
    )
    header = f"{'phase':<10}{'pollers':>8}{'requests':>10}{'req/s':>10}{'p50 ms':>9}{'p95 ms':>9}{'p99 ms':>9}"
    header += f"{'errors':>8}{'server p50 ms':>15}{'server CPU':>12}{'client CPU':>12}"
    print(header)
    print("-" * len(header))
    for label, r in (("baseline", baseline), ("load", load)):
        print(
            f"{label:<10}{r['pollers']:>8}{r['requests']:>10}{r['rps']:>10.0f}{r['p50']:>9.2f}{r['p95']:>9.2f}"
            f"{r['p99']:>9.2f}{r['errors']:>8}{r['server_p50']:>15.3f}"
            f"{r['server_cpu']:>12.0%}{r['client_cpu']:>12.0%}"
        )
    print("-" * len(header))
    print(
        f"load / baseline: throughput x{load['rps'] / baseline['rps']:.2f}, "
        f"p50 latency x{load['p50'] / baseline['p50']:.1f}, "
        f"per-poller rate x{load['rps'] / load['pollers'] / baseline['rps']:.3f}"
    )
    for label, r in (("baseline", baseline), ("load", load)):
        if r["error_kinds"]:
            print(f"{label} errors: {r['error_kinds']}")
    return 1 if load["errors"] or baseline["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
