"""The shared polling policy: adaptive back-off, jitter, Retry-After, queue-time limit."""

from __future__ import annotations

import random

import pytest

from airflow_azureml.exceptions import AzureMLConfigError
from airflow_azureml.outcomes import JobSnapshot
from airflow_azureml.polling import JobWatch, PollingPolicy, TransientBudgetExceeded


def test_backoff_grows_while_unchanged_and_is_capped() -> None:
    policy = PollingPolicy(interval=10, max_interval=100, backoff=2, jitter=0)
    assert [policy.delay(n) for n in range(6)] == [10, 20, 40, 80, 100, 100]


def test_jitter_stays_within_bounds() -> None:
    policy = PollingPolicy(interval=10, max_interval=10, jitter=0.2)
    rng = random.Random(1)
    delays = [policy.delay(0, rng) for _ in range(200)]
    assert min(delays) >= 8 and max(delays) <= 12 and len(set(delays)) > 100


def test_six_hour_job_costs_far_fewer_polls_than_fixed_30s() -> None:
    policy = PollingPolicy(interval=30, max_interval=600, backoff=1.5, jitter=0)
    watch = JobWatch(policy)
    elapsed, polls = 0.0, 0
    while elapsed < 6 * 3600:
        delay = watch.observe(JobSnapshot(name="j", status="Running"), now=elapsed)
        assert delay is not None
        elapsed += delay
        polls += 1
    assert polls < 720 / 10  # a fixed 30 s poll would need 720


def test_status_change_resets_backoff_and_terminal_stops() -> None:
    watch = JobWatch(PollingPolicy(interval=1, max_interval=100, backoff=2, jitter=0))
    assert watch.observe(JobSnapshot(name="j", status="Queued"), now=0) == 1
    assert watch.observe(JobSnapshot(name="j", status="Queued"), now=1) == 2
    assert watch.observe(JobSnapshot(name="j", status="Running"), now=3) == 1
    assert watch.observe(JobSnapshot(name="j", status="Completed"), now=4) is None


def test_queue_time_limit() -> None:
    watch = JobWatch(PollingPolicy(interval=1, max_interval=10, max_queue_time=60))
    watch.observe(JobSnapshot(name="j", status="Queued"), now=0)
    assert not watch.queue_time_exceeded(now=59)
    assert watch.queue_time_exceeded(now=61)
    watch.observe(JobSnapshot(name="j", status="Running"), now=62)
    assert not watch.queue_time_exceeded(now=1000)


def test_retry_after_is_honoured_and_transient_errors_are_bounded() -> None:
    watch = JobWatch(PollingPolicy(interval=4, max_interval=100, max_transient_errors=3))
    assert watch.transient_error(retry_after=7.5) == 7.5
    assert watch.transient_error(retry_after=None) > 0
    watch.transient_error(retry_after=None)
    with pytest.raises(TransientBudgetExceeded):
        watch.transient_error(retry_after=None)
    # a successful poll resets the budget, and errors never counted as polls
    watch.transient_errors = 0
    watch.observe(JobSnapshot(name="j", status="Running"))
    assert watch.polls == 1


@pytest.mark.parametrize(
    "kwargs",
    [{"interval": 0}, {"interval": 10, "max_interval": 5}, {"backoff": 0.5}, {"jitter": 1.5}, {"max_queue_time": 0}],
)
def test_invalid_policy(kwargs: dict) -> None:
    with pytest.raises(AzureMLConfigError):
        PollingPolicy(**kwargs)


def test_policy_serialises() -> None:
    policy = PollingPolicy(interval=5, max_interval=50, max_queue_time=120)
    assert PollingPolicy.from_dict(policy.to_dict()) == policy
