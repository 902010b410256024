"""How long a preempted unit of work waits before its next job is submitted.

Issue 11's bound: from the preemption being observed to the next job being submitted, at most one
poll interval + 5 s (a job resubmitted after a whole-cluster preemption waits in Azure's queue at
no cost, so there is no fixed back-off). Measured here more strictly, from the moment the
preempted job *ended* in the emulator (so the wait's own detection delay, up to one poll
interval, is inside the figure) to the moment the emulator created the next job.

For each path (polling in the worker, deferred to the triggerer), one ``dag.test()`` run of an
invoke task whose first ``--preemptions`` jobs are preempted (Azure's ``PreemptionError`` form)
as soon as they run. The baseline in the same run is the old behaviour, a back-off before every
resubmission (``--baseline-backoff`` seconds, doubling); the ratio of the two is printed.

    python benchmarks/resubmit_latency.py [--interval 3] [--preemptions 2] [--baseline-backoff 5]
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
SLACK = 5.0  # seconds allowed on top of one poll interval


def preempt_running_jobs(emulator: Any, count: int, stop: threading.Event) -> None:
    """Preempt the cluster whenever a job not yet preempted is Running, ``count`` times."""
    done: set[str] = set()
    while not stop.is_set() and len(done) < count:
        running = [j.name for j in emulator.jobs() if j.status == "Running" and j.name not in done]
        if running:
            done.update(running)
            emulator.preempt_cluster("low-pri-cluster", form="failed")
        time.sleep(0.02)


DAG_FILE = """
import json, os
import pendulum
from airflow.sdk import DAG
from airflow_azureml.operators import AzureMLInvokeBatchEndpointOperator

CASE = json.loads(os.environ["RESUBMIT_LATENCY_CASE"])
with DAG(CASE["dag_id"], schedule=None, start_date=pendulum.datetime(2026, 11, 1, tz="UTC")) as dag:
    AzureMLInvokeBatchEndpointOperator(
        task_id="score",
        endpoint_name="heart-classifier-batch",
        deployment_name="classifier-mlflow",
        inputs={"heart_dataset": "azureml://datastores/workspaceblobstore/paths/in/latency/"},
        outputs={"score": "azureml://datastores/workspaceblobstore/paths/out/" + CASE["dag_id"] + "/"},
        max_resubmits=CASE["preemptions"],
        loop_after=CASE["loop_after"],
        resubmit_backoff=CASE["backoff"],
        deferrable=CASE["deferrable"],
        polling={"interval": CASE["interval"], "max_interval": CASE["interval"], "jitter": 0.0},
    )
