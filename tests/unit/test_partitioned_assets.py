"""Partitioned assets in the example chain: the key format, the feature's detection, and both paths of
``announce_interval`` (keyed events on Airflow 3.3; on 3.1 and 3.2 the whole-interval event alone, logged once).
The real scheduler's runs per key: tests/e2e/test_partitioned_assets.py."""

from __future__ import annotations

import runpy
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from airflow_azureml import compat
from airflow_azureml.assets import partition_key, split_partition_key

DAGS = Path(__file__).resolve().parents[2] / "dags"
SCORED = "azureml://datastores/workspaceblobstore/paths/assets/output"
PLANNED = [
    {"outputs": {"score": f"{SCORED}/{interval}/part-{k:03d}/"}} for interval in ("20261101T0000",) for k in (1, 0)
]
KEYS = ["2026-11-01T00:00:00|part-000", "2026-11-01T00:00:00|part-001"]


@pytest.fixture(autouse=True)
def _airflow_imported() -> None:
    """Airflow's first import replaces the root logger's handlers (caplog's among them): import it first."""
    import airflow  # noqa: F401


def chain(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The example chain's module, parsed as the DAG processor does (``dags/`` on the path)."""
    monkeypatch.syspath_prepend(str(DAGS))
    return runpy.run_path(str(DAGS / "example_asset_chain.py"))


def test_the_key_names_the_interval_start_in_utc_and_the_partition() -> None:
    start = datetime(2026, 11, 1, tzinfo=timezone.utc)
    assert partition_key(start, "part-000") == "2026-11-01T00:00:00|part-000"
    assert partition_key(start.astimezone(timezone(timedelta(hours=2))), "part-000") == KEYS[0]
    assert split_partition_key(KEYS[1]) == (start, "part-001")
    for bad in ("", "a|b"):
        with pytest.raises(ValueError, match="partition name"):
            partition_key(start, bad)
    for bad in ("2026-11-01T00:00:00", "2026-11-01|part-000", "2026-11-01T00:00:00|a|b"):
        with pytest.raises(ValueError):
            split_partition_key(bad)


def test_airflow_s_mappers_read_the_key_without_a_format() -> None:
    """Why the form: ProductMapper's default delimiter, and the temporal mappers' default input format."""
    try:
        from airflow.partition_mappers.identity import IdentityMapper
        from airflow.partition_mappers.product import ProductMapper
        from airflow.partition_mappers.temporal import StartOfDayMapper
    except ImportError:  # Airflow 3.1 has no partition mappers
        assert not compat.has_partitioned_assets()
        return
    assert IdentityMapper().to_downstream(KEYS[0]) == KEYS[0]
    assert ProductMapper(StartOfDayMapper(), IdentityMapper()).to_downstream(KEYS[1]) == "2026-11-01|part-001"


def test_the_feature_is_what_the_installed_airflow_has() -> None:
    major_minor = tuple(int(p) for p in compat.airflow_version().split(".")[:2])
    assert compat.has_partitioned_assets() is (major_minor >= (3, 3))
    if major_minor >= (3, 2):  # 3.2 has the timetable, but no key chosen by the task: not enough
        from airflow.sdk import PartitionedAssetTimetable  # noqa: F401
        from airflow.sdk.execution_time.context import OutletEventAccessor

        assert hasattr(OutletEventAccessor, "add_partitions") is (major_minor >= (3, 3))


def test_with_partitioned_assets_announce_interval_keys_one_event_per_scored_partition(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    module = chain(monkeypatch)
    if not compat.has_partitioned_assets():  # Airflow 3.1/3.2: the other test below is this version's path
        assert "partition_report_dag" not in module
        return
    from airflow.sdk.execution_time.context import OutletEventAccessors

    report = module["partition_report_dag"]
    assert type(report.timetable).__name__ == "PartitionedAssetTimetable"
    announce = module["scoring_dag"].get_task("announce_interval")
    assert [o.name for o in announce.outlets] == [SCORED, "azureml-scored-interval-partitions"]
    events = OutletEventAccessors()
    outputs = announce.python_callable(PLANNED, outlet_events=events)
    keyed = events[module["SCORED_PARTITIONS"]]
    assert sorted(keyed.partition_keys) == KEYS
    assert keyed.extra == {"outputs": {KEYS[k]: f"{SCORED}/20261101T0000/part-00{k}" for k in (0, 1)}}
    assert events[module["SCORED_INTERVAL"]].extra == {"outputs": outputs} and len(outputs) == 2


def test_without_partitioned_assets_the_chain_keeps_its_interval_event_and_logs_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Airflow 3.1 and 3.2's path (forced on 3.3): no keyed asset, no partition report, one log line."""
    monkeypatch.setattr(compat, "has_partitioned_assets", lambda: False)
    monkeypatch.setattr(compat, "_warned", set())
    module = chain(monkeypatch)
    assert module["PARTITIONED"] is False and "partition_report_dag" not in module
    announce = module["scoring_dag"].get_task("announce_interval")
    assert [o.uri for o in announce.outlets] == [SCORED]

    class Accessor:
        extra: dict[str, Any] = {}

    class Events:  # outlet_events with the one outlet left: Assets are not hashable on 3.1
        def __getitem__(self, asset: Any) -> Accessor:
            assert asset.uri == SCORED
            return Accessor

    with caplog.at_level("INFO", logger="airflow_azureml.compat"):
        for _ in range(2):
            announce.python_callable(PLANNED, outlet_events=Events())
    assert len(Accessor.extra["outputs"]) == 2
    lines = [r.getMessage() for r in caplog.records if r.name == "airflow_azureml.compat"]
    assert len(lines) == 1 and "add_partitions" in lines[0] and "whole-interval asset event only" in lines[0]


class _EventsOf:
    """``inlet_events`` as a task sees it: the events of one asset (an Asset is not hashable on Airflow 3.1)."""

    def __init__(self, asset: Any, events: list[Any]) -> None:
        self.asset, self.events = asset, events

    def __getitem__(self, asset: Any) -> list[Any]:
        assert asset == self.asset
        return self.events


def test_which_etl_events_a_scoring_run_scores(monkeypatch: pytest.MonkeyPatch) -> None:
    """A backfilled run scores its own interval's latest ETL event, also one older than the last 50; a day the ETL
    never wrote, and every run of the @daily part, skip (the ETL's event already triggers the scoring)."""
    from types import SimpleNamespace

    example = chain(monkeypatch)
    records, skip = example["RECORDS"], compat.skip_exception()
    day = datetime(2026, 9, 1, tzinfo=timezone.utc)
    events = [SimpleNamespace(extra={"interval": f"202609{n:02d}T0000", "n": n}) for n in range(1, 31)]
    events += [SimpleNamespace(extra={"interval": "20261101T0000", "n": 100 + n}) for n in range(60)]

    def context(run_type: str, start: datetime) -> dict[str, Any]:
        return {
            "dag_run": SimpleNamespace(run_type=run_type),
            "data_interval_start": start,
            "inlet_events": _EventsOf(records, events),
        }

    assert [e.extra["n"] for e in example["_records_to_score"](context("backfill", day))] == [1]  # older than 50
    assert [e.extra["n"] for e in example["_records_to_score"](context("backfill", day.replace(month=11)))] == [159]
    with pytest.raises(skip, match="no records for interval 20261231T0000"):
        example["_records_to_score"](context("backfill", day.replace(month=12, day=31)))
    with pytest.raises(skip, match="scheduled run scores nothing"):
        example["_records_to_score"](context("scheduled", day))
