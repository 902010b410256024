"""What the running Airflow (3.1, 3.2 or 3.3) offers the provider: the one place that knows.

Each 3.3-only feature is detected once, from Airflow's own modules, and when it is missing the
provider degrades and logs, once per process at first use, exactly what is lost
(docs/airflow_versions.md has the same table):

- ``task_state_store`` (3.3): where a task keeps its job chain between tries.
- trigger ``on_kill`` (3.3): the triggerer's call when a person ends a deferred task.
- ``conn-fields`` in the provider info (3.2): the connection form's fields for the extras.
- partitioned assets with keys set by the task (3.3): ``add_partitions`` on an outlet's events, read by a
  ``PartitionedAssetTimetable`` downstream.

Also the names the task SDK moved between versions (``AirflowException``, ``Stats``), imported from
where this version has them. Importing this module is cheap: nothing of Airflow at module level.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
from typing import Any

log = logging.getLogger(__name__)

LOSSES: dict[str, str] = {
    "task_state_store": (
        "Airflow {version} has no task_state_store (Airflow 3.3): the job chain is not kept between tries (within "
        "a try, across its deferrals, it is kept in an XCom). "
        "The deterministic job names and the unit-of-work property still prevent a duplicate job (a retry "
        "finds the chain in the workspace and attaches to it), but a crash between submit and persist can no "
        "longer be told from a first try, a cancel recorded by on_kill is not remembered (a later try treats "
        "that cancelled job as a person's cancel and fails), and the preemption count, backoff, fallback "
        "switch and usage restart with each try."
    ),
    "trigger_on_kill": (
        "Airflow {version} does not call a trigger's on_kill (Airflow 3.3): marking a deferred task failed or "
        "success, or clearing it, does not cancel its Azure ML job from the triggerer; the job runs on (and "
        "bills) until it ends, and a cleared task's next try attaches to it instead of cancelling it."
    ),
    "conn_fields": (
        "Airflow {version} does not read conn-fields or ui-field-behaviour from the provider info (Airflow "
        "3.2): the azure_ml connection form shows no fields for subscription_id, resource_group, "
        "workspace_name, tenant_id, cloud, ca_bundle and the other extras, and keeps the standard fields "
        "unlabelled (Login is the client id, Password the client secret); put the extras in the Extra field "
        "as JSON (same keys). The connection works the same."
    ),
    "partitioned_assets": (
        "Airflow {version} cannot give an asset event a partition key chosen by the task (outlet_events[...]"
        ".add_partitions, Airflow 3.3; 3.2's partition key is the run's, one per run): the example chain emits "
        "its whole-interval asset event only, with no event per scored (interval, partition), and "
        "example_asset_partition_report is not defined. Consumers schedule on the whole-interval asset as before."
    ),
}


@functools.cache
def airflow_version() -> str:
    """The installed Airflow's version, e.g. ``3.1.8``."""
    from importlib.metadata import version

    return version("apache-airflow-core")


def _has_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


@functools.cache
def has_task_state_store() -> bool:
    """Airflow 3.3 gives each task instance a ``task_state_store`` in its context."""
    return _has_module("airflow.models.task_state_store")


@functools.cache
def has_trigger_on_kill() -> bool:
    """Airflow 3.3's triggerer calls ``BaseTrigger.on_kill`` when a person ends a deferred task."""
    from airflow.triggers.base import BaseTrigger

    return callable(getattr(BaseTrigger, "on_kill", None))


