"""Shared by the test DAG files: record why a task failed, so tests can assert on typed errors."""

from __future__ import annotations

import inspect
import json
import os
from typing import Any


def _error_of_dag_test() -> BaseException | None:
    """The error Airflow's task runner hands ``finalize``, read from its frame.

    Airflow 3.1 and 3.2's ``dag.test()`` (the in-process supervisor) call ``finalize(ti, state, context,
    log, error)`` without first setting ``context["exception"] = error`` as the real task runner's
    ``main()`` does (3.3 sets it in both), so the failure callback would see no exception. The test
    harness's gap only: under a scheduler every version gives the callback its exception.
    """
    frame = inspect.currentframe()
    while frame is not None:
        code = frame.f_code
        if code.co_name == "finalize" and code.co_filename.endswith("task_runner.py"):
            error = frame.f_locals.get("error")
            return error if isinstance(error, BaseException) else None
        frame = frame.f_back
    return None


def record_failure(context: dict[str, Any]) -> None:
    path = os.environ.get("AZUREML_TEST_FAILURES")
    if path:
        exc = context["exception"] if "exception" in context else _error_of_dag_test()
        with open(path, "a") as handle:
            handle.write(json.dumps({"task": context["ti"].task_id, "type": type(exc).__name__, "message": str(exc)}))
            handle.write("\n")


def lose_task_state(context: dict[str, Any]) -> None:
    """An ``on_retry_callback`` that deletes the task's ``task_state_store`` rows between tries, as a lost or
    cleaned-up store leaves them (Airflow < 3.3 keeps none across tries: nothing to lose there).

    The metadata DB directly: by the time the callback runs, the task instance has moved to its next try and
    the store's API refuses the old try's id. ``dag.test()`` runs the callback in-process, with the DB at hand.
    """
    try:
        from airflow.models.task_state_store import TaskStateStoreModel
    except ImportError:
        return
    from airflow.utils.session import create_session
    from sqlalchemy import delete

    ti = context["ti"]
    model = TaskStateStoreModel
    with create_session() as session:
        deleted = session.execute(
            delete(model).where(
                model.dag_id == ti.dag_id,
                model.run_id == ti.run_id,
                model.task_id == ti.task_id,
                model.map_index == (ti.map_index if ti.map_index is not None else -1),
            )
        ).rowcount
    print(f"lose_task_state: deleted {deleted} task_state_store row(s) of {ti.task_id}")


def sync_dag_folder(dag_id: str | None = None) -> None:
    """Write the DAG folder to the metadata DB, as the DAG processor (or 3.3's ``dag.test()``) does; stop at the
    bundle that has ``dag_id``."""
    from airflow.dag_processing.bundles.manager import DagBundlesManager

    try:
        from airflow.dag_processing.dagbag import BundleDagBag, DagBag, sync_bag_to_db
    except ImportError:  # Airflow 3.1 keeps the DAG bag in airflow.models
        from airflow.models.dagbag import BundleDagBag, DagBag, sync_bag_to_db
    from airflow import settings
    from airflow.models.dag_version import DagVersion

    named = "bundle_name" in inspect.signature(DagBag.__init__).parameters  # Airflow 3.2 on
    manager = DagBundlesManager()
    manager.sync_bundles_to_db()
    # A DAG written less than [core] min_serialized_dag_update_interval (30 s) ago is not written again, so a
    # test that runs a case DAG right after another test ran another case of it got that case's tasks.
    # Airflow 3.1 reads it once into settings, 3.2 on at each write.
    env_key = "AIRFLOW__CORE__MIN_SERIALIZED_DAG_UPDATE_INTERVAL"
    env_was = os.environ.get(env_key)
    interval = getattr(settings, "MIN_SERIALIZED_DAG_UPDATE_INTERVAL", None)
    os.environ[env_key] = "0"
    if interval is not None:
        settings.MIN_SERIALIZED_DAG_UPDATE_INTERVAL = 0
    try:
        for bundle in manager.get_all_dag_bundles():
            if not bundle.is_initialized:
                bundle.initialize()
            extra = {"bundle_name": bundle.name} if named else {}
            bag = BundleDagBag(dag_folder=bundle.path, bundle_path=bundle.path, **extra)
            sync_bag_to_db(bag, bundle.name, bundle.version)
            if dag_id is not None and DagVersion.get_version(dag_id):
                break
    finally:
        if env_was is None:
            os.environ.pop(env_key, None)
        else:
            os.environ[env_key] = env_was
        if interval is not None:
            settings.MIN_SERIALIZED_DAG_UPDATE_INTERVAL = interval


def sync_dag_folder_as_dag_test_does(dag: Any) -> None:
    """Before a ``dag.test()`` on Airflow < 3.3, write the DAG folder's current DAGs to the metadata DB.

    Airflow 3.3's ``dag.test()`` re-syncs the DAG's bundle on every call (apache/airflow#64884); 3.1 and
    3.2's sync it only when the DAG has no version yet, so a test DAG whose tasks depend on the case
    (``AZUREML_TEST_CASE``) would run against the first case's serialized DAG ("Task delete not found").
    """
    from packaging.version import Version

    from airflow_azureml import compat

    if Version(compat.airflow_version()).release[:2] < (3, 3):
        sync_dag_folder(dag.dag_id)


def trigger_like_the_cli(dag_id: str, run_after: Any) -> dict[str, Any]:
    """The run ``airflow dags trigger <dag_id>`` (no ``--logical-date``) creates, made by the code that command calls
    (``airflow.api.common.trigger_dag.trigger_dag``), as a dict; the run is deleted again.

    With no scheduler to run it, a test runs the same shape in-process with ``dag.test(logical_date=None,
    run_after=...)`` and compares the two.
    """
    from airflow.api.common.trigger_dag import trigger_dag
    from airflow.models import DagRun
    from airflow.utils.session import create_session
    from airflow.utils.types import DagRunTriggeredByType

    sync_dag_folder(dag_id)
    run = trigger_dag(dag_id, triggered_by=DagRunTriggeredByType.CLI, run_after=run_after)
    assert run is not None
    shape = run_shape(run)
    with create_session() as session:
        for row in session.query(DagRun).filter_by(dag_id=dag_id, run_id=run.run_id):
            session.delete(row)  # with its task instances
    return shape


def run_shape(run: Any) -> dict[str, Any]:
    """What a task's context is built from: the run's type, logical date, data interval and run_after."""
    return {
        "run_type": str(run.run_type),
        "logical_date": run.logical_date,
        "data_interval": (run.data_interval_start, run.data_interval_end),
        "run_after": run.run_after,
    }
