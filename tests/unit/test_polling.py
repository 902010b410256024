"""The shared polling policy: adaptive back-off, jitter, Retry-After, queue-time limit."""

from __future__ import annotations

import random

import pytest

from airflow_azureml.exceptions import AzureMLConfigError
from airflow_azureml.outcomes import JobSnapshot
from airflow_azureml.polling import GaugeReading, JobWatch, PollingPolicy, SharedComputeReads, TransientBudgetExceeded


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


def test_retry_after_is_capped_by_max_interval() -> None:
    policy = PollingPolicy(interval=2, max_interval=30)
    assert policy.error_delay(1, retry_after=86400) == 30
    assert policy.error_delay(1, retry_after=5) == 5


@pytest.mark.parametrize("status", ["NotResponding", "Paused"])
def test_not_responding_and_paused_keep_the_wait_going(status: str) -> None:
    watch = JobWatch(PollingPolicy(interval=1, max_interval=10, jitter=0))
    assert watch.observe(JobSnapshot(name="j", status="Running"), now=0) is not None
    assert watch.observe(JobSnapshot(name="j", status=status), now=1) is not None
    assert watch.observe(JobSnapshot(name="j", status="Running"), now=2) is not None
    assert watch.observe(JobSnapshot(name="j", status="Completed"), now=3) is None


def test_a_missing_job_is_waited_for_with_backoff() -> None:
    watch = JobWatch(PollingPolicy(interval=1, max_interval=8, backoff=2, jitter=0))
    assert [watch.observe_missing() for _ in range(5)] == [1, 2, 4, 8, 8]
    assert watch.observe(JobSnapshot(name="j", status="Queued"), now=0) == 1  # appeared: back-off resets


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def reading(compute: str, preempted: int | None, taken: float, low: bool = True) -> GaugeReading:
    return GaugeReading(compute, low, preempted, taken)


def test_compute_reads_are_shared_at_most_once_per_interval() -> None:
    clock = Clock()
    reads = SharedComputeReads(clock)
    calls: list[float] = []

    def read(taken: float) -> GaugeReading:
        calls.append(taken)
        return reading("c", len(calls), taken)

    for _ in range(20):  # twenty waits on one compute within one interval: one read
        assert reads.get(("ws", "c"), 10, read) is not None
    clock.now += 5
    reads.get(("ws", "c"), 10, read)
    assert len(calls) == 1
    clock.now += 5
    reads.get(("ws", "c"), 10, read)
    reads.get(("ws", "other"), 10, read)
    assert len(calls) == 3 and reads.reads == 3


def test_a_failed_compute_read_also_waits_out_the_interval() -> None:
    clock = Clock()
    reads = SharedComputeReads(clock)

    def broken(taken: float) -> GaugeReading:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        reads.get("k", 10, broken)
    assert reads.get("k", 10, broken) is None  # not read again within the interval


def test_gauge_counts_only_readings_taken_while_the_job_ran() -> None:
    watch = JobWatch(PollingPolicy(interval=1, max_interval=10, jitter=0))
    watch.observe(JobSnapshot(name="j", status="Queued", compute="c"), now=0)
    assert not watch.wants_gauge()
    watch.offer_gauge(reading("c", 3, taken=0.5))  # not Running: run history's times would decide
    watch.observe(JobSnapshot(name="j", status="Running", compute="c"), now=10)
    assert watch.wants_gauge()
    watch.offer_gauge(reading("c", 3, taken=9.0))  # before the poll that saw it Running: run times decide
    assert watch.gauge.samples == 0
    watch.offer_gauge(reading("c", 1, taken=10.5))  # the read that follows a Running poll: counted
    watch.offer_gauge(reading("c", 1, taken=10.5))  # the same reading again: counted once
    watch.offer_gauge(reading("c", None, taken=11.0))  # the compute did not report the gauge: not zero
    assert watch.gauge.samples == 1
    watch.offer_gauge(reading("c", 1, taken=11.5))  # 1.5 s after the poll: the job may have ended since
    assert watch.gauge.samples == 1
    watch.observe(JobSnapshot(name="j", status="Running", compute="c"), now=12)
    assert watch.gauge.samples == 2
    watch.offer_gauge(reading("c", 2, taken=12.5))
    watch.observe(JobSnapshot(name="j", status="Running", compute="c"), now=13)
    assert watch.gauge.samples == 3 and watch.gauge.rose_while_running
    assert watch.gauge.first_while_running == 1 and watch.gauge.peak_while_running == 2
    watch.observe(JobSnapshot(name="j", status="Canceled", compute="c"), now=14)
    assert not watch.wants_gauge() and watch.gauge.samples == 3  # the Queued-time read: no run times, dropped


def _whole(taken: float, at: float) -> GaugeReading:
    return GaugeReading("c", True, 2, taken, 2, at=at)


