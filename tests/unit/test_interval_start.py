"""``example_partitions.interval_start``: the interval a run of the example DAGs works on."""

from __future__ import annotations

from types import SimpleNamespace

import example_partitions as ep  # the DAG folder's shared module (tests/conftest.py puts it on sys.path)
import pendulum
import pytest


def test_a_run_with_a_data_interval_keeps_it() -> None:
    start = pendulum.datetime(2026, 11, 28, tz="UTC")
    late = SimpleNamespace(run_after=pendulum.datetime(2026, 12, 3, 14, 37, 52, tz="UTC"))
    assert ep.interval_start(start, late) is start  # scheduled runs, backfills: unchanged
    assert ep.interval_key(ep.interval_start(start, late)) == "20261128T0000"


def test_a_run_without_one_works_on_the_minute_it_was_triggered_in() -> None:
    def key(*hms: int) -> str:
        run = SimpleNamespace(run_after=pendulum.datetime(2026, 12, 3, *hms, tz="UTC"))
        return ep.interval_key(ep.interval_start(None, run))

    assert key(14, 37, 52) == key(14, 37, 0) == key(14, 37, 59) == "20261203T1437"  # the same work
    assert key(14, 38, 0) == "20261203T1438"  # a minute later: new work, new partitions
    run = SimpleNamespace(run_after=pendulum.datetime(2026, 12, 3, 15, 37, 52, 5, tz="Europe/Berlin"))
    assert ep.interval_start(None, run) == pendulum.datetime(2026, 12, 3, 14, 37, tz="UTC")


def test_a_run_with_neither_says_what_to_pass() -> None:
    with pytest.raises(ValueError, match="logical date"):
        ep.interval_start(None, None)
