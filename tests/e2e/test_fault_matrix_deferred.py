"""The fault matrix on a real Airflow deployment, part 3: tasks that wait in the triggerer (two
triggerers; a person's cancel or clear while deferred) and the service renaming jobs (a retry must
still find them).

Each test runs the example DAG for its own data interval, so results are independent; the last test
checks that nothing this deployment wrote holds secret material.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import pytest

from tests.e2e.conftest import DAG_ID, E2E
from tests.e2e.rows import (
    CLUSTER,
    CONF,
    DEPLOYMENT,
    ENDPOINT,
    alive_triggerers,
    assert_exactly_once,
    assert_no_secret_material,
    held_queued,
    partition_jobs,
    pid_owning_local_port,
    run_example,
    scoring_tasks,
    sql,
    trigger_polled,
    wait_until,
)

# A row waits on conditions, never on luck; on a loaded 2-core machine a row may take minutes.
pytestmark = [pytest.mark.e2e, pytest.mark.timeout(900)]


@pytest.mark.timeout(600)
def test_two_triggerers_one_killed(e2e: E2E) -> None:
    """Airflow's HA triggerer: the triggers of a killed triggerer move to the one that lives."""
    partitions = 6
    first = alive_triggerers(e2e)
    e2e.airflow.start_service("triggerer", name="triggerer-2")
    wait_until(
        lambda: len(alive_triggerers(e2e)) == len(first) + 1, timeout=120, what="the second triggerer", paced=True
    )
    second = next(t for t in alive_triggerers(e2e) if t not in first)
    moved: list[str] = []

    def fault(run_id: str, interval: str) -> None:
        try:
            held_queued(e2e, run_id, interval, partitions)

            def assigned() -> dict[int, int]:
                query = "SELECT triggerer_id, count(*) FROM trigger WHERE triggerer_id IS NOT NULL GROUP BY 1"
                return {int(t): int(n) for t, n in sql(e2e, query)}

            wait_until(lambda: sum(assigned().values()) >= partitions, what="all triggers assigned", paced=True)
            held = assigned()
            victim = max(held, key=lambda t: held[t])
            survivor = second if victim != second else first[-1]
            e2e.airflow.kill("triggerer-2" if victim == second else "triggerer")
            moved.append("triggerer-2" if victim == second else "triggerer")
            wait_until(
                lambda: not sql(e2e, "SELECT 1 FROM trigger WHERE triggerer_id IS DISTINCT FROM %s", survivor),
                timeout=180,
                what="the survivor taking over every trigger",
            )
        finally:
            e2e.emulator.set_capacity(CLUSTER, None)

    try:
        _, interval, state = run_example(
            e2e, "2026-11-18T00:00:00+00:00", {"partitions": partitions, "files_per_partition": 1}, fault
        )
    finally:  # back to one triggerer named "triggerer", as the other rows expect
        if moved == ["triggerer"]:
            e2e.airflow.start_service("triggerer")
        e2e.airflow.stop_service("triggerer-2")
    result = e2e.record(
        "two triggerers, one killed (HA triggerer takeover)",
        interval,
        state,
        f"`kill -9` of {moved[0] if moved else 'none'}; the other triggerer took over its triggers",
    )
    assert moved and state == "success"
    assert_exactly_once(result, jobs=partitions)


