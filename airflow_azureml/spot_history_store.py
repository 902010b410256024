"""Where a spot cluster's ``SpotHistory`` lives between tasks, and how concurrent tasks update it.

The eviction rate the spot policy uses is observed on the *cluster*, by every task that runs on it,
so it cannot live in one task's ``task_state_store``. A whole-cluster preemption ends every mapped
partition on one tick, so the updates arrive together, from separate processes and machines.

- ``BlobHistoryStore`` (the default): one JSON blob per spot target in Azure Storage, updated by
  optimistic concurrency. Each update reads the blob and its ETag, applies its change and writes
  with ``If-Match`` (``If-None-Match: *`` for the first one); a writer that lost the race gets 412
  or 409, reads again and reapplies its change. No update is lost, whatever the concurrency.
- ``VariableHistoryStore``: one Airflow Variable per spot target. Airflow has no compare-and-set
  for Variables, so concurrent updates can overwrite each other (last writer wins). It is used only
  where no storage account is known or reachable, and says so in the task log.

The history is advice: a store that fails is logged, and never fails a task.
"""

from __future__ import annotations

import json
import logging
import random
import re
import time
from collections.abc import Callable
from typing import Any, Protocol
from urllib.parse import quote

from airflow_azureml.spot_policy import SpotHistory

log = logging.getLogger(__name__)

VARIABLE_PREFIX = "azureml_spot_history"
RECORD_VERSION = 1
#: The container the default blob store uses in the workspace's storage account.
DEFAULT_CONTAINER = "azureml-airflow-spot-history"
MAX_ATTEMPTS = 40  # writers that lose a race retry; 40 jittered attempts outlast 64 writers on one tick
DATA_ROLE = "Storage Blob Data Contributor"

#: One update: the stored history and compute facts in, the new ones out. Pure: it may run more than once.
Change = Callable[[SpotHistory, dict[str, Any]], tuple[SpotHistory, dict[str, Any]]]


class StoreUnavailable(Exception):
    """The store refused this identity (no data role, no such account): another store must be used."""


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
    """One blob, updated with ETag conditions (Azure Storage's optimistic concurrency)."""

    def __init__(self, url: str, credential: Any, connection_verify: str | bool = True) -> None:
        self.url = url
        self.where = url.split("?", 1)[0]
        self._credential = credential
        self._verify = connection_verify
        self._client: Any = None
        self._container_checked = False

    def _blob(self) -> Any:
        if self._client is None:
            from azure.storage.blob import BlobClient

            self._client = BlobClient.from_blob_url(
                self.url, credential=self._credential, connection_verify=self._verify
            )
        return self._client

    def _read(self) -> tuple[Any, str | None]:
        from azure.core.exceptions import ResourceNotFoundError

        try:
            download = self._blob().download_blob()
            data = download.readall()
        except ResourceNotFoundError:
            return None, None  # no blob yet, or no container yet
        try:
            record = json.loads(data)
        except ValueError:
            log.warning("The spot history %s is not JSON; starting from the prior.", self.where)
            record = None
        return record, download.properties.etag

    def _refused(self, exc: Exception) -> StoreUnavailable | None:
        status = getattr(exc, "status_code", None)
        if status in (401, 403):
            return StoreUnavailable(
                f"Azure Storage refused this identity ({status}) for {self.where}: it needs the {DATA_ROLE} role there."
            )
        return None

    def load(self) -> tuple[SpotHistory, dict[str, Any]]:
        from azure.core.exceptions import AzureError

        try:
            record, _ = self._read()
        except AzureError as exc:
            refused = self._refused(exc)
            if refused:
                raise refused from None
            log.warning(
                "Could not read the spot history %s (%s); starting from the prior.", self.where, type(exc).__name__
            )
            return SpotHistory(), {}
        return parse_record(record, self.where)

    def update(self, change: Change) -> bool:
        """Apply ``change`` once, atomically: re-read and re-apply after every write another writer won."""
        from azure.core import MatchConditions
        from azure.core.exceptions import AzureError, ResourceExistsError, ResourceModifiedError, ResourceNotFoundError

        for attempt in range(MAX_ATTEMPTS):
            try:
                record, etag = self._read()
                history, compute = change(*parse_record(record, self.where))
                data = json.dumps(make_record(history, compute))
                if etag is None:
                    self._blob().upload_blob(data, overwrite=False)  # If-None-Match: *
                else:
                    self._blob().upload_blob(
                        data, overwrite=True, etag=etag, match_condition=MatchConditions.IfNotModified
                    )
                return True
            except (ResourceModifiedError, ResourceExistsError):
                time.sleep(random.uniform(0, min(1.0, 0.02 * 2**attempt)))  # another writer won: read again
            except ResourceNotFoundError:
                if self._container_checked:
                    raise
                self._create_container()
            except AzureError as exc:
                refused = self._refused(exc)
                if refused:
                    raise refused from None
                log.warning("Could not save the spot history %s (%s).", self.where, type(exc).__name__)
                return False
        log.warning("Could not save the spot history %s: %d writers won in a row.", self.where, MAX_ATTEMPTS)
        return False

    def _create_container(self) -> None:
        """A first writer in a new account creates the container (the data role allows it)."""
        from azure.core.exceptions import ResourceExistsError
        from azure.storage.blob import ContainerClient

        self._container_checked = True
        url = self.url.split("?", 1)[0]
        marker = f"/{self._blob().container_name}/"
        container_url = url[: url.index(marker) + len(marker) - 1]
        client = ContainerClient.from_container_url(
            container_url, credential=self._credential, connection_verify=self._verify
        )
        try:
            client.create_container()
            log.info("Created the container %s for the spot history.", container_url)
        except ResourceExistsError:
            pass


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
