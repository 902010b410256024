"""Deadline-bound runs of the example DAG on a real Airflow deployment (issue 22, docs/spot_policy.md).

- A run whose deadline leaves room for one preemption on spot: its partition starts on spot, the whole cluster
  is preempted once the slack no longer covers another attempt, and the resubmitted job goes to the dedicated
  fallback (rule ``deadline``), logged with its inputs. The run meets its deadline, every row scored once.
- A run whose deadline not even the fallback can meet, with ``on_infeasible_deadline="fail"``: each partition
  fails before any job is sent, with the deadline's numbers in the error, and is not retried.

The failing row runs first: on this file's own deployment it also creates the clusters and deployments, so the
other row's first decision comes soon after its trigger, well within the room its deadline leaves.

The deadline and the policy go in the run's conf (the DAG's ``deadline`` and ``on_infeasible_deadline``
params). The emulator's jobs last seconds, so the cluster's shared spot history is seeded with two hour-long
runs: the policy then plans with an hour of work, as it would on a real cluster. The deadline is set ahead of
the trigger by just over what spot needs (an attempt, a plausible preemption's loss and a restart); when the
slack falls below that margin follows from the first decision's logged inputs, and the row waits for it with
the spot job held, not for a guessed time.
"""

from __future__ import annotations

import ast
import json
import re
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import DAG_ID, E2E
from tests.e2e.rows import (
    CLUSTER,
    assert_exactly_once,
    forget_spot_history,
    preempt_whole_cluster,
    wait_until,
)

# Beside the 3.1/3.2 runs in .ci/run (make test-distributed), with its own deployment: `make test` is at its budget.
pytestmark = [pytest.mark.e2e, pytest.mark.distributed, pytest.mark.timeout(1500)]

TARGET = "heart-classifier-batch/classifier-mlflow"  # dags/azureml/endpoint.yml / deployment.yml: the history's key
FALLBACK = "classifier-mlflow-dedicated"  # dags/azureml/deployment-dedicated.yml
CONF = {"partitions": 1, "files_per_partition": 3, "rows_per_file": 10}
# Spot needs an attempt (about an hour here), a preemption's loss (another) and a restart (2 min) of slack: a bit
# over 2 h 2 min. The deadline gives this much more, so that the first decision comes while spot still fits.
ROOM = timedelta(minutes=4)


def seed_hour_long_history(e2e: E2E, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cluster's shared history (the connection's blob store): 40 runs of an hour on 2 nodes completed on
    spot, no preemption or eviction. Long enough that the row's own preemption barely moves the estimates the
    policy plans with (the work, from the eviction rate; the preemption rate): with 2 runs of history, the held
    job's evicted nodes lowered the work estimate by 0.09 h, and spot still fitted after the preemption."""
    from airflow_azureml.hooks.azure_ml import AzureMLHook
    from airflow_azureml.spot_policy import SpotHistory

    forget_spot_history(e2e)
    monkeypatch.setenv("AIRFLOW_CONN_AZURE_ML_DEFAULT", e2e.emulator.connection_info()["airflow_conn_json"])
    history = SpotHistory(
        exposure_hours=40.0, spot_completions=40, completed_jobs=40, completed_hours=40.0, node_hours=80.0
    )
    store = AzureMLHook().spot_history_store(TARGET)
    assert store.update(lambda _history, _known: (history, {}))
    assert e2e.emulator.spot_histories(), "the seed is in the emulator's blob store, where the tasks look"


def score_log(e2e: E2E, run_id: str, attempt: int | None = None) -> str:
    """The scoring task's log for its one partition: one attempt's, or every attempt's in order (the worker's
    files; empty until one exists)."""
    folder = e2e.airflow.logs / f"dag_id={DAG_ID}" / f"run_id={run_id}" / "task_id=score_partition" / "map_index=0"
    if attempt is not None:
        path = Path(folder) / f"attempt={attempt}.log"
        return path.read_text(errors="replace") if path.exists() else ""
    paths = sorted(Path(folder).glob("attempt=*.log"), key=lambda p: int(p.name.split("=")[1].split(".")[0]))
    return "\n".join(p.read_text(errors="replace") for p in paths)


def events(log: str) -> list[str]:
    """The log's messages (Airflow 3 writes a task log as JSON lines; a line cut short by a write is skipped)."""
    found = []
    for line in log.splitlines():
        try:
            found.append(str(json.loads(line).get("event", "")))
        except ValueError:
            continue
    return found


def policy_lines(log: str) -> list[tuple[str, str, dict[str, Any]]]:
    """Every ``Spot policy: <what> (rule <rule>). Inputs: {...}`` message: what, rule and the inputs as logged."""
    found = []
    for event in events(log):
        match = re.fullmatch(r"Spot policy: (.+?) \(rule (\w+)\)\. Inputs: (\{.*\})", event, re.DOTALL)
        if match:
            found.append((match[1], match[2], ast.literal_eval(match[3])))
    return found


def trigger(e2e: E2E, logical_date: str, conf: dict[str, Any]) -> tuple[str, str]:
    run_id = e2e.airflow.trigger(DAG_ID, logical_date, {**CONF, **conf})
    return run_id, e2e.interval_key(logical_date)


def cost_report(e2e: E2E, run_id: str) -> dict[str, Any]:
    path = f"/dags/{DAG_ID}/dagRuns/{run_id}/taskInstances/score_partition/xcomEntries/azureml_cost"
    value = e2e.airflow.api("GET", path, params={"map_index": 0})["value"]
    return json.loads(value) if isinstance(value, str) else value


