"""Studio links of a task's jobs: its current job, and the one before it in a chain of resubmissions.

The URLs are persisted to XCom right after submission, before any waiting or deferral, so the links
work while the task is still running. Airflow gives an operator a fixed set of links, so the whole
chain (every job, oldest first) is in XCom ``azureml_studio_job_urls`` and in the task log.
``job_url`` is the one place that builds a URL.
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
CHAIN_XCOM_KEY = "azureml_studio_job_urls"  # every job of the chain, oldest first
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
        return f"{settings.resource_manager_url}/_emulator/studio/jobs/{job_name}"
    base = str(_extra(extra, "studio_url") or STUDIO_BY_CLOUD.get(settings.cloud, "")).rstrip("/")
    if not base:
        return ""
    tenant = f"&tid={settings.tenant_id}" if settings.tenant_id else ""
    return f"{base}/runs/{job_name}?wsid={settings.workspace_path}{tenant}"


class AzureMLStudioJobLink(BaseOperatorLink):
    """The task's current job: the newest of its chain."""

    name = "Azure ML Studio"

    @staticmethod
    def persist(context: Any, url: str, chain: list[str] | None = None) -> None:
        """``url`` is the current job's; ``chain`` every job's, oldest first (the current one last)."""
        context["ti"].xcom_push(key=XCOM_KEY, value=url)
        if chain is not None:
            context["ti"].xcom_push(key=CHAIN_XCOM_KEY, value=list(chain))

    def get_link(self, operator: Any, *, ti_key: TaskInstanceKey) -> str:
        return XCom.get_value(key=XCOM_KEY, ti_key=ti_key) or ""


class AzureMLStudioPreviousJobLink(BaseOperatorLink):
    """The job before the current one (a preempted or lost job); empty while the chain has one job."""

    name = "Azure ML Studio (previous job)"

    def get_link(self, operator: Any, *, ti_key: TaskInstanceKey) -> str:
        chain = XCom.get_value(key=CHAIN_XCOM_KEY, ti_key=ti_key) or []
        return str(chain[-2]) if isinstance(chain, list) and len(chain) >= 2 else ""
