"""What one emulated batch job costs with an MLflow model, against a plain scoring script.

Run ``python benchmarks/emulator_mlflow_jobs.py [--jobs 8]``.

Three deployments of the same shape as the example's (one node, ``mini_batch_size`` 2, four CSV files of
25 rows each, the tests' fast timing), each measured in a fresh child process of its own that starts an
emulator, registers what the deployment needs and runs ``--jobs`` batch jobs one after the other:

* ``script-stdlib``: a scoring script that needs the standard library only (main's example ``score.py``,
  a hand-set logistic scorer): the baseline;
* ``script-mlflow``: the example's custom-script deployment (``dags/azureml/score/score.py``), which loads
  the registered MLflow model with ``mlflow.sklearn``;
* ``mlflow``: the example's main deployment, the MLflow model with no scoring script (the emulator runs
  Azure's generated script, ``emulator/scoring/_mlflow_driver.py``).

Each kind runs three times, with 0 jobs, 1 job and ``--jobs`` jobs: "CPU s/job" is (``--jobs`` - 0) / ``--jobs``,
what a job costs on average including anything paid once per emulator; "later CPU" is (``--jobs`` - 1) /
(``--jobs`` - 1), what each job after the first costs.
CPU is the child's whole process tree (``os.wait4``: the emulator thread, the scoring processes and any
process they started, once reaped), wall is the mean time from submitting a job to its end as the
emulator reports it. Ratios are against ``script-stdlib`` in the same run. Only 127.0.0.1 is contacted;
the data folder is a temporary directory, removed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
MODEL = REPO / "dags" / "azureml" / "model"
SCRIPT_MLFLOW = REPO / "dags" / "azureml" / "score" / "score.py"
KINDS = ("script-stdlib", "script-mlflow", "mlflow")
API = "2024-10-01"

STDLIB_SCORE = """
import csv, math
from pathlib import Path

WEIGHTS = {"age": 0.045, "sex": 0.6, "cp": 0.35, "trestbps": 0.012, "chol": 0.006, "fbs": 0.2,
           "thalach": -0.025, "exang": 0.9, "oldpeak": 0.45}


def init():
    pass


def run(mini_batch):
    lines = []
    for file_path in mini_batch:
        with open(file_path, newline="") as handle:
            for row in csv.DictReader(handle):
                z = -3.2 + sum(w * float(row[c]) for c, w in WEIGHTS.items())
                p = 1.0 / (1.0 + math.exp(-z))
                lines.append(f"{Path(file_path).name},{row['row_id']},{p:.4f},{int(p >= 0.5)}")
    return lines
