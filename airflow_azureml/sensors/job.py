"""``AzureMLJobSensor``: wait for any Azure ML job by name, in poke, reschedule or deferrable mode."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from functools import cached_property
from typing import Any

from airflow.sdk import BaseSensorOperator

from airflow_azureml.compat import conf
from airflow_azureml.exceptions import AzureMLConfigError, AzureMLError, AzureMLJobQueueTimeoutError
from airflow_azureml.hooks.azure_ml import AzureMLHook
from airflow_azureml.links.studio import AzureMLStudioJobLink
from airflow_azureml.naming import DEFAULT_CONN_ID
from airflow_azureml.outcomes import GaugeEvidence, JobSnapshot, Outcome, classify, exception_for
from airflow_azureml.polling import PollingPolicy


class AzureMLJobSensor(BaseSensorOperator):
    """Succeeds when the job completes; raises the typed error when it fails, is cancelled or preempted.

    ``polling`` sets the deferrable wait (interval, back-off, ``max_queue_time``); in poke and
    reschedule modes Airflow's ``poke_interval`` applies and ``max_queue_time`` is checked on each poke.
    A job that does not exist yet is waited for (it may be submitted by another DAG).
    """

    template_fields: Sequence[str] = ("job_name",)
    operator_extra_links = (AzureMLStudioJobLink(),)

    def __init__(
        self,
        *,
        job_name: str,
        azure_ml_conn_id: str = DEFAULT_CONN_ID,
        polling: PollingPolicy | dict[str, Any] | None = None,
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.job_name = job_name
        self.azure_ml_conn_id = azure_ml_conn_id
        self.polling = polling if isinstance(polling, PollingPolicy) else PollingPolicy.from_dict(polling)
        self.deferrable = deferrable

    @cached_property
    def hook(self) -> AzureMLHook:
        return AzureMLHook(azure_ml_conn_id=self.azure_ml_conn_id)

    def execute(self, context: Any) -> Any:
        if not self.deferrable:
            return super().execute(context)
        snapshot = self.hook.job_snapshot(self.job_name)  # check before deferring
        if snapshot is not None and snapshot.terminal:
            return self._finish(context, snapshot)
        if snapshot is None:
            self.log.info("Job %s does not exist yet; waiting for it in the triggerer.", self.job_name)
        from airflow_azureml.triggers.job import AzureMLJobTrigger  # with Airflow's trigger base: not at parse

        self.defer(
            trigger=AzureMLJobTrigger(
                job_name=self.job_name,
                azure_ml_conn_id=self.azure_ml_conn_id,
                polling=self.polling,
                wait_for_creation=True,  # as poke mode: the job may be submitted later, by another DAG (never
                # cancelled by this task's on_kill: it is watched, not owned)
            ),
            method_name="execute_complete",
            timeout=self.execution_timeout or timedelta(seconds=self.timeout),
        )

    def poke(self, context: Any) -> bool:
        from airflow_azureml.hooks.rest import TransientRestError

        try:  # a throttled read or a token failure is a poke that saw nothing, not a failed sensor
            snapshot = self.hook.job_snapshot(self.job_name, transient_retries=False)
        except TransientRestError as exc:
            self.log.warning("Could not read job %s this time (%s); poking again later.", self.job_name, exc)
            return False
        if snapshot is None:
            self.log.info("Job %s does not exist yet.", self.job_name)
            return False
        if not snapshot.terminal:
            self._check_queue_time(context, snapshot)
            self.log.info("Job %s is %s.", self.job_name, snapshot.status)
            return False
        self._finish(context, snapshot)
        return True

    def execute_complete(self, context: Any, event: dict[str, Any]) -> dict[str, Any]:
        if event["status"] == "queue_timeout":
            raise AzureMLJobQueueTimeoutError(event["message"], job_name=event["job_name"])
        if event["status"] == "config_error":  # e.g. the triggerer does not see the connection
            raise AzureMLConfigError(f"Waiting for job {event.get('job_name')} failed: {event.get('message')}")
        if event["status"] != "terminal":
            raise AzureMLError(f"Waiting for job {event.get('job_name')} failed: {event.get('message')}")
        gauge = GaugeEvidence.from_dict(event.get("gauge_evidence"))
        return self._finish(context, JobSnapshot.from_dict(event["job"]), gauge)

    def _finish(self, context: Any, snapshot: JobSnapshot, gauge: GaugeEvidence | None = None) -> dict[str, Any]:
        """Poke mode has no gauge samples (each poke is one read): classify then decides on Azure's messages."""
        AzureMLStudioJobLink.persist(context, self.hook.studio_job_url(snapshot.name))
        activity = self.hook.job_cancel_requests(snapshot) if snapshot.status == "Canceled" else None
        verdict = classify(snapshot, gauge=gauge, activity=activity)  # the message names who cancelled, if logged
        if verdict.outcome is not Outcome.SUCCEEDED:
            raise exception_for(snapshot, verdict)
        return {"job_name": snapshot.name, "status": snapshot.status, "output_uri": snapshot.output_uri}

    def _check_queue_time(self, context: Any, snapshot: JobSnapshot) -> None:
        """Poke/reschedule modes: measure queue time from the task's first try start."""
        limit = self.polling.max_queue_time
        if limit is None or not snapshot.queued:
            return
        ti = context["ti"]
        started = getattr(ti, "start_date", None)
        if started is None:
            return
        from datetime import datetime, timezone

        waited = (datetime.now(timezone.utc) - started).total_seconds()
        if waited > limit:
            raise AzureMLJobQueueTimeoutError(
                f"Job {snapshot.name} stayed {snapshot.status} for more than {limit}s",
                job_name=snapshot.name,
                status=snapshot.status,
            )
