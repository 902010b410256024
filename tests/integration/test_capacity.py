"""Capacity as Airflow sees it: the cluster's delete in overlapping runs, and the capacity pool.

Real parts only: the real SDK against the emulator, real ``dag.test()`` runs on the session's metadata DB, and
for the pool Airflow's own REST API (its FastAPI app served by uvicorn on 127.0.0.1) on that same DB.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pendulum
import pytest

from airflow_azureml.emulator import Emulator
from airflow_azureml.emulator.scoring.data import write_heart_csvs
from tests.conftest import REPO, load_dag, task_states, xcom_value
from tests.helpers import when_running
from tests.integration.test_emulator_sdk import setup_workspace

RUN_A = pendulum.datetime(2026, 11, 1, tz="UTC")
RUN_B = pendulum.datetime(2026, 11, 2, tz="UTC")


@pytest.fixture
def workspace(emulator: Emulator, azureml_conn: dict[str, Any], airflow_db: Path) -> Emulator:
    from airflow_azureml.hooks import AzureMLHook

    setup_workspace(AzureMLHook())
    write_heart_csvs(emulator.datastore_path("in/a"), files=4, rows_per_file=5)
    return emulator


def run_b_in_another_process(case: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    """Run B of the DAG, with no work of its own: ``dag.test()`` needs a main thread, so it is a second process
    on the same metadata DB and emulator, as a second worker would be."""
    script = (
        "import pendulum\n"
        "from tests.conftest import load_dag\n"
        "run = load_dag('azureml_capacity_cases.py', 'azureml_capacity_teardown').test(\n"
        f"    logical_date=pendulum.parse({RUN_B.isoformat()!r}), run_conf={{'inputs': []}})\n"
        "print('STATE', run.state)\n"
    )
    code = (
        "import sys, pathlib\n"
        f"sys.path.insert(0, {str(REPO)!r})\n"
        "import tests.conftest as c\n"
        f"c.DAGS_FOLDER = pathlib.Path({os.environ['AIRFLOW__CORE__DAGS_FOLDER']!r})\n"
        f"sys.path.insert(0, str(c.DAGS_FOLDER))\n" + script
    )
    env = {k: v for k, v in os.environ.items() if k != "AZUREML_CURRENT_CLOUD"}  # a fresh process's cloud
    env["AZUREML_TEST_CASE"] = json.dumps(case)
    return subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("compute_id_null", [False, True], ids=["computeId", "computeId-null"])
def test_delete_skips_while_another_runs_job_runs(
    workspace: Emulator, monkeypatch: pytest.MonkeyPatch, compute_id_null: bool
) -> None:
    """Run A's job runs on the cluster; run B's teardown deletes nothing (skipped, and says why); A's job
    completes, and A's own teardown, with the cluster free, deletes it. With ``computeId`` null on the batch
    job (Azure's recorded shape) the job is known by its deployment's compute."""
    emulator = workspace
    emulator.set_behaviour(batch_job_compute_id_null=compute_id_null)
    monkeypatch.setenv("AZUREML_TEST_CASE", json.dumps({"if_busy": "skip"}))
    runs_b: list[subprocess.CompletedProcess[str]] = []
    jobs_at_b: list[list[tuple[str, str]]] = []

    b_window: list[int] = []

    def run_b(_emulator: Emulator, _job: str) -> None:  # A's job is Running, held until this returns
        b_window.append(len(emulator.requests()))
        runs_b.append(run_b_in_another_process({"if_busy": "skip"}))
        jobs_at_b.append([(j.name, j.status) for j in emulator.jobs()])
        b_window.append(len(emulator.requests()))

    with when_running(emulator, run_b, timeout=300):
        run_a = load_dag("azureml_capacity_cases.py", "azureml_capacity_teardown").test(
            logical_date=RUN_A, run_conf={"inputs": ["in/a"]}
        )
    assert runs_b, "run B never started"
    out = runs_b[0].stdout + runs_b[0].stderr
    assert "STATE" in out, out[-3000:]
    (job_a,) = emulator.jobs()
    assert jobs_at_b == [[(job_a.name, "Running")]], "A's job was not running when B's teardown ran"
    assert "Compute low-pri-cluster is in use, so it is not deleted" in out, out[-3000:]
    # the job LIST shows it: the emulator's nodes of a job count as running only while they work a mini-batch,
    # and a queued job holds none at all
    assert f"1 job(s) not ended on it: {job_a.name} (Running)" in out, out[-3000:]
    # while run B ran (no submit of its own; A's job held Running), only B's delete read deployments, and only
    # when the job did not name its compute
    during_b = emulator.requests()[b_window[0] : b_window[1]]
    deployment_reads = [r for r in during_b if r["method"] == "GET" and "/deployments/" in r["path"]]
    assert bool(deployment_reads) is compute_id_null, deployment_reads
    b_states = b_task_states(RUN_B)
    assert b_states["delete"] == "skipped", b_states

    assert str(run_a.state) == "success", task_states(run_a)
    assert job_a.status == "Completed", job_a.error
    assert xcom_value(run_a, "delete") is True  # A's teardown found the cluster free
    deletes = [r for r in emulator.requests() if r["method"] == "DELETE" and "/computes/" in r["path"]]
    assert len(deletes) == 1, deletes
    assert emulator.call(lambda: "low-pri-cluster" not in emulator.workspace.computes)


def b_task_states(logical_date: pendulum.DateTime) -> dict[str, str]:
    from airflow.models import DagRun, TaskInstance
    from airflow.utils.session import create_session

    with create_session() as session:
        run = session.query(DagRun).filter_by(dag_id="azureml_capacity_teardown", logical_date=logical_date).one()
        tis = session.query(TaskInstance).filter_by(dag_id=run.dag_id, run_id=run.run_id).all()
        return {ti.task_id: str(ti.state) for ti in tis if ti.map_index < 0}


def job_lists(emulator: Emulator) -> int:
    return sum(1 for r in emulator.requests() if r["method"] == "GET" and r["path"].endswith("/jobs"))


def test_a_queued_job_holds_no_node_and_still_keeps_the_cluster(
    workspace: Emulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A job queued for capacity holds no node, so only the job LIST shows it: ``skip`` keeps the cluster;
    ``wait`` reads again until the job has ended, then deletes."""
    import threading

    from tests.integration.test_emulator_sdk import invoke, wait_status

    emulator = workspace
    from airflow_azureml.hooks import AzureMLHook

    emulator.set_capacity("low-pri-cluster", 0)  # no spot capacity: the job waits in Azure's queue
    job = invoke(AzureMLHook().get_conn(), "in/a", "queued-elsewhere")
    wait_status(emulator, job, "Queued")

    monkeypatch.setenv("AZUREML_TEST_CASE", json.dumps({"if_busy": "skip"}))
    run = load_dag("azureml_capacity_cases.py", "azureml_capacity_teardown").test(
        logical_date=RUN_A, run_conf={"inputs": []}
    )
    assert task_states(run)["delete"] == "skipped", task_states(run)
    assert emulator.job(job).status == "Queued"

    monkeypatch.setenv("AZUREML_TEST_CASE", json.dumps({"if_busy": "wait", "wait_timeout": 120}))
    lists_before = job_lists(emulator)

    def capacity_back_once_the_delete_waits() -> None:
        deadline = time.monotonic() + 120
        while job_lists(emulator) < lists_before + 2 and time.monotonic() < deadline:  # it read, and read again
            time.sleep(0.01)
        emulator.set_capacity("low-pri-cluster", None)

    threading.Thread(target=capacity_back_once_the_delete_waits, daemon=True).start()
    run = load_dag("azureml_capacity_cases.py", "azureml_capacity_teardown").test(
        logical_date=RUN_B, run_conf={"inputs": []}
    )
    assert str(run.state) == "success", task_states(run)
    assert emulator.job(job).status == "Completed", emulator.job(job).error
    assert xcom_value(run, "delete") is True
    assert emulator.call(lambda: "low-pri-cluster" not in emulator.workspace.computes)


PASSWORD = "pool-admin-test-password-not-a-real-one"


@pytest.fixture
def airflow_api(airflow_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Airflow's own REST API on the session's metadata DB: its FastAPI app (``core``: the public API and the
    simple auth manager's ``/auth/token``) served by uvicorn on 127.0.0.1, with a user allowed to edit pools."""
    import socket
    import threading

    import uvicorn

    passwords = tmp_path / "passwords.json"
    passwords.write_text(json.dumps({"pooladmin": PASSWORD}))
    monkeypatch.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS", "pooladmin:admin")
    monkeypatch.setenv("AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE", str(passwords))
    monkeypatch.setenv("AIRFLOW__API_AUTH__JWT_SECRET", "capacity-test-jwt-secret-not-a-real-one-" + "x" * 32)
    from airflow.api_fastapi.app import create_app, purge_cached_app

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    server = uvicorn.Server(uvicorn.Config(create_app("core"), log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert server.started, "Airflow's API did not start"
    conn = {"conn_type": "http", "host": url, "login": "pooladmin", "password": PASSWORD}
    monkeypatch.setenv("AIRFLOW_CONN_AIRFLOW_API", json.dumps(conn))
    try:
        yield url
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()
        purge_cached_app()


def api(url: str, method: str, path: str, **kwargs: Any) -> Any:
    import httpx

    with httpx.Client(base_url=url, timeout=30) as client:
        token = client.post("/auth/token", json={"username": "pooladmin", "password": PASSWORD}).json()
        answer = client.request(
            method, f"/api/v2{path}", headers={"Authorization": f"Bearer {token['access_token']}"}, **kwargs
        )
        return answer.status_code, (answer.json() if answer.content else None)


def test_sync_creates_updates_and_leaves_the_pool(
    emulator: Emulator, azureml_conn: dict[str, Any], airflow_api: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = "azureml_capacity_test-a"
    api(airflow_api, "DELETE", f"/pools/{name}")  # the session's DB is shared by the tests

    def run(case: dict[str, Any], logical: pendulum.DateTime) -> Any:
        monkeypatch.setenv("AZUREML_TEST_CASE", json.dumps({"pool_name": name, **case}))
        dag_run = load_dag("azureml_capacity_cases.py", "azureml_capacity_pool").test(logical_date=logical)
        assert str(dag_run.state) == "success", task_states(dag_run)
        return xcom_value(dag_run, "sync")

    # the example's YAML: max_instances 2, a job of instance_count 2: one job at a time
    assert run({}, RUN_A) == {"pool": name, "slots": 1, "cluster": "low-pri-cluster", "queue_ahead": 0, "written": True}
    status, pool = api(airflow_api, "GET", f"/pools/{name}")
    assert status == 200 and pool["slots"] == 1 and pool["include_deferred"] is True, pool
    assert "max_instances 2 // instance_count 2" in pool["description"]

    assert run({}, RUN_B)["written"] is False  # the same sizing: nothing written

    # someone changed it by hand: brought back
    by_hand = {"pool": name, "slots": 9, "include_deferred": False}
    status, pool = api(airflow_api, "PATCH", f"/pools/{name}", json=by_hand)
    assert status == 200 and (pool["slots"], pool["include_deferred"]) == (9, False), (status, pool)
    assert run({}, pendulum.datetime(2026, 11, 3, tz="UTC"))["written"] is True
    pool = api(airflow_api, "GET", f"/pools/{name}")[1]
    assert (pool["slots"], pool["include_deferred"]) == (1, True), pool

    # the live cluster: a name, not a YAML; the emulator's cluster from the same YAML has max_instances 2
    from airflow_azureml.hooks import AzureMLHook

    setup_workspace(AzureMLHook())
    got = run({"compute": "low-pri-cluster", "deployment": None, "instance_count": 1}, pendulum.datetime(2026, 11, 4))
    assert got == {"pool": name, "slots": 2, "cluster": "low-pri-cluster", "queue_ahead": 0, "written": True}
    assert api(airflow_api, "GET", f"/pools/{name}")[1]["slots"] == 2

    # two jobs more than fit wait in Azure's queue (a rendered template): 1 + 2 slots, and the description says so
    got = run({"queue_ahead": "{{ 1 + 1 }}"}, pendulum.datetime(2026, 11, 5, tz="UTC"))
    assert got == {"pool": name, "slots": 3, "cluster": "low-pri-cluster", "queue_ahead": 2, "written": True}
    pool = api(airflow_api, "GET", f"/pools/{name}")[1]
    assert pool["slots"] == 3 and "max_instances 2 // instance_count 2 + queue_ahead 2" in pool["description"], pool


def test_example_dag_scores_in_the_capacity_pool(
    emulator: Emulator, azureml_conn: dict[str, Any], airflow_api: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ``AZUREML_CAPACITY_POOL_CONN_ID`` the example syncs the pool from its YAML (max_instances 2 //
    instance_count 2 = 1 job at a time) before scoring, and its scoring tasks are in that pool. ``dag.test()``
    runs them one after the other without the scheduler, so the pool limits nothing here (tests/e2e would)."""
    from airflow.models import TaskInstance
    from airflow.utils.session import create_session

    pool = "azureml_capacity_low-pri-cluster"
    api(airflow_api, "DELETE", f"/pools/{pool}")
    monkeypatch.setenv("AZUREML_DATASTORE_ROOT", f"file://{emulator.datastore_path('')}")
    monkeypatch.setenv("AZUREML_POLL_SECONDS", "0.1")
    monkeypatch.setenv("AZUREML_CAPACITY_POOL_CONN_ID", "airflow_api")
    dag = load_dag("low_priority_batch_scoring.py")
    assert dag.get_task("score_partition").pool == pool
    run = dag.test(logical_date=RUN_A)
    assert str(run.state) == "success", task_states(run)
    status, body = api(airflow_api, "GET", f"/pools/{pool}")
    assert status == 200 and (body["slots"], body["include_deferred"]) == (1, True), body
    with create_session() as session:
        tis = session.query(TaskInstance).filter_by(dag_id=run.dag_id, run_id=run.run_id).all()
        pools = {ti.task_id: ti.pool for ti in tis}
    assert pools["score_partition"] == pool and pools["sync_capacity_pool"] == "azureml_infrastructure", pools
    assert task_states(run)["sync_capacity_pool"] == "success"
