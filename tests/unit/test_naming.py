"""Deterministic job names."""

from __future__ import annotations

from airflow_azureml import naming
from airflow_azureml.specs import JOB_NAME


def test_job_names_are_stable_valid_and_distinct() -> None:
    key = naming.work_key("dag", "task", "scheduled__2026-01-01T00:00:00+00:00", 3)
    assert key == naming.work_key("dag", "task", "scheduled__2026-01-01T00:00:00+00:00", 3)
    assert key != naming.work_key("dag", "task", "scheduled__2026-01-01T00:00:00+00:00", 4)
    names = {naming.job_name("my dag/with:odd chars" * 5, "invoke.partition", key, n) for n in range(3)}
    assert len(names) == 3
    assert all(JOB_NAME.match(name) for name in names)
