"""Partition helpers shared by the example DAGs: the ETL, the checkpoint plan, and the exactly-once report.

Not a DAG (listed in .airflowignore). Storage is reached through ``ObjectStoragePath`` at
``AZUREML_DATASTORE_ROOT``: a local folder for the emulator, ``abfs://...`` for a real datastore.
"""

from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path
from typing import Any

import pendulum
import yaml
from airflow.sdk import ObjectStoragePath

from airflow_azureml.exceptions import AirflowFailException

DATASTORE = "workspaceblobstore"
HEADER = ["row_id", "age", "sex", "cp", "trestbps", "chol", "fbs", "restecg", "thalach", "exang", "oldpeak"]


def datastore_root() -> str:
    """``AZUREML_DATASTORE_ROOT``, required: with no default, a forgotten setting cannot send the data to the
    worker's own disk, where no Azure ML job would ever read it."""
    root = os.environ.get("AZUREML_DATASTORE_ROOT", "").strip()
    if not root:
        raise ValueError(
            "AZUREML_DATASTORE_ROOT is not set: set it, on the DAG processor and every worker, to where the "
            "workspace's workspaceblobstore container is reachable (abfs://<container>@<account>.dfs.core.windows"
            ".net with AZUREML_STORAGE_CONN_ID, or a mounted folder as file:///mnt/blobstore; the emulator "
            "prints its own). Nothing was written."
        )
    return root.rstrip("/")


def storage(relative: str) -> ObjectStoragePath:
    """``relative`` under the root. ``abfs[s]://container@account.dfs.core.windows.net[/prefix]``, the
    ADLS Gen2 URI Azure documents, becomes ``abfs://container/prefix`` on the Airflow connection named
    by ``AZUREML_STORAGE_CONN_ID`` (an ``adls``/``wasb`` connection for that account): Airflow's
    ``ObjectStoragePath`` would read ``container`` as a connection id and drop the account.
    """
    root = datastore_root()
    scheme, _, rest = root.partition("://")
    netloc, _, prefix = rest.partition("/")
    container, at, host = netloc.rpartition("@")
    if scheme in ("abfs", "abfss") and at and "." in host:
        conn_id = os.environ.get("AZUREML_STORAGE_CONN_ID")
        if not conn_id:
            raise ValueError(
                f"AZUREML_DATASTORE_ROOT={root!r} is on storage account {host.split('.', 1)[0]!r}: set "
                "AZUREML_STORAGE_CONN_ID to an Airflow connection (type adls or wasb) for that account."
            )
        key = "/".join(part for part in (prefix.strip("/"), relative.strip("/")) if part)
        return ObjectStoragePath(f"{scheme}://{container}/{key}", conn_id=conn_id)
    return ObjectStoragePath(f"{root}/{relative.strip('/')}")


def datastore_uri(relative: str) -> str:
    return f"azureml://datastores/{DATASTORE}/paths/{relative.strip('/')}/"


def config_name(yaml_file: Path, key: str = "name") -> str:
    """A name from the az ml CLI YAML (endpoint, deployment, compute), so that it is defined in one place."""
    value = yaml.safe_load(yaml_file.read_text()).get(key)
    if not isinstance(value, str) or not value:
        raise ValueError(f"{yaml_file} has no {key!r}")
    return value


def config_datastore_path(yaml_file: Path, key: str = "path") -> str:
    """The datastore-relative folder an ``azureml://datastores/...`` URI in the az ml CLI YAML names (a model's
    ``path``), so that where the example copies a model to and where it registers it from agree."""
    from airflow_azureml.assets import parse_datastore_uri

    parsed = parse_datastore_uri(config_name(yaml_file, key))
    if parsed is None or parsed.datastore != DATASTORE or not parsed.path:
        raise ValueError(f"{yaml_file}: {key} is not a folder on the datastore {DATASTORE}")
    return parsed.path


class ExactlyOnceCheckError(AirflowFailException, ValueError):
    """The report's check found rows lost or duplicated. An ``AirflowFailException``: the same outputs would
    fail it again, so it fails at once, while a report whose worker died is retried like any task."""