def test_a_read_after_the_last_running_poll_is_weak_evidence_if_run_history_says_the_job_still_ran() -> None:
    """No poll saw the job Running after it: a person's cancel may have come first (CancelRequested hides it
    from the run times), so the lifecycle reads the Activity Log again before resubmitting."""
    watch = JobWatch(PollingPolicy(interval=100, max_interval=100, jitter=0))
    watch.observe(JobSnapshot(name="j", status="Running", compute="c"), now=0)
    watch.offer_gauge(_whole(taken=5, at=1005))  # every node preempted, 5 s after the poll
    watch.offer_gauge(_whole(taken=50, at=1050))  # still, after the job had ended
    watch.observe(JobSnapshot(name="j", status="Canceled", compute="c", ended_at=1030), now=100)
    assert watch.gauge.whole_cluster_preempted is None and watch.gauge.whole_cluster_preempted_near_end == 2
    assert watch.gauge.lost_nodes_of(2)


def test_a_read_after_the_job_ended_never_counts() -> None:
    watch = JobWatch(PollingPolicy(interval=100, max_interval=100, jitter=0))
    watch.observe(JobSnapshot(name="j", status="Running", compute="c"), now=0)
    watch.offer_gauge(_whole(taken=50, at=1050))  # a person cancelled at 1030; then the cluster went
    watch.observe(JobSnapshot(name="j", status="Canceled", compute="c", ended_at=1030), now=100)
    assert watch.gauge.samples == 0 and not watch.gauge.lost_nodes_of(2)
    unknown = JobWatch(PollingPolicy(interval=100, max_interval=100, jitter=0))
    unknown.observe(JobSnapshot(name="j", status="Running", compute="c"), now=0)
    unknown.offer_gauge(_whole(taken=5, at=1005))
    unknown.observe(JobSnapshot(name="j", status="Canceled", compute="c"), now=100)  # no run times: in doubt
    assert unknown.gauge.samples == 0


def test_a_read_before_the_first_running_poll_counts_between_run_historys_start_and_end_as_weak() -> None:
    watch = JobWatch(PollingPolicy(interval=100, max_interval=100, jitter=0))
    watch.observe(JobSnapshot(name="j", status="Queued", compute="c"), now=0)
    watch.offer_gauge(GaugeReading("c", True, 0, 2, 2, at=1002))  # queued still: before the start
    watch.offer_gauge(_whole(taken=20, at=1020))  # started at 1010, so it ran
    watch.observe(JobSnapshot(name="j", status="Canceled", compute="c", started_at=1010, ended_at=1040), now=100)
    assert watch.gauge.whole_cluster_preempted_near_end == 2 and watch.gauge.lost_nodes_of(2)
    assert watch.gauge.samples == 0  # the read at 1002 was not taken while it ran; the one at 1020 is weak


def test_the_evidence_cadence_reads_between_polls_and_stops_at_the_end() -> None:
    watch = JobWatch(PollingPolicy(interval=100, max_interval=300, jitter=0, evidence_interval=10))
    assert watch.evidence_delay(now=0) is None  # no compute known yet
    watch.observe(JobSnapshot(name="j", status="Running", compute="c"), now=0)
    assert watch.evidence_delay(now=0) == 0.0
    watch.offer_gauge(reading("c", 0, taken=0.1), now=0.2)
    assert watch.evidence_delay(now=5) == pytest.approx(5.2)
    watch.offer_gauge(None, now=10.2)  # a failed read also waits out the cadence
    assert watch.evidence_delay(now=10.2) == pytest.approx(10)
    dedicated = JobWatch(PollingPolicy(interval=100, max_interval=300, jitter=0, evidence_interval=10))
    dedicated.observe(JobSnapshot(name="j", status="Running", compute="d"), now=0)
    dedicated.offer_gauge(GaugeReading("d", False, 0, 0.1, 2), now=0.2)
    assert dedicated.evidence_delay(now=50) is None  # not low priority: nothing to preempt
    watch.observe(JobSnapshot(name="j", status="Completed", compute="c"), now=20)
    assert watch.evidence_delay(now=20) is None


@pytest.mark.parametrize("value", [0, -1, float("nan"), float("inf")])
def test_a_bad_evidence_interval_is_refused(value: float) -> None:
    with pytest.raises(AzureMLConfigError):
        PollingPolicy(evidence_interval=value)


def test_gauge_reading_from_rest_keeps_missing_as_missing() -> None:
    arm = {"properties": {"properties": {"vmPriority": "LowPriority", "nodeStateCounts": {"preemptedNodeCount": 2}}}}
    assert GaugeReading.from_rest("c", arm, 1.0) == GaugeReading("c", True, 2, 1.0)
    bare = {"properties": {"properties": {"vmPriority": "Dedicated"}}}
    assert GaugeReading.from_rest("c", bare, 1.0) == GaugeReading("c", False, None, 1.0)
    assert GaugeReading.from_rest("c", None, 1.0) is None


def test_a_very_long_unchanged_wait_does_not_overflow() -> None:
    policy = PollingPolicy(interval=1, max_interval=300, backoff=1.5, jitter=0)
    assert policy.delay(10_000) == 300


def test_a_slow_backoff_still_reaches_max_interval() -> None:
    policy = PollingPolicy(interval=1, max_interval=300, backoff=1.05, jitter=0)
    assert policy.delay(500) == 300
