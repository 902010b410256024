"""The provider's cost estimate against the emulator's own bill (issue 11 §2-§3).

A run of the real operator (``dag.test()``, the real SDK, the emulator's Retail Prices API): the first
job loses the whole low-priority cluster (Azure cancels it; its nodes stay billed as preempted until
they are deallocated), the resubmitted job loses one node to an eviction and finishes on a replacement.
The estimate, made from the compute's node counts sampled while the jobs waited, must be within 2 % of
the emulator's bill for that cluster, whose every node state change is exact (emulator.billing).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pendulum
import pytest

from airflow_azureml import cost
from airflow_azureml.emulator import Emulator
from airflow_azureml.emulator.scoring.data import write_heart_csvs
from airflow_azureml.hooks import prices as prices_module
from tests.conftest import load_dag, task_states, xcom_value
from tests.helpers import preempt_and_cancel_once_read, when_running
from tests.integration.test_emulator_sdk import setup_workspace
from tests.integration.test_exactly_once import gauge_read_while_running

LOGICAL = pendulum.datetime(2026, 11, 1, tz="UTC")
INPUT = "in/20261101"
CLUSTER = "low-pri-cluster"
SKU = "Standard_DS3_v2"
SPOT_RATIO = 0.2
TOLERANCE = 0.02  # issue 11: "within 2 % of the emulator's own bill"
# Evicted nodes stay in the gauge (billed as preempted) until the test deallocates them: a timer for it would race
# the reads this test is about. Under 3.1 and 3.2's dag.test() a deferred task resumes about 3 s after its
# trigger fires and no one reads the cluster in between; on a loaded machine CI measured 13 s, longer than the
# 12 s timer this test once used, and every node change then fell into that gap, placed by interpolation (the
# estimate is as fine as its reads; docs/cost.md), not by the reads.
HELD = 3600.0
TERMINAL = ("Completed", "Failed", "Canceled")
READS_BEFORE_RELEASE = 3


def _nodes(emulator: Emulator, job: str, state: str) -> int:
    nodes = emulator.workspace.computes[CLUSTER].nodes
    return emulator.call(lambda: sum(n.state == state and n.job_name == job for n in nodes))


def _until(check: Any, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def _cluster_reads_since(emulator: Emulator, since: float) -> int:
    return sum(
        1
        for r in emulator.requests()
        if r["method"] == "GET" and r["path"].endswith(f"/computes/{CLUSTER}") and r["t"] > since
    )


def _release_once_read(emulator: Emulator, since: float, job: str | None = None) -> None:
    """Deallocate the cluster's evicted nodes once the wait has read them a few times after ``since``, or
    ``job`` has ended (no wait reads then), or after 300 s: the test then fails on the bill, not by hanging
    on a full cluster."""

    def ended() -> bool:
        return job is not None and emulator.call(lambda: emulator.workspace.jobs[job].status) in TERMINAL

    try:
        _until(
            lambda: _cluster_reads_since(emulator, since) >= READS_BEFORE_RELEASE or ended(),
            "the wait never read the nodes",
            timeout=300,
        )
    finally:
        emulator.deallocate_preempted(CLUSTER)


def _release_when_resubmitted(emulator: Emulator, first: str, errors: list[BaseException]) -> None:
    """The first job's evicted nodes go once the resubmitted job's wait has read them (it queues for them);
    a failure here is the test's (``errors``), not a silent thread's."""
    try:
        try:
            _until(
                lambda: emulator.call(
                    lambda: any(j.name != first and j.compute == CLUSTER for j in emulator.workspace.jobs.values())
                ),
                "the job was never resubmitted",
                timeout=300,
            )
        except BaseException:
            emulator.deallocate_preempted(CLUSTER)
            raise
        _release_once_read(emulator, time.time())
    except BaseException as exc:
        errors.append(exc)


def preempt_then_evict(errors: list[BaseException]) -> Callable[[Emulator, str], None]:
    """First job: once the wait has read the gauge while it ran, the whole cluster is preempted, and Azure
    cancels the job once the wait has read the gauge up (``preempt_and_cancel_once_read``); its nodes go once
    the resubmitted job's wait has read them. Second job: once its wait has read both nodes running, one node
    is evicted, and goes once read. ``errors``: what the release thread met."""

    def action(emulator: Emulator, job: str) -> None:
        others = emulator.call(
            lambda: any(j.name != job and j.compute == CLUSTER for j in emulator.workspace.jobs.values())
        )
        if not others:
            running = emulator.job(job)
            _until(lambda: gauge_read_while_running(emulator, running), "the wait never read the gauge")
            threading.Thread(target=_release_when_resubmitted, args=(emulator, job, errors), daemon=True).start()
            preempt_and_cancel_once_read(emulator, job, CLUSTER, node_release_seconds=HELD)
            return
        emulator.set_behaviour(preempted_node_release_seconds=HELD)
        emulator.release_job(job)  # held before its work by when_running: this fault needs the work under way
        _until(lambda: _nodes(emulator, job, "running") >= 2, "the resubmitted job never ran on both nodes")
        on_both = time.time()
        _until(lambda: _cluster_reads_since(emulator, on_both) >= READS_BEFORE_RELEASE, "no read of both nodes")
        assert emulator.evict_nodes(CLUSTER, 1) == 1
        _release_once_read(emulator, time.time(), job)

    return action


@pytest.fixture
def workspace(
    emulator: Emulator, azureml_conn: dict[str, Any], airflow_db: Path, tmp_path: Path, monkeypatch
) -> Emulator:
    from airflow_azureml.hooks import AzureMLHook

    setup_workspace(AzureMLHook())
    # enough mini-batches (150 of 0.3 s on 2 x 2 workers) that the resubmitted job runs on after its eviction
    write_heart_csvs(emulator.datastore_path(INPUT), files=300, rows_per_file=1)
    emulator.call(lambda: setattr(emulator.workspace.timing, "mini_batch", 0.3))
    emulator.set_price_ratio(SKU, spot=SPOT_RATIO)
    # this test's prices cache, in its own directory (the emulator's prices API is the connection's)
    conn = json.loads(azureml_conn["airflow_conn_json"])
    assert conn["extra"]["prices_endpoint"] == emulator.base_url
    conn["extra"]["prices_cache_dir"] = str(tmp_path / "prices-cache")
    monkeypatch.setenv("AIRFLOW_CONN_AZURE_ML_DEFAULT", json.dumps(conn))
    prices_module.clear_memory_cache()
    return emulator


@contextmanager
def nodes_after_a_few_looks(emulator: Emulator, looks: int = 3) -> Iterator[None]:
    """No capacity until the operator has read the cluster a few times: Azure takes minutes to give a job
    its nodes, so a client's first reads come before them; the emulator gives them a tick after the submit,
    before the submit call has even returned (under load, half a second of two nodes no reading sees)."""
    emulator.set_capacity(CLUSTER, 0)
    since = time.time()
    stop = threading.Event()

    def release() -> None:
        while not stop.is_set() and _cluster_reads_since(emulator, since) < looks:
            time.sleep(0.01)
        emulator.set_capacity(CLUSTER, None)

    thread = threading.Thread(target=release, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=5)


def run_invoke(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, case: dict[str, Any]) -> Any:
    monkeypatch.setenv("AZUREML_TEST_FAILURES", str(tmp_path / "failures.jsonl"))
    monkeypatch.setenv("AZUREML_TEST_CASE", json.dumps(case))
    return load_dag("azureml_operator_cases.py", "azureml_invoke_case").test(logical_date=LOGICAL)


@pytest.mark.parametrize("deferrable", [False, True], ids=["polling", "deferred"])
def test_estimate_is_within_two_percent_of_the_emulators_bill(
    workspace: Emulator, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, deferrable: bool
) -> None:
    # Polls, and the compute reads with them (the estimate's resolution), every 0.05 s without backing off:
    # each node that comes or goes is then placed within 0.05 s. With the case's back-off to 0.2 s the
    # estimate came within 1 % too, but a run's few start and end changes then move it by up to 0.6 % each.
    case = {"deferrable": deferrable, "polling": {"interval": 0.05, "max_interval": 0.05}}
    errors: list[BaseException] = []
    with nodes_after_a_few_looks(workspace), when_running(workspace, preempt_then_evict(errors), times=2) as hit:
        run = run_invoke(monkeypatch, tmp_path, case)
    assert not errors, errors
    assert str(run.state) == "success", task_states(run)
    assert len(hit) == 2
    assert [j.status for j in workspace.jobs()] == ["Canceled", "Completed"]

    def settled() -> dict[str, Any] | None:
        bill = workspace.bill()["clusters"][CLUSTER]
        return None if any(n["deallocated_at"] is None for n in bill["nodes"]) else bill

    _until(lambda: settled() is not None, "every node deallocated")
    bill = settled()
    assert bill is not None and bill["evictions"] == 3  # both nodes of the first job, one of the second

    report = xcom_value(run, "invoke", key="azureml_cost")
    result = xcom_value(run, "invoke")
    entry = report["computes"][CLUSTER]
    spot_rate = bill["hourly_price"]
    assert entry["tier"] == "low_priority" and entry["hourly_price"] == pytest.approx(spot_rate)
    assert entry["price_source"].startswith("Retail Prices API")
    # which price and from when: the Spot meter's effectiveStartDate moved with the fixture's price change,
    # before the run; the quote was read during it (issue 22 section 3)
    from datetime import datetime

    took_effect = datetime.fromisoformat(entry["price_effective_from"].replace("Z", "+00:00")).timestamp()
    read_at = datetime.fromisoformat(entry["price_retrieved_at"]).timestamp()
    assert time.time() - 900 < took_effect <= read_at <= time.time() and not entry.get("price_changed_during")
    assert entry["dedicated_hourly_price"] == pytest.approx(spot_rate / SPOT_RATIO, rel=1e-3)
    estimated_seconds = sum(entry["node_seconds"].values())
    billed_seconds = bill["node_seconds_total"]
    assert estimated_seconds == pytest.approx(billed_seconds, rel=TOLERANCE), (entry["node_seconds"], bill)
    assert report["cost"] == pytest.approx(bill["cost"], rel=TOLERANCE), (report, bill)
    # preempted-state time as the counts show it, against the emulator's own
    assert entry["node_seconds"]["preempted"] == pytest.approx(bill["node_seconds"]["preempted"], rel=0.1)
    assert report["preemptions"] == 1 and report["lost_jobs"] == [result["job_names"][0]]
    # Azure's GET of a batch job leaves its node count null: the lost attempt's floor takes the deployment's 2
    # nodes (read by the operator), not one
    lost_spans = [s for s in report["usage"]["spans"] if s["job"] == result["job_names"][0] and "started_at" in s]
    assert lost_spans and {s["instance_count"] for s in lost_spans} == {2}, report["usage"]["spans"]
    assert report["evicted_node_hours"] > 0 and report["lost_node_hours"] > 0
    # all-dedicated: the work without the lost attempt and the evicted nodes' wait, at pay-as-you-go
    equivalent = report["dedicated_equivalent"]
    assert 0 < equivalent["node_hours"] < estimated_seconds / 3600
    assert equivalent["cost"] == pytest.approx(equivalent["node_hours"] * entry["dedicated_hourly_price"])
    assert report["savings"] == pytest.approx(equivalent["cost"] - report["cost"])
    assert report["savings_pct"] == pytest.approx(100 * report["savings"] / equivalent["cost"])
    assert result["cost"]["cost"] == report["cost"]  # the returned result carries it too
    # the run's bill from the tasks' XCom values: one task here, the same numbers
    run_bill = cost.run_bill([report])
    assert run_bill["cost"] == pytest.approx(report["cost"]) and run_bill["preemptions"] == 1
    assert "secret" not in json.dumps(report).lower()
