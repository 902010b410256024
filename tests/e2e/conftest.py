"""The e2e deployment (PostgreSQL, emulator, Airflow services) and the reliability table it produces.

Everything lives under pytest's temporary directory. The table goes there too, unless
``AZUREML_RELIABILITY_DIR`` names a folder: ``make reliability`` points it at ``docs/``, so that
``make test`` never changes a tracked file.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pytest

from airflow_azureml.emulator import Emulator, Timing
from airflow_azureml.example_data import input_row_ids, scored_row_ids
from tests.e2e.harness import AirflowDeployment, Postgres, Redis

DAG_ID = "low_priority_batch_scoring"
RESULTS: list[FaultResult] = []


@dataclass
class FaultResult:
    fault: str
    jobs_submitted: int
    duplicate_jobs: int
    rows_in: int
    rows_lost: int
    rows_duplicated: int
    final_state: str
    notes: str


@dataclass
class E2E:
    emulator: Emulator
    airflow: AirflowDeployment
    postgres: Postgres

    def interval_key(self, logical_date: str) -> str:
        return (
            logical_date[:4] + logical_date[5:7] + logical_date[8:10] + "T" + logical_date[11:13] + logical_date[14:16]
        )

    def jobs_for(self, interval: str) -> list[Any]:
        return [j for j in self.emulator.jobs() if self.is_for(j, interval)]

    @staticmethod
    def is_for(job: Any, interval: str) -> bool:
        """The job scores ``interval``: the emulator's own record of its input, not a wire field."""
        return f"/input/{interval}/" in str(job.input_uri or "")

    def rows(self, interval: str) -> tuple[int, int, int]:
        """(rows in, rows lost, rows duplicated) computed from the datastore, not from the DAG's own report."""
        root = self.emulator.datastore_path(f"scoring/input/{interval}")
        rows_in = lost = duplicated = 0
        for part in sorted(p for p in root.iterdir() if p.is_dir()) if root.exists() else []:
            files = input_row_ids(part)
            inputs = {row_id for ids in files.values() for row_id in ids}
            predictions = self.emulator.datastore_path(f"scoring/output/{interval}/{part.name}/predictions.csv")
            scored = scored_row_ids(predictions.read_text(), files) if predictions.exists() else []
            rows_in += len(inputs)
            lost += len(inputs - set(scored))
            duplicated += len(scored) - len(set(scored))
        return rows_in, lost, duplicated

    def duplicates(self, interval: str) -> int:
        """Jobs for a unit of work that the provider should never have submitted, whatever their names.

        A partition's input folder is its unit of work, so jobs are grouped by input, not by name
        (the service may choose the name). A job is a duplicate when an earlier job for the same
        input had completed, or was still live (not ended) when it was created: only a job that
        follows one that ended Failed or Canceled is a legitimate resubmission.
        """
        by_input: dict[str, list[Any]] = {}
        for job in self.jobs_for(interval):
            by_input.setdefault(str(job.input_uri), []).append(job)
        extra = 0
        for jobs in by_input.values():
            jobs.sort(key=lambda j: j.created)
            for i, job in enumerate(jobs):
                earlier = jobs[:i]
                if any(e.status == "Completed" or e.ended is None or e.ended > job.created for e in earlier):
                    extra += 1
        return extra

    def record(self, fault: str, interval: str, final_state: str, notes: str) -> FaultResult:
        rows_in, lost, duplicated = self.rows(interval)
        result = FaultResult(
            fault,
            len(self.jobs_for(interval)),
            self.duplicates(interval),
            rows_in,
            lost,
            duplicated,
            final_state,
            notes,
        )
        RESULTS.append(result)
        return result


