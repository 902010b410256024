"""Partition helpers shared by the example DAGs: the ETL, the checkpoint plan, and the exactly-once report.

Not a DAG (listed in .airflowignore). Storage is reached through ``ObjectStoragePath`` at
``AZUREML_DATASTORE_ROOT``: a local folder for the emulator, ``abfs://...`` for a real datastore.
"""

from __future__ import annotations

import csv
import io
import json
import os
from typing import Any

from airflow.sdk import ObjectStoragePath

DATASTORE = "workspaceblobstore"
HEADER = ["row_id", "age", "sex", "cp", "trestbps", "chol", "fbs", "restecg", "thalach", "exang", "oldpeak"]


def datastore_root() -> str:
    return os.environ.get("AZUREML_DATASTORE_ROOT", "file:///tmp/azureml-datastore/workspaceblobstore").rstrip("/")


def storage(relative: str) -> ObjectStoragePath:
    return ObjectStoragePath(f"{datastore_root()}/{relative.strip('/')}")


def datastore_uri(relative: str) -> str:
    return f"azureml://datastores/{DATASTORE}/paths/{relative.strip('/')}/"


def interval_key(start: Any) -> str:
    return start.strftime("%Y%m%dT%H%M")


def write_partitions(prefix: str, interval: str, seed: int, partitions: int, files: int, rows: int) -> list[dict]:
    """Write the interval's records as partition folders. Idempotent: ``_SUCCESS`` marks a finished one."""
    from airflow_azureml.emulator.scoring.data import heart_rows

    result = []
    for k in range(partitions):
        folder = f"{prefix}/input/{interval}/part-{k:03d}"
        if not (storage(folder) / "_SUCCESS").exists():
            storage(folder).mkdir(parents=True, exist_ok=True)
            for f in range(files):
                buffer = io.StringIO()
                writer = csv.writer(buffer)
                writer.writerow(HEADER)
                writer.writerows(
                    heart_rows(rows, seed=seed + 1000 * k + f, id_prefix=f"{interval}-{k:03d}-", start=f * rows)
                )
                (storage(folder) / f"records-{f:03d}.csv").write_text(buffer.getvalue())
            (storage(folder) / "_SUCCESS").write_text(str(files * rows))
        result.append({"partition": k, "input": folder, "output": f"{prefix}/output/{interval}/part-{k:03d}"})
    return result


def pending(partitions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The checkpoint: invoke kwargs for the partitions that have no predictions yet."""
    todo = []
    for p in partitions:
        if (storage(p["output"]) / "predictions.csv").exists():
            print(f"partition {p['partition']}: predictions exist, skipping without a job")
            continue
        todo.append(
            {
                "inputs": {"heart_dataset": datastore_uri(p["input"])},
                "outputs": {"score": datastore_uri(p["output"])},
                "job_identity": p["input"],
            }
        )
    return todo


def report(prefix: str, interval: str, partitions: list[dict[str, Any]], results: list[dict] | None) -> dict:
    """Rows in must equal rows scored, each row exactly once, in every partition; writes report.json."""
    rows_in = rows_scored = 0
    problems = []
    for p in partitions:
        inputs: set[str] = set()
        for path in sorted(storage(p["input"]).glob("*.csv")):
            inputs |= {r["row_id"] for r in csv.DictReader(io.StringIO(path.read_text()))}
        scored = [line.split(",")[1] for line in (storage(p["output"]) / "predictions.csv").read_text().splitlines()]
        rows_in += len(inputs)
        rows_scored += len(scored)
        if len(scored) != len(set(scored)) or set(scored) != inputs:
            problems.append(
                f"partition {p['partition']}: {len(inputs)} in, {len(scored)} scored "
                f"({len(scored) - len(set(scored))} duplicated, {len(inputs - set(scored))} missing)"
            )
    results = [r for r in (results or []) if r]
    summary = {
        "interval": interval,
        "partitions": len(partitions),
        "partitions_scored_this_run": len(results),
        "jobs": sorted({name for r in results for name in r["job_names"]}),
        "resubmissions": sum(r["resubmits"] for r in results),
        "preemptions": sum(r["preemptions"] for r in results),
        "rows_in": rows_in,
        "rows_scored": rows_scored,
        "predictions": [str(storage(p["output"]) / "predictions.csv") for p in partitions],
    }
    folder = storage(f"{prefix}/reports/{interval}")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "report.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))
    if problems:
        raise ValueError("exactly-once check failed: " + "; ".join(problems))
    return summary
