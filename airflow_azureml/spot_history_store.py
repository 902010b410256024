"""Where a spot cluster's ``SpotHistory`` lives between tasks: one Airflow Variable per spot target.

The eviction rate the spot policy uses is observed on the *cluster*, by every task that runs on it,
so it cannot live in one task's ``task_state_store``. A Variable is what Airflow shares between
tasks and DAG runs. Concurrent tasks may overwrite each other's update (last writer wins): a lost
update loses one observation, which only brings the estimate closer to its prior, never a second
job. A Variable that cannot be read or parsed is logged and replaced by an empty history.
"""

from __future__ import annotations

import logging
import re
import time
from typing import Any

from airflow_azureml.spot_policy import SpotHistory

log = logging.getLogger(__name__)

VARIABLE_PREFIX = "azureml_spot_history"
RECORD_VERSION = 1


def variable_name(conn_id: str, target: str) -> str:
    """``azureml_spot_history__<conn>__<target>``, with anything but letters, digits, ``-``, ``_``, ``.`` as ``_``."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", f"{conn_id}__{target}")
    return f"{VARIABLE_PREFIX}__{safe}"[:250]


def load(name: str) -> tuple[SpotHistory, dict[str, Any]]:
    """The stored history and what is known of the spot compute (``vm_size``, ``location``, ``startup_hours``)."""
    try:
        from airflow.sdk import Variable

        record = Variable.get(name, default=None, deserialize_json=True)
    except Exception as exc:  # no API server reachable, a value that is not JSON: start from the prior
        log.warning("Could not read the spot history %s (%s); starting from the prior.", name, type(exc).__name__)
        return SpotHistory(), {}
    if not isinstance(record, dict):
        return SpotHistory(), {}
    try:
        history = SpotHistory.from_dict(record.get("history"))
    except ValueError as exc:
        log.warning("The spot history %s is not readable (%s); starting from the prior.", name, exc)
        return SpotHistory(), {}
    compute = record.get("compute") if isinstance(record.get("compute"), dict) else {}
    return history, dict(compute)


def save(name: str, history: SpotHistory, compute: dict[str, Any]) -> None:
    try:
        from airflow.sdk import Variable

        record = {"version": RECORD_VERSION, "history": history.to_dict(), "compute": compute, "saved": time.time()}
        Variable.set(
            name, record, description="airflow_azureml spot policy: what was seen on this cluster", serialize_json=True
        )
    except Exception as exc:  # the history is advice: never fail a task over it
        log.warning("Could not save the spot history %s (%s).", name, type(exc).__name__)
