"""Shared helpers for tests that drive the emulator while Airflow runs."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from airflow_azureml.emulator import Emulator


@contextmanager
def when_running(
    emulator: Emulator,
    action: Callable[[Emulator, str], object],
    *,
    times: int = 1,
    cluster: str = "low-pri-cluster",
    timeout: float = 120,
    ready: Callable[[Emulator, Any], bool] | None = None,
) -> Iterator[list[str]]:
    """Run ``action(emulator, job_name)`` each time a new job on ``cluster`` reaches Running (and, with
    ``ready``, once ``ready(emulator, job)`` holds), ``times`` times.

    Until then the emulator holds the cluster's Running jobs before their end (``hold_cluster``), so the
    action lands while the job runs however slow a loaded machine makes this watcher.
    """
    hit: list[str] = []
    stop = threading.Event()
    emulator.hold_cluster(cluster)

    def watch() -> None:
        deadline = time.monotonic() + timeout
        try:
            while not stop.is_set() and len(hit) < times and time.monotonic() < deadline:
                for job in emulator.jobs():
                    if job.compute != cluster or job.status != "Running" or job.name in hit or not job.started:
                        continue
                    if ready is None or ready(emulator, job):
                        hit.append(job.name)
                        action(emulator, job.name)
                        emulator.release_job(job.name)
                        break
                time.sleep(0.01)
        finally:
            emulator.hold_cluster(cluster, held=False)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        yield hit
    finally:
        stop.set()
        thread.join(timeout=5)
        emulator.hold_cluster(cluster, held=False)


@contextmanager
def evicted_nodes_released_on_resubmit(emulator: Emulator, cluster: str, timeout: float = 120) -> Iterator[None]:
    """The cluster's evicted nodes go once a second job is on it and a read of the cluster has come since that
    job was created: a verdict that resubmitted was taken by then, and the resubmitted job's wait has seen it
    queued behind nodes the gauge still counts, as on Azure. Until then ``preempted_node_release_seconds``
    still bounds how long they stay: a test that keeps them 30 s, so that a read "just after the end" sees
    them, no longer waits out the 30 s. A second job before the verdict (a duplicate submit) frees them early,
    and fails its test."""
    stop = threading.Event()

    def resubmitted_and_read() -> bool:
        jobs = sorted((j for j in emulator.jobs() if j.compute == cluster), key=lambda j: j.created)
        if len(jobs) < 2:
            return False
        since = jobs[1].created.timestamp()
        return any(
            r["t"] > since and r["method"] == "GET" and r["path"].endswith(f"/computes/{cluster}")
            for r in emulator.requests()
        )

    def release() -> None:
        deadline = time.monotonic() + timeout
        while not stop.wait(0.05) and time.monotonic() < deadline:
            if resubmitted_and_read():
                emulator.deallocate_preempted(cluster)
                return

    thread = threading.Thread(target=release, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=10)


# A plausible whole-cluster preemption: the service cancels the job a while after its nodes went (capacity
# stays gone meanwhile) and the nodes count as preempted until then, so a wait can read the gauge up while
# the job still runs: the only evidence of this cancel, as Azure sends no message. The emulator's default
# (0 s: the job ends at once) leaves none.
PREEMPTION_WINDOW = {"capacity_cancel_after_seconds": 2.0, "preempted_node_release_seconds": 4.0}


# The provider takes a gauge read as seen while the job ran only when it came at least its clock margin
# (airflow_azureml.polling.CLOCK_MARGIN, 1 s) before run history's end: a held preemption ends this long after
# the wait's second read of the gauge up, whatever that read's delay on a loaded machine.
AFTER_THE_READS = 1.5


def preempt_and_cancel_once_read(
    emulator: Emulator,
    job: str,
    cluster: str = "low-pri-cluster",
    timeout: float = 120,
    node_release_seconds: float = PREEMPTION_WINDOW["preempted_node_release_seconds"],
) -> list[str]:
    """Preempt the whole cluster; Azure cancels its jobs (no message) once ``job``'s wait has read the gauge
    up twice, ``AFTER_THE_READS`` after that, and never before ``PREEMPTION_WINDOW``'s while; the nodes go
    ``node_release_seconds`` after that. Returns the jobs that lost their capacity.

    A cancel on a timer (``PREEMPTION_WINDOW`` alone) raced the wait's reads: the firm evidence needs a read
    within about 1 s of the loss, and a stalled poll on a loaded machine turns it into weak evidence, which waits
    ``evidence_wait`` (900 s by default) for the Activity Log, outliving the test. The nodes stay in the gauge
    until the jobs end, and ``preempted_node_release_seconds`` more, as with the timer. After ``timeout`` the
    jobs end anyway, and the test shows what the provider made of that."""
    emulator.set_behaviour(**{**PREEMPTION_WINDOW, "preempted_node_release_seconds": node_release_seconds})
    lost = emulator.call(
        lambda: emulator.workspace.preempt_cluster(cluster, "canceled", hold_end=True, hold_nodes=True)
    )
    at = time.time()  # every read after this saw the nodes preempted: they stay in the gauge while held
    deadline = time.monotonic() + timeout
    read_up_at: float | None = None
    try:
        while time.monotonic() < deadline:
            read_up = read_up_at is None and read_twice_since(emulator.requests(), job, cluster, at)
            now = time.time()  # after the log was read: no later than the second read is then
            if read_up:
                read_up_at = now
            held = now - at >= PREEMPTION_WINDOW["capacity_cancel_after_seconds"]
            if held and read_up_at is not None and now - read_up_at >= AFTER_THE_READS:
                break
            time.sleep(0.02)
    finally:
        emulator.call(lambda: emulator.workspace.end_held_preemption(cluster))
    return lost


def preempt(form: str = "canceled") -> Callable[[Emulator, str], object]:
    """A whole-cluster preemption: ``canceled`` (no message: the gauge tells it, ``preempt_and_cancel_once_read``)
    or ``failed`` (Azure's PreemptionError, evidence whenever it is read)."""

    def action(emulator: Emulator, job: str) -> object:
        if form == "canceled":
            return preempt_and_cancel_once_read(emulator, job)
        return emulator.preempt_cluster("low-pri-cluster", form=form)

    return action


EXAMPLE_MODEL = ("heart-classifier-mlflow", "1", "models/heart-classifier-mlflow/1")


def register_example_model(emulator: Emulator) -> None:
    """What the example DAG's ``publish_model`` and ``register_model`` tasks do, done directly: the
    committed MLflow model (dags/azureml/model/) on the datastore, registered as dags/azureml/model.yml says."""
    import shutil
    from pathlib import Path

    name, version, folder = EXAMPLE_MODEL
    source = Path(__file__).resolve().parents[1] / "dags" / "azureml" / "model"
    shutil.copytree(source, emulator.datastore_path(folder), dirs_exist_ok=True)
    body = {
        "properties": {
            "modelType": "mlflow_model",
            "modelUri": f"azureml://datastores/workspaceblobstore/paths/{folder}/",
            "description": "the example's MLflow model",
        }
    }
    emulator.call(lambda: emulator.workspace.put_model_version(name, version, body))


def read_twice_since(requests: Iterable[dict[str, Any]], job: str, cluster: str, since: float) -> bool:
    """In an emulator request log: two rounds of a read of job ``job`` (its GET, or a LIST) then a read of
    ``cluster``, all after ``since``.

    One round may not be the wait's own gauge sample: the wait may have used a shared reading taken before
    it saw the job Running (and rejected it), or the compute read may have been another wait's. The second
    round leaves no such doubt. A compute read alone is not a sample: waits also read the compute for the
    bill while a job is queued.
    """
    rounds, want_job = 0, True
    for r in requests:
        if r["t"] <= since or r["method"] != "GET":
            continue
        if want_job and r["path"].endswith((f"/jobs/{job}", "/jobs")):
            want_job = False
        elif not want_job and r["path"].endswith(f"/computes/{cluster}"):
            rounds, want_job = rounds + 1, True
    return rounds >= 2
