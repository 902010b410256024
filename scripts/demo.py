"""``make demo``: run the example DAG against the local emulator, one new data interval per run.

Each run starts the emulator on the demo's data folder, runs ``airflow dags test
low_priority_batch_scoring`` for the next data interval while the emulator preempts the whole
low-priority cluster once mid-run, then re-runs every earlier interval and prints what each run
cost, counted from the emulator's own job records. The earlier intervals' partitions are finished
checkpoints on the datastore, so their re-runs submit no job: that is the reuse of finished work.

Everything lives under ``.demo/`` (or ``--dir`` / ``AZUREML_DEMO_DIR``) and is kept between runs:
the emulator's data folder (certificate, client secret, the datastore with the DAG's inputs,
outputs, checkpoints and reports), the Airflow home with its metadata DB, and one log per
interval. ``--fresh`` deletes it all first and starts again from interval 1.

Which intervals are finished is read from the datastore (a report, and every partition's
checkpoint verified). The emulator keeps its jobs in memory only, so a restarted emulator has no
record of earlier runs' jobs: its records are exactly the jobs submitted during this run, which
is what "new jobs" counts. The jobs an earlier run paid for are named in the checkpoints.
"""

from __future__ import annotations

import argparse
import datetime as dt
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
FIRST_INTERVAL = dt.date(2026, 11, 29)
DAG_ID = "low_priority_batch_scoring"
PREFIX = "scoring"  # the DAG's folder on the datastore
CLUSTER = "low-pri-cluster"


def start_emulator(demo: Path) -> tuple[subprocess.Popen[bytes], dict[str, Any]]:
    data_dir = demo / "emulator"
    info_path = data_dir / "emulator.json"
    info_path.unlink(missing_ok=True)  # an earlier run's file names an earlier port: wait for this one's
    proc = subprocess.Popen(
        [sys.executable, "-m", "airflow_azureml.emulator", "--data-dir", str(data_dir), "--mini-batch-seconds", "3"],
        stdout=subprocess.DEVNULL,
        stderr=open(demo / "emulator.log", "wb"),  # noqa: SIM115 - lives as long as the process
    )
    deadline = time.monotonic() + 30
    while not info_path.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"emulator did not start; see {demo / 'emulator.log'}")
        time.sleep(0.05)
    time.sleep(0.1)  # the file is written in one go, but let its writer finish
    return proc, json.loads(info_path.read_text())


class Control:
    """The emulator's control API, as any client would use it: HTTPS with its control token as the bearer
    (``emulator.json``'s ``control_token``; no workspace token opens it)."""

    def __init__(self, info: dict[str, Any]) -> None:
        from airflow_azureml import redaction

        self.info = info
        redaction.mask(info["control_token"])  # a secret: never in a log
        self.session = requests.Session()
        self.session.trust_env = False  # use the emulator's CA, not REQUESTS_CA_BUNDLE
        self.session.verify = info["ca_cert"]

    def _headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.info['control_token']}"}

    def jobs(self) -> list[dict[str, Any]]:
        return self.session.get(f"{self.info['base_url']}/_emulator/jobs", headers=self._headers(), timeout=10).json()

    def job(self, name: str) -> dict[str, Any]:
        response = self.session.get(
            f"{self.info['base_url']}/_emulator/jobs/{name}", headers=self._headers(), timeout=10
        )
        response.raise_for_status()
        return response.json()["job"]

    def set_behaviour(self, **switches: Any) -> None:
        self.session.post(
            f"{self.info['base_url']}/_emulator/behaviour", json=switches, headers=self._headers(), timeout=10
        ).raise_for_status()

    def bill(self) -> dict[str, Any]:
        """The emulator's own bill (``GET /_emulator/bill``), to hold the provider's estimate against."""
        response = self.session.get(f"{self.info['base_url']}/_emulator/bill", headers=self._headers(), timeout=10)
        response.raise_for_status()
        return response.json()

    def requests(self, since: float) -> list[dict[str, Any]]:
        """The emulator's request log since ``since`` (epoch seconds): who read what, and when."""
        response = self.session.get(
            f"{self.info['base_url']}/_emulator/requests",
            params={"since": since, "last": 100000},
            headers=self._headers(),
            timeout=10,
        )
        response.raise_for_status()
        return response.json()

    def preempt(self, cluster: str) -> None:
        self.session.post(
            f"{self.info['base_url']}/_emulator/clusters/{cluster}/preempt",
            json={"form": "canceled"},
            headers=self._headers(),
            timeout=10,
        ).raise_for_status()


