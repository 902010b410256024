"""Shared helpers for tests that drive the emulator while Airflow runs."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
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


# A plausible whole-cluster preemption: the service cancels the job a while after its nodes went (capacity
# stays gone meanwhile) and the nodes count as preempted until then, so a wait can read the gauge up while
# the job still runs: the only evidence of this cancel, as Azure sends no message. The emulator's default
# (0 s: the job ends at once) leaves none.
PREEMPTION_WINDOW = {"capacity_cancel_after_seconds": 2.0, "preempted_node_release_seconds": 4.0}


def preempt(form: str = "canceled") -> Callable[[Emulator, str], object]:
    def action(emulator: Emulator, _job: str) -> object:
        if form == "canceled":
            emulator.set_behaviour(**PREEMPTION_WINDOW)
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
