"""Deterministic job names: the same unit of work always maps to the same names.

A retry, a crash after submit, or the SDK's own POST retries then find the existing job with
one GET instead of paying for a second one. Resubmissions after a preemption get the next
suffix (``-r1``, ``-r2``...), so the whole chain of a unit of work is discoverable.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

_UNSAFE = re.compile(r"[^a-zA-Z0-9_-]+")

# The Airflow connection every hook, operator and sensor uses unless told otherwise (defined here, not on
# the hook, so that a DAG file importing an operator does not import the hook).
DEFAULT_CONN_ID = "azure_ml_default"


def slug(text: str, limit: int) -> str:
    cleaned = _UNSAFE.sub("-", text).strip("-_") or "x"
    return cleaned[:limit].rstrip("-_")


def work_key(*parts: object) -> str:
    """A short stable hash of what identifies one unit of work."""
    return hashlib.sha256("\x1f".join(str(p) for p in parts).encode()).hexdigest()[:12]


def unit_key(dag_id: str, task_id: str, work: Any) -> str:
    """The unit-of-work key of ``work`` (what the job does: endpoint, deployment, rendered inputs and
    outputs...), independent of run id and map index, so that the same work always has the same key."""
    return work_key(dag_id, task_id, json.dumps(work, sort_keys=True, default=str, separators=(",", ":")))


def job_name(dag_id: str, task_id: str, key: str, resubmission: int) -> str:
    """``<dag>-<task>-<key>-r<n>``: readable in Studio, unique per unit of work and resubmission."""
    return f"{slug(dag_id, 40)}-{slug(task_id, 40)}-{key}-r{resubmission}"


def experiment_name(dag_id: str) -> str:
    return slug(dag_id, 200)


# Every job the provider submits carries this key, whose value is the job's unit-of-work key
# (``work_key``), as a job *property* (immutable in Azure; the jobs LIST filters on
# ``properties=key=value``) and, where the submit API accepts tags (command jobs; the SDK's batch
# invoke does not), also as a tag. Waits narrow the workspace job LIST with it; a try searches
# it before submitting, because Azure may ignore the requested job name
# (azure-sdk-for-python#32763), so a name alone cannot find the job.
UNIT_TAG = "airflow_azureml.unit"
# The resubmission number of the job within its unit's chain (value: "0", "1", ...), same places.
RESUBMISSION_TAG = "airflow_azureml.resubmission"


# What the batch deployment ran when the job was submitted (``deployment_fingerprint``): a job that
# completed with another model, code or environment than the deployment's now is not reused.
DEPLOYMENT_RUNS_TAG = "airflow_azureml.deployment_runs"


def deployment_fingerprint(deployment: dict[str, Any]) -> str:
    """A short hash of what an ARM batch deployment runs: its model, code, scoring script and environment
    (ids are versioned, so a new model version or re-uploaded code changes it; a description does not)."""
    props = deployment.get("properties") or {}
    model = props.get("model") or {}
    code = props.get("codeConfiguration") or {}
    runs = {
        "model": model.get("assetId") or model.get("path") or model.get("jobId"),
        "code": code.get("codeId"),
        "scoring_script": code.get("scoringScript"),
        "environment": props.get("environmentId"),
        "environment_variables": props.get("environmentVariables") or {},
    }
    return work_key(json.dumps(runs, sort_keys=True, default=str))


def job_markers(key: str, resubmission: int) -> dict[str, str]:
    """The properties (and tags) that let a later try find this job whatever name Azure gave it."""
    return {UNIT_TAG: key, RESUBMISSION_TAG: str(resubmission)}