def preempt_once_mid_run(control: Control, done: threading.Event, seen: list[str]) -> None:
    while not done.is_set():
        running = [j for j in control.jobs() if j["compute"] == CLUSTER and j["status"] == "Running"]
        if running:
            # The evidence of a preemption is a rise of the cluster's gauge seen while the job ran: wait
            # until the job's wait has polled it Running and read the cluster after that poll (its polls
            # back off while the job is queued, so a fixed pause is not enough), then let a few
            # mini-batches finish.
            wait_until_sampled(control, running[0]["name"], since=time.time(), timeout=60)
            time.sleep(0.5)
            control.preempt(CLUSTER)
            seen.append(running[0]["name"])
            print(f"  >> emulator: preempted the whole low-priority cluster while {running[0]['name']} was running")
            return
        time.sleep(0.1)


def wait_until_sampled(control: Control, job: str, since: float, timeout: float) -> None:
    """Until a read of ``job`` (its GET, or the triggerer's job LIST) after ``since`` is followed by a read
    of the cluster: the wait then holds a gauge sample taken while the job ran (or ``timeout``)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        log = control.requests(since)
        reads = [r["t"] for r in log if r["method"] == "GET" and r["path"].endswith((f"/jobs/{job}", "/jobs"))]
        if reads and any(
            r["method"] == "GET" and r["path"].endswith(f"/computes/{CLUSTER}") and r["t"] > reads[0] for r in log
        ):
            return
        time.sleep(0.1)


# ------------------------------------------------------------------ intervals, checkpoints, jobs
def interval_date(n: int) -> dt.date:
    """Interval ``n`` (1, 2, ...) is the ``n``-th day from the first one: ``@daily`` data intervals."""
    return FIRST_INTERVAL + dt.timedelta(days=n - 1)


def interval_key(n: int) -> str:
    """The DAG's folder name for interval ``n`` (``example_partitions.interval_key`` of its start)."""
    return interval_date(n).strftime("%Y%m%dT0000")


def earlier_intervals(demo: Path) -> list[int]:
    """The intervals earlier runs finished, as the datastore says: a report, and every partition verified."""
    finished = []
    n = 1
    while True:
        report = datastore(demo) / PREFIX / "reports" / interval_key(n) / "report.json"
        if not report.exists() or len(checkpoints(demo, n)) != json.loads(report.read_text())["partitions"]:
            return finished
        finished.append(n)
        n += 1


def datastore(demo: Path) -> Path:
    return demo / "emulator" / "datastores" / "workspaceblobstore"


def checkpoints(demo: Path, n: int) -> list[dict[str, Any]]:
    """Interval ``n``'s partitions that the DAG's report verified, as their checkpoints on the datastore say."""
    folder = datastore(demo) / PREFIX / "checkpoints" / interval_key(n)
    states = [json.loads(path.read_text()) for path in sorted(folder.glob("part-*.json"))]
    return [state for state in states if state.get("verified")]


def job_interval(job: dict[str, Any]) -> str:
    """The interval folder (``20261129T0000``) that a job's input names, from its ARM record; ``?`` if none."""
    inputs = job["properties"].get("inputs") or {}
    uris = [v.get("uri", "") for v in inputs.values() if isinstance(v, dict)]
    return next((u.split(f"/{PREFIX}/input/")[1].split("/")[0] for u in uris if f"/{PREFIX}/input/" in u), "?")


