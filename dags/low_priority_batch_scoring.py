"""Score each data interval's heart-disease records on a low-priority (spot) Azure ML cluster.

Steps:
1. setup: create the low-priority cluster and the batch deployment (idempotent, from the
   az ml CLI YAML in ``dags/azureml/``, as the Azure docs show them);
2. extract: write the interval's input as K partition folders of CSV files on the datastore;
3. plan + score: one mapped invoke task per *unfinished* partition. Partitions are the
   checkpoints: a partition whose predictions already exist is not submitted again, and each
   job's name derives from (interval, partition), so a retry, a clear or a backfill reattaches
   to or reuses the job instead of paying for a second one. Whole-cluster preemptions are
   resubmitted by the operator;
4. report: check rows in = rows scored, each row exactly once, and summarise;
5. teardown: delete the cluster, even when scoring fails.

The same file runs against Azure and against the local emulator; only the ``azure_ml_default``
connection and ``AZUREML_DATASTORE_ROOT`` (where the workspace's blob datastore is mounted or
reachable through fsspec, e.g. ``abfs://container@account.dfs.core.windows.net``) differ.
"""

from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path
from typing import Any

import pendulum
from airflow.sdk import DAG, ObjectStoragePath, Param, task

from airflow_azureml.operators import (
    AzureMLCreateBatchDeploymentOperator,
    AzureMLCreateComputeClusterOperator,
    AzureMLDeleteComputeOperator,
    AzureMLInvokeBatchEndpointOperator,
)

CONFIG = Path(__file__).parent / "azureml"
CLUSTER = "low-pri-cluster"
ENDPOINT = "heart-classifier-batch"
DEPLOYMENT = "classifier-xgboost"
DATASTORE = "workspaceblobstore"
DATASTORE_ROOT = os.environ.get("AZUREML_DATASTORE_ROOT", "file:///tmp/azureml-datastore/workspaceblobstore")
POLL_SECONDS = float(os.environ.get("AZUREML_POLL_SECONDS", "30"))
RESUBMIT_BACKOFF = float(os.environ.get("AZUREML_RESUBMIT_BACKOFF_SECONDS", "60"))
# Waiting in the triggerer frees the worker slot for the hours a batch job can take.
DEFERRABLE = os.environ.get("AZUREML_DEFERRABLE", "true").lower() == "true"
HEADER = ["row_id", "age", "sex", "cp", "trestbps", "chol", "fbs", "restecg", "thalach", "exang", "oldpeak"]


def interval_path(start: pendulum.DateTime) -> str:
    return start.strftime("%Y%m%dT%H%M")


def datastore_uri(relative: str) -> str:
    return f"azureml://datastores/{DATASTORE}/paths/{relative.strip('/')}/"


def storage(relative: str) -> ObjectStoragePath:
    return ObjectStoragePath(f"{DATASTORE_ROOT.rstrip('/')}/{relative.strip('/')}")