def retry_args(first_delay_seconds: float) -> dict[str, Any]:
    """Retries that outlast Azure's throttling and short outages: ``first_delay_seconds`` doubling (with
    Airflow's jitter) up to 30 minutes. Airflow 3.1 takes ``retry_exponential_backoff`` as a bool (base 2);
    3.2 made it the multiplier, where ``True`` would mean 1, no back-off at all."""
    from airflow import __version__ as airflow_version
    from packaging.version import Version

    doubling: bool | float = True if Version(airflow_version) < Version("3.2") else 2.0
    return {
        "retries": 3,
        "retry_delay": pendulum.duration(seconds=first_delay_seconds),
        "retry_exponential_backoff": doubling,
        "max_retry_delay": pendulum.duration(minutes=30),
    }


def interval_key(start: Any) -> str:
    return start.strftime("%Y%m%dT%H%M")


def interval_start(data_interval_start: Any, dag_run: Any) -> pendulum.DateTime:
    """The start of the interval a run works on; its key (``interval_key``) names the run's partitions.

    A run with a data interval (scheduled, backfilled, ``airflow dags test <date>``, the REST API with a
    ``logical_date``) works on its data interval's start, as before. In Airflow 3 a run with no logical date
    (``airflow dags trigger`` without ``--logical-date``, the UI's Trigger button, the REST API with
    ``"logical_date": null``) has no data interval: ``data_interval_start`` is not in its context. Such a
    run works on the minute it was triggered in: its ``run_after``, down to the minute (interval keys have
    minute resolution), which is the interval that a run given that minute as its logical date has (with
    Airflow 3's ``@daily``, a ``CronTriggerTimetable``, and with ``schedule=None``). Each manual run thus
    scores new data, and two runs triggered in the same minute are the same interval: the same
    partitions, the same jobs, scored once.
    """
    if data_interval_start is not None:
        return data_interval_start
    if dag_run is None or getattr(dag_run, "run_after", None) is None:
        raise ValueError("this run has neither a data interval nor a run_after: pass a logical date")
    return pendulum.instance(dag_run.run_after).in_timezone("UTC").replace(second=0, microsecond=0)


def _marker(prefix: str, interval: str, k: int) -> ObjectStoragePath:
    """The ETL's ``_SUCCESS`` marker: beside the input folder, never in it (it would be scored as input)."""
    return storage(f"{prefix}/markers/{interval}/part-{k:03d}._SUCCESS")


def _layout(prefix: str, interval: str, partitions: int, files: int, rows: int) -> tuple[int, int, int]:
    """The interval's partition layout, fixed the first time the interval is written.

    Partitions are the checkpoints and job identities: re-partitioning an interval that was already (even
    partly) scored would score its rows again under new identities. So a changed ``partitions``,
    ``files_per_partition`` or ``rows_per_file`` param applies to intervals not written yet; an interval
    written before keeps its layout, and the run says so. (An interval written by a version without a
    layout file keeps the number of partitions its markers show.)
    """
    wanted = {"partitions": partitions, "files_per_partition": files, "rows_per_file": rows}
    path = storage(f"{prefix}/layouts/{interval}.json")
    if path.exists():
        fixed = json.loads(path.read_text())
    else:
        markers = storage(f"{prefix}/markers/{interval}")
        written = sorted(markers.glob("part-*._SUCCESS")) if markers.exists() else []
        fixed = {**wanted, "partitions": len(written)} if written else wanted
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(fixed, indent=2))
    if fixed != wanted:
        print(
            f"interval {interval} keeps the layout it was first written with, {json.dumps(fixed)}; this run's "
            f"params ask for {json.dumps(wanted)}, which applies to intervals not written yet. To lay this "
            f"interval out again, delete {prefix}/{{input,markers,layouts,checkpoints,output}}/{interval} first."
        )
    return fixed["partitions"], fixed["files_per_partition"], fixed["rows_per_file"]