def jobs_by_interval(control: Control, dump: Path) -> dict[str, list[dict[str, Any]]]:
    """The emulator's job records, grouped by interval; their ARM records are written to ``dump``."""
    grouped: dict[str, list[dict[str, Any]]] = {}
    records = []
    for summary in control.jobs():
        record = control.job(summary["name"])
        records.append(record)
        grouped.setdefault(job_interval(record), []).append(summary)
    dump.write_text(json.dumps(records, indent=2))
    return grouped


def log_errors(log: Path) -> list[str]:
    """A clean run logs no error: each one is a defect of ours (the run's own faults are warnings)."""
    # Airflow 3.1 and 3.2 log an absent Variable (the spot history before a first job) as an error; 3.3 at debug
    lines = log.read_text(errors="replace").splitlines()
    return [line for line in lines if "[error" in line and "Variable not found" not in line]


# One interpreter runs ``airflow db migrate`` and then ``airflow dags test`` once per interval, through
# Airflow's own CLI parser, as ``python -m airflow`` would: a re-run then costs its tasks, not a
# second start of Airflow and the Azure SDK. Each command's output goes to its own log file.
AIRFLOW_COMMANDS = """
import json, os, sys, traceback
from airflow.cli import cli_parser
from airflow.configuration import write_default_airflow_configuration_if_needed

write_default_airflow_configuration_if_needed()
parser = cli_parser.get_parser()
codes = []
for argv, log in json.loads(sys.argv[1]):
    with open(log, "wb") as handle:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(handle.fileno(), 1)
        os.dup2(handle.fileno(), 2)
        try:
            args = parser.parse_args(argv)
            args.func(args)
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException:
            traceback.print_exc()
            code = 1
        sys.stdout.flush()
        sys.stderr.flush()
    codes.append(code)
    with open(sys.argv[2], "w") as handle:
        json.dump(codes, handle)
    if code and argv[0] == "db":
        break
"""


