"""One JSON record in one blob, updated by Azure Storage's optimistic concurrency (ETags).

Each update reads the blob and its ETag, applies a pure change and writes with ``If-Match``
(``If-None-Match: *`` for the first one). A writer that lost the race gets 412 or 409, reads again
and reapplies its change, so no update is lost whatever the concurrency. The spot history
(``spot_history_store``) and the unit journal (``unit_journal``) both keep their records this way.
"""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

MAX_ATTEMPTS = 40  # writers that lose a race retry; 40 jittered attempts outlast 64 writers on one tick
DATA_ROLE = "Storage Blob Data Contributor"


class StoreUnavailable(Exception):
    """Storage refused this identity (no data role, no such account): another store must be used."""


class EtagBlob:
    """A JSON record at ``url``; ``what`` names it in the log (e.g. "the spot history")."""

    def __init__(self, url: str, credential: Any, connection_verify: str | bool = True, what: str = "the record"):
        self.url = url
        self.where = url.split("?", 1)[0]
        self.what = what
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

    def _refused(self, exc: Exception) -> StoreUnavailable | None:
        status = getattr(exc, "status_code", None)
        if status in (401, 403):
            return StoreUnavailable(
                f"Azure Storage refused this identity ({status}) for {self.where}: it needs the {DATA_ROLE} role there."
            )
        return None

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
            log.warning("%s %s is not JSON; starting again.", self.what.capitalize(), self.where)
            record = None
        return record, download.properties.etag

    def read(self) -> Any:
        """The record (None when there is none). Raises ``StoreUnavailable``, or the ``AzureError``."""
        from azure.core.exceptions import AzureError

        try:
            return self._read()[0]
        except AzureError as exc:
            refused = self._refused(exc)
            if refused:
                raise refused from None
            raise

    def update(self, change: Callable[[Any], Any]) -> bool:
        """Write ``change(record)`` once, atomically: re-read and re-apply after every write another won.

        ``change`` is pure (it may run more than once) and returns the new JSON-ready record. False, logged,
        when Storage failed otherwise than by refusing this identity (``StoreUnavailable`` is raised).
        """
        import time

        from azure.core import MatchConditions
        from azure.core.exceptions import AzureError, ResourceExistsError, ResourceModifiedError, ResourceNotFoundError

        for attempt in range(MAX_ATTEMPTS):
            try:
                record, etag = self._read()
                data = json.dumps(change(record))
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
                log.warning("Could not save %s %s (%s).", self.what, self.where, type(exc).__name__)
                return False
        log.warning("Could not save %s %s: %d writers won in a row.", self.what, self.where, MAX_ATTEMPTS)
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
            log.info("Created the container %s for %s.", container_url, self.what)
        except ResourceExistsError:
            pass