@pytest.mark.timeout(900)
def test_triggerers_paused_past_their_heartbeat_and_stopped_while_20_jobs_wait(e2e: E2E) -> None:
    """Issue 18 §5: neither the move of a trigger to another triggerer nor a triggerer's graceful shutdown
    (SIGTERM, as in a rolling restart) cancels a job. A triggerer paused past its heartbeat loses its
    triggers to the other one; resumed, it finds them gone and Airflow 3.3 cancels them there as if a
    person had acted, calling ``on_kill`` (apache/airflow#73454). Then each triggerer in turn is stopped
    with SIGTERM while the other takes over."""
    partitions = 20
    wait_until(
        lambda: len(alive_triggerers(e2e)) == 1, timeout=120, what="one triggerer (an earlier row's gone)", paced=True
    )
    services = {alive_triggerers(e2e)[-1]: "triggerer"}
    e2e.airflow.start_service("triggerer", name="triggerer-2")
    wait_until(lambda: len(alive_triggerers(e2e)) == 2, timeout=120, what="the second triggerer", paced=True)
    services.update({t: "triggerer-2" for t in alive_triggerers(e2e) if t not in services})
    steps: list[str] = []
    guarded: list[tuple[int, int]] = []  # (Airflow's on_kill calls of the moved triggers, our refusals)

    def assigned() -> dict[int, int]:
        query = "SELECT triggerer_id, count(*) FROM trigger WHERE triggerer_id IS NOT NULL GROUP BY 1"
        return {int(t): int(n) for t, n in sql(e2e, query)}

    def all_on(triggerer: int) -> bool:
        return assigned() == {triggerer: partitions}

    def in_trigger_logs(run_id: str, text: str) -> int:
        """How often ``text`` is in this run's trigger logs (Airflow's and the trigger's own lines)."""
        logs = (e2e.airflow.home / "logs").glob(f"dag_id={DAG_ID}/run_id={run_id}/*/*/*.trigger.*.log")
        return sum(p.read_text(errors="replace").count(text) for p in logs)

    def on_kill_calls(run_id: str) -> int:
        return in_trigger_logs(run_id, "invoking on_kill")

    def fault(run_id: str, interval: str) -> None:
        try:
            held_queued(e2e, run_id, interval, partitions)
            wait_until(lambda: sum(assigned().values()) == partitions, what="all triggers assigned", paced=True)
            held = assigned()
            paused = max(held, key=lambda t: held[t])
            other = next(t for t in services if t != paused)
            group = e2e.airflow.procs[services[paused]].pid
            os.killpg(group, signal.SIGSTOP)  # no heartbeat: after the health threshold its triggers move
            try:
                wait_until(lambda: all_on(other), timeout=240, what="the other triggerer taking over", paced=True)
            finally:
                os.killpg(group, signal.SIGCONT)
            wait_until(
                lambda: paused in alive_triggerers(e2e),
                timeout=120,
                what="the paused triggerer's heartbeat",
                paced=True,
            )
            deadline = time.monotonic() + 60  # Airflow cancels the moved triggers at its next sync: on_kill
            while on_kill_calls(run_id) == 0 and time.monotonic() < deadline:
                time.sleep(0.5)
            calls = on_kill_calls(run_id)

            def refusals() -> int:
                return in_trigger_logs(run_id, "not a person's mark of the task")

            deadline = time.monotonic() + 60  # each on_kill reads the task's state first, then logs its refusal
            while refusals() < calls and time.monotonic() < deadline:
                time.sleep(0.5)
            guarded.append((calls, refusals()))
            steps.append(f"{services[paused]} paused past its heartbeat and resumed ({calls} on_kill calls)")
            for stopped, heir in ((other, paused), (paused, None)):
                name = services[stopped]
                wait_until(lambda: len(alive_triggerers(e2e)) >= 2, timeout=120, what="two triggerers", paced=True)
                e2e.airflow.stop_service(name)  # SIGTERM
                survivor = heir if heir is not None else next(t for t in alive_triggerers(e2e) if t != stopped)
                wait_until(
                    lambda s=survivor: all_on(s), timeout=240, what="the survivor taking every trigger", paced=True
                )
                steps.append(f"SIGTERM of {name}")
                e2e.airflow.start_service("triggerer", name=name)
                wait_until(
                    lambda: len(alive_triggerers(e2e)) >= 2, timeout=120, what="the restarted triggerer", paced=True
                )
                services.update({t: name for t in alive_triggerers(e2e) if t not in services})
        finally:
            e2e.emulator.set_capacity(CLUSTER, None)

    try:
        _, interval, state = run_example(
            e2e, "2026-11-23T00:00:00+00:00", {"partitions": partitions, "files_per_partition": 1}, fault, timeout=900
        )
    finally:  # back to one triggerer named "triggerer", as the other rows expect
        e2e.airflow.stop_service("triggerer-2")
        if e2e.airflow.procs["triggerer"].poll() is not None:
            e2e.airflow.start_service("triggerer")
    cancelled = [j.name for j in e2e.jobs_for(interval) if j.cancel_requested]
    result = e2e.record(
        "two triggerers, 20 jobs waiting: one paused past its heartbeat (its triggers move), then SIGTERM of each",
        interval,
        state,
        f"{'; '.join(steps)}; {len(cancelled)} jobs cancelled, all resumed in the other triggerer",
    )
    assert len(steps) == 3, steps
    # the fault this row is for happened: Airflow called on_kill for moved triggers, and each refused
    (calls, refused), *_ = guarded
    assert calls > 0 and refused >= calls, guarded
    assert cancelled == [], f"a trigger's move or a triggerer's shutdown cancelled {cancelled}"
    assert state == "success"
    assert_exactly_once(result, jobs=partitions)