def write_partitions(prefix: str, interval: str, seed: int, partitions: int, files: int, rows: int) -> list[dict]:
    """Write the interval's records as partition folders. Idempotent: a marker records a finished one, and
    the layout is the one the interval was first written with (``_layout``)."""
    from airflow_azureml.example_data import heart_rows

    partitions, files, rows = _layout(prefix, interval, partitions, files, rows)
    result = []
    for k in range(partitions):
        folder = f"{prefix}/input/{interval}/part-{k:03d}"
        legacy = storage(folder) / "_SUCCESS"  # where older versions put it: inside the input
        if legacy.exists():
            legacy.unlink()
            _marker(prefix, interval, k).parent.mkdir(parents=True, exist_ok=True)
            _marker(prefix, interval, k).write_text(str(files * rows))
        if not _marker(prefix, interval, k).exists():
            storage(folder).mkdir(parents=True, exist_ok=True)
            for f in range(files):
                buffer = io.StringIO()
                writer = csv.writer(buffer)
                writer.writerow(HEADER)
                writer.writerows(
                    heart_rows(rows, seed=seed + 1000 * k + f, id_prefix=f"{interval}-{k:03d}-", start=f * rows)
                )
                (storage(folder) / f"records-{f:03d}.csv").write_text(buffer.getvalue())
            _marker(prefix, interval, k).parent.mkdir(parents=True, exist_ok=True)
            _marker(prefix, interval, k).write_text(str(files * rows))
        result.append({"partition": k, "input": folder, "output": f"{prefix}/output/{interval}/part-{k:03d}"})
    return result


def publish_model(local_folder: str, relative: str) -> str:
    """Copy the model's files (``dags/azureml/model/``) to the datastore folder ``relative``; its URI.

    The model version is registered from there (``dags/azureml/model.yml``): a datastore path works the
    same on Azure and on the emulator, which cannot take the SDK's upload of a local folder (docs/emulator.md).
    Idempotent: the same files again change nothing a registered version points at.
    """
    from pathlib import Path

    target = storage(relative)
    target.mkdir(parents=True, exist_ok=True)
    for path in sorted(Path(local_folder).iterdir()):
        if path.is_file():
            (target / path.name).write_bytes(path.read_bytes())
    return datastore_uri(relative)


# ------------------------------------------------------------------ checkpoints: verified partitions only
def _state_path(p: dict[str, Any]) -> ObjectStoragePath:
    prefix, _, rest = p["output"].partition("/output/")
    return storage(f"{prefix}/checkpoints/{rest}.json")


def checkpoint(p: dict[str, Any]) -> dict[str, Any]:
    """``{"attempt": n, "verified": bool, ...}``: a partition is finished only once verified."""
    path = _state_path(p)
    return json.loads(path.read_text()) if path.exists() else {"attempt": 0, "verified": False}


def _save_checkpoint(p: dict[str, Any], state: dict[str, Any]) -> None:
    """Written beside, then renamed over: a task killed mid-write leaves the old checkpoint, never half a
    JSON file that every later plan and report would fail to read."""
    path = _state_path(p)
    path.parent.mkdir(parents=True, exist_ok=True)
    written = path.parent / f"{path.name}.{os.getpid()}.tmp"
    written.write_text(json.dumps(state, indent=2))
    written.rename(path)


def attempt_output(p: dict[str, Any], attempt: int) -> str:
    """Each redo writes to a fresh folder, so a rejected output is never appended to or mixed in."""
    return p["output"] if attempt == 0 else f"{p['output']}-redo-{attempt}"


def attempt_identity(p: dict[str, Any], attempt: int) -> str:
    """The unit of work of an attempt: a redo is new work, so it gets a new job, not the rejected one."""
    return p["input"] if attempt == 0 else f"{p['input']}#redo-{attempt}"


