"""Where a spot cluster's ``SpotHistory`` lives between tasks, and how concurrent tasks update it.

The eviction rate the spot policy uses is observed on the *cluster*, by every task that runs on it,
so it cannot live in one task's ``task_state_store``. A whole-cluster preemption ends every mapped
partition on one tick, so the updates arrive together, from separate processes and machines.

- ``BlobHistoryStore`` (the default): one JSON blob per spot target in Azure Storage, updated by
  optimistic concurrency (``blob_records``): no update is lost, whatever the concurrency.
- ``VariableHistoryStore``: one Airflow Variable per spot target. Airflow has no compare-and-set
  for Variables, so concurrent updates can overwrite each other (last writer wins). It is used only
  where no storage account is known or reachable, and says so in the task log.

The history is advice: a store that fails is logged, and never fails a task.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from typing import Any, Protocol
from urllib.parse import quote

from airflow_azureml.blob_records import EtagBlob, StoreUnavailable
from airflow_azureml.spot_policy import SpotHistory

log = logging.getLogger(__name__)

VARIABLE_PREFIX = "azureml_spot_history"
RECORD_VERSION = 1
#: The container the default blob store uses in the workspace's storage account.
DEFAULT_CONTAINER = "azureml-airflow-spot-history"
#: One update: the stored history and compute facts in, the new ones out. Pure: it may run more than once.
Change = Callable[[SpotHistory, dict[str, Any]], tuple[SpotHistory, dict[str, Any]]]


class HistoryStore(Protocol):
    where: str  # how the task log names it

    def load(self) -> tuple[SpotHistory, dict[str, Any]]: ...

    def update(self, change: Change) -> bool: ...


def variable_name(conn_id: str, target: str) -> str:
    """``azureml_spot_history__<conn>__<target>``, with anything but letters, digits, ``-``, ``_``, ``.`` as ``_``."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", f"{conn_id}__{target}")
    return f"{VARIABLE_PREFIX}__{safe}"[:250]


def blob_url(container_url: str, conn_id: str, target: str) -> str:
    """The target's blob under ``container_url`` (a container, or a folder in one)."""
    return f"{container_url.rstrip('/')}/{quote(variable_name(conn_id, target), safe='')}.json"


def storage_container_url(storage_account_id: str, storage_suffix: str) -> str | None:
    """The default store's container in the workspace's storage account (its ARM id), or None."""
    match = re.search(r"/storageAccounts/([a-z0-9]{3,24})$", storage_account_id or "", re.IGNORECASE)
    if not match:
        return None
    return f"https://{match.group(1).lower()}.blob.{storage_suffix}/{DEFAULT_CONTAINER}"


def parse_record(record: Any, where: str) -> tuple[SpotHistory, dict[str, Any]]:
    """A stored record as (history, compute facts); anything unreadable starts from the prior, logged."""
    if not isinstance(record, dict):
        return SpotHistory(), {}
    try:
        history = SpotHistory.from_dict(record.get("history"))
    except ValueError as exc:
        log.warning("The spot history %s is not readable (%s); starting from the prior.", where, exc)
        return SpotHistory(), {}
    compute = record.get("compute") if isinstance(record.get("compute"), dict) else {}
    return history, dict(compute)


def make_record(history: SpotHistory, compute: dict[str, Any]) -> dict[str, Any]:
    return {"version": RECORD_VERSION, "history": history.to_dict(), "compute": compute, "saved": time.time()}


class BlobHistoryStore:
    """One blob, updated with ETag conditions (``blob_records.EtagBlob``)."""

    def __init__(self, url: str, credential: Any, connection_verify: str | bool = True) -> None:
        self.blob = EtagBlob(url, credential, connection_verify, what="the spot history")
        self.where = self.blob.where

    def load(self) -> tuple[SpotHistory, dict[str, Any]]:
        from azure.core.exceptions import AzureError

        try:
            record = self.blob.read()
        except AzureError as exc:
            log.warning(
                "Could not read the spot history %s (%s); starting from the prior.", self.where, type(exc).__name__
            )
            return SpotHistory(), {}
        return parse_record(record, self.where)

    def update(self, change: Change) -> bool:
        """Apply ``change`` once, atomically: re-read and re-apply after every write another writer won."""
        return self.blob.update(lambda record: make_record(*change(*parse_record(record, self.where))))


class VariableHistoryStore:
    """One Airflow Variable: last writer wins when updates are concurrent (no compare-and-set)."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.where = f"Variable {name}"

    def load(self) -> tuple[SpotHistory, dict[str, Any]]:
        try:
            from airflow.sdk import Variable

            record = Variable.get(self.name, default=None, deserialize_json=True)
        except Exception as exc:  # no API server reachable, a value that is not JSON: start from the prior
            log.warning(
                "Could not read the spot history %s (%s); starting from the prior.", self.where, type(exc).__name__
            )
            return SpotHistory(), {}
        return parse_record(record, self.where)

    def update(self, change: Change) -> bool:
        history, compute = change(*self.load())
        try:
            from airflow.sdk import Variable

            Variable.set(
                self.name,
                make_record(history, compute),
                description="airflow_azureml spot policy: what was seen on this cluster",
                serialize_json=True,
            )
        except Exception as exc:  # the history is advice: never fail a task over it
            log.warning("Could not save the spot history %s (%s).", self.where, type(exc).__name__)
            return False
        return True


class FallbackStore:
    """``primary``, until it refuses this identity; then ``fallback`` (said once in the log)."""

    def __init__(self, primary: HistoryStore, fallback: HistoryStore) -> None:
        self.primary = primary
        self.fallback = fallback
        self.active: HistoryStore = primary

    @property
    def where(self) -> str:
        return self.active.where

    def _switch(self, exc: StoreUnavailable) -> None:
        log.warning(
            "%s Using %s instead; concurrent tasks may overwrite each other's updates there.", exc, self.fallback.where
        )
        self.active = self.fallback

    def load(self) -> tuple[SpotHistory, dict[str, Any]]:
        try:
            return self.active.load()
        except StoreUnavailable as exc:
            self._switch(exc)
            return self.active.load()

    def update(self, change: Change) -> bool:
        try:
            return self.active.update(change)
        except StoreUnavailable as exc:
            self._switch(exc)
            return self.active.update(change)
