"""airflow_azureml.compat: each 3.3-only feature is detected from Airflow itself, and its loss logged once."""

from __future__ import annotations

import pytest

from airflow_azureml import compat


@pytest.fixture(autouse=True)
def _airflow_imported() -> None:
    """Airflow's first import sets up logging and replaces the root logger's handlers (caplog's among them):
    import it before the test runs, as any earlier test file would have."""
    import airflow  # noqa: F401


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


def test_before_3_3_the_state_lives_for_one_try_in_an_xcom() -> None:
    """Without ``task_state_store`` the state is kept in the task instance's XCom (cleared by Airflow when
    a try starts, kept when a deferred task resumes); on 3.3 the real store is the only one."""

    class TaskInstance:  # the two XCom calls the store makes, on a task instance of a mapped task
        task_id, map_index = "invoke", 3

        def __init__(self) -> None:
            self.xcoms: dict[tuple[str, str, int], object] = {}

        def xcom_push(self, key: str, value: object) -> None:
            self.xcoms[(self.task_id, key, self.map_index)] = value

        def xcom_pull(self, task_ids: str, key: str, map_indexes: int) -> object:
            return self.xcoms.get((task_ids, key, map_indexes))

    ti = TaskInstance()
    store = compat.task_state_store({"ti": ti})
    if compat.has_task_state_store():
        assert store is None  # a context without the store is a test's
        return
    assert isinstance(store, compat.TryStateStore) and store.get("azureml_job") is None
    store.set("azureml_job", {"job": "j-r0"})
    assert ti.xcoms == {("invoke", compat.TRY_STATE_XCOM_PREFIX + "azureml_job", 3): {"job": "j-r0"}}
    assert compat.task_state_store({"ti": ti}).get("azureml_job") == {"job": "j-r0"}


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