@contextlib.contextmanager
def deployment(base: Path, *, celery: bool = False, extra_env: dict[str, str] | None = None) -> Iterator[E2E]:
    """PostgreSQL, the emulator and Airflow's services; with ``celery``, CeleryExecutor on a Redis broker, two
    Celery workers and two triggerers (the backfill rows, docs/backfills.md)."""
    first_row = len(RESULTS)  # this file's rows go beside its deployment; `make reliability` writes them all
    with contextlib.ExitStack() as stack:  # whatever started is stopped, in reverse order, whatever fails
        postgres = Postgres(base).start()
        stack.callback(postgres.stop)
        redis = Redis(base).start() if celery else None
        if redis is not None:
            stack.callback(redis.stop)
        # Slower mini-batches than the integration tests, so that faults land while jobs run.
        emulator = Emulator(base / "emulator", timing=Timing(mini_batch=0.3, node_startup=0.2, tick=0.02)).start()
        stack.callback(emulator.stop)
        airflow = AirflowDeployment(
            base,
            postgres.url,
            {
                "AIRFLOW_CONN_AZURE_ML_DEFAULT": emulator.connection_info()["airflow_conn_json"],
                "AZUREML_DATASTORE_ROOT": f"file://{emulator.datastore_path('')}",
                "AZUREML_POLL_SECONDS": "1",
                # a job held queued for minutes would back its wait off to 300 s, and the row would sit idle
                "AZUREML_MAX_POLL_SECONDS": "3",
                "AZUREML_RESUBMIT_BACKOFF_SECONDS": "1",
                # A preemption the waits saw only near its end (their reads delayed on a loaded machine) waits
                # 900 s for a person's cancel to show in the Activity Log: past a row's 400 s, and the stuck run
                # held one of the DAG's two active-run slots into the next row (a CI run, twice-preempted row).
                # The rows' retries are 1 s apart already (tests/conftest.py).
                "AZUREML_EVIDENCE_WAIT_SECONDS": "20",
                **(extra_env or {}),
            },
            broker_url=redis.url if redis else None,
            celery_workers=2 if celery else 0,
            triggerers=2 if celery else 1,
        )
        stack.callback(airflow.stop)
        folder = os.environ.get("AZUREML_RELIABILITY_DIR")
        if folder:
            stack.callback(lambda: write_reliability_table(Path(folder), RESULTS))
        else:
            stack.callback(lambda: write_reliability_table(base, RESULTS[first_row:]))
        airflow.start()
        airflow.wait_for_dag(DAG_ID)
        # the scheduler creates no run of its own (USE_JOB_SCHEDULE off, harness.py); should one exist, let it
        # finish before any fault is injected
        for run in airflow.api("GET", f"/dags/{DAG_ID}/dagRuns")["dag_runs"]:
            airflow.wait_for_run(DAG_ID, run["dag_run_id"], timeout=300)
        yield E2E(emulator, airflow, postgres)


@pytest.fixture(scope="module")
def e2e(tmp_path_factory: pytest.TempPathFactory) -> Iterator[E2E]:
    """One deployment per matrix file, stopped when the file's last row ends.

    Module scope, not session: under ``make test`` each file runs on a pytest-xdist worker that then goes
    on to integration tests, and a session-scoped deployment kept its scheduler, API server, triggerer and
    DAG processor running until the worker's very last test (four idle deployments: 15-20 % of a core).
    """
    with deployment(tmp_path_factory.mktemp("e2e")) as running:
        yield running


def write_reliability_table(folder: Path, results: list[FaultResult]) -> None:
    """reliability.md from ``results`` (and their JSON beside it), in ``folder``."""
    if not results:
        return
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "reliability.json").write_text(json.dumps([asdict(r) for r in results], indent=2) + "\n")
    lines = [
        "# Reliability: the e2e fault matrix",
        "",
        "Generated by `make reliability` (the `tests/e2e` suite) from its last run on a real Airflow deployment:",
        "PostgreSQL metadata DB, `airflow api-server`, `scheduler`, `dag-processor` and `triggerer` as",
        "separate processes with LocalExecutor, and the emulator. Each row runs the example DAG",
        "`low_priority_batch_scoring` for its own data interval, injects the fault, and counts from the",
        "emulator and the datastore (not from the DAG's own report).",
        "",
        "A duplicate job is a job for a unit of work submitted after that unit's previous job had",
        "completed. Rows lost/duplicated compare every input row id with the predictions files.",
        "",
        "| fault | jobs submitted | duplicate jobs | rows in | rows lost | rows duplicated | final state | notes |",
        "| --- | ---: | ---: | ---: | ---: | ---: | --- | --- |",
    ]
    for r in results:
        lines.append(
            f"| {r.fault} | {r.jobs_submitted} | {r.duplicate_jobs} | {r.rows_in} | {r.rows_lost} | "
            f"{r.rows_duplicated} | {r.final_state} | {r.notes} |"
        )
    (folder / "reliability.md").write_text("\n".join(lines) + "\n")


SECRET_PATTERNS = [re.compile(r"eyJ[A-Za-z0-9_-]{10,}\.")]