def test_a_deadline_not_even_the_fallback_meets_fails_before_any_job_when_asked(
    e2e: E2E, monkeypatch: pytest.MonkeyPatch
) -> None:
    seed_hour_long_history(e2e, monkeypatch)
    deadline = datetime.now(timezone.utc).replace(microsecond=0) + timedelta(minutes=30)
    logical_date = "2026-11-26T00:00:00+00:00"
    run_id, interval = trigger(e2e, logical_date, {"deadline": deadline.isoformat(), "on_infeasible_deadline": "fail"})
    state = e2e.airflow.wait_for_run(DAG_ID, run_id, 400)
    result = e2e.record(
        "deadline: not even the fallback meets it (on_infeasible_deadline='fail')",
        interval,
        state,
        "the partition failed at its first try's start, before any job was sent, not retried; its rows stay unscored"
        " (counted as lost here): a clear runs them, on the fallback ('fail' applies to a first try only)",
    )
    assert state == "failed" and result.jobs_submitted == 0 and e2e.jobs_for(interval) == [], result
    tasks = {t["task_id"]: t for t in e2e.airflow.task_instances(DAG_ID, run_id)}
    assert tasks["score_partition"]["state"] == "failed" and tasks["score_partition"]["try_number"] == 1, tasks
    log = score_log(e2e, run_id, attempt=1)
    assert "AzureMLDeadlineError" in log and f"Deadline {deadline.isoformat()} cannot be met" in log, log[-3000:]
    assert "No job was sent" in log and "on_infeasible_deadline='fallback'" in log
    assert score_log(e2e, run_id, attempt=2) == ""  # no retry: time only makes it later


def test_a_preemption_that_leaves_too_little_slack_moves_the_work_to_the_fallback(
    e2e: E2E, monkeypatch: pytest.MonkeyPatch
) -> None:
    seed_hour_long_history(e2e, monkeypatch)
    deadline = datetime.now(timezone.utc).replace(microsecond=0) + timedelta(hours=2, minutes=2) + ROOM
    logical_date = "2026-11-25T00:00:00+00:00"
    preempted: list[str] = []
    before = e2e.emulator.behaviour()
    # the preempted nodes stay in the gauge a while after the job ends, so that its wait reads them up
    e2e.emulator.set_behaviour(preempted_node_release_seconds=20.0)
    e2e.emulator.hold_cluster(CLUSTER)  # the spot job runs, and does not end, until the preemption
    try:
        triggered = time.time()
        run_id, interval = trigger(e2e, logical_date, {"deadline": deadline.isoformat()})
        first = wait_until(lambda: policy_lines(score_log(e2e, run_id)), 300, "the first spot decision", interval=1)
        what, _, inputs = first[0]
        waited = inputs["deadline_now"] - triggered
        assert waited < ROOM.total_seconds(), f"the first decision came {waited:.0f} s after the trigger: no room"
        assert what == "stay on spot" and inputs["deadline_verdict"] == "spot", first[0]
        assert abs(inputs["deadline"] - deadline.timestamp()) < 1, inputs
        # Spot fits until the slack falls below the margin; a moment later, not even one attempt more fits.
        fits_until = inputs["deadline_now"] + (inputs["deadline_slack_hours"] - inputs["deadline_margin_hours"]) * 3600
        # a minute more: the preemption itself moves the estimates a little (seconds with this history)
        wait_until(lambda: time.time() > fits_until + 60, ROOM.total_seconds() + 90, "the slack to run out", 1)
        ended = preempt_whole_cluster(e2e, lambda job: f"/input/{interval}/" in str(job.input_uri or ""), preempted)
    finally:
        e2e.emulator.hold_cluster(CLUSTER, held=False)
        e2e.emulator.set_behaviour(preempted_node_release_seconds=before["preempted_node_release_seconds"])
    state = e2e.airflow.wait_for_run(DAG_ID, run_id, 400)
    jobs = e2e.jobs_for(interval)
    result = e2e.record(
        "deadline: a preemption leaves too little slack",
        interval,
        state,
        "the partition started on spot; after the preemption the deadline rule moved it to the fallback",
    )
    assert state == "success" and len(preempted) == 1 and len(ended) == 1, (state, preempted, ended)
    assert_exactly_once(result, jobs=2)
    assert [(j.deployment, j.status) for j in sorted(jobs, key=lambda j: j.created)] == [
        ("classifier-mlflow", "Canceled"),
        (FALLBACK, "Completed"),
    ]
    # logged: the decision after the preemption, with the deadline's numbers that made it
    decisions = policy_lines(score_log(e2e, run_id))
    moved = [d for d in decisions if d[0].startswith("move to the fallback")]
    assert len(moved) == 1 and moved[0][1] == "deadline", decisions
    after = moved[0][2]
    assert after["preemptions"] == 1 and after["deadline_verdict"] == "fallback", after
    assert after["deadline_slack_hours"] < after["deadline_margin_hours"], after
    # met: the chain ended before the deadline, which the bill (and the UI's savings view) carries
    report = cost_report(e2e, run_id)
    finished = datetime.fromisoformat(report["finished_at"])
    assert datetime.fromisoformat(report["deadline"]) == deadline and finished < deadline, report
