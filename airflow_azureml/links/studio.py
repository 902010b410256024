"""``AzureMLStudioJobLink``: the task's job in Azure ML Studio (or the emulator's job page).

The URL is persisted to XCom right after submission, before any waiting or deferral, so the
link works while the task is still running. ``job_url`` is the one place that builds it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperatorLink
from airflow.sdk.execution_time.xcom import XCom

if TYPE_CHECKING:
    from airflow.models.taskinstancekey import TaskInstanceKey

    from airflow_azureml.hooks.connection import AzureMLConnectionSettings

XCOM_KEY = "azureml_studio_job_url"
# The emulator writes this key, true, into the connection it hands out; no other connection has it.
EMULATOR_EXTRA = "emulator"

# Studio host per cloud: learn.microsoft.com/azure/machine-learning/how-to-access-azureml-behind-firewall
# ("Azure Machine Learning hosts": ml.azure.com, ml.azure.us, studio.ml.azure.cn).
STUDIO_BY_CLOUD = {
    "AzureCloud": "https://ml.azure.com",
    "AzureChinaCloud": "https://studio.ml.azure.cn",
    "AzureUSGovernment": "https://ml.azure.us",
}


def _extra(extra: Mapping[str, Any], name: str) -> Any:
    return extra.get(name) or extra.get(f"extra__azure_ml__{name}")


def job_url(settings: AzureMLConnectionSettings, extra: Mapping[str, Any], job_name: str) -> str:
    """The job's page: the emulator's only when the connection says it is the emulator.

    Otherwise Studio of the connection's cloud, or the connection's ``studio_url``. A custom cloud
    without ``studio_url`` has no known Studio: no link (empty), rather than a guessed one.
    """
    if _extra(extra, EMULATOR_EXTRA) in (True, "true", "True", "1"):
        return f"{settings.resource_manager_url}/_emulator/jobs/{job_name}"
    base = str(_extra(extra, "studio_url") or STUDIO_BY_CLOUD.get(settings.cloud, "")).rstrip("/")
    if not base:
        return ""
    tenant = f"&tid={settings.tenant_id}" if settings.tenant_id else ""
    return f"{base}/runs/{job_name}?wsid={settings.workspace_path}{tenant}"


class AzureMLStudioJobLink(BaseOperatorLink):
    name = "Azure ML Studio"

    @staticmethod
    def persist(context: Any, url: str) -> None:
        context["ti"].xcom_push(key=XCOM_KEY, value=url)

    def get_link(self, operator: Any, *, ti_key: TaskInstanceKey) -> str:
        return XCom.get_value(key=XCOM_KEY, ti_key=ti_key) or ""