async def task_instance_state(ti: Any) -> str | None:
    """The state Airflow's metadata holds now for ``ti`` (a trigger's ``task_instance``), asked from inside
    the triggerer through its supervisor (the Execution API's task-states read): ``"none"`` for a task
    with no state (cleared), ``"absent"`` when Airflow has no such task instance, None when it can't be told.

    Why: Airflow 3.3 calls a trigger's ``on_kill`` for a person's action, but also when the trigger moved to
    another triggerer (apache/airflow#73454, open): only the task's state tells the two apart.
    """
    try:
        from airflow.sdk.execution_time import task_runner
        from airflow.sdk.execution_time.comms import GetTaskStates
    except ImportError:
        return None
    comms = getattr(task_runner, "SUPERVISOR_COMMS", None)
    fields = [getattr(ti, name, None) for name in ("dag_id", "run_id", "task_id")]
    if comms is None or not hasattr(comms, "asend") or not all(isinstance(f, str) for f in fields):
        return None
    dag_id, run_id, task_id = fields
    map_index = getattr(ti, "map_index", None)
    map_index = map_index if isinstance(map_index, int) else -1
    try:
        result = await comms.asend(
            GetTaskStates(dag_id=dag_id, task_ids=[task_id], run_ids=[run_id], map_index=map_index)
        )
    except Exception:
        log.warning("Could not read the state of task %s/%s/%s.", dag_id, run_id, task_id, exc_info=True)
        return None
    if not hasattr(result, "task_states"):
        return None  # an error response
    states = (result.task_states or {}).get(run_id) or {}
    key = task_id if map_index < 0 else f"{task_id}_{map_index}"
    if key not in states:
        return "absent"  # Airflow answered and has no such task instance: its run or DAG was deleted
    state = states[key]
    return str(getattr(state, "value", state)) if state is not None else "none"


@functools.cache
def has_conn_fields() -> bool:
    """Airflow 3.2's providers manager first builds the connection form from the provider info's
    ``conn-fields`` and ``ui-field-behaviour`` (3.1 accepts both keys and ignores them). Read from its
    source, not imported: the check runs inside ``get_provider_info``."""
    spec = importlib.util.find_spec("airflow.providers_manager")
    if spec is None or not spec.origin:
        return False
    try:
        with open(spec.origin, encoding="utf-8") as source:
            return '"conn-fields"' in source.read()
    except OSError:
        return False


@functools.cache
def has_partitioned_assets() -> bool:
    """Airflow 3.3: a task sets its outlet events' partition keys (``OutletEventAccessor.add_partitions``: one
    event per key) and a ``PartitionedAssetTimetable`` queues one run per key. Airflow 3.2 has the timetable but
    keys an event with its run's ``partition_key`` only (one per run, from a partitioned timetable or a trigger),
    so it cannot announce several partitions of one interval; 3.1 has neither."""
    try:
        from airflow.sdk import PartitionedAssetTimetable  # noqa: F401
        from airflow.sdk.execution_time.context import OutletEventAccessor
    except ImportError:
        return False
    return callable(getattr(OutletEventAccessor, "add_partitions", None))


def asset_or_time_schedule(assets: list[Any], cron: str, timezone: str = "UTC") -> Any:
    """Runs on ``assets``' events and on ``cron`` (which also makes the DAG backfillable: Airflow backfills
    periodic timetables only). The task SDK exports both timetables from 3.2 on; 3.1 has them in core."""
    try:
        from airflow.sdk import AssetOrTimeSchedule, CronTriggerTimetable
    except ImportError:  # Airflow 3.1
        from airflow.timetables.assets import AssetOrTimeSchedule  # type: ignore[no-redef]
        from airflow.timetables.trigger import CronTriggerTimetable  # type: ignore[no-redef]
    return AssetOrTimeSchedule(timetable=CronTriggerTimetable(cron, timezone=timezone), assets=assets)


_warned: set[str] = set()


def warn_missing(feature: str) -> None:
    """Log, once per process, what is lost without ``feature`` on this Airflow."""
    if feature in _warned:
        return
    _warned.add(feature)
    # the form's loss is cosmetic, the partitions' an example's extra; the other two change what a retry or a
    # person's action does
    level = logging.INFO if feature in ("conn_fields", "partitioned_assets") else logging.WARNING
    log.log(level, LOSSES[feature].format(version=airflow_version()))


TRY_STATE_XCOM_PREFIX = "azureml_try_state:"


