"""The spot history's shared store under concurrency: separate processes updating one cluster's history.

A whole-cluster preemption ends every mapped partition on one tick, and each task then records what it
saw. These tests start real processes (the hook, azure-identity and azure-storage-blob over HTTPS to the
emulator's storage account), release them together, and count what the emulator holds afterwards.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from airflow_azureml.emulator import Emulator

REPO = Path(__file__).resolve().parents[2]
TARGET = "heart-classifier-batch/classifier-mlflow"
WRITERS = 8
UPDATES = 6  # per writer: a preemption and a completion, three times over

# One writer: what one task records when its job ends (the operator's change functions, through the hook).
WRITER = r"""
import os, sys, time
from pathlib import Path
from airflow_azureml.hooks.azure_ml import AzureMLHook

me, ready, go, updates = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4])
store = AzureMLHook().spot_history_store(os.environ["TARGET"])
store.load()  # signed in and connected before the start
ready.write_text("ready")
while not go.exists():
    time.sleep(0.005)
for i in range(updates):
    job = f"{me}-{i}"
    now = time.time()
    store.update(lambda h, known: (h.record_start(job, now), known))
    if i % 2 == 0:
        change = lambda h, known: (h.record_preemption(exposure_hours=0.5, now=time.time(), job=job), known)
    else:
        change = lambda h, known: (h.record_completion(run_hours=1.0, now=time.time(), job=job), {"vm_size": "x"})
    assert store.update(change), "an update gave up"
print(store.where)
"""


def run_writers(tmp_path: Path, conn_json: str, writers: int = WRITERS, updates: int = UPDATES) -> list[str]:
    """``writers`` processes, released at once once all are connected; returns where each wrote."""
    env = {**os.environ, "AIRFLOW_CONN_AZURE_ML_DEFAULT": conn_json, "TARGET": TARGET, "PYTHONPATH": str(REPO)}
    go = tmp_path / "go"
    readies = [tmp_path / f"ready-{n}" for n in range(writers)]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, f"w{n}", str(readies[n]), str(go), str(updates)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in range(writers)
    ]
    try:
        deadline = time.monotonic() + 240
        while not all(r.exists() for r in readies):
            assert time.monotonic() < deadline, "the writers did not start"
            assert all(p.poll() is None for p in procs), [p.communicate() for p in procs if p.poll() is not None]
            time.sleep(0.05)
        go.write_text("go")
        outputs = [p.communicate(timeout=240) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, (_out, err) in zip(procs, outputs, strict=True):
        assert p.returncode == 0, err[-3000:]
    return [out.strip().splitlines()[-1] for out, _ in outputs]


def stored_history(emulator: Emulator) -> dict[str, Any]:
    records = emulator.spot_histories()
    assert len(records) == 1, sorted(records)
    return next(iter(records.values()))


def test_concurrent_writers_lose_no_update(emulator: Emulator, tmp_path: Path) -> None:
    """8 processes, 6 updates each, all at once: every preemption, completion and end is kept."""
    conn = emulator.connection_info()["airflow_conn_json"]
    where = run_writers(tmp_path, conn)
    assert all("airflow-spot-history" in w for w in where), where  # the blob store, not a Variable
    record = stored_history(emulator)
    history = record["history"]
    half = WRITERS * UPDATES // 2
    # counts fade with a half-life of a week: seconds later they are within 1e-4 of the count
    assert history["preemptions"] == pytest.approx(half, rel=1e-4)
    assert history["spot_completions"] == pytest.approx(half, rel=1e-4)
    assert history["exposure_hours"] == pytest.approx(half * 0.5 + half * 1.0, rel=1e-4)
    assert history["running"] == {}, "an ended job is still counted as running"
    assert record["compute"] == {"vm_size": "x"}
    conflicts = [r for r in emulator.request_log if r.get("plane") == "blob" and r.get("status") in (409, 412)]
    assert conflicts, "the writers never raced: this test proved nothing"


def test_an_identity_without_a_data_role_falls_back_to_a_variable(
    emulator: Emulator,
    azureml_conn: dict[str, Any],
    caplog: pytest.LogCaptureFixture,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Storage answers 403 (no Storage Blob Data Contributor): the history goes to a Variable, said in the log."""
    from airflow_azureml.hooks.azure_ml import AzureMLHook

    emulator.set_behaviour(storage_data_role=False)
    store = AzureMLHook().spot_history_store(TARGET)
    history, _ = store.load()
    assert history.preemptions == 0
    logged = caplog.text + capsys.readouterr().out  # Airflow's structlog may print instead of logging
    assert "Storage Blob Data Contributor" in logged
    assert store.where.startswith("Variable azureml_spot_history__")
    assert emulator.spot_histories() == {}
    statuses = [r["status"] for r in emulator.request_log if r.get("plane") == "blob"]
    assert statuses and set(statuses) == {403}, statuses


def test_a_token_for_another_audience_is_refused(emulator: Emulator) -> None:
    """Azure Storage takes only tokens issued for https://storage.azure.com (the ARM token is refused, 401)."""
    import requests

    token = emulator.call(lambda: emulator.identity.issue(emulator.client_id, emulator.base_url + "/.default"))
    url = emulator.connection_info()["airflow_conn_json"]
    container = json.loads(url)["extra"]["spot_history_url"]
    answer = requests.get(
        f"{container}/x.json", headers={"Authorization": f"Bearer {token['access_token']}"}, verify=emulator.ca_cert
    )
    assert answer.status_code == 401
    assert answer.headers["x-ms-error-code"] == "InvalidAuthenticationInfo"
    assert "resource_id=https://storage.azure.com" in answer.headers["WWW-Authenticate"]
