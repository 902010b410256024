"""Waits against the emulator over the wire (real azure-identity, aiohttp, requests): a wait never hangs,
one bad job fails only its own wait, credentials are refreshed, waits are bounded, not found means not found,
and the compute's preemption gauge is sampled with shared reads while jobs run."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import threading
from pathlib import Path
from typing import Any

import pytest

from airflow_azureml import naming
from airflow_azureml.emulator import Emulator
from airflow_azureml.emulator.scoring.data import write_heart_csvs
from airflow_azureml.hooks import AzureMLHook
from airflow_azureml.hooks.rest import AsyncRestClient
from airflow_azureml.polling import PollingPolicy
from airflow_azureml.triggers.job import AzureMLJobTrigger
from airflow_azureml.triggers.poller import WorkspacePoller
from tests.conftest import load_dag, task_states
from tests.integration.test_emulator_sdk import invoke, setup_workspace
from tests.integration.test_example_dag import INTERVAL

FAST = {"interval": 0.05, "max_interval": 0.2, "jitter": 0.0}
CONN = "azure_ml_default"
HANG_GUARD = 90.0  # seconds; only ever reached when a wait hangs


def trigger(name: str, **kwargs: Any) -> AzureMLJobTrigger:
    return AzureMLJobTrigger(job_name=name, azure_ml_conn_id=CONN, polling=kwargs.pop("polling", FAST), **kwargs)


async def run_trigger(t: AzureMLJobTrigger) -> dict[str, Any]:
    async for event in t.run():
        return event.payload
    raise AssertionError("trigger yielded nothing")


async def until(predicate: Any) -> None:
    while not predicate():
        await asyncio.sleep(0.01)


@pytest.fixture
def jobs(emulator: Emulator, azureml_conn: dict[str, Any]) -> tuple[Emulator, Any]:
    ml = setup_workspace(AzureMLHook())
    write_heart_csvs(emulator.datastore_path("in/a"), files=6, rows_per_file=4)
    return emulator, ml


def invoke_tagged(ml: Any, input_path: str, job_name: str) -> str:
    """A batch job as the provider submits it: carrying ``naming.UNIT_TAG`` as a user property."""
    from azure.ai.ml import Input

    from tests.integration.test_emulator_sdk import DEPLOYMENT, ENDPOINT

    job = ml.batch_endpoints.invoke(
        endpoint_name=ENDPOINT,
        deployment_name=DEPLOYMENT,
        inputs={
            "heart_dataset": Input(
                type="uri_folder", path=f"azureml://datastores/workspaceblobstore/paths/{input_path}/"
            )
        },
        job_name=job_name,
        params_override=[{"properties": {naming.UNIT_TAG: f"unit-{job_name}"}}],
    )
    return str(job.name)


def job_reads(emulator: Emulator, name: str) -> list[dict[str, Any]]:
    return [r for r in emulator.requests() if r["method"] == "GET" and r["path"].endswith(f"/jobs/{name}")]


# ----------------------------------------------------------------- shutdown race
def test_trigger_started_while_the_poller_closes_is_served(
    jobs: tuple[Emulator, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The last wait resolved and ``_run``'s ``finally`` awaits ``close()``: a trigger starting then is served."""
    _, ml = jobs
    first, second = invoke(ml, "in/a", "job-race-1"), invoke(ml, "in/a", "job-race-2")
    original_close = AsyncRestClient.close
    closes: list[asyncio.Event] = []

    async def scenario() -> dict[str, Any]:
        closing, release = asyncio.Event(), asyncio.Event()

        async def held_close(self: AsyncRestClient) -> None:
            closes.append(closing)
            closing.set()
            await release.wait()
            await original_close(self)

        monkeypatch.setattr(AsyncRestClient, "close", held_close)
        assert (await run_trigger(trigger(first)))["status"] == "terminal"
        await closing.wait()  # the first poller is now inside close()
        late = asyncio.create_task(run_trigger(trigger(second)))
        for _ in range(10):
            await asyncio.sleep(0)  # the late trigger joins (or not) while close() is held
        release.set()
        return await asyncio.wait_for(late, HANG_GUARD)

    event = asyncio.run(scenario())
    assert event["status"] == "terminal" and event["job"]["status"] == "Completed"