"""


# ----------------------------------------------------------------------------------- child process
def child(kind: str, jobs: int) -> dict[str, Any]:
    import requests

    from airflow_azureml.emulator import Emulator
    from airflow_azureml.emulator.behaviour import Timing
    from airflow_azureml.example_data import write_heart_csvs

    fast = Timing(provisioning=0.02, node_startup=0.05, mini_batch=0.03, command_job=0.2, tick=0.01)
    with (
        tempfile.TemporaryDirectory(prefix="bench-mlflow-jobs-") as data_dir,
        Emulator(Path(data_dir), timing=fast) as emulator,
    ):
        ws_state = emulator.workspace
        info = emulator.connection_info()
        session = requests.Session()
        session.trust_env = False
        session.verify = info["ca_cert"]

        def token(scope: str) -> str:
            form = {"grant_type": "client_credentials", "scope": scope}
            form.update(client_id=info["client_id"], client_secret=info["client_secret"])
            resp = session.post(f"{info['base_url']}/{info['tenant_id']}/oauth2/v2.0/token", data=form, timeout=30)
            resp.raise_for_status()
            return str(resp.json()["access_token"])

        session.headers["Authorization"] = f"Bearer {token(info['base_url'] + '/.default')}"
        scoring_auth = f"Bearer {token(info['aml_resource_id'] + '/.default')}"
        ws = (
            f"{info['base_url']}/subscriptions/{info['subscription_id']}/resourceGroups/{info['resource_group']}"
            f"/providers/Microsoft.MachineLearningServices/workspaces/{info['workspace']}"
        )

        def call(method: str, url: str, **kwargs: Any) -> Any:
            resp = session.request(method, url, params={"api-version": API}, timeout=60, **kwargs)
            if resp.status_code >= 300:
                raise RuntimeError(f"{method} {url}: {resp.status_code} {resp.text}")
            return resp.json()

        # the registered MLflow model (both MLflow kinds), from the workspace's datastore
        shutil.copytree(MODEL, emulator.datastore_path("models/heart-mlflow/1"))
        emulator.call(
            lambda: ws_state.put_model_version(
                "heart-mlflow",
                "1",
                {
                    "properties": {
                        "modelUri": "azureml://datastores/workspaceblobstore/paths/models/heart-mlflow/1",
                        "modelType": "mlflow_model",
                    }
                },
            )
        )
        model = "heart-classifier" if kind == "script-stdlib" else "heart-mlflow"
        props: dict[str, Any] = {
            "compute": "azureml:cpu-cluster",
            # the baseline's model is the emulator's built-in demo model, not an MLflow model
            "model": {"referenceType": "Id", "assetId": f"azureml:{model}:1"},
            "miniBatchSize": 2,
            "maxConcurrencyPerInstance": 2,
            "resources": {"instanceCount": 1},
        }
        if kind.startswith("script-"):

            def code_version() -> str:
                container = ws_state.blobs.create_container()
                folder = ws_state.blobs.root / container.name
                if kind == "script-stdlib":
                    (folder / "score.py").write_text(STDLIB_SCORE)
                else:
                    shutil.copy(SCRIPT_MLFLOW, folder / "score.py")
                ws_state.codes.put(
                    "bench-code", "1", {"properties": {"codeUri": ws_state.blobs.container_url(container)}}
                )
                return "/subscriptions/x/codes/bench-code/versions/1"

            code_id = emulator.call(code_version)
            props["codeConfiguration"] = {"codeId": code_id, "scoringScript": "score.py"}
            props["environmentId"] = "azureml://registries/azureml/environments/sklearn-1.5/labels/latest"
        call(
            "PUT",
            f"{ws}/computes/cpu-cluster",
            json={
                "location": "eastus",
                "properties": {
                    "computeType": "AmlCompute",
                    "properties": {
                        "vmSize": "STANDARD_DS3_V2",
                        "vmPriority": "Dedicated",
                        "scaleSettings": {"minNodeCount": 0, "maxNodeCount": 4},
                    },
                },
            },
        )
        endpoint = call("PUT", f"{ws}/batchEndpoints/heart", json={"location": "eastus", "properties": {}})
        call("PUT", f"{ws}/batchEndpoints/heart/deployments/blue", json={"location": "eastus", "properties": props})
        write_heart_csvs(emulator.datastore_path("in"), files=4, rows_per_file=25)
        walls: list[float] = []
        for index in range(jobs):
            name = f"bench-{kind}-{index}"
            started = time.monotonic()
            call(
                "POST",
                endpoint["properties"]["scoringUri"],
                headers={"azureml-model-deployment": "blue", "Authorization": scoring_auth},
                json={
                    "properties": {
                        "name": name,
                        "inputData": {
                            "x": {
                                "jobInputType": "UriFolder",
                                "uri": "azureml://datastores/workspaceblobstore/paths/in/",
                            }
                        },
                    }
                },
            )
            deadline = started + 120
            while (job := emulator.job(name)).status not in ("Completed", "Failed", "Canceled"):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"job {name} did not end")
                time.sleep(0.01)
            walls.append(time.monotonic() - started)
            if job.status != "Completed" or job.rows_scored != 100:
                raise RuntimeError(f"job {name}: {job.status}, {job.rows_scored} rows, {job.error}")
    return {"kind": kind, "jobs": jobs, "walls": walls}


# ---------------------------------------------------------------------------------------- parent
def measure(kind: str, jobs: int) -> dict[str, Any]:
    env = dict(os.environ, MLFLOW_DISABLE_TELEMETRY="true", DO_NOT_TRACK="true")
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", kind, "--jobs", str(jobs)]
    started = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, env=env, cwd=REPO, text=True)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    out = proc.stdout.read() if proc.stdout else ""
    if proc.returncode != 0:
        raise RuntimeError(f"{kind} with {jobs} jobs: exit {proc.returncode}")
    result = json.loads(out.strip().splitlines()[-1])
    result["cpu"] = usage.ru_utime + usage.ru_stime
    result["total_wall"] = time.monotonic() - started
    result["maxrss_mb"] = usage.ru_maxrss / 1024
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=8, help="batch jobs per kind (default 8)")
    parser.add_argument("--kinds", default=",".join(KINDS), help=f"comma-separated, of {', '.join(KINDS)}")
    parser.add_argument("--child", choices=KINDS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(child(args.child, args.jobs)), flush=True)
        return 0
    kinds = [k for k in args.kinds.split(",") if k]
    if args.jobs < 2:
        parser.error("--jobs must be >= 2")
    if "script-stdlib" not in kinds:
        kinds.insert(0, "script-stdlib")
    rows: dict[str, dict[str, float]] = {}
    for kind in kinds:
        print(f"{kind}: 0 jobs, 1 job, then {args.jobs} jobs...", flush=True)
        empty, one, full = measure(kind, 0), measure(kind, 1), measure(kind, args.jobs)
        rows[kind] = {
            "cpu": (full["cpu"] - empty["cpu"]) / args.jobs,
            "cpu_later": (full["cpu"] - one["cpu"]) / (args.jobs - 1),
            "wall": sum(full["walls"]) / len(full["walls"]),
            "first": full["walls"][0],
            "rest": sum(full["walls"][1:]) / max(1, len(full["walls"]) - 1),
            "rss": full["maxrss_mb"],
        }
    base = rows["script-stdlib"]
    print()
    print(f"{args.jobs} sequential batch jobs per kind (4 files x 25 rows, 1 node); {os.cpu_count()} CPUs")
    header = (
        f"{'kind':<15}{'CPU s/job':>10}{'x base':>8}{'later CPU':>10}{'x base':>8}{'wall s/job':>11}{'x base':>8}"
        f"{'1st job s':>10}{'later s':>9}{'x base':>8}{'max RSS MB':>11}"
    )
    print(header)
    print("-" * len(header))
    for kind, r in rows.items():
        print(
            f"{kind:<15}{r['cpu']:>10.3f}{r['cpu'] / base['cpu']:>8.1f}"
            f"{r['cpu_later']:>10.3f}{r['cpu_later'] / base['cpu_later']:>8.1f}"
            f"{r['wall']:>11.3f}{r['wall'] / base['wall']:>8.1f}"
            f"{r['first']:>10.3f}{r['rest']:>9.3f}{r['rest'] / base['rest']:>8.1f}{r['rss']:>11.0f}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