class TryStateStore:
    """Before Airflow 3.3: a task instance's state for the length of one try, kept in an XCom.

    Airflow clears a task's XComs when a try starts but not when a deferred task resumes, so the
    state survives the deferrals of one try (the trigger's wait, the back-off in the triggerer) and
    restarts with each try: what ``task_state_store`` keeps across tries is the documented loss; within
    a try nothing is lost (without it a resumed try would forget its preemptions and back-off).
    """

    def __init__(self, ti: Any) -> None:
        self._ti = ti

    def get(self, key: str) -> Any:
        """The value this try wrote before it deferred. At a try's start there is none (Airflow has just
        cleared the XComs) and it is not read: 3.1 and 3.2 log an absent XCom's read as an error."""
        server = getattr(self._ti, "_ti_context_from_server", None)  # what the task runner resumes from
        if server is not None and not getattr(server, "next_method", None):
            return None
        map_index = getattr(self._ti, "map_index", -1)
        return self._ti.xcom_pull(
            task_ids=self._ti.task_id,
            key=TRY_STATE_XCOM_PREFIX + key,
            map_indexes=map_index if isinstance(map_index, int) else -1,
        )

    def set(self, key: str, value: Any) -> None:
        self._ti.xcom_push(key=TRY_STATE_XCOM_PREFIX + key, value=value)


def task_state_store(context: Any) -> Any | None:
    """The task's ``task_state_store``; on Airflow < 3.3 (logged the first time) a store for this try only
    (``TryStateStore``), or None without a task instance that has XComs."""
    store = context.get("task_state_store") if context is not None else None
    if store is None and not has_task_state_store():
        warn_missing("task_state_store")
        ti = context.get("ti") if context is not None else None
        if hasattr(ti, "xcom_push") and hasattr(ti, "xcom_pull") and hasattr(ti, "task_id"):
            return TryStateStore(ti)
    return store


def airflow_exceptions() -> tuple[type[Exception], type[Exception]]:
    """``(AirflowException, AirflowFailException)``: the task SDK exports both from 3.2 on, 3.1 only in core."""
    try:
        from airflow.sdk.exceptions import AirflowException, AirflowFailException
    except ImportError:  # Airflow 3.1
        from airflow.exceptions import AirflowException, AirflowFailException
    return AirflowException, AirflowFailException


def skip_exception() -> type[Exception]:
    """``AirflowSkipException``: in the task SDK from 3.2 on, in core in 3.1."""
    try:
        from airflow.sdk.exceptions import AirflowSkipException
    except ImportError:  # Airflow 3.1
        from airflow.exceptions import AirflowSkipException  # type: ignore[no-redef,attr-defined]
    return AirflowSkipException


def stats() -> Any:
    """Airflow's metrics client: ``airflow.sdk.observability.stats`` from 3.2 on, ``airflow.stats`` in 3.1."""
    try:
        from airflow.sdk.observability.stats import Stats
    except ImportError:  # Airflow 3.1
        from airflow.stats import Stats
    return Stats


def command_stats() -> Any:
    """Airflow's metrics client in a process that is not a task (a command such as the backfill bill).

    A task's runner sets the client up from ``[metrics]``; nothing does in a plain process, where 3.2 and 3.3
    would send nothing. So it is set up here the way each version's task runner does it.
    """
    try:
        from airflow.sdk.observability.metrics import stats_utils
    except ImportError:  # Airflow 3.1: airflow.stats sets itself up from the config on first use
        return stats()
    try:  # Airflow 3.3: a module-level client
        from airflow.sdk import conf as sdk_conf
        from airflow.sdk.observability import stats as module

        module.initialize(  # type: ignore[attr-defined]
            factory=stats_utils.get_stats_factory(),
            export_legacy_names=sdk_conf.getboolean("metrics", "legacy_names_on", fallback=True),
        )
        return module
    except (ImportError, AttributeError, TypeError):  # Airflow 3.2: the Stats class takes the factory
        client = stats()
        client.initialize(factory=stats_utils.get_stats_factory(client))
        return client


def __getattr__(name: str) -> Any:
    """``conf`` on first access: the task SDK exports it from 3.2 on, 3.1 only from core."""
    if name == "conf":
        try:
            from airflow.sdk import conf
        except ImportError:  # Airflow 3.1
            from airflow.configuration import conf
        return conf
    raise AttributeError(name)
