"""Shared helpers for tests that drive the emulator while Airflow runs."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from airflow_azureml.emulator import Emulator


@contextmanager
def when_running(
    emulator: Emulator,
    action: Callable[[Emulator, str], object],
    *,
    times: int = 1,
    cluster: str = "low-pri-cluster",
    timeout: float = 120,
) -> Iterator[list[str]]:
    """Run ``action(emulator, job_name)`` each time a new job on ``cluster`` reaches Running, ``times`` times."""
    hit: list[str] = []
    stop = threading.Event()

    def watch() -> None:
        deadline = time.monotonic() + timeout
        while not stop.is_set() and len(hit) < times and time.monotonic() < deadline:
            for job in emulator.jobs():
                if job.compute == cluster and job.status == "Running" and job.name not in hit and job.started:
                    hit.append(job.name)
                    action(emulator, job.name)
                    break
            time.sleep(0.01)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        yield hit
    finally:
        stop.set()
        thread.join(timeout=5)


def preempt(form: str = "canceled") -> Callable[[Emulator, str], object]:
    return lambda emulator, _job: emulator.preempt_cluster("low-pri-cluster", form=form)
