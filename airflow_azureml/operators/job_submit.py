"""Submitting a unit's next job exactly once: the record of the submit is written before it is sent.

The task state (``task_state_store``) and the unit journal (``unit_journal``, a blob that outlives the
task state) both say ``submitting`` before the request goes out and name the job once the answer is back,
so a try after a crash looks for that submit's job (``JobChain.of_unfinished_submit``) before sending
another. A collaborator of ``operators/job_actions.py``; it decides nothing (``lifecycle`` said submit).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from airflow_azureml import naming
from airflow_azureml.operators.job_chain import JobChain, refused

if TYPE_CHECKING:
    from airflow_azureml.hooks.azure_ml import AzureMLHook
    from airflow_azureml.lifecycle import ResubmissionState
    from airflow_azureml.unit_journal import UnitJournal


def unit_journal(hook: AzureMLHook, key: str, cache: dict[str, Any], log: logging.Logger) -> UnitJournal | None:
    """The unit's journal, kept in ``cache`` (one per task process); None where no container is known."""
    cached = cache.get("_unit_journal")
    if cached is None or cached[0] != key:
        try:
            journal = hook.unit_journal(key)
        except Exception as exc:  # a safety net: never fail a task over it
            log.warning("No unit journal (%s); a lost task state relies on Azure's LIST.", type(exc).__name__)
            journal = None
        cached = cache["_unit_journal"] = (key, journal)
    return cached[1]


def recall_journal(journal: UnitJournal | None, state: ResubmissionState, log: logging.Logger) -> dict[int, str] | None:
    """The task state knows no job of this unit: the journal may (Airflow 3.1/3.2, a lost or new record).

    Returns the journal's jobs by resubmission number (None: it knows neither a job nor a submit); an
    unfinished submit it knows goes to ``state.submitting``.
    """
    record = journal.load() if journal is not None else None
    if record is None or not (record.jobs or record.submitting):
        return None
    if record.submitting and state.submitting is None:
        state.submitting = dict(record.submitting)
    log.info(
        "The unit journal %s knows jobs %s%s.",
        journal.blob.where if journal is not None else "",
        record.names() or "none",
        f" and a submit of resubmission {record.submitting['n']} that did not return" if record.submitting else "",
    )
    return dict(record.jobs)


class UnitSubmitter:
    """Sends one unit's next job (``send``: the operator's ``submit_job``) and records it where a retry looks.

    ``requested(state, n)`` names the job to request; ``remember`` stores the state in ``task_state_store``;
    ``journal()`` is the unit's journal, looked up only when it is written (finding it may read the workspace).
    """

    def __init__(
        self,
        chain: JobChain,
        journal: Callable[[], UnitJournal | None],
        *,
        requested: Callable[[ResubmissionState, int], str],
        send: Callable[[str, str | None, dict[str, str]], str | None],
        remember: Callable[[ResubmissionState], None],
        log: logging.Logger,
    ) -> None:
        self.chain = chain
        self.journal = journal
        self.requested = requested
        self.send = send
        self.remember = remember
        self.log = log

    def submit(self, state: ResubmissionState, interval: float, fallback: Callable[[], str | None]) -> str:
        """The chain's next job: an earlier try's unfinished submit's, once found, else a new one.

        ``interval``: how often to look for that submit's job; ``fallback``: where the job goes once the
        policy moved there (asked only then).
        """
        n = state.next_resubmission
        requested = self.requested(state, n)
        earlier = self.chain.of_unfinished_submit(state, n, interval)
        if earlier is not None:
            self.record(state, n, earlier)
            return earlier
        target = fallback() if state.fallback_rule else None
        where = f" on the fallback {target} ({state.fallback_rule})" if target else ""
        self.log.info("Submitting job %s (resubmission %d)%s.", requested, n, where)
        journal = self.journal()
        if journal is not None:
            journal.submitting(n, time.time())  # the record that outlives the task state
        state.submitting = {"n": n, "at": time.time()}  # after the journal: its write does not age the record
        self.remember(state)  # before the request: a crash from here on leaves this record
        try:
            name = self.send(requested, target, naming.job_markers(state.key, n)) or requested
        except Exception as exc:
            # Refused (a 4xx that is not a timeout, conflict or throttle; bad input): no job exists, the next try
            # must not wait for one. Otherwise the job may exist, created late in the call: the wait counts from now.
            state.submitting = None if refused(exc) else {"n": n, "at": time.time()}
            self.remember(state)
            if journal is not None:
                if state.submitting is None:
                    journal.submitted(n, None)
                else:
                    journal.submitting(n, state.submitting["at"])  # re-dated, as the task state
            raise
        if name != requested:
            name = self.chain.follow_returned(state, n, requested, name)
        self.record(state, n, name)
        return name

    def record(self, state: ResubmissionState, n: int, name: str) -> None:
        """Job ``name`` is resubmission ``n``: first to the task state, then to the journal."""
        state.job_names.append(name)
        state.next_resubmission = n + 1
        state.submitting = None
        self.remember(state)  # first thing after the submit returns
        journal = self.journal()
        if journal is not None:
            journal.submitted(n, name)