def run_airflow(commands: list[tuple[list[str], Path]], env: dict[str, str], demo: Path) -> list[int]:
    """Run Airflow CLI ``commands`` (argv, log) in one process; their exit codes (1 for one never run)."""
    codes_path = demo / "logs" / "exit-codes.json"
    codes_path.parent.mkdir(exist_ok=True)
    codes_path.unlink(missing_ok=True)
    payload = json.dumps([(argv, str(log)) for argv, log in commands])
    subprocess.run(
        [sys.executable, "-c", AIRFLOW_COMMANDS, payload, str(codes_path)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=open(demo / "logs" / "airflow.log", "wb"),  # noqa: SIM115 - only what precedes the first command
    )
    codes = json.loads(codes_path.read_text()) if codes_path.exists() else []
    return codes + [1] * (len(commands) - len(codes))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="scripts/demo.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--fresh", action="store_true", help="delete the demo folder first and start at interval 1")
    parser.add_argument(
        "--dir",
        type=Path,
        default=Path(os.environ.get("AZUREML_DEMO_DIR") or REPO / ".demo"),
        help="the demo folder, kept between runs (default: $AZUREML_DEMO_DIR or .demo/)",
    )
    args = parser.parse_args(argv)
    demo: Path = args.dir.resolve()
    started = time.monotonic()
    if args.fresh:
        shutil.rmtree(demo, ignore_errors=True)
    demo.mkdir(parents=True, exist_ok=True)
    # This script imports Airflow itself (the provider's secret masking, the bill): without an Airflow home of
    # its own, Airflow's defaults would make ~/airflow/logs in the user's home.
    os.environ["AIRFLOW_HOME"] = str(demo / "airflow")
    earlier = earlier_intervals(demo)
    new = max(earlier, default=0) + 1
    emulator, info = start_emulator(demo)
    print(f"emulator: {info['base_url']} (workspace {info['workspace']}, data {demo / 'emulator'})")
    env = {
        **os.environ,
        "AIRFLOW_HOME": str(demo / "airflow"),
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW_CONN_AZURE_ML_DEFAULT": info["airflow_conn_json"],
        "AZUREML_DATASTORE_ROOT": f"file://{datastore(demo)}",
        "AZUREML_POLL_SECONDS": "1",
        "AZUREML_MAX_POLL_SECONDS": "5",
        "AZUREML_RESUBMIT_BACKOFF_SECONDS": "2",
    }
    try:
        control = Control(info)
        # A whole-cluster preemption does not end the job at once: Azure first tries to get the
        # nodes back, and cancels for lack of capacity later (seeds 000/001). The emulator's
        # default is the least convenient 0 s; the demo plays a short, plausible window.
        control.set_behaviour(capacity_cancel_after_seconds=4.0, preempted_node_release_seconds=8.0)
        done, preempted = threading.Event(), []
        watcher = threading.Thread(target=preempt_once_mid_run, args=(control, done, preempted), daemon=True)
        watcher.start()
        logs = demo / "logs"
        print(f"interval {new}: airflow dags test {DAG_ID} {interval_date(new)}  (new)")
        for n in earlier:  # the checkpoint: finished partitions are reused, no job is submitted
            print(f"interval {n}: airflow dags test {DAG_ID} {interval_date(n)}  (re-run)")
        print(f"  (logs: {logs}/interval-*.log)")
        order = [new, *earlier]
        migrate, *codes = run_airflow(
            [(["db", "migrate"], logs / "db-migrate.log")]
            + [(["dags", "test", DAG_ID, interval_date(n).isoformat()], logs / f"interval-{n}.log") for n in order],
            env,
            demo,
        )
        done.set()
        setup_errors = log_errors(logs / "db-migrate.log") + log_errors(logs / "airflow.log")
        if migrate != 0 or setup_errors:
            print(f"airflow db migrate failed (exit {migrate}); see {logs / 'db-migrate.log'}")
            for line in setup_errors:
                print(f"    {line[:300]}")
            return 1
        runs = [(n, code, logs / f"interval-{n}.log") for n, code in zip(order, codes, strict=True)]
        jobs = jobs_by_interval(control, logs / "emulator-jobs.json")  # this run's jobs: the emulator's records
        ok = True
        print()
        try:  # the re-runs submit no job: the emulator's bill is the new interval's
            emulator_bill: dict[str, Any] | None = control.bill()
        except requests.RequestException:
            emulator_bill = None
        for n, code, log in sorted(runs):
            ok &= show(n, n != new, code, log, jobs.pop(interval_key(n), []), demo, emulator_bill)
        for key, extra in jobs.items():  # a job for no interval this run ran: a defect
            ok = False
            print(f"unexpected jobs for {key}: {[j['name'] for j in extra]}")
        print(f"took {time.monotonic() - started:.1f}s")
        if ok:
            again = "interval 1" if new == 1 else f"intervals 1-{new}"
            print(f"run it again to score interval {new + 1} and re-run {again} from the checkpoints")
        return 0 if ok else 1
    finally:
        emulator.terminate()
        emulator.wait(timeout=10)


def run_bill(demo: Path, n: int, report: dict[str, Any]) -> dict[str, Any] | None:
    """Interval ``n``'s bill: the report task's, or ``cost.run_bill`` of the run's ``azureml_cost`` XComs
    read from the demo's metadata DB (the same values the report task combines)."""
    if isinstance(report.get("bill"), dict):
        return report["bill"]
    import contextlib
    import sqlite3

    from airflow_azureml.cost import run_bill as combine

    db = demo / "airflow" / "airflow.db"
    if not db.exists():
        return None
    with contextlib.closing(sqlite3.connect(db)) as conn:
        row = conn.execute(
            "SELECT id FROM dag_run WHERE dag_id = ? AND logical_date LIKE ? ORDER BY id DESC LIMIT 1",
            (DAG_ID, f"{interval_date(n).isoformat()}%"),
        ).fetchone()
        if row is None:
            return None
        values = [
            v
            for (v,) in conn.execute(
                "SELECT value FROM xcom WHERE dag_run_id = ? AND key = ?", (row[0], "azureml_cost")
            )
        ]
    decoded = []
    for value in values:
        while isinstance(value, (str, bytes)):
            value = json.loads(value)
        decoded.append(value)
    return combine(decoded) if decoded else None