# ---------------------------------------------------- one bad job fails only its wait
@pytest.mark.parametrize("status", [400, 403])
def test_a_bad_job_fails_only_its_own_wait(jobs: tuple[Emulator, Any], status: int) -> None:
    emulator, ml = jobs
    good = [invoke(ml, "in/a", f"job-good-{i}") for i in range(2)]
    bad = invoke(ml, "in/a", "job-bad")
    emulator.add_fault(kind="status", status=status, path=f"/jobs/{bad}$", methods=["GET"], count=None)

    async def scenario() -> list[dict[str, Any]]:
        return await asyncio.wait_for(asyncio.gather(*(run_trigger(trigger(n)) for n in [*good, bad])), HANG_GUARD)

    events = {e["job_name"]: e for e in asyncio.run(scenario())}
    assert events[bad]["status"] == "error" and f"HTTP {status}" in events[bad]["message"]
    for name in good:
        assert events[name]["status"] == "terminal" and events[name]["job"]["status"] == "Completed"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_token_failure_is_transient_and_the_credential_is_rebuilt_from_the_connection(
    jobs: tuple[Emulator, Any], azureml_conn: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Entra ID unreachable: the waits keep going; once the connection works again, a new credential is used."""
    _, ml = jobs
    names = [invoke(ml, "in/a", f"job-tok-{i}") for i in range(2)]
    good = azureml_conn["airflow_conn_json"]
    info = json.loads(good)
    info["extra"]["authority_url"] = f"https://127.0.0.1:{_closed_port()}"
    monkeypatch.setenv("AIRFLOW_CONN_AZURE_ML_DEFAULT", json.dumps(info))

    async def scenario() -> list[dict[str, Any]]:
        waits = asyncio.gather(*(run_trigger(trigger(n)) for n in names))
        await asyncio.sleep(0)
        poller = WorkspacePoller.for_connection(CONN)
        await asyncio.wait_for(until(lambda: poller.stats.transient_errors >= 1), HANG_GUARD)
        os.environ["AIRFLOW_CONN_AZURE_ML_DEFAULT"] = good  # the admin fixed the connection
        return await asyncio.wait_for(waits, HANG_GUARD)

    events = asyncio.run(scenario())
    assert [e["status"] for e in events] == ["terminal", "terminal"], events


def test_a_rotated_secret_is_picked_up_from_the_connection(
    jobs: tuple[Emulator, Any], azureml_conn: dict[str, Any]
) -> None:
    """The secret is rotated in Entra ID while jobs wait; the admin updates the connection a bit later."""
    emulator, ml = jobs
    emulator.set_capacity("low-pri-cluster", 0)
    names = [invoke(ml, "in/a", f"job-rotated-{i}") for i in range(2)]
    rotated = json.loads(azureml_conn["airflow_conn_json"])
    rotated["password"] = "the-rotated-secret-value"

    def rotate() -> None:
        emulator.call(lambda: emulator.identity.clients.__setitem__(azureml_conn["client_id"], rotated["password"]))
        emulator.expire_tokens()

    async def scenario() -> list[dict[str, Any]]:
        waits = asyncio.gather(*(run_trigger(trigger(n)) for n in names))
        await asyncio.sleep(0)
        poller = WorkspacePoller.for_connection(CONN)
        await asyncio.wait_for(until(lambda: poller.stats.ticks >= 1), HANG_GUARD)
        await asyncio.to_thread(rotate)
        await asyncio.wait_for(until(lambda: poller.stats.transient_errors >= 1), HANG_GUARD)
        os.environ["AIRFLOW_CONN_AZURE_ML_DEFAULT"] = json.dumps(rotated)
        await asyncio.to_thread(emulator.set_capacity, "low-pri-cluster", None)
        return await asyncio.wait_for(waits, HANG_GUARD)

    events = asyncio.run(scenario())
    assert [e["status"] for e in events] == ["terminal", "terminal"], events
    assert "the-rotated-secret-value" not in json.dumps(events)


def test_async_wait_after_all_tokens_expired_uses_a_new_token(jobs: tuple[Emulator, Any]) -> None:
    emulator, ml = jobs
    emulator.set_capacity("low-pri-cluster", 0)  # queued until we let it run
    name = invoke(ml, "in/a", "job-401")

    async def scenario() -> dict[str, Any]:
        wait = asyncio.create_task(run_trigger(trigger(name)))
        await asyncio.sleep(0)
        poller = WorkspacePoller.for_connection(CONN)
        await asyncio.wait_for(until(lambda: poller.stats.ticks >= 1), HANG_GUARD)
        await asyncio.to_thread(emulator.expire_tokens)
        await asyncio.to_thread(emulator.set_capacity, "low-pri-cluster", None)
        return await asyncio.wait_for(wait, HANG_GUARD)

    event = asyncio.run(scenario())
    assert event["status"] == "terminal", event
    # the wait's reads: the job's, and its compute's (read while the job is queued too, for its node counts)
    reads = job_reads(emulator, name) + _compute_reads(emulator, 0)
    assert any(r.get("auth") == "rejected" for r in reads), "the 401 path was not exercised"


def test_sync_read_after_all_tokens_expired_uses_a_new_token(jobs: tuple[Emulator, Any]) -> None:
    emulator, ml = jobs
    name = invoke(ml, "in/a", "job-401-sync")
    hook = AzureMLHook()
    assert hook.job_snapshot(name) is not None
    emulator.expire_tokens()
    assert hook.job_snapshot(name) is not None
    assert any(r.get("auth") == "rejected" for r in job_reads(emulator, name))


# ------------------------------------------------------------------ bounded waits
def test_retry_after_is_capped_by_max_interval(jobs: tuple[Emulator, Any]) -> None:
    emulator, ml = jobs
    name = invoke(ml, "in/a", "job-ra")
    emulator.add_fault(kind="status", status=429, retry_after=86400, path=f"/jobs/{name}$", methods=["GET"], count=1)
    event = asyncio.run(asyncio.wait_for(run_trigger(trigger(name)), HANG_GUARD))
    assert event["status"] == "terminal"
    assert job_reads(emulator, name)[0]["retry_after"] == "86400"


def test_sync_wait_caps_retry_after(jobs: tuple[Emulator, Any]) -> None:
    emulator, ml = jobs
    name = invoke(ml, "in/a", "job-ra-sync")
    emulator.add_fault(kind="status", status=503, retry_after=86400, path=f"/jobs/{name}$", methods=["GET"], count=1)
    result: list[Any] = []
    worker = threading.Thread(
        target=lambda: result.append(AzureMLHook().wait_for_job(name, PollingPolicy(**FAST))), daemon=True
    )
    worker.start()
    worker.join(HANG_GUARD)
    assert result and result[0].status == "Completed"


def test_trigger_on_kill_retries_a_throttled_cancel_within_the_policy(jobs: tuple[Emulator, Any]) -> None:
    emulator, ml = jobs
    emulator.set_capacity("low-pri-cluster", 0)
    name = invoke(ml, "in/a", "job-kill-ra")
    emulator.add_fault(kind="status", status=503, retry_after=86400, path=f"/jobs/{name}/cancel$", count=1)
    asyncio.run(asyncio.wait_for(trigger(name).on_kill(), HANG_GUARD))
    job = emulator.job(name)
    assert job is not None and job.status in ("CancelRequested", "Canceled")


# --------------------------------------------------------- the LIST is narrowed
def test_the_list_is_narrowed_to_the_providers_jobs(jobs: tuple[Emulator, Any]) -> None:
    emulator, ml = jobs
    tagged = [invoke_tagged(ml, "in/a", f"job-list-{i}") for i in range(6)]
    untagged = invoke(ml, "in/a", "job-list-foreign")  # e.g. a sensor on a job someone else submitted
    before = len(emulator.requests())

    async def scenario() -> tuple[list[dict[str, Any]], WorkspacePoller]:
        waits = asyncio.gather(*(run_trigger(trigger(n)) for n in [*tagged, untagged]))
        await asyncio.sleep(0)
        poller = WorkspacePoller.for_connection(CONN)
        return await asyncio.wait_for(waits, HANG_GUARD), poller

    events, poller = asyncio.run(scenario())
    assert {e["status"] for e in events} == {"terminal"}
    lists = [r for r in emulator.requests()[before:] if r["method"] == "GET" and r["path"].endswith("/jobs")]
    assert lists, "more than three waits share a LIST"
    # every provider job carries UNIT_TAG as a user property (batch invoke cannot send tags)
    assert all(r["query"].get("properties") == naming.UNIT_TAG for r in lists), lists[0]["query"]
    assert job_reads(emulator, untagged), "a job outside the LIST is read by GET"
    assert poller.stats.job_gets < poller.stats.waits_served, "the tagged jobs are served by the LIST"


# -------------------------------------------------------- not found means not found
def test_trigger_waits_for_a_job_that_does_not_exist_yet(jobs: tuple[Emulator, Any]) -> None:
    emulator, ml = jobs
    name = "job-created-later"

    async def scenario() -> dict[str, Any]:
        wait = asyncio.create_task(run_trigger(trigger(name, wait_for_creation=True)))
        await asyncio.wait_for(until(lambda: any(r["status"] == 404 for r in job_reads(emulator, name))), HANG_GUARD)
        await asyncio.to_thread(invoke, ml, "in/a", name)
        return await asyncio.wait_for(wait, HANG_GUARD)

    event = asyncio.run(scenario())
    assert event["status"] == "terminal" and event["job"]["status"] == "Completed"


def test_deferrable_sensor_waits_for_a_job_submitted_later(
    jobs: tuple[Emulator, Any], airflow_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    emulator, ml = jobs
    name = "job-sensed-before-it-exists"
    monkeypatch.setenv("AZUREML_TEST_FAILURES", str(tmp_path / "failures.jsonl"))
    monkeypatch.setenv("AZUREML_TEST_CASE", json.dumps({"job_name": name, "mode": "deferrable"}))
    stop = threading.Event()

    def submit_after_a_miss() -> None:
        while not stop.is_set():
            if len([r for r in job_reads(emulator, name) if r["status"] == 404]) >= 2:
                invoke(ml, "in/a", name)
                return
            stop.wait(0.02)

    submitter = threading.Thread(target=submit_after_a_miss, daemon=True)
    submitter.start()
    try:
        dag_run = load_dag("azureml_sensor_cases.py").test(logical_date=INTERVAL)
    finally:
        stop.set()
        submitter.join(10)
    assert str(dag_run.state) == "success", task_states(dag_run)
    assert emulator.job(name) is not None


def test_run_history_404_of_an_existing_job_is_not_no_such_job(jobs: tuple[Emulator, Any]) -> None:
    emulator, ml = jobs
    emulator.set_capacity("low-pri-cluster", 0)
    name = invoke(ml, "in/a", "job-details-404")
    hook = AzureMLHook()
    hook.cancel_job(name)
    snapshot = hook.wait_for_job(name, PollingPolicy(**FAST))
    assert snapshot.status == "Canceled"
    emulator.add_fault(kind="status", status=404, path=f"/runs/{name}/details$", count=None)
    again = AzureMLHook().job_snapshot(name)
    assert again is not None and again.name == name and again.status == "Canceled"


# ------------------------------------------------------- a completed job's run times
def test_a_completed_jobs_waits_keep_its_run_times_and_its_bill_a_floor(jobs: tuple[Emulator, Any]) -> None:
    """Sync and deferred, a completed job's wait reads run history's start and end times, so the bill counts the
    attempt's node time even when no read of the cluster fell inside its run. Without them a completed attempt
    billed only what the reads saw: a .ci/run on Airflow 3.1 got a cost of 0 for a completed scoring task
    (tests/integration/test_openlineage.py)."""
    from airflow_azureml import cost

    emulator, ml = jobs
    sync_name = invoke(ml, "in/a", "job-completed-times-sync")
    snapshot = AzureMLHook().wait_for_job(sync_name, PollingPolicy(**FAST))
    deferred_name = invoke(ml, "in/a", "job-completed-times-deferred")
    event = asyncio.run(asyncio.wait_for(run_trigger(trigger(deferred_name)), HANG_GUARD))
    assert event["status"] == "terminal"
    for name, started_at, ended_at in (
        (sync_name, snapshot.started_at, snapshot.ended_at),
        (deferred_name, event["job"]["started_at"], event["job"]["ended_at"]),
    ):
        job = emulator.job(name)
        assert job.status == "Completed" and job.started is not None and job.ended is not None
        assert started_at == pytest.approx(job.started.timestamp(), abs=0.01), name
        assert ended_at == pytest.approx(job.ended.timestamp(), abs=0.01), name
    # the deferred wait's usage carries them: a bill of it with its reads all outside the run still counts the run
    (span,) = [s for s in event["usage"]["spans"] if s.get("job") == deferred_name]
    assert span["started_at"] == event["job"]["started_at"] and span["ended_at"] == event["job"]["ended_at"]
    start, end = span["started_at"], span["ended_at"]
    zero = [0] * len(cost.STATES)
    span["points"], span["end"] = [[start - 2.0, *zero], [end + 1.0, *zero]], end + 1.0  # no node seen by a read
    span["instance_count"] = 2
    bill = cost.estimate(event["usage"], {"low-pri-cluster": {"dedicated": 1.0, "spot": 0.2}})
    assert bill["node_hours_total"] == pytest.approx(2 * (end - start) / 3600.0, rel=1e-6), bill


@pytest.mark.parametrize("status", [403, 503])
def test_run_history_that_fails_for_a_completed_job_does_not_fail_its_wait(
    jobs: tuple[Emulator, Any], status: int
) -> None:
    """A completed job's run-history details only refine its bill: a read of them that fails (no permission on
    run history, throttling) leaves them out, and the sync and the deferred wait still end Completed at once."""
    emulator, ml = jobs
    sync_name = invoke(ml, "in/a", f"job-history-{status}-sync")
    deferred_name = invoke(ml, "in/a", f"job-history-{status}-deferred")
    emulator.add_fault(kind="status", status=status, path="/runs/[^/]+/details$", count=None)
    snapshot = AzureMLHook().wait_for_job(sync_name, PollingPolicy(**FAST))
    event = asyncio.run(asyncio.wait_for(run_trigger(trigger(deferred_name)), HANG_GUARD))
    assert snapshot.status == "Completed" and snapshot.started_at is None
    assert event["status"] == "terminal" and event["job"]["status"] == "Completed", event
    assert event["job"]["started_at"] is None
    for name in (sync_name, deferred_name):  # one read of the details per wait: no retry, no loop on them
        reads = [r for r in emulator.requests() if r["path"].endswith(f"/runs/{name}/details")]
        assert [r["status"] for r in reads] == [status], (name, reads)


# ------------------------------------------------------------ the preemption gauge
def _compute_reads(emulator: Emulator, since: int, compute: str = "low-pri-cluster") -> list[dict[str, Any]]:
    return [
        r for r in emulator.requests()[since:] if r["method"] == "GET" and r["path"].endswith(f"/computes/{compute}")
    ]


def test_async_waits_sample_the_gauge_with_shared_compute_reads(jobs: tuple[Emulator, Any]) -> None:
    emulator, ml = jobs
    write_heart_csvs(emulator.datastore_path("in/big"), files=40, rows_per_file=2)
    names = [invoke_tagged(ml, "in/big", f"job-gauge-{i}") for i in range(5)]
    before = len(emulator.requests())

    async def scenario() -> tuple[list[dict[str, Any]], WorkspacePoller]:
        waits = asyncio.gather(*(run_trigger(trigger(n)) for n in names))
        await asyncio.sleep(0)
        poller = WorkspacePoller.for_connection(CONN)
        return await asyncio.wait_for(waits, HANG_GUARD), poller

    events, poller = asyncio.run(scenario())
    assert {e["status"] for e in events} == {"terminal"}
    evidence = [e["gauge_evidence"] for e in events]
    sampled = [ev for ev in evidence if ev["samples"]]  # a job seen Running only once may have no sample
    assert sampled, evidence
    assert all(ev["compute"] == "low-pri-cluster" and ev["low_priority"] is True for ev in sampled), sampled
    assert all(ev["first_while_running"] is not None for ev in sampled)
    # shared reads: one read per compute per tick at most, however many waits run on it
    reads = _compute_reads(emulator, before)
    assert 0 < len(reads) == poller.stats.compute_gets <= poller.stats.ticks


def test_sync_wait_returns_the_gauge_evidence(jobs: tuple[Emulator, Any]) -> None:
    emulator, ml = jobs
    write_heart_csvs(emulator.datastore_path("in/big"), files=40, rows_per_file=2)
    name = invoke(ml, "in/big", "job-gauge-sync")
    before = len(emulator.requests())
    snapshot, evidence = AzureMLHook().wait_for_job_evidence(name, PollingPolicy(**FAST))
    assert snapshot.status == "Completed"
    assert evidence.compute == "low-pri-cluster" and evidence.low_priority is True
    assert 1 <= evidence.samples <= len(_compute_reads(emulator, before))
    assert evidence.first_while_running is not None and evidence.peak_while_running is not None


# ------------------------------------------------ NotResponding and Paused are not terminal
def test_a_job_that_stops_responding_and_resumes_is_waited_for(jobs: tuple[Emulator, Any]) -> None:
    emulator, ml = jobs
    # Every job, once Running, goes NotResponding. The sync job's wait must see that: it resumes once a poll
    # has (a 0.5 s stall needed a poll inside it, which a loaded machine may not make).
    emulator.set_behaviour(stall_seconds=600)
    sync_name = invoke(ml, "in/a", "job-stall-sync")
    statuses: list[str] = []

    def seen(snapshot: Any) -> None:
        statuses.append(snapshot.status)
        if snapshot.status == "NotResponding":  # the service resumes the job
            emulator.call(lambda: emulator.workspace.jobs[sync_name].set_status("Running"))

    snapshot = AzureMLHook().wait_for_job(sync_name, PollingPolicy(**FAST), seen)
    assert "NotResponding" in statuses and snapshot.status == "Completed", statuses

    emulator.set_behaviour(stall_seconds=0.5)  # the trigger's wait outlasts it, whatever it saw
    async_name = invoke(ml, "in/a", "job-stall-async")
    event = asyncio.run(asyncio.wait_for(run_trigger(trigger(async_name)), HANG_GUARD))
    job = emulator.job(async_name)
    assert job is not None and job.stalled
    assert event["status"] == "terminal" and event["job"]["status"] == "Completed", event


def test_a_poke_that_cannot_get_a_token_pokes_again(
    jobs: tuple[Emulator, Any], azureml_conn: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    from airflow_azureml.sensors import AzureMLJobSensor

    _, ml = jobs
    name = invoke(ml, "in/a", "job-poke-token")
    info = json.loads(azureml_conn["airflow_conn_json"])
    info["extra"]["authority_url"] = f"https://127.0.0.1:{_closed_port()}"
    monkeypatch.setenv("AIRFLOW_CONN_AZURE_ML_DEFAULT", json.dumps(info))
    sensor = AzureMLJobSensor(task_id="s", job_name=name)
    assert sensor.poke({}) is False  # Entra ID unreachable: not a failed sensor
    monkeypatch.setenv("AIRFLOW_CONN_AZURE_ML_DEFAULT", azureml_conn["airflow_conn_json"])
    AzureMLHook().wait_for_job(name, PollingPolicy(**FAST))
    # the same hook's client rebuilt its credential from the fixed connection
    again = sensor.hook.job_snapshot(name, transient_retries=False)
    assert again is not None and again.status == "Completed"