def deferring_exits_received(e2e: E2E, run_id: str, partitions: int) -> bool:
    """The scheduler has received the executor's event for each scoring task's first try (the worker that
    deferred it has exited): its log says so, the only place Airflow records it."""
    log = (e2e.airflow.home / "scheduler.log").read_text(errors="replace")
    keys = {f"task_id='score_partition', run_id='{run_id}', try_number=1, map_index={i})": i for i in range(partitions)}
    received = set()
    for line in log.splitlines():
        if "Received executor event with state success" in line or "Received executor event with state failed" in line:
            received.update(index for key, index in keys.items() if key in line)
    return len(received) == partitions


@pytest.mark.timeout(600)
def test_person_cancels_a_job_while_its_task_is_deferred(e2e: E2E) -> None:
    cancelled: list[tuple[int, str]] = []

    def fault(run_id: str, interval: str) -> None:
        try:
            held_queued(e2e, run_id, interval, CONF["partitions"])
            index = min(scoring_tasks(e2e, run_id))
            wait_until(
                lambda: trigger_polled(e2e, run_id, interval, index), what="the trigger polling its job", paced=True
            )
            # Airflow's own race, not the provider's: when the worker that deferred the try reports its exit
            # after the trigger fired and the try resumed, the scheduler takes that late "success" for a state
            # changed externally and marks the running try UP_FOR_RETRY (seen once in CI under load: the
            # deferring worker took 6 s to exit). Let the deferring workers' exits reach the scheduler first.
            wait_until(
                lambda: deferring_exits_received(e2e, run_id, CONF["partitions"]),
                timeout=180,
                interval=1.0,
                what="the scheduler receiving the deferring tries' exits",
            )
            job = partition_jobs(e2e, interval, index)[0]
            e2e.emulator.call(lambda: e2e.emulator.workspace.cancel_job(job.name))  # Studio / az ml job cancel
            cancelled.append((index, job.name))
        finally:
            e2e.emulator.set_capacity(CLUSTER, None)

    run_id, interval, state = run_example(e2e, "2026-11-13T00:00:00+00:00", during=fault)
    assert cancelled, "the fault never fired"
    index, _ = cancelled[0]
    task = scoring_tasks(e2e, run_id)[index]
    assert state == "failed"
    assert task["state"] == "failed" and task["try_number"] == 1, f"a person's cancel must not be retried: {task}"
    assert len(partition_jobs(e2e, interval, index)) == 1, "the cancelled work was resubmitted"
    # the person's clear is the request to run it again: one new job, for that partition only
    e2e.airflow.clear_run(DAG_ID, run_id)
    state = e2e.airflow.wait_for_run(DAG_ID, run_id, 300)
    result = e2e.record(
        "a person cancels a job while its task is deferred",
        interval,
        state,
        "the try failed without retries (try 1); a later clear ran that partition again with one new job",
    )
    assert state == "success"
    assert_exactly_once(result, jobs=CONF["partitions"] + 1)


@pytest.mark.timeout(600)
def test_clear_of_a_deferred_task_after_on_kill(e2e: E2E) -> None:
    cleared: list[int] = []

    def fault(run_id: str, interval: str) -> None:
        try:
            held_queued(e2e, run_id, interval, CONF["partitions"])
            index = min(scoring_tasks(e2e, run_id))
            wait_until(
                lambda: trigger_polled(e2e, run_id, interval, index), what="the trigger polling its job", paced=True
            )
            e2e.airflow.api(
                "POST",
                f"/dags/{DAG_ID}/clearTaskInstances",
                json={
                    "dry_run": False,
                    "dag_run_id": run_id,
                    "task_ids": [["score_partition", index]],
                    "only_failed": False,
                    "reset_dag_runs": True,
                },
            )
            cleared.append(index)
            wait_until(
                lambda: any(j.cancel_requested for j in partition_jobs(e2e, interval, index)),
                timeout=90,
                what="on_kill's cancel of the cleared task's job",
            )
        finally:
            e2e.emulator.set_capacity(CLUSTER, None)

    _, interval, state = run_example(e2e, "2026-11-14T00:00:00+00:00", during=fault)
    assert cleared, "the fault never fired"
    jobs = sorted(partition_jobs(e2e, interval, cleared[0]), key=lambda j: j.created)
    result = e2e.record(
        "a clear of a deferred task after `on_kill`",
        interval,
        state,
        "the job was cancelled (by the cleared task's next try; on_kill leaves it to that try); the next try "
        "submitted the next job of the chain instead of attaching",
    )
    assert state == "success"
    assert [j.status for j in jobs] == ["Canceled", "Completed"], [(j.name, j.status) for j in jobs]
    assert_exactly_once(result, jobs=CONF["partitions"] + 1)


