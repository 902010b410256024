"""A unit of work's job chain, kept in Azure Storage beside the work: found again when the task's state is not.

``task_state_store`` (Airflow 3.3) keeps a unit's chain between tries, but not on Airflow 3.1/3.2, not when a
DAG run is deleted and run again, and not when the store itself is cleared. Azure may then be no help: it may
ignore the requested job name (azure-sdk-for-python#32763), its jobs LIST can lag, and nothing documents that
an invoke's ``properties`` reach the job or that the LIST filters on them. The journal is the record that
survives all of that:

- before a submit is sent: ``submitting = {"n": resubmission, "at": epoch s}`` (a crash from here on leaves it);
- once the submit returns: the job's name under its resubmission number, ``submitting`` cleared.

One blob per unit (``units/<conn>__<key>.json``) in the spot history's container, updated with ETags
(``blob_records``). It is a safety net: a journal that cannot be read or written is logged and never fails a
task (the LIST and the names still find the chain wherever Azure keeps the properties).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

from airflow_azureml.blob_records import EtagBlob, StoreUnavailable

log = logging.getLogger(__name__)

RECORD_VERSION = 1
FOLDER = "units"


def journal_url(container_url: str, conn_id: str, key: str) -> str:
    """The unit's blob in the container (or folder) ``container_url``."""
    return f"{container_url.rstrip('/')}/{FOLDER}/{quote(f'{conn_id}__{key}', safe='')}.json"


@dataclass
class JournalRecord:
    """What the journal knows of one unit: its jobs by resubmission number, and an unfinished submit."""

    jobs: dict[int, str] = field(default_factory=dict)
    submitting: dict[str, Any] | None = None

    @classmethod
    def from_blob(cls, record: Any, key: str) -> JournalRecord:
        if not isinstance(record, dict) or record.get("key") != key:
            return cls()
        jobs: dict[int, str] = {}
        for number, name in (record.get("jobs") or {}).items():
            if str(number).isdigit() and isinstance(name, str) and name:
                jobs[int(number)] = name
        pending = record.get("submitting")
        ok = (
            isinstance(pending, dict)
            and isinstance(pending.get("n"), int)
            and isinstance(pending.get("at"), (int, float))
        )
        return cls(jobs, dict(pending) if ok else None)

    def to_blob(self, key: str) -> dict[str, Any]:
        return {
            "version": RECORD_VERSION,
            "key": key,
            "jobs": {str(n): name for n, name in sorted(self.jobs.items())},
            "submitting": self.submitting,
            "saved": time.time(),
        }

    def names(self) -> list[str]:
        """The chain's job names, oldest first."""
        return [self.jobs[n] for n in sorted(self.jobs)]


class UnitJournal:
    """The journal of unit ``key`` in ``blob``; every failure is logged and swallowed (it is a safety net)."""

    def __init__(self, blob: EtagBlob, key: str) -> None:
        self.blob = blob
        self.key = key
        self.available = True

    def _failed(self, doing: str, exc: Exception) -> None:
        # Not used again in this process: each failing call may spend Storage's own retries (minutes).
        self.available = False
        if isinstance(exc, StoreUnavailable):
            log.warning("%s The unit journal is not kept: a lost task state relies on Azure's LIST alone.", exc)
        else:
            log.warning(
                "Could not %s the unit journal %s (%s); not using it again in this try.",
                doing,
                self.blob.where,
                type(exc).__name__,
            )

    def load(self) -> JournalRecord:
        if not self.available:
            return JournalRecord()
        try:
            return JournalRecord.from_blob(self.blob.read(), self.key)
        except Exception as exc:  # the journal is advice: never fail a task over it
            self._failed("read", exc)
            return JournalRecord()

    def _update(self, doing: str, change: Any) -> None:
        if not self.available:
            return
        try:
            self.blob.update(lambda stored: change(JournalRecord.from_blob(stored, self.key)).to_blob(self.key))
        except Exception as exc:
            self._failed(doing, exc)

    def submitting(self, n: int, at: float) -> None:
        """Written before the submit of resubmission ``n`` is sent."""

        def change(record: JournalRecord) -> JournalRecord:
            record.submitting = {"n": n, "at": at}
            return record

        self._update("write", change)

    def submitted(self, n: int, name: str | None) -> None:
        """The submit of ``n`` returned ``name`` (None: it was refused and created nothing)."""

        def change(record: JournalRecord) -> JournalRecord:
            if name:
                record.jobs[n] = name
            if record.submitting and record.submitting.get("n") == n:
                record.submitting = None
            return record

        self._update("write", change)