def show_bill(bill: dict[str, Any] | None, emulator_bill: dict[str, Any] | None) -> None:
    """The run's bill (spot cost, the all-dedicated equivalent, savings), and the emulator's own beside it."""
    from airflow_azureml.cost import format_bill

    if bill is None:
        print("  bill                     not found (no task reported a cost)")
        return
    for line in format_bill(bill, title="bill of this run").splitlines():
        print(f"  {line}")
    if emulator_bill:
        for name, cluster in sorted((emulator_bill.get("clusters") or {}).items()):
            if cluster.get("node_seconds_total"):
                cost = cluster.get("cost")
                print(
                    f"  emulator's own bill      {name}: {cluster['node_seconds_total'] / 3600:.4f} node-hours, "
                    f"{'unknown' if cost is None else f'${cost:,.4f}'}"
                )


def show(
    n: int,
    rerun: bool,
    code: int,
    log: Path,
    jobs: list[dict[str, Any]],
    demo: Path,
    emulator_bill: dict[str, Any] | None = None,
) -> bool:
    """Print interval ``n``'s figures: jobs from the emulator's records, the rest from the datastore.

    True when all is right: no error logged, each row scored once, every partition a finished
    checkpoint, and for a re-run no new job; for a new interval, the preemption was resubmitted.
    """
    report_path = datastore(demo) / PREFIX / "reports" / interval_key(n) / "report.json"
    report = json.loads(report_path.read_text()) if code == 0 and report_path.exists() else None
    errors = log_errors(log)
    if report is None:
        print(f"interval {n}: DAG run failed (exit {code}); see {log}")
        for line in errors:
            print(f"    {line[:300]}")
        return False
    exact = report["rows_in"] == report["rows_scored"]
    rows = f"{report['rows_in']} / {report['rows_scored']}  ({'each row exactly once' if exact else 'MISMATCH'})"
    finished = checkpoints(demo, n)
    complete = len(finished) == report["partitions"]
    if rerun:
        what = "all" if complete else f"{len(finished)} of"
        paid = {name for state in finished for name in state.get("jobs", [])}
        print(
            f"interval {n}: {len(jobs)} new jobs ({what} {report['partitions']} partitions were finished checkpoints)"
        )
        print(f"  the checkpoints name the {len(paid)} jobs an earlier run paid for; rows in / rows scored {rows}")
        for job in jobs:  # there should be none
            print(f"    NEW {job['status']:<10} {job['compute']:<16} {job['name']}")
    else:
        preemptions = sum(1 for j in jobs if j["status"] in ("Canceled", "Failed"))
        print(f"interval {n}: {interval_date(n)}  (data interval {report['interval']}, new)")
        print(f"  partitions               {report['partitions']}")
        print(f"  jobs submitted           {len(jobs)}")
        for job in jobs:
            print(f"    {job['status']:<10} {job['compute']:<16} {job['name']}")
        print(f"  preemptions seen         {preemptions}")
        print(f"  resubmissions            {report['resubmissions']}")
        print(f"  rows in / rows scored    {rows}")
        print(f"  finished checkpoints     {len(finished)} of {report['partitions']} partitions")
        output = datastore(demo) / PREFIX / "output" / report["interval"]
        print(f"  predictions              {output}/part-*/predictions.csv")
        print("                           one line per input row, ['<file>', <prediction>], in each file's order")
        print("                           (the MLflow model's no-code output; docs/example.md)")
        show_bill(run_bill(demo, n, report), emulator_bill)
    print(f"  errors logged            {len(errors)}")
    for line in errors:
        print(f"    {line[:300]}")
    if rerun:
        return not jobs and complete and exact and not errors
    # The run must show what the demo is for: the preemption resubmitted, each row scored once.
    return complete and exact and not errors and (not jobs or report["resubmissions"] >= 1)


if __name__ == "__main__":
    sys.exit(main())
