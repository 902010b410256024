"""Shared plumbing of this provider's operators: the connection, the hook, the polling policy."""

from __future__ import annotations

from functools import cached_property
from typing import Any

from airflow.sdk import BaseOperator

from airflow_azureml.hooks.azure_ml import AzureMLHook
from airflow_azureml.polling import PollingPolicy


class AzureMLBaseOperator(BaseOperator):
    """Base of every operator here. ``polling`` accepts a ``PollingPolicy`` or its dict form."""

    def __init__(
        self,
        *,
        azure_ml_conn_id: str = AzureMLHook.default_conn_name,
        polling: PollingPolicy | dict[str, Any] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.azure_ml_conn_id = azure_ml_conn_id
        self.polling = polling if isinstance(polling, PollingPolicy) else PollingPolicy.from_dict(polling)

    @cached_property
    def hook(self) -> AzureMLHook:
        return AzureMLHook(azure_ml_conn_id=self.azure_ml_conn_id)
