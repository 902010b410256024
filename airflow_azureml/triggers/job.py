"""``AzureMLJobTrigger``: waits for an Azure ML job in the triggerer, on native asyncio."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, ClassVar

from airflow.triggers.base import TriggerEvent

from airflow_azureml.polling import JobWatch, PollingPolicy, TransientBudgetExceeded
from airflow_azureml.triggers.base import AzureMLBaseTrigger

_ON_KILL_TASKS: set[asyncio.Future[None]] = set()

#: Task states after which on_kill cancels the job: a person marked the task ended, or its run is gone
#: ("absent"). Any other state (still deferred: the trigger moved; none, scheduled, queued, running,
#: up_for_retry: cleared, or a try of its own already watches the job) leaves the job to the task.
ENDED_BY_A_PERSON = frozenset({"failed", "success", "skipped", "removed", "upstream_failed", "absent"})


class AzureMLJobTrigger(AzureMLBaseTrigger):
    """Fires once when the job is terminal, has been queued longer than ``max_queue_time``, or can't be read.

    Event payload: ``{"status": "terminal" | "queue_timeout" | "error", "job_name", "job", "message",
    "gauge_evidence"}``, where ``job`` is a ``JobSnapshot`` dict and ``gauge_evidence`` a
    ``GaugeEvidence`` dict (the compute's preemption gauge as sampled while the job was Running).
    ``wait_for_creation``: a job that does not exist yet is waited for, not an error. Only sensors wait
    so, and a sensor's job is someone else's: its trigger's ``on_kill`` never cancels it.
    ``found_ending``: the deferring try found the job already being cancelled, and whether its run knew the
    job then (``"known"`` / ``"unknown"``); the event carries it back (``"found_ending"``), so that the resumed
    try does not take that cancel for one it watched happen (Airflow before 3.3 keeps no task state across
    the deferral to say it). Serialised only when set: a triggerer of an earlier version builds the rest.
    Waits on the same connection share one poller.
    """

    serialized_fields: ClassVar[tuple[str, ...]] = ("job_name", "wait_for_creation")

    def __init__(
        self,
        *,
        job_name: str,
        azure_ml_conn_id: str,
        polling: PollingPolicy | dict[str, Any] | None = None,
        wait_for_creation: bool = False,
        found_ending: str | None = None,
    ) -> None:
        super().__init__(azure_ml_conn_id=azure_ml_conn_id, polling=polling)
        self.job_name = job_name
        self.wait_for_creation = bool(wait_for_creation)
        self.found_ending = found_ending if found_ending in ("known", "unknown") else None

    def serialize(self) -> tuple[str, dict[str, Any]]:
        path, kwargs = super().serialize()
        if self.found_ending is not None:
            kwargs["found_ending"] = self.found_ending
        return path, kwargs

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from airflow_azureml import compat
        from airflow_azureml.triggers.poller import WorkspacePoller

        if not compat.has_trigger_on_kill():  # Airflow < 3.3 never calls on_kill below
            compat.warn_missing("trigger_on_kill")

        payload = await WorkspacePoller.for_connection(self.azure_ml_conn_id).wait(
            self.job_name, self.policy, wait_for_creation=self.wait_for_creation
        )
        yield TriggerEvent(payload if self.found_ending is None else {**payload, "found_ending": self.found_ending})

    async def on_kill(self) -> None:
        """Decide and cancel in a task of its own, shielded: Airflow 3.3's triggerer cancels a killed
        trigger again at every sync until it finishes, which interrupted ``on_kill`` at its first slow
        await (the task-state read: the job of a task marked failed was left running)."""
        work = asyncio.ensure_future(self._on_kill())
        _ON_KILL_TASKS.add(work)  # a strong reference while it runs on after the trigger has finished
        work.add_done_callback(_ON_KILL_TASKS.discard)
        await asyncio.shield(work)

    async def _on_kill(self) -> None:
        """A person marked the deferred task ended (or its run was deleted): cancel the remote job.

        Airflow 3.3 also calls this when the trigger moved to another triggerer (one that missed its
        heartbeat finds its triggers gone: apache/airflow#73454). The task is then still deferred, and
        the job is not cancelled: a move must never end the work. A throttled or failed cancel is retried
        within the wait's policy (``Retry-After`` capped by ``max_interval``), so a lost cancel does not
        leave the job running and billing.
        """
        from airflow_azureml import compat
        from airflow_azureml.hooks.azure_ml import AzureMLHook
        from airflow_azureml.hooks.rest import ResourceNotFound, TransientRestError

        if self.wait_for_creation:  # a sensor's: the job is watched, not owned
            self.log.info("Deferred task killed; job %s is not this task's to cancel.", self.job_name)
            return
        ti = getattr(self, "task_instance", None)
        if ti is not None:  # run by a triggerer: ask Airflow what happened to the task
            state = await compat.task_instance_state(ti)
            if state not in ENDED_BY_A_PERSON:
                self.log.warning(
                    "on_kill for job %s, but its task is %s: not a person's mark of the task (the trigger moved "
                    "to another triggerer, apache/airflow#73454, or the task was cleared). Not cancelling; a "
                    "cleared task's next try cancels the job itself.",
                    self.job_name,
                    state or "in a state Airflow did not tell",
                )
                return
        client = await AzureMLHook(azure_ml_conn_id=self.azure_ml_conn_id).async_rest()
        watch = JobWatch(self.policy)
        try:
            self.log.warning("Deferred task killed; cancelling Azure ML job %s.", self.job_name)
            while True:
                try:
                    await client.cancel_job(self.job_name)
                    return
                except TransientRestError as exc:
                    try:
                        delay = watch.transient_error(exc.retry_after)
                    except TransientBudgetExceeded:
                        raise exc from None
                    self.log.warning("Cancelling %s: %s; retrying in %.1fs", self.job_name, exc, delay)
                    await asyncio.sleep(delay)
        except ResourceNotFound:
            self.log.info("Job %s does not exist; nothing to cancel.", self.job_name)
        finally:
            await client.close()
