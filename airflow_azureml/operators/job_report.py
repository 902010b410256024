"""What a job operator shows people besides its result: the chain's Studio links and each verdict.

The verdict goes with its evidence to the task log and to XCom ``azureml_verdict``, so that a person can
see why a cancelled job was judged a preemption or a person's cancel; the bill is ``job_cost``'s.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from airflow_azureml.links.studio import AzureMLStudioJobLink

if TYPE_CHECKING:
    from airflow_azureml.hooks.azure_ml import AzureMLHook
    from airflow_azureml.lifecycle import ResubmissionState
    from airflow_azureml.outcomes import Classification, JobSnapshot

VERDICT_XCOM_KEY = "azureml_verdict"


def persist_links(hook: AzureMLHook, context: Any, state: ResubmissionState, current: str, log: logging.Logger) -> None:
    """The current job's Studio link, and every job of the chain's (the previous-job link reads them)."""
    names = [n for n in state.job_names if n != current] + [current]
    urls = [hook.studio_job_url(n) for n in names]
    AzureMLStudioJobLink.persist(context, urls[-1], chain=urls)
    if len(urls) > 1:
        shown = ", ".join(url or name for url, name in zip(urls, names, strict=True))
        log.info("The job chain in Studio, oldest first: %s", shown)


def report_verdict(context: Any, snapshot: JobSnapshot, verdict: Classification, log: logging.Logger) -> None:
    """The verdict and its evidence, to the task log and to XCom."""
    log.info("Job %s: %s (%s). Evidence: %s", snapshot.name, verdict.outcome.value, verdict.reason, verdict.evidence)
    ti = context.get("ti") if context is not None else None
    if ti is not None and hasattr(ti, "xcom_push"):
        ti.xcom_push(key=VERDICT_XCOM_KEY, value={"job_name": snapshot.name, **verdict.to_dict()})