"""


def load_dag(path: Path) -> Any:
    import importlib.util

    from airflow.sdk import DAG

    spec = importlib.util.spec_from_file_location(f"latency_{time.monotonic_ns()}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return next(v for v in vars(module).values() if isinstance(v, DAG))


def run_case(emulator: Any, label: str, *, deferrable: bool, args: argparse.Namespace, backoff: float) -> list[float]:
    import json

    import pendulum

    before = {j.name for j in emulator.jobs()}
    case = {
        "dag_id": f"resubmit_latency_{label}",
        "preemptions": args.preemptions,
        "loop_after": args.preemptions if backoff == 0 else 0,
        "backoff": backoff,
        "deferrable": deferrable,
        "interval": args.interval,
    }
    os.environ["RESUBMIT_LATENCY_CASE"] = json.dumps(case)
    dag = load_dag(Path(os.environ["AIRFLOW__CORE__DAGS_FOLDER"]) / "resubmit_latency_dag.py")
    day = pendulum.datetime(2026, 11, 1, tz="UTC")
    stop = threading.Event()
    injector = threading.Thread(target=preempt_running_jobs, args=(emulator, args.preemptions, stop), daemon=True)
    injector.start()
    try:
        run = dag.test(logical_date=day)
    finally:
        stop.set()
        injector.join(5)
    if str(run.state) != "success":
        raise SystemExit(f"{label}: the run ended {run.state}")
    jobs = sorted((j for j in emulator.jobs() if j.name not in before), key=lambda j: j.created)
    if len(jobs) != args.preemptions + 1:
        raise SystemExit(f"{label}: expected {args.preemptions + 1} jobs, found {[j.name for j in jobs]}")
    return [(nxt.created - prev.ended).total_seconds() for prev, nxt in itertools.pairwise(jobs)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--interval", type=float, default=3.0, help="poll interval, seconds (no adaptive growth)")
    parser.add_argument("--preemptions", type=int, default=2, help="preemptions per run")
    parser.add_argument("--baseline-backoff", type=float, default=5.0, help="the old fixed back-off, seconds")
    args = parser.parse_args()

    home = Path(tempfile.mkdtemp(prefix="resubmit-latency-"))
    os.environ.update(
        {
            "AIRFLOW_HOME": str(home),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__DAGS_FOLDER": str(home / "dags"),
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
            "AIRFLOW__LOGGING__LOGGING_LEVEL": "WARNING",
        }
    )
    (home / "dags").mkdir()
    (home / "dags" / "resubmit_latency_dag.py").write_text(DAG_FILE)
    subprocess.run([sys.executable, "-m", "airflow", "db", "migrate"], check=True, capture_output=True)

    from azure.ai.ml import load_compute
    from azure.ai.ml.entities import BatchEndpoint
    from azure.ai.ml.entities._load_functions import load_model_batch_deployment

    from airflow_azureml.emulator import Emulator, Timing
    from airflow_azureml.emulator.scoring.data import write_heart_csvs
    from airflow_azureml.hooks import AzureMLHook

    timing = Timing(provisioning=0.05, node_startup=0.5, mini_batch=0.1, command_job=0.5, tick=0.02)
    rows: list[tuple[str, list[float]]] = []
    try:
        with Emulator(home / "emulator", timing=timing) as emulator:
            os.environ["AIRFLOW_CONN_AZURE_ML_DEFAULT"] = emulator.connection_info()["airflow_conn_json"]
            ml = AzureMLHook().get_conn()
            ml.compute.begin_create_or_update(
                load_compute(source=str(REPO / "dags/azureml/low-pri-cluster.yml"))
            ).result()
            ml.batch_endpoints.begin_create_or_update(BatchEndpoint(name="heart-classifier-batch")).result()
            deployment = load_model_batch_deployment(source=str(REPO / "dags/azureml/deployment.yml"))
            ml.batch_deployments.begin_create_or_update(deployment).result()
            write_heart_csvs(emulator.datastore_path("in/latency"), files=8, rows_per_file=5)
            for label, deferrable, backoff in (
                ("polling", False, 0.0),
                ("deferred", True, 0.0),
                ("polling_fixed_backoff", False, args.baseline_backoff),
                ("deferred_fixed_backoff", True, args.baseline_backoff),
            ):
                print(f"  running {label} ...", file=sys.stderr)
                rows.append((label, run_case(emulator, label, deferrable=deferrable, args=args, backoff=backoff)))
    finally:
        import shutil

        shutil.rmtree(home, ignore_errors=True)

    bound = args.interval + SLACK
    print(f"\npoll interval {args.interval:.1f}s (fixed), bound = interval + {SLACK:.0f}s = {bound:.1f}s")
    print("latency = preempted job ended -> next job created, per resubmission (emulator clock)")
    print(f"{'path':<26}{'n':>3}{'p50 s':>8}{'max s':>8}{'max/bound':>11}  verdict")
    table = {label: values for label, values in rows}
    for label, values in rows:
        worst = max(values)
        verdict = ("OK" if worst <= bound else "MISS") if "fixed" not in label else "baseline"
        median = statistics.median(values)
        print(f"{label:<26}{len(values):>3}{median:>8.2f}{worst:>8.2f}{worst / bound:>11.2f}  {verdict}")
    for path in ("polling", "deferred"):
        ours, base = statistics.median(table[path]), statistics.median(table[f"{path}_fixed_backoff"])
        print(
            f"{path}: median latency {ours:.2f}s vs {base:.2f}s with the old back-off "
            f"({args.baseline_backoff:.0f}s, doubling): x{ours / base:.2f}"
        )
    return 0 if all(max(v) <= bound for label, v in rows if "fixed" not in label) else 1


if __name__ == "__main__":
    raise SystemExit(main())
