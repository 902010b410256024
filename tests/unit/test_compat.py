"""airflow_azureml.compat: each 3.3-only feature is detected from Airflow itself, and its loss logged once."""

from __future__ import annotations

import pytest

from airflow_azureml import compat


def _lines(caplog: pytest.LogCaptureFixture, word: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "airflow_azureml.compat" and word in r.getMessage()]


def test_task_state_store_or_its_loss_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    compat._warned.discard("task_state_store")
    store = object()
    with caplog.at_level("INFO", logger="airflow_azureml.compat"):
        given = compat.task_state_store({"task_state_store": store})
        absent = [compat.task_state_store({}), compat.task_state_store(None)]
    assert given is store and absent == [None, None]
    lines = _lines(caplog, "task_state_store")
    if compat.has_task_state_store():  # 3.3: a context without one is a test's, nothing is lost
        assert lines == []
    else:
        assert len(lines) == 1
        assert "still prevent a duplicate job" in lines[0] and "crash between submit and persist" in lines[0]


def test_features_match_the_installed_airflow() -> None:
    from airflow.triggers.base import BaseTrigger

    three_three = tuple(int(p) for p in compat.airflow_version().split(".")[:2]) >= (3, 3)
    assert compat.has_task_state_store() is three_three
    assert compat.has_trigger_on_kill() is three_three is hasattr(BaseTrigger, "on_kill")
    assert compat.has_conn_fields() is (tuple(int(p) for p in compat.airflow_version().split(".")[:2]) >= (3, 2))


def test_trigger_on_kill_loss_is_logged_once_at_the_first_run(caplog: pytest.LogCaptureFixture) -> None:
    compat._warned.discard("trigger_on_kill")
    with caplog.at_level("INFO", logger="airflow_azureml.compat"):
        if not compat.has_trigger_on_kill():
            compat.warn_missing("trigger_on_kill")
            compat.warn_missing("trigger_on_kill")
    lines = _lines(caplog, "on_kill")
    assert len(lines) == (0 if compat.has_trigger_on_kill() else 1)
    if lines:
        assert "does not cancel its Azure ML job" in lines[0]


def test_names_moved_between_versions_resolve() -> None:
    from airflow_azureml.compat import conf
    from airflow_azureml.exceptions import AzureMLConfigError

    assert conf.getboolean("core", "unit_test_mode", fallback=False) in (True, False)
    _, fail = compat.airflow_exceptions()
    assert issubclass(AzureMLConfigError, fail)
    assert hasattr(compat.stats(), "incr")
