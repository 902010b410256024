"""Every exception the provider raises, typed so that retry policies can tell them apart.

- ``AzureMLConfigError``: bad input or configuration, raised before any API call. Fails without retry.
- ``AzureMLJobFailedError``: the job's own code failed. Retrying resubmits the same bug.
- ``AzureMLJobPreemptedError``: low-priority capacity was lost more times than this run of the
  task allows (``max_resubmits``; automatic retries share the budget, a clear starts a fresh one).
- ``AzureMLJobCanceledError``: a person cancelled the job. Fails without retry: a person's decision
  is final; clearing the task is the request to run the work again.
- ``AzureMLJobQueueTimeoutError``: the job waited for capacity longer than ``max_queue_time``.
- ``AzureMLDeadlineError``: with ``on_infeasible_deadline="fail"``, not even the fallback can finish the work
  by its deadline. Raised before the unit's first job; fails without retry (time only makes it later).
"""

from __future__ import annotations

from airflow_azureml.compat import airflow_exceptions

AirflowException, AirflowFailException = airflow_exceptions()


class AzureMLError(AirflowException):
    """Base class of this provider's errors."""


class AzureMLConfigError(AirflowFailException, AzureMLError, ValueError):
    """Invalid input or connection settings, detected before anything was sent to Azure.

    An ``AirflowFailException``: retrying cannot fix the input, so the task fails at once.
    """


class AzureMLJobError(AzureMLError):
    """A job ended without success. Carries the job name, its last status and the service's message."""

    def __init__(self, message: str, *, job_name: str | None = None, status: str | None = None) -> None:
        super().__init__(message)
        self.job_name = job_name
        self.status = status

    def __reduce__(self):  # keep job_name/status through pickling (task runner, triggers)
        return (_rebuild, (type(self), str(self), self.job_name, self.status))


class AzureMLJobFailedError(AzureMLJobError):
    """The job failed for a reason other than preemption; the message is the service's error."""


class AzureMLJobPreemptedError(AzureMLJobError):
    """The job was preempted and the resubmission budget is spent."""


class AzureMLJobCanceledError(AirflowFailException, AzureMLJobError):
    """A person cancelled the job. An ``AirflowFailException``: retries would override them.

    Clearing the task runs the work again as a new job of the same chain.
    """


class AzureMLJobQueueTimeoutError(AzureMLJobError):
    """The job stayed queued for capacity longer than ``max_queue_time``."""


class AzureMLDeadlineError(AirflowFailException, AzureMLError):
    """Not even the fallback finishes the unit by its deadline, and ``on_infeasible_deadline="fail"`` asked
    for a failure then, before any job is sent. An ``AirflowFailException``: a retry is only later."""


def _rebuild(cls: type[AzureMLJobError], message: str, job_name: str | None, status: str | None) -> AzureMLJobError:
    return cls(message, job_name=job_name, status=status)