@pytest.mark.timeout(600)
def test_service_ignores_the_requested_job_name(e2e: E2E) -> None:
    """Azure/azure-sdk-for-python#32763: the service names the job; a retry must still find it."""
    killed: list[str] = []

    def kill_submitter(entry: dict[str, Any]) -> None:
        pid = pid_owning_local_port(entry["peer_port"])
        if pid and pid != os.getpid() and not killed:
            killed.append(str(pid))
            os.kill(pid, signal.SIGKILL)

    e2e.emulator.set_deployment_behaviour(ENDPOINT, DEPLOYMENT, ignore_job_name=True)
    e2e.emulator.after_response(
        lambda e: e["method"] == "POST" and e["path"].startswith("/inference/batch/") and e["status"] == 201,
        kill_submitter,
    )
    try:
        _, interval, state = run_example(e2e, "2026-11-15T00:00:00+00:00")
    finally:
        e2e.emulator.set_deployment_behaviour(ENDPOINT, DEPLOYMENT, ignore_job_name=False)
    jobs = e2e.jobs_for(interval)
    result = e2e.record(
        "the service ignores the requested job name (and the submitter is killed after the invoke)",
        interval,
        state,
        "the retry found the service-named job by its unit-of-work marker instead of submitting another",
    )
    assert killed, "the fault never fired"
    assert all(j.name.startswith("batchjob-") for j in jobs), [j.name for j in jobs]
    assert state == "success"
    assert_exactly_once(result, jobs=CONF["partitions"])


@pytest.mark.timeout(600)
def test_submitter_killed_before_the_answer_while_the_name_is_ignored_and_the_list_lags(e2e: E2E) -> None:
    """The least convenient Azure at once: the job exists, its answer never reaches the task (kill -9 while
    the response is held after the commit), the name is Azure's, the invoke's properties never reach the
    job, the LIST ignores its properties filter and shows the job only 60 s later (long enough that the
    retry starts inside that window on a loaded machine too), and the task's ``task_state_store`` rows are
    deleted after the kill. The unit journal's unfinished submit is what makes the retry wait, and the job's
    carrier (endpoint, deployment, experiment, data paths) is what finds it (issue 18 §4)."""
    killed: list[str] = []

    def kill_while_answer_held(run_id: str, interval: str) -> None:
        def submitter_waiting_for_its_answer() -> int | None:
            """The task process whose invoke created its job and whose answer the emulator still holds."""
            if not e2e.jobs_for(interval):
                return None
            for r in e2e.emulator.requests():
                if r.get("fault") == "latency-after" and "status" not in r and r.get("peer_port"):
                    pid = pid_owning_local_port(r["peer_port"])
                    if pid and pid != os.getpid():
                        return pid
            return None

        pid = wait_until(submitter_waiting_for_its_answer, what="the submitter of a committed invoke, answer held")
        killed.append(str(pid))
        os.kill(pid, signal.SIGKILL)
        # the killed try wrote its record before the invoke: lose it (a store cleaned up, or Airflow < 3.3)
        lost.extend(sql(e2e, "DELETE FROM task_state_store WHERE run_id = %s RETURNING task_id", run_id))

    lost: list[tuple[Any, ...]] = []
    e2e.emulator.set_deployment_behaviour(ENDPOINT, DEPLOYMENT, ignore_job_name=True)
    e2e.emulator.set_behaviour(
        list_lag_seconds=60.0, list_ignores_properties_filter=True, invoke_properties_dropped=True
    )
    e2e.emulator.add_fault(kind="latency", seconds=15, when="after", route="invoke", count=1)
    try:
        _, interval, state = run_example(e2e, "2026-11-22T00:00:00+00:00", during=kill_while_answer_held)
    finally:
        e2e.emulator.set_behaviour(
            list_lag_seconds=0.0, list_ignores_properties_filter=False, invoke_properties_dropped=False
        )
        e2e.emulator.set_deployment_behaviour(ENDPOINT, DEPLOYMENT, ignore_job_name=False)
    result = e2e.record(
        "`kill -9` of the submitter before the invoke's answer, with the name ignored, the properties dropped, "
        "the LIST unfiltered and 60 s behind, and the task state deleted",
        interval,
        state,
        "the retry found the unfinished submit in the unit journal and followed the job that carries the "
        "unit's endpoint, deployment and data paths once the LIST showed it",
    )
    assert killed, "the fault never fired"
    assert lost, "the killed try had written no task state to lose"
    assert state == "success"
    assert_exactly_once(result, jobs=CONF["partitions"])


def test_no_secret_or_token_in_logs_xcom_or_trigger_rows(e2e: E2E) -> None:
    assert_no_secret_material(e2e)
