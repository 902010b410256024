"""``make demo``: run the example DAG for one data interval against the local emulator.

It starts the emulator, runs ``airflow dags test low_priority_batch_scoring`` while the
emulator preempts the whole low-priority cluster once mid-run, then prints the report.
Everything lives under ``.demo/`` (or ``AZUREML_DEMO_DIR``) and is recreated on each run.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import requests

REPO = Path(__file__).resolve().parents[1]
DEMO = Path(os.environ.get("AZUREML_DEMO_DIR") or REPO / ".demo").resolve()
INTERVAL = "2026-11-29"
DAG_ID = "low_priority_batch_scoring"


def start_emulator() -> tuple[subprocess.Popen[bytes], dict[str, Any]]:
    data_dir = DEMO / "emulator"
    proc = subprocess.Popen(
        [sys.executable, "-m", "airflow_azureml.emulator", "--data-dir", str(data_dir), "--mini-batch-seconds", "3"],
        stdout=subprocess.DEVNULL,
        stderr=open(DEMO / "emulator.log", "wb"),  # noqa: SIM115 - lives as long as the process
    )
    info_path = data_dir / "emulator.json"
    deadline = time.monotonic() + 30
    while not info_path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"emulator did not start; see {DEMO / 'emulator.log'}")
        time.sleep(0.05)
    return proc, json.loads(info_path.read_text())


class Control:
    """The emulator's control API, as any client would use it: HTTPS with a bearer token."""

    def __init__(self, info: dict[str, Any]) -> None:
        from azure.identity import ClientSecretCredential

        self.info = info
        self.credential = ClientSecretCredential(
            info["tenant_id"],
            info["client_id"],
            info["client_secret"],
            authority=info["base_url"],
            connection_verify=info["ca_cert"],
            disable_instance_discovery=True,
        )
        self.session = requests.Session()
        self.session.trust_env = False  # use the emulator's CA, not REQUESTS_CA_BUNDLE
        self.session.verify = info["ca_cert"]

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.credential.get_token(self.info['base_url'] + '/.default').token}"}

    def jobs(self) -> list[dict[str, Any]]:
        return self.session.get(f"{self.info['base_url']}/_emulator/jobs", headers=self._headers(), timeout=10).json()

    def set_behaviour(self, **switches: Any) -> None:
        self.session.post(
            f"{self.info['base_url']}/_emulator/behaviour", json=switches, headers=self._headers(), timeout=10
        ).raise_for_status()

    def preempt(self, cluster: str) -> None:
        self.session.post(
            f"{self.info['base_url']}/_emulator/clusters/{cluster}/preempt",
            json={"form": "canceled"},
            headers=self._headers(),
            timeout=10,
        ).raise_for_status()


def preempt_once_mid_run(control: Control, done: threading.Event, seen: list[str]) -> None:
    while not done.is_set():
        running = [j for j in control.jobs() if j["compute"] == "low-pri-cluster" and j["status"] == "Running"]
        if running:
            # Let the wait (1 s polls) read the cluster's gauge while the job runs, and let a few
            # mini-batches finish: the evidence of a preemption is a rise seen while the job ran.
            time.sleep(1.6)
            control.preempt("low-pri-cluster")
            seen.append(running[0]["name"])
            print(f"  >> emulator: preempted the whole low-priority cluster while {running[0]['name']} was running")
            return
        time.sleep(0.1)


def main() -> int:
    started = time.monotonic()
    shutil.rmtree(DEMO, ignore_errors=True)
    DEMO.mkdir()
    emulator, info = start_emulator()
    print(f"emulator: {info['base_url']} (workspace {info['workspace']})")
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(DEMO / "airflow"),
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW_CONN_AZURE_ML_DEFAULT": info["airflow_conn_json"],
        "AZUREML_DATASTORE_ROOT": f"file://{DEMO / 'emulator' / 'datastores' / 'workspaceblobstore'}",
        "AZUREML_POLL_SECONDS": "1",
        "AZUREML_RESUBMIT_BACKOFF_SECONDS": "2",
    }
    try:
        subprocess.run(
            [sys.executable, "-m", "airflow", "db", "migrate"],
            env=env,
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        control = Control(info)
        # A whole-cluster preemption does not end the job at once: Azure first tries to get the
        # nodes back, and cancels for lack of capacity later (seeds 000/001). The emulator's
        # default is the least convenient 0 s; the demo plays a short, plausible window.
        control.set_behaviour(capacity_cancel_after_seconds=4.0, preempted_node_release_seconds=8.0)
        done, preempted = threading.Event(), []
        watcher = threading.Thread(target=preempt_once_mid_run, args=(control, done, preempted), daemon=True)
        watcher.start()
        print(f"running: airflow dags test {DAG_ID} {INTERVAL}  (log: {DEMO / 'dags-test.log'})")
        with open(DEMO / "dags-test.log", "wb") as log:
            result = subprocess.run(
                [sys.executable, "-m", "airflow", "dags", "test", DAG_ID, INTERVAL],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        done.set()
        jobs = control.jobs()
        reports = sorted(
            (DEMO / "emulator" / "datastores" / "workspaceblobstore" / "scoring" / "reports").glob("*/report.json")
        )
        if result.returncode != 0 or not reports:
            print(f"DAG run failed (exit {result.returncode}); see {DEMO / 'dags-test.log'}")
            return 1
        # A clean run logs no error: each one is a defect of ours (the run's own faults are warnings).
        log_lines = (DEMO / "dags-test.log").read_text(errors="replace").splitlines()
        errors = [line for line in log_lines if "[error" in line]
        report = json.loads(reports[-1].read_text())
        preemptions = sum(1 for j in jobs if j["status"] in ("Canceled", "Failed"))
        print()
        print("report")
        print(f"  data interval            {report['interval']}")
        print(f"  partitions               {report['partitions']}")
        print(f"  jobs submitted           {len(jobs)}")
        for job in jobs:
            print(f"    {job['status']:<10} {job['compute']:<16} {job['name']}")
        print(f"  preemptions seen         {preemptions}")
        print(f"  resubmissions            {report['resubmissions']}")
        print(
            f"  rows in / rows scored    {report['rows_in']} / {report['rows_scored']}"
            f"  ({'each row exactly once' if report['rows_in'] == report['rows_scored'] else 'MISMATCH'})"
        )
        outputs = Path(report["predictions"][0].replace("file://", "")).parent.parent
        print(f"  predictions              {outputs}/part-*/predictions.csv")
        print(f"  errors logged            {len(errors)}")
        for line in errors:
            print(f"    {line[:300]}")
        print(f"  took                     {time.monotonic() - started:.1f}s")
        exact = report["rows_in"] == report["rows_scored"]
        return 0 if exact and report["resubmissions"] >= 1 and not errors else 1
    finally:
        emulator.terminate()
        emulator.wait(timeout=10)


if __name__ == "__main__":
    sys.exit(main())
