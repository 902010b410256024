"""``dag.test()`` of the example DAG against the emulator, with an injected whole-cluster preemption."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pendulum
import pytest

from airflow_azureml.emulator import Emulator
from airflow_azureml.exceptions import AirflowFailException
from tests.conftest import FAST, load_dag, task_states
from tests.helpers import preempt, when_running
from tests.integration.test_assets import asset_events
from tests.integration.test_exactly_once import preempt_cluster, when_sampled

INTERVAL = pendulum.datetime(2026, 11, 28, tz="UTC")
# Mini-batches slow enough for a wait to see a job Running and read the cluster's gauge before it ends.
SLOW_BATCHES = replace(FAST, mini_batch=0.5)


@pytest.fixture
def emulator(tmp_path: Path, request: pytest.FixtureRequest, fork_server: Any) -> Iterator[Emulator]:
    """conftest's emulator; a test may ask for another ``Timing`` (indirect parametrization)."""
    with Emulator(tmp_path / "emulator", timing=getattr(request, "param", FAST), fork_server=fork_server) as emu:
        yield emu


@pytest.fixture
def example_env(emulator: Emulator, azureml_conn: dict[str, Any], airflow_db: Path, monkeypatch: pytest.MonkeyPatch):
    root = emulator.datastore_path("")
    monkeypatch.setenv("AZUREML_DATASTORE_ROOT", f"file://{root}")
    monkeypatch.setenv("AZUREML_POLL_SECONDS", "0.1")
    monkeypatch.setenv("AZUREML_RESUBMIT_BACKOFF_SECONDS", "0.1")
    return emulator


def read_report(emulator: Emulator) -> dict[str, Any]:
    return json.loads(
        emulator.datastore_path(f"scoring/reports/{INTERVAL.strftime('%Y%m%dT%H%M')}/report.json").read_text()
    )


@pytest.mark.parametrize(
    ("form", "emulator"),
    [("canceled", SLOW_BATCHES), ("failed", FAST)],
    indirect=["emulator"],
    ids=["canceled", "failed"],
)
def test_example_dag_survives_whole_cluster_preemption(example_env: Emulator, form: str) -> None:
    emulator = example_env
    dag = load_dag("low_priority_batch_scoring.py")
    if form == "canceled":
        # Azure sends no message for this cancel: only the gauge read while the job runs tells it. The
        # cluster is preempted once the wait has read the gauge, and the service cancels the job once the
        # wait has read the gauge up (tests.helpers.preempt_and_cancel_once_read), as a plausible while would.
        assert emulator.behaviour()["capacity_cancel_message"] is False
        watching = when_sampled(emulator, preempt_cluster)
    else:  # Azure's own PreemptionError is evidence whenever it is read
        watching = when_running(emulator, preempt(form))
    with watching as preempted:
        run = dag.test(logical_date=INTERVAL)
    assert str(run.state) == "success", task_states(run)
    assert len(preempted) == 1
    report = read_report(emulator)
    assert report["rows_in"] == report["rows_scored"] == 4 * 6 * 25
    assert report["preemptions"] == 1 and report["resubmissions"] == 1
    jobs = emulator.jobs()
    assert len(jobs) == report["partitions"] + report["resubmissions"] == 5
    assert sorted(j.name for j in jobs) == report["jobs"]
    assert sum(j.status == "Completed" for j in jobs) == 4
    # the run's bill, beside the exactly-once summary: every scoring task's report, one per partition
    bill = report["bill"]
    assert len(bill["tasks"]) == 4 and bill["preemptions"] == 1
    assert bill["node_hours"]["low_priority"] > 0

    # the same data interval again: every partition is a finished checkpoint, so no job at all
    rerun = load_dag("low_priority_batch_scoring.py").test(logical_date=INTERVAL)
    assert str(rerun.state) == "success", task_states(rerun)
    assert len(emulator.jobs()) == 5
    assert read_report(emulator)["partitions_scored_this_run"] == 0


SECOND = pendulum.datetime(2026, 11, 29, tz="UTC")


def input_folders(emulator: Emulator, interval: pendulum.DateTime) -> list[Path]:
    return sorted(emulator.datastore_path(f"scoring/input/{interval.strftime('%Y%m%dT%H%M')}").glob("part-*"))


