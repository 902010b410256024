"""The job LIST's page cap: the base cap, and reading further only while that is cheaper than GETs."""

from __future__ import annotations

from airflow_azureml.triggers.poller import WorkspacePoller


def cap(last_page: dict[str, int], names: set[str]) -> int:
    poller = WorkspacePoller("c")
    poller._last_page = last_page
    return poller._page_cap(names, 100)


def test_base_cap_without_history() -> None:
    assert cap({}, {f"j{i}" for i in range(250)}) == 4  # ceil(250 / 100) + 1


def test_jobs_spread_over_far_pages_stretch_the_cap() -> None:
    # 300 waits left of 2000: they were last seen on pages 1..20, 15 per page
    names = {f"j{i}" for i in range(300)}
    last = {f"j{i}": 1 + i // 15 for i in range(300)}
    assert cap(last, names) == 21  # 20 pages + one of drift beat ~240 GETs


def test_one_far_job_does_not_stretch_the_cap() -> None:
    names = {f"j{i}" for i in range(50)}
    last = {**{f"j{i}": 1 for i in range(49)}, "j49": 40}
    assert cap(last, names) == 2  # one GET is cheaper than 39 more pages


def test_jobs_never_found_do_not_stretch_the_cap() -> None:
    names = {f"old{i}" for i in range(20)}
    assert cap({}, names) == 2
