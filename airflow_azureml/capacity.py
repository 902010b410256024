"""Capacity as Airflow sees it (pure): how many jobs fit on a cluster, and whether a cluster is in use.

A cluster runs at most ``max_instances`` nodes and a job takes ``instance_count`` of them, so at most
``max_instances // instance_count`` jobs run on it at once. More jobs than that wait in Azure's queue, where
their ``max_queue_time`` runs out; an Airflow pool of that many slots keeps the rest waiting in Airflow.

Whether a cluster is in use is read from what Azure documents: the AmlCompute's ``nodeStateCounts``
(``runningNodeCount``: nodes running jobs; ``preparingNodeCount``) and the workspace's job LIST (a queued job
holds no node, so only the LIST shows it). Nothing here calls Azure or Airflow.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from airflow_azureml.exceptions import AzureMLConfigError

IF_BUSY = ("skip", "wait", "delete")
MAX_QUEUE_AHEAD = 8
# A job in any other state than these may still run, or be queued for nodes of the cluster.
ENDED_JOB_STATES = frozenset({"Completed", "Failed", "Canceled"})
# Airflow's own rule for a pool's name (PoolBody: at most 256 characters); the characters are ours: a name a
# metric can carry (``pool.open_slots.<name>``) and a URL path can hold without quoting.
_POOL_NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,256}$")


def capacity_pool_name(cluster: str) -> str:
    """The default pool of a cluster: every task that runs jobs on it should use this one pool."""
    return f"azureml_capacity_{cluster}"


def check_pool_name(value: Any) -> str:
    if not isinstance(value, str) or not _POOL_NAME.match(value):
        raise AzureMLConfigError(f"pool_name must be 1-256 letters, digits, '_', '.' or '-', got {value!r}.")
    return value


def check_if_busy(value: Any) -> str:
    if value not in IF_BUSY:
        raise AzureMLConfigError(f"if_busy must be one of {IF_BUSY}, got {value!r}.")
    return str(value)


def pool_slots(max_instances: Any, instance_count: Any, *, cluster: str = "the cluster") -> int:
    """How many jobs of ``instance_count`` nodes run at once on a cluster of ``max_instances`` nodes.

    A job larger than the cluster can never start (it would wait in Azure's queue until its queue time ends),
    so that is a configuration error, not a pool of 0 slots that would hold every task forever.
    """
    for label, value in (("max_instances", max_instances), ("instance_count", instance_count)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise AzureMLConfigError(f"{label} must be a positive integer, got {value!r}.")
    if instance_count > max_instances:
        raise AzureMLConfigError(
            f"A job of instance_count {instance_count} can never run on {cluster}, which has at most "
            f"{max_instances} nodes (max_instances): lower instance_count or raise max_instances."
        )
    return max_instances // instance_count


def rendered_number(value: Any) -> Any:
    """A rendered template's whole number (ASCII digits, spaces around) as an int; any other value as it is."""
    if isinstance(value, str) and re.fullmatch(r"[0-9]+", value.strip()):
        return int(value.strip())
    return value


def check_queue_ahead(value: Any) -> int:
    """Slots a pool adds beyond the cluster's capacity, for jobs that wait in Azure's queue: a small whole number.

    A rendered template (ASCII digits) is accepted. More than a handful would turn the pool back into Azure's
    queue, where ``max_queue_time`` runs out: at most 8.
    """
    value = rendered_number(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_QUEUE_AHEAD:
        raise AzureMLConfigError(f"queue_ahead must be a whole number from 0 to {MAX_QUEUE_AHEAD}, got {value!r}.")
    return value


def node_counts(compute: Mapping[str, Any]) -> dict[str, int]:
    """``nodeStateCounts`` of an AmlCompute ARM document (``properties.properties``); absent counts are 0."""
    inner = (compute.get("properties") or {}).get("properties") or {}
    counts = inner.get("nodeStateCounts") or {}
    return {str(k): int(v) for k, v in counts.items() if isinstance(v, int) and not isinstance(v, bool)}


def short_compute(compute_id: Any) -> str:
    """``/subscriptions/.../computes/<name>`` or ``azureml:<name>`` -> ``<name>`` (lower case: ARM names are not
    case-sensitive)."""
    text = str(compute_id or "")
    if text.startswith("azureml:"):
        text = text[len("azureml:") :]
    return text.rstrip("/").rsplit("/", 1)[-1].lower()


def jobs_on_cluster(
    jobs: Iterable[Mapping[str, Any]],
    cluster: str,
    deployment_compute: Callable[[str, str], str | None],
) -> list[tuple[str, str]]:
    """``(name, status)`` of every job of the LIST that has not ended and runs, or waits to run, on ``cluster``.

    A job names its compute in ``computeId``. Azure leaves that null on a batch endpoint's job (its recorded
    ``batch_job.get``): such a job is on the compute of its deployment, which Azure records on the job as the
    ``azureml.deploymentname`` tag and the ``azureml.endpointname`` property; ``deployment_compute(endpoint,
    deployment)`` reads that deployment's compute (None when unknown: not counted).
    """
    wanted = cluster.lower()
    found = []
    for job in jobs:
        props = job.get("properties") or {}
        status = str(props.get("status") or "Unknown")
        if status in ENDED_JOB_STATES:
            continue
        compute = short_compute(props.get("computeId"))
        if not compute:
            endpoint = (props.get("properties") or {}).get("azureml.endpointname")
            deployment = (props.get("tags") or {}).get("azureml.deploymentname")
            if endpoint and deployment:
                compute = short_compute(deployment_compute(str(endpoint), str(deployment)))
        if compute == wanted:
            found.append((str(job.get("name") or "?"), status))
    return found


def busy_reasons(counts: Mapping[str, int], jobs: list[tuple[str, str]]) -> list[str]:
    """What shows a cluster in use, in words for the task log; empty when nothing does."""
    reasons = []
    running, preparing = counts.get("runningNodeCount", 0), counts.get("preparingNodeCount", 0)
    if running or preparing:
        reasons.append(f"{running} node(s) running jobs and {preparing} being prepared (nodeStateCounts)")
    if jobs:
        listed = ", ".join(f"{name} ({status})" for name, status in jobs[:10])
        more = f" and {len(jobs) - 10} more" if len(jobs) > 10 else ""
        reasons.append(f"{len(jobs)} job(s) not ended on it: {listed}{more}")
    return reasons
