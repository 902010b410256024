"""Deterministic job names: the same unit of work always maps to the same names.

A retry, a crash after submit, or the SDK's own POST retries then find the existing job with
one GET instead of paying for a second one. Resubmissions after a preemption get the next
suffix (``-r1``, ``-r2``...), so the whole chain of a unit of work is discoverable.
"""

from __future__ import annotations

import hashlib
import re

_UNSAFE = re.compile(r"[^a-zA-Z0-9_-]+")


def slug(text: str, limit: int) -> str:
    cleaned = _UNSAFE.sub("-", text).strip("-_") or "x"
    return cleaned[:limit].rstrip("-_")


def work_key(*parts: object) -> str:
    """A short stable hash of what identifies one unit of work."""
    return hashlib.sha256("\x1f".join(str(p) for p in parts).encode()).hexdigest()[:12]


def job_name(dag_id: str, task_id: str, key: str, resubmission: int) -> str:
    """``<dag>-<task>-<key>-r<n>``: readable in Studio, unique per unit of work and resubmission."""
    return f"{slug(dag_id, 40)}-{slug(task_id, 40)}-{key}-r{resubmission}"


def experiment_name(dag_id: str) -> str:
    return slug(dag_id, 200)


# Every job the provider submits carries this tag, whose value is the job's unit-of-work key
# (``work_key``). Waits narrow the workspace job LIST with ``tag=UNIT_TAG``; a try searches it
# before submitting, because Azure may ignore the requested job name (azure-sdk-for-python#32763).
UNIT_TAG = "airflow_azureml.unit"
# The resubmission number of the job within its unit's chain (tag value: "0", "1", ...).
RESUBMISSION_TAG = "airflow_azureml.resubmission"
