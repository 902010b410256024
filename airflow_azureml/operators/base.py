"""Shared plumbing of this provider's operators: the connection, the hook, the polling policy."""

from __future__ import annotations

from functools import cached_property
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator

from airflow_azureml.naming import DEFAULT_CONN_ID
from airflow_azureml.polling import PollingPolicy

if TYPE_CHECKING:
    from airflow_azureml.hooks.azure_ml import AzureMLHook


class AzureMLBaseOperator(BaseOperator):
    """Base of every operator here. ``polling`` accepts a ``PollingPolicy`` or its dict form."""

    def __init__(
        self,
        *,
        azure_ml_conn_id: str = DEFAULT_CONN_ID,
        polling: PollingPolicy | dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.azure_ml_conn_id = azure_ml_conn_id
        self.polling = polling if isinstance(polling, PollingPolicy) else PollingPolicy.from_dict(polling)

    @cached_property
    def hook(self) -> AzureMLHook:
        from airflow_azureml.hooks.azure_ml import AzureMLHook  # at run time: a DAG parse never needs it

        return AzureMLHook(azure_ml_conn_id=self.azure_ml_conn_id)