with DAG(
    dag_id="low_priority_batch_scoring",
    schedule="@daily",
    start_date=pendulum.datetime(2026, 11, 1, tz="UTC"),
    catchup=False,
    max_active_runs=2,
    default_args={"retries": 2, "retry_delay": pendulum.duration(seconds=5)},
    params={
        "partitions": Param(4, type="integer", minimum=1, maximum=64),
        "files_per_partition": Param(6, type="integer", minimum=1),
        "rows_per_file": Param(25, type="integer", minimum=1),
    },
    tags=["azureml", "low-priority", "example"],
    doc_md=__doc__,
) as dag:
    create_cluster = AzureMLCreateComputeClusterOperator(
        task_id="create_low_priority_cluster", compute=str(CONFIG / "low-pri-cluster.yml")
    )
    create_deployment = AzureMLCreateBatchDeploymentOperator(
        task_id="create_batch_deployment", deployment=str(CONFIG / "deployment.yml")
    )

    @task
    def extract(params: dict[str, Any], data_interval_start: pendulum.DateTime) -> list[dict[str, Any]]:
        """Write the interval's records as partition folders; idempotent, a marker file marks a finished one."""
        from airflow_azureml.emulator.scoring.data import heart_rows

        interval = interval_path(data_interval_start)
        seed = int(data_interval_start.timestamp())
        partitions = []
        for k in range(params["partitions"]):
            folder = f"scoring/input/{interval}/part-{k:03d}"
            rows = params["files_per_partition"] * params["rows_per_file"]
            if not (storage(folder) / "_SUCCESS").exists():
                storage(folder).mkdir(parents=True, exist_ok=True)
                for f in range(params["files_per_partition"]):
                    buffer = io.StringIO()
                    writer = csv.writer(buffer)
                    writer.writerow(HEADER)
                    writer.writerows(
                        heart_rows(
                            params["rows_per_file"],
                            seed=seed + 1000 * k + f,
                            id_prefix=f"{interval}-{k:03d}-",
                            start=f * params["rows_per_file"],
                        )
                    )
                    (storage(folder) / f"records-{f:03d}.csv").write_text(buffer.getvalue())
                (storage(folder) / "_SUCCESS").write_text(str(rows))
            partitions.append(
                {"partition": k, "input": folder, "output": f"scoring/output/{interval}/part-{k:03d}", "rows": rows}
            )
        return partitions

    @task
    def plan(partitions: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The checkpoint: only partitions without predictions for this interval are scored."""
        pending = []
        for p in partitions:
            if (storage(p["output"]) / "predictions.csv").exists():
                print(f"partition {p['partition']}: predictions exist, skipping without a job")
                continue
            pending.append(
                {
                    "inputs": {"heart_dataset": datastore_uri(p["input"])},
                    "outputs": {"score": datastore_uri(p["output"])},
                    "job_identity": f"{p['input']}",
                }
            )
        return pending

    score = AzureMLInvokeBatchEndpointOperator.partial(
        task_id="score_partition",
        endpoint_name=ENDPOINT,
        deployment_name=DEPLOYMENT,
        max_resubmits=3,
        resubmit_backoff=RESUBMIT_BACKOFF,
        deferrable=DEFERRABLE,
        polling={"interval": POLL_SECONDS, "max_interval": max(POLL_SECONDS, 300.0)},
        map_index_template="{{ task.job_identity }}",
    ).expand_kwargs(plan(extracted := extract()))

    @task(trigger_rule="none_failed")
    def report(
        partitions: list[dict[str, Any]], results: list[dict[str, Any]] | None, data_interval_start: pendulum.DateTime
    ) -> dict[str, Any]:
        """Rows in must equal rows scored, each row exactly once, in every partition."""
        rows_in = rows_scored = 0
        problems = []
        for p in partitions:
            inputs = set()
            for path in sorted(storage(p["input"]).glob("*.csv")):
                inputs |= {r["row_id"] for r in csv.DictReader(io.StringIO(path.read_text()))}
            scored = [
                line.split(",")[1] for line in (storage(p["output"]) / "predictions.csv").read_text().splitlines()
            ]
            rows_in += len(inputs)
            rows_scored += len(scored)
            if len(scored) != len(set(scored)) or set(scored) != inputs:
                problems.append(
                    f"partition {p['partition']}: {len(inputs)} in, {len(scored)} scored "
                    f"({len(scored) - len(set(scored))} duplicated, {len(inputs - set(scored))} missing)"
                )
        results = [r for r in (results or []) if r]
        summary = {
            "interval": interval_path(data_interval_start),
            "partitions": len(partitions),
            "partitions_scored_this_run": len(results),
            "jobs": sorted({name for r in results for name in r["job_names"]}),
            "resubmissions": sum(r["resubmits"] for r in results),
            "preemptions": sum(r["preemptions"] for r in results),
            "rows_in": rows_in,
            "rows_scored": rows_scored,
            "predictions": [str(storage(p["output"]) / "predictions.csv") for p in partitions],
        }
        report_folder = storage(f"scoring/reports/{summary['interval']}")
        report_folder.mkdir(parents=True, exist_ok=True)
        (report_folder / "report.json").write_text(json.dumps(summary, indent=2))
        print(json.dumps(summary, indent=2))
        if problems:
            raise ValueError("exactly-once check failed: " + "; ".join(problems))
        return summary

    delete_cluster = AzureMLDeleteComputeOperator(task_id="delete_cluster", name=CLUSTER)

    checked = report(extracted, score.output)
    create_cluster >> create_deployment >> extracted
    checked >> delete_cluster
    delete_cluster.as_teardown(setups=create_cluster)
