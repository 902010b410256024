"""``AzureMLJobTrigger``: waits for an Azure ML job in the triggerer, on native asyncio."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, ClassVar

from airflow.triggers.base import TriggerEvent

from airflow_azureml.polling import JobWatch, PollingPolicy, TransientBudgetExceeded
from airflow_azureml.triggers.base import AzureMLBaseTrigger


class AzureMLJobTrigger(AzureMLBaseTrigger):
    """Fires once when the job is terminal, has been queued longer than ``max_queue_time``, or can't be read.

    Event payload: ``{"status": "terminal" | "queue_timeout" | "error", "job_name", "job", "message",
    "gauge_evidence"}``, where ``job`` is a ``JobSnapshot`` dict and ``gauge_evidence`` a
    ``GaugeEvidence`` dict (the compute's preemption gauge as sampled while the job was Running).
    ``wait_for_creation``: a job that does not exist yet is waited for (sensors), not an error.
    ``cancel_on_kill``: a person's end of the deferred task cancels the job (the task's own job; a sensor
    only watches someone else's, so it passes False).
    Waits on the same connection share one poller.
    """

    serialized_fields: ClassVar[tuple[str, ...]] = ("job_name", "wait_for_creation", "cancel_on_kill")

    def __init__(
        self,
        *,
        job_name: str,
        azure_ml_conn_id: str,
        polling: PollingPolicy | dict[str, Any] | None = None,
        wait_for_creation: bool = False,
        cancel_on_kill: bool = True,
    ) -> None:
        super().__init__(azure_ml_conn_id=azure_ml_conn_id, polling=polling)
        self.job_name = job_name
        self.wait_for_creation = bool(wait_for_creation)
        self.cancel_on_kill = bool(cancel_on_kill)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from airflow_azureml import compat
        from airflow_azureml.triggers.poller import WorkspacePoller

        if not compat.has_trigger_on_kill():  # Airflow < 3.3 never calls on_kill below
            compat.warn_missing("trigger_on_kill")

        payload = await WorkspacePoller.for_connection(self.azure_ml_conn_id).wait(
            self.job_name, self.policy, wait_for_creation=self.wait_for_creation
        )
        yield TriggerEvent(payload)

    async def on_kill(self) -> None:
        """A person marked the deferred task failed/success or cleared it: cancel the remote job.

        Airflow 3.3 also calls this when the trigger moved to another triggerer (one that missed its
        heartbeat finds its triggers gone: apache/airflow#73454). The task is then still deferred, and
        the job is not cancelled: a move must never end the work. A throttled or failed cancel is retried
        within the wait's policy (``Retry-After`` capped by ``max_interval``), so a lost cancel does not
        leave the job running and billing.
        """
        from airflow_azureml import compat
        from airflow_azureml.hooks.azure_ml import AzureMLHook
        from airflow_azureml.hooks.rest import ResourceNotFound, TransientRestError

        if not self.cancel_on_kill:
            self.log.info("Deferred task killed; job %s is not this task's to cancel.", self.job_name)
            return
        ti = getattr(self, "task_instance", None)
        if ti is not None:  # run by a triggerer: ask Airflow what happened to the task
            state = await compat.task_instance_state(ti)
            if state in (None, "deferred"):
                self.log.warning(
                    "on_kill for job %s, but its task is %s: the trigger moved to another triggerer or this "
                    "one lost track of it (apache/airflow#73454), not a person's action. Not cancelling; "
                    "a cleared task's next try cancels the job itself.",
                    self.job_name,
                    "still deferred" if state else "in a state Airflow did not tell",
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
