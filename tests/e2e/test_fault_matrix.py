"""The fault matrix on a real Airflow deployment, part 1: faults of one job (kills, preemptions,
evictions, a clear, a task marked failed) and two overlapping DAG runs.

Each test runs the example DAG for its own data interval, so results are independent; the last test
checks that nothing this deployment wrote holds secret material.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

import psutil
import pytest

from tests.e2e.conftest import DAG_ID, E2E
from tests.e2e.rows import (
    CLUSTER,
    CONF,
    assert_exactly_once,
    assert_no_secret_material,
    cluster_exists,
    deferred_scoring_task,
    forget_spot_history,
    pid_owning_local_port,
    preempt_whole_cluster,
    run_example,
    trigger_polled,
    wait_until,
)

# A row waits on conditions, never on luck; on a loaded 2-core machine a row may take minutes.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]


def test_kill9_task_right_after_invoke_post(e2e: E2E) -> None:
    killed: list[str] = []
    seen: list[str] = []

    def kill_submitter(entry: dict[str, Any]) -> None:
        try:
            pid = pid_owning_local_port(entry["peer_port"])
            seen.append(f"port {entry['peer_port']} -> pid {pid}")
            if pid and pid != os.getpid() and not killed:
                killed.append(" ".join(psutil.Process(pid).cmdline())[:80])
                os.kill(pid, signal.SIGKILL)
        except Exception as exc:  # surfaced by the assertion below
            seen.append(repr(exc))

    e2e.emulator.after_response(
        lambda e: e["method"] == "POST" and e["path"].startswith("/inference/batch/") and e["status"] == 201,
        kill_submitter,
    )
    _, interval, state = run_example(e2e, "2026-11-02T00:00:00+00:00")
    result = e2e.record(
        "`kill -9` of the task process right after the invoke POST returned",
        interval,
        state,
        "the retry found the job by its deterministic name and re-attached",
    )
    assert killed, f"the fault never fired: {seen}"
    assert state == "success"
    assert_exactly_once(result, jobs=2)


def test_task_marked_failed_while_deferred_cancels_the_job(e2e: E2E) -> None:
    marked: list[str] = []

    def fault(run_id: str, interval: str) -> None:
        wait_until(lambda: cluster_exists(e2e), what="cluster")
        e2e.emulator.set_capacity(CLUSTER, 0)
        try:
            ti = wait_until(lambda: deferred_scoring_task(e2e, run_id), what="a deferred scoring task", paced=True)
            # Airflow runs on_kill only for a trigger the triggerer has started: wait until it polls.
            wait_until(
                lambda: trigger_polled(e2e, run_id, interval, ti["map_index"]),
                what="the trigger polling its job",
                paced=True,
            )
            e2e.airflow.set_task_state(DAG_ID, run_id, "score_partition", ti["map_index"], "failed")
            marked.append(str(ti["map_index"]))
            wait_until(lambda: any(j.cancel_requested for j in e2e.jobs_for(interval)), timeout=60, what="cancel")
        finally:
            e2e.emulator.set_capacity(CLUSTER, None)  # never leave the run hanging, whatever happened

    run_id, interval, state = run_example(e2e, "2026-11-04T00:00:00+00:00", during=fault)
    cancelled = [j for j in e2e.jobs_for(interval) if j.cancel_requested]
    assert marked and state == "failed"
    assert len(cancelled) == 1 and cancelled[0].status == "Canceled"
    # nothing is lost: clearing the run scores the cancelled partition with a new job, and only that one
    e2e.airflow.clear_run(DAG_ID, run_id)
    state = e2e.airflow.wait_for_run(DAG_ID, run_id, 300)
    result = e2e.record(
        "a deferred task marked failed by a person",
        interval,
        state,
        "trigger on_kill cancelled its job; after a clear only that partition ran again",
    )
    assert state == "success"
    assert_exactly_once(result, jobs=3)


def test_clear_after_success_submits_nothing(e2e: E2E) -> None:
    run_id, interval, state = run_example(e2e, "2026-11-05T00:00:00+00:00")
    assert state == "success"
    before = len(e2e.jobs_for(interval))
    e2e.airflow.clear_run(DAG_ID, run_id)
    time.sleep(2)
    state = e2e.airflow.wait_for_run(DAG_ID, run_id, 300)
    result = e2e.record(
        "the whole run cleared after success", interval, state, "every partition was a finished checkpoint: no new job"
    )
    assert state == "success"
    assert_exactly_once(result, jobs=before)


def test_whole_cluster_preempted_twice(e2e: E2E) -> None:
    preempted: list[str] = []

    def fault(run_id: str, interval: str) -> None:
        preempt_whole_cluster(e2e, lambda job: f"/input/{interval}/" in str(job.input_uri or ""), preempted, times=2)

    # A preempted node stays in the gauge a while after the jobs end (long enough for the waits to read it)
    before = e2e.emulator.behaviour()
    e2e.emulator.set_behaviour(preempted_node_release_seconds=20.0)
    try:
        _, interval, state = run_example(e2e, "2026-11-06T00:00:00+00:00", during=fault)
    finally:
        e2e.emulator.set_behaviour(preempted_node_release_seconds=before["preempted_node_release_seconds"])
    ended = [j for j in e2e.jobs_for(interval) if j.status == "Canceled"]  # every job running on the cluster
    result = e2e.record(
        "whole-cluster preemption twice in a row",
        interval,
        state,
        f"{len(ended)} jobs ended by the 2 preemptions, each resubmitted once",
    )
    assert len(preempted) == 2 and state == "success" and len(ended) >= 2
    assert_exactly_once(result, jobs=2 + len(ended))


def test_node_evictions_during_a_run(e2e: E2E) -> None:
    def fault(run_id: str, interval: str) -> None:
        wait_until(lambda: cluster_exists(e2e), what="cluster")
        e2e.emulator.set_eviction_rate(CLUSTER, 0.8)

    _, interval, state = run_example(e2e, "2026-11-07T00:00:00+00:00", {"files_per_partition": 8}, fault)
    jobs = e2e.jobs_for(interval)
    redone = sum(j.mini_batch_attempts - j.mini_batches_total for j in jobs)
    result = e2e.record(
        "random node evictions during a run",
        interval,
        state,
        f"{redone} mini-batch(es) redone on other nodes; jobs still completed",
    )
    assert state == "success"
    assert_exactly_once(result, jobs=2)


@pytest.mark.timeout(600)
def test_two_overlapping_dag_runs(e2e: E2E) -> None:
    dates = ["2026-11-19T00:00:00+00:00", "2026-11-20T00:00:00+00:00"]
    forget_spot_history(e2e)
    runs = [e2e.airflow.trigger(DAG_ID, d, CONF) for d in dates]
    states = [e2e.airflow.wait_for_run(DAG_ID, r, 400) for r in runs]
    info = [e2e.airflow.api("GET", f"/dags/{DAG_ID}/dagRuns/{r}") for r in runs]
    overlap = info[0]["start_date"] < info[1]["end_date"] and info[1]["start_date"] < info[0]["end_date"]
    results = [
        e2e.record(
            f"two overlapping DAG runs (run {label})",
            e2e.interval_key(d),
            s,
            "both runs scored their interval on the one shared cluster; no teardown deleted it under the other",
        )
        for label, d, s in zip("AB", dates, states, strict=True)
    ]
    assert overlap, info
    assert states == ["success", "success"]
    for result in results:
        assert_exactly_once(result, jobs=CONF["partitions"])
    # the runs overlapped, but their infrastructure writes (clusters, endpoint, deployments) did not: they
    # share the pool of one slot, so no two of the eight tasks ran at once
    infra = [
        ti
        for r in runs
        for ti in e2e.airflow.api("GET", f"/dags/{DAG_ID}/dagRuns/{r}/taskInstances")["task_instances"]
        if ti["task_id"].startswith("create_")
    ]
    assert len(infra) == 8 and {ti["pool"] for ti in infra} == {"azureml_infrastructure"}, infra
    windows = sorted((ti["start_date"], ti["end_date"], ti["dag_run_id"], ti["task_id"]) for ti in infra)
    for before, after in itertools.pairwise(windows):
        assert before[1] <= after[0], f"two infrastructure writes at once: {before} and {after}"
    check_the_bill_of_the_range(e2e, dates, runs)


def check_the_bill_of_the_range(e2e: E2E, dates: list[str], runs: list[str]) -> None:
    """``python -m airflow_azureml.cost`` (and ``airflow azureml bill``) over the two runs' range, against the
    real api-server: every job of both intervals billed, both runs' cost reports read, and the two runs'
    shared cluster time billed once."""
    from airflow_azureml import cost

    env = {**os.environ, "AIRFLOW_CONN_AIRFLOW_API": json.dumps({"conn_type": "http", "host": e2e.airflow.base})}
    argv = [sys.executable, "-m", "airflow_azureml.cost", "--dag-id", DAG_ID, "--from", dates[0][:10]]
    argv += ["--to", dates[1][:10], "--no-metrics"]
    done = subprocess.run([*argv, "--json"], env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    bill = json.loads(done.stdout)
    assert [r["run_id"] for r in bill["runs"]] == runs and all(r["state"] == "success" for r in bill["runs"])
    for run, date in zip(bill["runs"], dates, strict=True):
        assert run["tasks_reported"] == CONF["partitions"], run
        assert set(run["jobs"]) == {j.name for j in e2e.jobs_for(e2e.interval_key(date))}, run
    # the same reports, read by the test itself, give the same total
    reports = []
    for run_id in runs:
        for ti in e2e.airflow.task_instances(DAG_ID, run_id):
            if ti["task_id"] == "score_partition":
                path = f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/score_partition/xcomEntries/azureml_cost"
                reports.append(e2e.airflow.api("GET", path, params={"map_index": ti["map_index"]})["value"])
    expected = cost.run_bill(reports)
    assert bill["cost"] is not None and bill["cost"] == pytest.approx(expected["cost"])
    assert bill["node_hours"] == pytest.approx(expected["node_hours"]) and sum(bill["node_hours"].values()) > 0
    assert bill["cost"] <= bill["sum_of_runs_cost"] + 1e-9  # overlapping runs: shared time billed once
    text = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert text.returncode == 0 and f"Azure ML bill of {DAG_ID}, 2 runs" in text.stdout, text.stderr[-2000:]
    print(text.stdout)  # the real output that docs/backfills.md shows
    # the same command, registered in Airflow's own CLI by the provider (Airflow 3.2+): the same bill
    cli = e2e.airflow.airflow("azureml", "bill", *argv[3:], "--json", timeout=120)
    cli_bill = json.loads(cli.stdout[cli.stdout.index("{\n") :])  # after any log line Airflow prints first
    assert (cli_bill["runs"], cli_bill["cost"]) == (bill["runs"], bill["cost"])


def test_no_secret_or_token_in_logs_xcom_or_trigger_rows(e2e: E2E) -> None:
    assert_no_secret_material(e2e)
