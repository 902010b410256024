"""``AzureMLJobTrigger``: waits for an Azure ML job in the triggerer, on native asyncio."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any, ClassVar

from airflow.triggers.base import TriggerEvent

from airflow_azureml.polling import PollingPolicy
from airflow_azureml.triggers.base import AzureMLBaseTrigger


class AzureMLJobTrigger(AzureMLBaseTrigger):
    """Fires once when the job is terminal, has been queued longer than ``max_queue_time``, or can't be read.

    Event payload: ``{"status": "terminal" | "queue_timeout" | "error", "job_name", "job", "message"}``,
    where ``job`` is a ``JobSnapshot`` dict. Waits on the same connection share one poller.
    """

    serialized_fields: ClassVar[tuple[str, ...]] = ("job_name",)

    def __init__(
        self, *, job_name: str, azure_ml_conn_id: str, polling: PollingPolicy | dict[str, Any] | None = None
    ) -> None:
        super().__init__(azure_ml_conn_id=azure_ml_conn_id, polling=polling)
        self.job_name = job_name

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from airflow_azureml.triggers.poller import WorkspacePoller

        payload = await WorkspacePoller.for_connection(self.azure_ml_conn_id).wait(self.job_name, self.policy)
        yield TriggerEvent(payload)

    async def on_kill(self) -> None:
        """A person marked the deferred task failed/success or cleared it: cancel the remote job.

        Airflow calls this only for user actions, never when a triggerer restarts or moves the trigger.
        """
        from airflow_azureml.hooks.azure_ml import AzureMLHook
        from airflow_azureml.hooks.rest import ResourceNotFound

        client = await AzureMLHook(azure_ml_conn_id=self.azure_ml_conn_id).async_rest()
        try:
            self.log.warning("Deferred task killed; cancelling Azure ML job %s.", self.job_name)
            await client.cancel_job(self.job_name)
        except ResourceNotFound:
            self.log.info("Job %s does not exist; nothing to cancel.", self.job_name)
        finally:
            await client.close()
