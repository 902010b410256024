"""``AzureMLStudioJobLink``: the task's job in Azure ML Studio (or the emulator's job page).

The URL is persisted to XCom right after submission, before any waiting or deferral, so the
link works while the task is still running.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperatorLink
from airflow.sdk.execution_time.xcom import XCom

if TYPE_CHECKING:
    from airflow.models.taskinstancekey import TaskInstanceKey

XCOM_KEY = "azureml_studio_job_url"


class AzureMLStudioJobLink(BaseOperatorLink):
    name = "Azure ML Studio"

    @staticmethod
    def persist(context: Any, url: str) -> None:
        context["ti"].xcom_push(key=XCOM_KEY, value=url)

    def get_link(self, operator: Any, *, ti_key: TaskInstanceKey) -> str:
        return XCom.get_value(key=XCOM_KEY, ti_key=ti_key) or ""
