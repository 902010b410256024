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


def test_unit_key_is_the_work_not_the_run() -> None:
    work = {"endpoint": "ep", "deployment": "d", "inputs": {"x": "azureml://datastores/s/paths/in/a/"}, "outputs": {}}
    same = {"outputs": {}, "inputs": {"x": "azureml://datastores/s/paths/in/a/"}, "deployment": "d", "endpoint": "ep"}
    other = {**work, "inputs": {"x": "azureml://datastores/s/paths/in/b/"}}
    assert naming.unit_key("dag", "task", work) == naming.unit_key("dag", "task", same)  # key order is not identity
    assert naming.unit_key("dag", "task", work) != naming.unit_key("dag", "task", other)
    assert naming.unit_key("dag", "task", work) != naming.unit_key("dag", "other_task", work)


def test_job_markers_carry_the_unit_and_the_resubmission() -> None:
    assert naming.job_markers("abc", 2) == {naming.UNIT_TAG: "abc", naming.RESUBMISSION_TAG: "2"}


def test_a_refused_submit_is_told_from_one_that_may_have_created_a_job() -> None:
    from azure.core.exceptions import HttpResponseError, ServiceResponseError

    from airflow_azureml.exceptions import AzureMLConfigError, AzureMLError
    from airflow_azureml.operators.job_chain import refused as _refused

    def wrapped(inner: BaseException) -> AzureMLError:
        try:
            try:
                raise inner
            except BaseException:
                raise AzureMLError("Invoking batch endpoint 'e' failed") from None
        except AzureMLError as outer:
            return outer

    def http(status: int) -> HttpResponseError:
        error = HttpResponseError(message=f"HTTP {status}")
        error.status_code = status
        return error

    assert _refused(AzureMLConfigError("bad input"))
    assert _refused(wrapped(http(404))) and _refused(wrapped(http(400)))
    for maybe_created in (http(409), http(429), http(408), http(500), http(503), ServiceResponseError("lost")):
        assert not _refused(wrapped(maybe_created)), maybe_created
    assert not _refused(RuntimeError("unknown"))