def pending(partitions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The checkpoint: invoke kwargs for every partition that is not verified yet (new, running or rejected)."""
    todo = []
    for p in partitions:
        state = checkpoint(p)
        if state.get("verified"):
            print(f"partition {p['partition']}: verified output exists, skipping without a job")
            continue
        attempt = int(state.get("attempt", 0))
        todo.append(
            {
                "inputs": {"heart_dataset": datastore_uri(p["input"])},
                "outputs": {"score": datastore_uri(attempt_output(p, attempt))},
                "job_identity": attempt_identity(p, attempt),
            }
        )
    return todo


def _input_rows(p: dict[str, Any]) -> dict[str, list[str]]:
    """``{file name: row ids in file order}`` of a partition's input files."""
    return {
        path.name: [r["row_id"] for r in csv.DictReader(io.StringIO(path.read_text()))]
        for path in sorted(storage(p["input"]).glob("*.csv"))
    }


def _scored(output: str, inputs: dict[str, list[str]]) -> list[str]:
    """The row ids of the output's lines: the scoring script writes them, an MLflow model's lines are
    matched to the input rows by position in their file (``scored_row_ids``)."""
    from airflow_azureml.example_data import scored_row_ids

    path = storage(output) / "predictions.csv"
    if not path.exists():
        return []
    return scored_row_ids(path.read_text(), inputs)


def report(
    prefix: str,
    interval: str,
    partitions: list[dict[str, Any]],
    results: list[dict] | None,
    planned: list[dict[str, Any]] | None = None,
    costs: list[dict[str, Any] | None] | None = None,
) -> dict:
    """Verify and checkpoint each partition (row ids in = row ids scored, each once); writes report.json.

    A partition becomes finished only here: its job completed in this run *and* its output holds every
    input row exactly once. With Azure's default ``error_threshold: -1`` a job completes although files
    failed, so completion alone proves nothing. A completed job whose output is wrong is rejected: the
    next run redoes the partition as a new unit of work, into a new folder.
    """
    results = list(results or [])
    completed: dict[str, dict[str, Any]] = {}  # job_identity -> this run's completed result
    for kwargs, result in zip(planned or [], results, strict=False):
        if result and result.get("status") == "Completed":
            completed[kwargs["job_identity"]] = result
    rows_in = rows_scored = 0
    problems = []
    outputs = []
    for p in partitions:
        state = checkpoint(p)
        attempt = int(state.get("attempt", 0))
        output = attempt_output(p, attempt)
        files = _input_rows(p)
        inputs = {row_id for ids in files.values() for row_id in ids}
        scored = _scored(output, files)
        rows_in += len(inputs)
        rows_scored += len(scored)
        outputs.append(str(storage(output) / "predictions.csv"))
        exact = len(scored) == len(set(scored)) and set(scored) == inputs
        if state.get("verified") and exact:
            continue
        result = completed.get(attempt_identity(p, attempt))
        if result is not None and exact:
            _save_checkpoint(p, {**state, "verified": True, "jobs": result.get("job_names", [])})
            continue
        problems.append(
            f"partition {p['partition']}: {len(inputs)} in, {len(scored)} scored "
            f"({len(scored) - len(set(scored))} duplicated, {len(inputs - set(scored))} missing)"
        )
        if result is not None or state.get("verified"):  # the job finished, and its output is wrong: redo it
            _save_checkpoint(p, {"attempt": attempt + 1, "verified": False, "rejected": output})
    results = [r for r in results if r]
    summary = {
        "interval": interval,
        "partitions": len(partitions),
        "partitions_scored_this_run": len(results),
        "jobs": sorted({name for r in results for name in r["job_names"]}),
        "resubmissions": sum(r["resubmits"] for r in results),
        "preemptions": sum(r["preemptions"] for r in results),
        "rows_in": rows_in,
        "rows_scored": rows_scored,
        "predictions": outputs,
    }
    if costs is not None:  # the bill of this run's jobs (docs/cost.md): spot cost, all-dedicated, savings
        from airflow_azureml.cost import format_bill, run_bill

        bill = run_bill(costs)
        summary["bill"] = {k: v for k, v in bill.items() if k != "usage"}
        print(format_bill(bill, title=f"bill of interval {interval}"))
    folder = storage(f"{prefix}/reports/{interval}")
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "report.json").write_text(json.dumps(summary, indent=2))
    print(json.dumps(summary, indent=2))
    if problems:
        raise ExactlyOnceCheckError(
            f"exactly-once check failed for interval {interval}: " + "; ".join(problems) + ". The rejected "
            "partitions are redone as new work, into new folders, by the next run of this interval: fix the input "
            "if it is bad, then clear this DAG run (or its extract task and everything downstream)."
        )
    return summary