def test_etl_marker_is_not_sent_as_input(example_env: Emulator) -> None:
    run = load_dag("low_priority_batch_scoring.py").test(logical_date=INTERVAL)
    assert str(run.state) == "success", task_states(run)
    folders = input_folders(example_env, INTERVAL)
    assert len(folders) == 4
    for folder in folders:
        assert sorted(p.name for p in folder.iterdir()) == [f"records-{f:03d}.csv" for f in range(6)]
    for job in example_env.jobs():  # 6 files in mini-batches of 2: 3 mini-batches, not 4
        assert job.mini_batches_total == 3, job.name


def test_no_task_deletes_the_shared_cluster(example_env: Emulator) -> None:
    dag = load_dag("low_priority_batch_scoring.py")
    assert dag.max_active_runs == 2
    deleting = [t.task_id for t in dag.tasks if "Delete" in type(t).__name__]
    assert deleting == [], "another run's jobs may be running on the cluster"


def test_two_overlapping_runs_both_succeed(example_env: Emulator, tmp_path: Path) -> None:
    """Run A and run B of the DAG at the same time (max_active_runs=2, one cluster): both succeed.

    ``dag.test()`` must run in a main thread, so run B runs in a second process against the same
    metadata DB and emulator while run A runs here.
    """
    import os
    import subprocess
    import sys

    from tests.conftest import DAGS_FOLDER

    emulator = example_env
    script = (
        "import importlib.util, sys, pendulum\n"
        f"sys.path.insert(0, {str(DAGS_FOLDER)!r})\n"
        f"spec = importlib.util.spec_from_file_location('b', {str(DAGS_FOLDER / 'low_priority_batch_scoring.py')!r})\n"
        "module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module)\n"
        f"run = module.dag.test(logical_date=pendulum.parse({SECOND.isoformat()!r}))\n"
        # a file of its own: Airflow's log writers share stdout, so a printed line can land inside another
        f"open({str(tmp_path / 'state_b.txt')!r}, 'w').write(str(run.state))\n"
    )
    # a fresh process, as a second worker would be: not the cloud this process registered with the SDK
    env = {k: v for k, v in os.environ.items() if k != "AZUREML_CURRENT_CLOUD"}
    started: list[subprocess.Popen[str]] = []

    # run B's output goes to a file: a pipe nobody reads until run A ends fills up and stops B mid-run
    output_b = tmp_path / "run_b.log"

    def start_run_b(_emulator: Emulator, _job: str) -> None:  # once run A's first job runs on the cluster
        with output_b.open("w") as sink:
            started.append(subprocess.Popen([sys.executable, "-c", script], env=env, stdout=sink, stderr=sink))

    try:
        with when_running(emulator, start_run_b):
            run_a = load_dag("low_priority_batch_scoring.py").test(logical_date=INTERVAL)
        assert started, "run B never started"
        started[0].wait(timeout=600)
        out = output_b.read_text(errors="replace")
    finally:
        for process in started:
            process.kill()
    assert str(run_a.state) == "success", task_states(run_a)
    state_b = tmp_path / "state_b.txt"
    assert state_b.exists() and state_b.read_text().rsplit(".", 1)[-1].lower() == "success", out[-3000:]
    for interval in (INTERVAL, SECOND):
        report = json.loads(
            emulator.datastore_path(f"scoring/reports/{interval.strftime('%Y%m%dT%H%M')}/report.json").read_text()
        )
        assert report["rows_in"] == report["rows_scored"] == 4 * 6 * 25
    assert emulator.call(lambda: "low-pri-cluster" in emulator.workspace.computes)
    assert not [r for r in emulator.requests() if r["method"] == "DELETE" and "/computes/" in r["path"]]
    assert all(j.status == "Completed" for j in emulator.jobs())
    assert len(emulator.jobs()) == 8  # 4 partitions per run, none twice


