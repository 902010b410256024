"""Assets on ``azureml://`` URIs: the provider's scheme registration, and the ETL -> scoring -> report chain
(``dags/example_asset_chain.py``) run with ``dag.test()`` against the emulator, asset events read from the
metadata DB."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pendulum
import pytest

from airflow_azureml import compat
from airflow_azureml.emulator import Emulator
from tests.conftest import load_dag, task_states, xcom_value

INTERVAL = pendulum.datetime(2026, 11, 20, tz="UTC")
CHAIN = ("example_asset_etl", "example_asset_scoring", "example_asset_report")
RECORDS_URI = "azureml://datastores/workspaceblobstore/paths/assets/input"
SCORED_INTERVAL_URI = "azureml://datastores/workspaceblobstore/paths/assets/output"


def test_provider_registers_the_azureml_scheme() -> None:
    try:  # Airflow 3.2 on: the task SDK's registry (ProvidersManager's asset_* properties are deprecated there)
        from airflow.sdk.providers_manager_runtime import ProvidersManagerTaskRuntime as ProvidersManager
    except ImportError:  # Airflow 3.1
        from airflow.providers_manager import ProvidersManager

    pm = ProvidersManager()
    pm.initialize_providers_asset_uri_resources()
    assert pm.asset_uri_handlers["azureml"].__name__ == "sanitize_uri"
    asset = pm.asset_factories["azureml"](datastore="workspaceblobstore", path="/scoring/output/")
    assert asset.uri == "azureml://datastores/workspaceblobstore/paths/scoring/output"
    assert "azureml" in pm.asset_to_openlineage_converters


@pytest.mark.parametrize(
    ("written", "stored"),
    [
        ("azureml://datastores/workspaceblobstore/paths/scoring/output/part-000/", None),
        ("azureml://DataStores/workspaceblobstore/Paths/scoring//output/part-000", None),
        (
            "azureml://subscriptions/S/resourceGroups/RG/workspaces/WS/datastores/ds/paths/In/",
            "azureml://subscriptions/S/resourcegroups/RG/workspaces/WS/datastores/ds/paths/In",
        ),
        ("azureml://jobs/job-1/outputs/score", "azureml://jobs/job-1/outputs/score"),
    ],
)
def test_asset_uris_are_normalised(written: str, stored: str | None) -> None:
    from airflow.sdk import Asset

    expected = stored or "azureml://datastores/workspaceblobstore/paths/scoring/output/part-000"
    assert Asset(written).uri == expected


@pytest.mark.parametrize(
    "bad", ["azureml://datastores/ds", "azureml://workspaceblobstore/paths/x", "azureml://datastores/ds/paths/x?a=1"]
)
def test_malformed_azureml_uris_are_refused(bad: str) -> None:
    from airflow.sdk import Asset

    with pytest.raises(ValueError, match="azureml://"):
        Asset(bad)


def _sync_and_unpause(dag_ids: tuple[str, ...]) -> None:
    """Write the DAG folder to the metadata DB (as the DAG processor would) and unpause the chain: Airflow
    queues runs only for unpaused DAGs scheduled on an asset."""
    from airflow.models.dag import DagModel
    from airflow.utils.session import create_session

    from tests.dag_support import sync_dag_folder

    sync_dag_folder()
    with create_session() as session:
        session.query(DagModel).filter(DagModel.dag_id.in_(dag_ids)).update(
            {DagModel.is_paused: False}, synchronize_session=False
        )


def asset_events(run: Any) -> list[dict[str, Any]]:
    """The asset events a DAG run emitted, from the metadata DB."""
    from airflow.models.asset import AssetEvent
    from airflow.utils.session import create_session

    with create_session() as session:
        rows = (
            session.query(AssetEvent)
            .filter_by(source_dag_id=run.dag_id, source_run_id=run.run_id)
            .order_by(AssetEvent.source_map_index)
            .all()
        )
        return [
            {
                "uri": row.asset.uri,
                "task": row.source_task_id,
                "map_index": row.source_map_index,
                "extra": dict(row.extra or {}),
                "aliases": sorted(a.name for a in row.source_aliases),
                "partition_key": getattr(row, "partition_key", None),  # the column exists from Airflow 3.2
            }
            for row in rows
        ]


def queued_for(dag_id: str) -> list[str]:
    """The asset URIs Airflow queued a run of ``dag_id`` for (``asset_dag_run_queue``)."""
    from airflow.models.asset import AssetDagRunQueue, AssetModel
    from airflow.utils.session import create_session

    with create_session() as session:
        rows = (
            session.query(AssetModel.uri)
            .join(AssetDagRunQueue, AssetDagRunQueue.asset_id == AssetModel.id)
            .filter(AssetDagRunQueue.target_dag_id == dag_id)
            .all()
        )
        return sorted(r[0] for r in rows)


def _clear_queue() -> None:
    from airflow.models.asset import AssetDagRunQueue
    from airflow.utils.session import create_session

    with create_session() as session:
        session.query(AssetDagRunQueue).filter(AssetDagRunQueue.target_dag_id.in_(CHAIN)).delete()


@pytest.fixture
def chain_env(emulator: Emulator, azureml_conn: dict[str, Any], airflow_db: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("AZUREML_DATASTORE_ROOT", f"file://{emulator.datastore_path('')}")
    monkeypatch.setenv("AZUREML_POLL_SECONDS", "0.1")
    monkeypatch.setenv("AZUREML_RESUBMIT_BACKOFF_SECONDS", "0.1")  # a loop of preemptions backs off 60 s by default
    _sync_and_unpause(CHAIN)
    _clear_queue()
    yield emulator
    _clear_queue()


def test_etl_scoring_report_chain_on_assets(chain_env: Emulator) -> None:
    emulator = chain_env

    etl = load_dag("example_asset_chain.py", "example_asset_etl").test(logical_date=INTERVAL)
    assert str(etl.state) == "success", task_states(etl)
    (records,) = asset_events(etl)
    assert records["uri"] == RECORDS_URI and records["task"] == "extract"
    assert len(records["extra"]["partitions"]) == 2
    assert queued_for("example_asset_scoring") == [RECORDS_URI]  # the scoring DAG is scheduled on it

    scoring = load_dag("example_asset_chain.py", "example_asset_scoring").test(logical_date=INTERVAL)
    assert str(scoring.state) == "success", task_states(scoring)
    events = asset_events(scoring)
    scored = [e for e in events if e["task"] == "score_partition"]
    interval = records["extra"]["interval"]
    outputs = [f"azureml://datastores/workspaceblobstore/paths/assets/output/{interval}/part-{k:03d}" for k in (0, 1)]
    assert [e["uri"] for e in scored] == outputs  # the outputs rendered at run time, one event per mapped task
    for k, event in enumerate(scored):
        result = xcom_value(scoring, "score_partition", map_index=k)
        assert event["task"] == "score_partition" and event["map_index"] == k
        assert event["aliases"] == ["azureml-scored-partitions"]
        assert event["extra"]["job_name"] == result["job_name"] and event["extra"]["output"] == "score"
        assert event["extra"]["job_names"] == result["job_names"]
    # one event for the whole interval, after every partition: the report DAG's only trigger
    announced = [e for e in events if e["task"] == "announce_interval"]
    (whole,) = [e for e in announced if e["uri"] == SCORED_INTERVAL_URI]
    assert whole["extra"] == {"outputs": outputs} and whole["partition_key"] is None
    # Airflow 3.3: one keyed event per scored partition besides it (docs/assets.md); none before
    keyed = sorted(e["partition_key"] for e in announced if e["uri"] != SCORED_INTERVAL_URI)
    day = INTERVAL.strftime("%Y-%m-%dT%H:%M:%S")
    assert keyed == ([f"{day}|part-{k:03d}" for k in (0, 1)] if compat.has_partitioned_assets() else [])
    assert queued_for("example_asset_report") == [SCORED_INTERVAL_URI]
    jobs = len(emulator.jobs())
    assert jobs == 2

    report = load_dag("example_asset_chain.py", "example_asset_report").test(logical_date=INTERVAL)
    assert str(report.state) == "success", task_states(report)
    summary = xcom_value(report, "count_rows")
    assert summary["partitions"] == 2 and summary["rows_scored"] == 2 * 2 * 10
    command = emulator.job(xcom_value(report, "summarize_predictions")["job_name"])
    assert command is not None and command.status == "Completed"
    assert sorted(i["uri"].rstrip("/") for i in command.submitted["inputs"].values()) == outputs


def test_the_report_never_runs_on_part_of_an_interval(chain_env: Emulator) -> None:
    """One partition scored, the other failed (preempted past its budget): the scored one has its event,
    but the interval is not announced, so nothing queues the report DAG."""
    from tests.helpers import when_running

    emulator = chain_env
    etl = load_dag("example_asset_chain.py", "example_asset_etl").test(logical_date=INTERVAL)
    assert str(etl.state) == "success", task_states(etl)

    def preempt(emu: Emulator, _job: str) -> None:  # dag.test() runs the mapped tasks one after the other
        emu.preempt_cluster("low-pri-cluster", form="failed")

    # the first partition dag.test() runs (the order differs between Airflow versions): its job and 3 resubmissions
    with when_running(emulator, preempt, times=4, timeout=600):
        scoring = load_dag("example_asset_chain.py", "example_asset_scoring").test(logical_date=INTERVAL)
    states = task_states(scoring)
    assert str(scoring.state) == "failed" and states["announce_interval"] == "upstream_failed", states
    events = asset_events(scoring)
    assert len([e for e in events if e["task"] == "score_partition"]) == 1  # the other partition scored
    assert [e for e in events if e["task"] == "announce_interval"] == []
    assert queued_for("example_asset_report") == []


def test_outputs_become_events_of_alias_and_matching_asset_outlets() -> None:
    from airflow.sdk import Asset, AssetAlias
    from airflow.sdk.execution_time.context import OutletEventAccessors

    from airflow_azureml.assets import output_places, record_output_events

    declared = Asset("azureml://datastores/workspaceblobstore/paths/scored/static/")
    alias, unrelated = AssetAlias("scored"), Asset("azureml://datastores/workspaceblobstore/paths/elsewhere")
    outputs = {
        "score": "azureml://datastores/workspaceblobstore/paths/scored/static/",
        "extra_copy": "azureml://datastores/workspaceblobstore/paths/scored/20261120/part-001/",
        "asset_ref": "azureml:heart-data:1",  # a data asset names no place: no event
    }
    events = OutletEventAccessors()
    emitted = record_output_events(
        {"outlet_events": events}, [declared, alias, unrelated], output_places(outputs), {"job_name": "j-1"}
    )
    static, rendered = (
        "azureml://datastores/workspaceblobstore/paths/scored/static",
        "azureml://datastores/workspaceblobstore/paths/scored/20261120/part-001",
    )
    assert sorted(emitted) == sorted([static, rendered, static])
    assert events[declared].extra == {"job_name": "j-1", "output": "score"}
    assert events[unrelated].extra == {}
    by_uri = {e.dest_asset_key.uri: e.extra for e in events[alias].asset_alias_events}
    assert by_uri == {
        static: {"job_name": "j-1", "output": "score"},
        rendered: {"job_name": "j-1", "output": "extra_copy"},
    }
    # no outlets, or no outlet_events in the context (a direct execute() call): nothing, no error
    assert record_output_events({"outlet_events": OutletEventAccessors()}, [], output_places(outputs), {}) == []
    assert record_output_events({}, [alias], output_places(outputs), {}) == []
    # with no outputs given, the job's default output location (Azure's "score" output)
    assert output_places(None, "azureml://datastores/workspaceblobstore/paths/azureml/j-1/score/") == {
        "score": output_places({"s": "azureml://datastores/workspaceblobstore/paths/azureml/j-1/score"})["s"]
    }


def test_chain_from_a_manual_etl_run_without_a_logical_date(chain_env: Emulator) -> None:
    """The ETL triggered by hand (its only trigger: ``schedule=None``) with no logical date, as the UI's Trigger
    button and ``airflow dags trigger`` make it; the scoring and report runs with none either, as the scheduler
    creates asset-triggered runs. The ETL writes the minute it was triggered in."""
    from tests.dag_support import run_shape, trigger_like_the_cli

    emulator = chain_env
    triggered_at = pendulum.datetime(2026, 12, 3, 9, 5, 41, tz="UTC")
    etl_dag = load_dag("example_asset_chain.py", "example_asset_etl")
    triggered = trigger_like_the_cli(etl_dag.dag_id, triggered_at)
    assert triggered["logical_date"] is None and triggered["data_interval"] == (None, None)
    etl = etl_dag.test(logical_date=None, run_after=triggered_at)
    assert run_shape(etl) == triggered
    assert str(etl.state) == "success", task_states(etl)
    (records,) = asset_events(etl)
    assert records["extra"]["interval"] == "20261203T0905"

    scoring = load_dag("example_asset_chain.py", "example_asset_scoring").test(logical_date=None)
    assert str(scoring.state) == "success", task_states(scoring)
    scored = "azureml://datastores/workspaceblobstore/paths/assets/output/20261203T0905"
    outputs = [f"{scored}/part-{k:03d}" for k in (0, 1)]
    assert [e["uri"] for e in asset_events(scoring) if e["task"] == "score_partition"] == outputs
    report = load_dag("example_asset_chain.py", "example_asset_report").test(logical_date=None)
    assert str(report.state) == "success", task_states(report)
    assert xcom_value(report, "count_rows")["rows_scored"] == 2 * 2 * 10
    assert len([j for j in emulator.jobs() if j.job_type == "Pipeline"]) == 2