def test_a_completed_job_with_rows_missing_is_not_a_finished_partition(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With error_threshold -1 a job completes although files failed: the partition is redone, as new work."""
    import example_partitions as ep

    monkeypatch.setenv("AZUREML_DATASTORE_ROOT", f"file://{tmp_path}")
    parts = ep.write_partitions("scoring", "20261128T0000", 1, partitions=1, files=2, rows=3)
    (planned,) = ep.pending(parts)
    ids = [f"20261128T0000-000-{i:07d}" for i in range(6)]
    out = tmp_path / "scoring/output/20261128T0000/part-000"
    out.mkdir(parents=True)
    (out / "predictions.csv").write_text("".join(f"records-000.csv,{i},0.5,1\n" for i in ids[:3]))  # file 2 failed
    done = {"status": "Completed", "job_names": ["job-1"], "resubmits": 0, "preemptions": 0}
    with pytest.raises(ValueError, match="3 missing") as failed:
        ep.report("scoring", "20261128T0000", parts, [done], [planned])
    # fails at once, while the report task keeps the DAG's retries for a lost worker
    assert isinstance(failed.value, AirflowFailException)
    (redo,) = ep.pending(parts)  # not skipped: redone as a new unit of work, into a fresh folder
    assert redo["job_identity"] != planned["job_identity"]
    assert redo["outputs"]["score"] != planned["outputs"]["score"]

    fresh = tmp_path / "scoring/output/20261128T0000/part-000-redo-1"
    fresh.mkdir(parents=True)
    (fresh / "predictions.csv").write_text("".join(f"records-00{n // 3}.csv,{i},0.5,1\n" for n, i in enumerate(ids)))
    summary = ep.report("scoring", "20261128T0000", parts, [done], [redo])
    assert summary["rows_in"] == summary["rows_scored"] == 6
    assert ep.pending(parts) == []  # verified: finished now


def test_a_checkpoint_write_killed_midway_leaves_the_old_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The report task is retried when its worker dies: a torn checkpoint would fail every later plan."""
    import example_partitions as ep
    from airflow.sdk import ObjectStoragePath

    monkeypatch.setenv("AZUREML_DATASTORE_ROOT", f"file://{tmp_path}")
    (part,) = ep.write_partitions("scoring", "20261128T0000", 1, partitions=1, files=1, rows=2)
    ep._save_checkpoint(part, {"attempt": 0, "verified": True, "jobs": ["job-1"]})
    real = ObjectStoragePath.write_text

    def killed_midway(self: ObjectStoragePath, text: str, *args: Any, **kwargs: Any) -> int:
        real(self, text[: len(text) // 2], *args, **kwargs)
        raise KeyboardInterrupt("the worker died mid-write")

    with monkeypatch.context() as patched:
        patched.setattr(ObjectStoragePath, "write_text", killed_midway)
        with pytest.raises(KeyboardInterrupt):
            ep._save_checkpoint(part, {"attempt": 1, "verified": False, "rejected": "x"})
    assert ep.checkpoint(part) == {"attempt": 0, "verified": True, "jobs": ["job-1"]}
    assert ep.pending([part]) == []


def test_predictions_without_a_completed_job_are_not_a_finished_partition(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import example_partitions as ep

    monkeypatch.setenv("AZUREML_DATASTORE_ROOT", f"file://{tmp_path}")
    parts = ep.write_partitions("scoring", "20261128T0000", 1, partitions=1, files=1, rows=2)
    out = tmp_path / "scoring/output/20261128T0000/part-000"
    out.mkdir(parents=True)
    (out / "predictions.csv").write_text("records-000.csv,20261128T0000-000-0000000,0.5,1\n")
    assert len(ep.pending(parts)) == 1  # a predictions.csv alone is not a checkpoint


def test_partition_with_failed_files_is_redone_not_skipped(example_env: Emulator) -> None:
    """error_threshold -1: the job completes without a failed file's rows; the next run redoes that partition."""
    import example_partitions as ep

    emulator = example_env
    interval = INTERVAL.strftime("%Y%m%dT%H%M")
    ep.write_partitions("scoring", interval, int(INTERVAL.timestamp()), 4, 6, 25)  # what extract will find
    bad = emulator.datastore_path(f"scoring/input/{interval}/part-000/records-000.csv")
    lines = bad.read_text().splitlines()
    first = lines[1].split(",")
    lines[1] = ",".join([first[0], "not-a-number", *first[2:]])  # this file fails to score
    bad.write_text("\n".join(lines) + "\n")

    first_run = load_dag("low_priority_batch_scoring.py").test(logical_date=INTERVAL)
    assert str(first_run.state) == "failed" and task_states(first_run)["report"] == "failed", task_states(first_run)
    assert asset_events(first_run) == []  # a partly verified interval is not announced
    assert all(j.status == "Completed" for j in emulator.jobs())  # completed, although rows are missing
    assert len(emulator.jobs()) == 4

    # the data is fixed upstream: the ETL writes the partition again
    for marker in (
        emulator.datastore_path(f"scoring/markers/{interval}/part-000._SUCCESS"),
        emulator.datastore_path(f"scoring/input/{interval}/part-000/_SUCCESS"),
    ):
        marker.unlink(missing_ok=True)
    second_run = load_dag("low_priority_batch_scoring.py").test(logical_date=INTERVAL)
    assert str(second_run.state) == "success", task_states(second_run)
    report = read_report(emulator)
    assert report["rows_in"] == report["rows_scored"] == 4 * 6 * 25
    assert report["partitions_scored_this_run"] == 1
    assert len(emulator.jobs()) == 5  # one new job, for the redone partition only
    (event,) = asset_events(second_run)  # the whole interval verified: one event, downstream DAGs' trigger
    assert event["uri"] == "azureml://datastores/workspaceblobstore/paths/scoring/reports"
    assert event["task"] == "report" and event["extra"]["interval"] == interval
    assert event["extra"]["rows_scored"] == 4 * 6 * 25


def test_production_settings_retries_timeout_and_one_infrastructure_write_at_a_time(example_env: Emulator) -> None:
    """Retries that outlast Azure's throttling (minutes, doubling), a run timeout, and the infrastructure
    tasks in the pool of one slot that serialises endpoint writes across runs and DAGs."""
    from airflow import __version__ as airflow_version
    from packaging.version import Version

    for file in ("low_priority_batch_scoring.py", "kubernetes_instance_type_scoring.py"):
        dag = load_dag(file)
        assert dag.dagrun_timeout == pendulum.duration(hours=20)
        infra = {t.task_id for t in dag.tasks if t.pool == "azureml_infrastructure"}
        writers = {t.task_id for t in dag.tasks if type(t).__name__.startswith(("AzureMLCreate", "AzureMLAttach"))}
        assert writers and writers <= infra, (writers, infra)
        for t in dag.tasks:
            assert t.retries == 3 and t.max_retry_delay == pendulum.duration(minutes=30)
            # conftest sets AZUREML_RETRY_DELAY_SECONDS=1 for the suite; the DAG's default is 120 s
            assert t.retry_delay == pendulum.duration(seconds=1)
            doubling = t.retry_exponential_backoff
            assert doubling is True if Version(airflow_version) < Version("3.2") else doubling == 2.0


def test_a_changed_partition_count_does_not_repartition_a_scored_interval(example_env: Emulator) -> None:
    emulator = example_env
    first = load_dag("low_priority_batch_scoring.py").test(logical_date=INTERVAL, run_conf={"partitions": 2})
    assert str(first.state) == "success", task_states(first)
    assert len(emulator.jobs()) == 2
    again = load_dag("low_priority_batch_scoring.py").test(logical_date=INTERVAL, run_conf={"partitions": 6})
    assert str(again.state) == "success", task_states(again)
    assert len(emulator.jobs()) == 2  # the interval keeps its 2 partitions, both verified: no new job
    report = read_report(emulator)
    assert report["partitions"] == 2 and report["rows_in"] == report["rows_scored"] == 2 * 6 * 25


# A manual run: `airflow dags trigger` without --logical-date, the UI's Trigger button, the REST API with
# "logical_date": null. Airflow 3 gives it no logical date and no data interval, only run_after.
TRIGGERED = pendulum.datetime(2026, 12, 3, 14, 37, 52, 123456, tz="UTC")


def test_a_manual_run_without_a_logical_date_scores_the_minute_it_was_triggered_in(example_env: Emulator) -> None:
    from tests.dag_support import run_shape, trigger_like_the_cli

    emulator = example_env
    dag = load_dag("low_priority_batch_scoring.py")
    triggered = trigger_like_the_cli(dag.dag_id, TRIGGERED)
    assert triggered["logical_date"] is None and triggered["data_interval"] == (None, None)
    run = dag.test(logical_date=None, run_after=TRIGGERED)
    assert run_shape(run) == triggered  # the run `airflow dags trigger` makes, run in-process
    assert str(run.state) == "success", task_states(run)
    report = json.loads(emulator.datastore_path("scoring/reports/20261203T1437/report.json").read_text())
    assert report["interval"] == "20261203T1437"
    assert report["rows_in"] == report["rows_scored"] == 4 * 6 * 25
    assert report["partitions_scored_this_run"] == 4 and len(emulator.jobs()) == 4

    # triggered again in the same minute: the same interval, already scored, so no job at all
    again = load_dag("low_priority_batch_scoring.py").test(logical_date=None, run_after=TRIGGERED.add(seconds=5))
    assert str(again.state) == "success", task_states(again)
    assert len(emulator.jobs()) == 4
    assert read_report_of(emulator, "20261203T1437")["partitions_scored_this_run"] == 0


def read_report_of(emulator: Emulator, interval: str) -> dict[str, Any]:
    return json.loads(emulator.datastore_path(f"scoring/reports/{interval}/report.json").read_text())
