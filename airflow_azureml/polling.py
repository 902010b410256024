"""The one polling and back-off policy, shared by the worker's sync wait and the triggerer's async wait.

A fixed 30 s poll costs a 6-hour job 720 reads. Adaptive back-off grows the interval while
the job's status stays the same, so a long job costs a few dozen reads, and resets on a change.
"""

from __future__ import annotations

import math
import random
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import asdict, dataclass, field
from typing import Any

from airflow_azureml.cost import UsageRecorder, counts_from_rest
from airflow_azureml.exceptions import AzureMLConfigError
from airflow_azureml.outcomes import GaugeEvidence, JobSnapshot

# The job state in which the compute's preemptedNodeCount gauge says something about this job.
GAUGE_STATE = "Running"


@dataclass(frozen=True)
class PollingPolicy:
    """How often to look at a job, and when to give up.

    - ``interval``: first delay between polls, seconds.
    - ``max_interval``: cap of the adaptive back-off.
    - ``backoff``: growth factor per poll with an unchanged status.
    - ``jitter``: fraction of random spread, so thousands of waits do not poll in lockstep.
    - ``max_queue_time``: seconds a job may wait in a queued state (no capacity) before we stop.
    - ``max_transient_errors``: consecutive network/5xx errors tolerated; they never count as polls.
    """

    interval: float = 30.0
    max_interval: float = 300.0
    backoff: float = 1.5
    jitter: float = 0.1
    max_queue_time: float | None = None
    max_transient_errors: int = 30

    def __post_init__(self) -> None:
        if self.interval <= 0 or self.max_interval < self.interval:
            raise AzureMLConfigError("polling interval must be > 0 and <= max_interval")
        if self.backoff < 1 or not 0 <= self.jitter < 1:
            raise AzureMLConfigError("backoff must be >= 1 and jitter in [0, 1)")
        if self.max_queue_time is not None and self.max_queue_time <= 0:
            raise AzureMLConfigError("max_queue_time must be > 0 seconds")

    def delay(self, unchanged_polls: int, rng: random.Random | None = None) -> float:
        # The exponent is bounded: a job queued for days has thousands of unchanged polls, and
        # 1.5 ** 1800 overflows a float; past the cap the delay is max_interval anyway.
        polls = max(0, unchanged_polls)
        if self.backoff > 1:
            polls = min(polls, math.ceil(math.log(self.max_interval / self.interval, self.backoff)) + 1)
        growth = self.backoff**polls
        base = min(self.max_interval, self.interval * growth)
        spread = base * self.jitter
        return max(0.0, base + (rng or random).uniform(-spread, spread))

    def error_delay(self, consecutive_errors: int, retry_after: float | None) -> float:
        """Delay after a throttled or failed request: ``Retry-After`` when the service sent one, capped by
        ``max_interval`` (a server asking for a day must not park a wait, or an ``on_kill`` cancel, for a day)."""
        if retry_after is not None:
            return min(self.max_interval, max(0.0, retry_after))
        return min(self.max_interval, self.interval * (2 ** min(consecutive_errors, 10)) / 4)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> PollingPolicy:
        return cls(**(data or {}))


@dataclass
class JobWatch:
    """State of one wait, independent of sync or async I/O: feed it snapshots, it says what next."""

    policy: PollingPolicy
    started: float = field(default_factory=time.monotonic)
    last_status: str | None = None
    unchanged_polls: int = 0
    queued_since: float | None = None
    polls: int = 0
    transient_errors: int = 0
    running_since: float | None = None  # first poll of the current Running streak
    last_compute: str | None = None
    gauge: GaugeEvidence = field(default_factory=GaugeEvidence)
    _gauge_taken: float | None = None  # when the last reading this wait used was taken
    terminal: bool = False  # the last poll saw the job ended
    # node counts of the job's compute, sampled while the job is not terminal (nodes are billed while
    # queued and preparing too), from the same shared reads as the gauge: the cost estimate (cost.py)
    usage: UsageRecorder = field(default_factory=UsageRecorder)

    def observe(self, snapshot: JobSnapshot, now: float | None = None) -> float | None:
        """Record a poll. Returns the delay before the next one, or None if the job is terminal."""
        now = time.monotonic() if now is None else now
        self._count(snapshot.status)
        self.last_compute = snapshot.compute
        self.terminal = snapshot.terminal
        self.usage.status(_wall(now), snapshot.name, snapshot.status, snapshot.compute)
        if snapshot.status == GAUGE_STATE:
            self.running_since = self.running_since if self.running_since is not None else now
        else:
            self.running_since = None
        if snapshot.queued:
            self.queued_since = self.queued_since if self.queued_since is not None else now
        else:
            self.queued_since = None
        if snapshot.terminal:
            return None
        return self.policy.delay(self.unchanged_polls)

    def observe_missing(self) -> float:
        """Record a poll that found no job of that name (a sensor waits for it). Returns the next delay."""
        self._count(None)
        return self.policy.delay(self.unchanged_polls)

    def _count(self, status: str | None) -> None:
        self.polls += 1
        self.transient_errors = 0
        if status == self.last_status and self.polls > 1:
            self.unchanged_polls += 1
        else:
            self.unchanged_polls = 0
            self.last_status = status

    def wants_gauge(self) -> bool:
        """The job was Running at the last poll: a gauge reading now says something about it."""
        return self.running_since is not None

    def offer_gauge(self, reading: GaugeReading | None) -> None:
        """Use a (possibly shared) compute reading, if it was taken while this job was Running.

        A reading taken before this wait saw the job Running may predate the job's start, and the same
        reading is never counted twice: both would make a rise that this job never saw.
        """
        if reading is None or reading.preempted is None or self.running_since is None:
            return
        if reading.taken < self.running_since or reading.taken == self._gauge_taken:
            return
        self._gauge_taken = reading.taken
        self.gauge = self.gauge.observe(reading.compute, reading.low_priority, reading.preempted, reading.nodes)

    def wants_usage(self) -> bool:
        """The job's compute is known: a reading now (or once more at its end) counts its nodes."""
        return self.last_compute is not None

    def offer_usage(self, reading: GaugeReading | None) -> None:
        """Use a (possibly shared) compute reading for the node-seconds; the gauge evidence is separate."""
        if reading is None or reading.counts is None or reading.at is None:
            return
        self.usage.sample(
            reading.at, reading.compute, reading.counts, reading.vm_size, reading.location, reading.low_priority
        )

    def usage_dict(self) -> dict[str, Any]:
        return self.usage.to_dict()

    def queue_time_exceeded(self, now: float | None = None) -> bool:
        if self.policy.max_queue_time is None or self.queued_since is None:
            return False
        now = time.monotonic() if now is None else now
        return now - self.queued_since > self.policy.max_queue_time

    def transient_error(self, retry_after: float | None) -> float:
        """Record a transient failure; raises once the budget is spent. Returns the delay."""
        self.transient_errors += 1
        if self.transient_errors > self.policy.max_transient_errors:
            raise TransientBudgetExceeded(self.transient_errors)
        return self.policy.error_delay(self.transient_errors, retry_after)


class TransientBudgetExceeded(Exception):
    """Too many consecutive transient errors while polling."""


@dataclass(frozen=True)
class GaugeReading:
    """One read of a compute's ``nodeStateCounts.preemptedNodeCount`` gauge. ``preempted`` None: not reported."""

    compute: str
    low_priority: bool
    preempted: int | None
    taken: float  # time.monotonic() of the read
    nodes: int | None = None  # currentNodeCount (preempted nodes included): a whole-cluster preemption covers it
    # for the cost estimate (cost.py), not the gauge (so not compared): nodeStateCounts in cost.STATES order,
    # the wall-clock time of the read, the compute's size and region (prices)
    counts: tuple[int, ...] | None = field(default=None, compare=False)
    at: float | None = field(default=None, compare=False)
    vm_size: str | None = field(default=None, compare=False)
    location: str | None = field(default=None, compare=False)

    @classmethod
    def from_rest(cls, compute: str, arm_compute: dict[str, Any] | None, taken: float) -> GaugeReading | None:
        if not arm_compute:
            return None
        inner = (arm_compute.get("properties") or {}).get("properties") or {}
        counts = inner.get("nodeStateCounts") or {}
        value = counts.get("preemptedNodeCount")
        preempted = value if isinstance(value, int) and not isinstance(value, bool) else None
        low = str(inner.get("vmPriority", "")).lower() == "lowpriority"
        current = inner.get("currentNodeCount")
        nodes = current if isinstance(current, int) and not isinstance(current, bool) else None
        size = inner.get("vmSize")
        return cls(
            compute,
            low,
            preempted,
            taken,
            nodes,
            counts=counts_from_rest(inner),
            at=(_wall(taken) + time.time()) / 2,  # the service read its state between the request and the answer
            vm_size=str(size) if size else None,
            location=str(arm_compute.get("location") or "") or None,
        )


def _wall(monotonic: float) -> float:
    """Wall-clock time of a ``time.monotonic()`` instant (usage from several processes is merged)."""
    return time.time() - (time.monotonic() - monotonic)


class SharedComputeReads:
    """At most one compute read per compute per poll interval, shared by every wait in this process.

    Many waits on one cluster need the same gauge; reading it once per wait per poll would cost as
    much as the job reads that the coalesced poller saves. Keys name the workspace and the compute.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._readings: dict[Hashable, GaugeReading | None] = {}
        self._taken: dict[Hashable, float] = {}
        self._locks: dict[Hashable, threading.Lock] = {}
        self._guard = threading.Lock()
        self.reads = 0

    def fresh(self, key: Hashable, max_age: float) -> tuple[bool, GaugeReading | None]:
        """``(True, reading)`` when a read of ``key`` is younger than ``max_age`` (the reading may be None)."""
        with self._guard:
            taken = self._taken.get(key)
            if taken is not None and self.clock() - taken < max_age:
                return True, self._readings.get(key)
        return False, None

    def store(self, key: Hashable, reading: GaugeReading | None, taken: float) -> None:
        with self._guard:
            self.reads += 1
            self._readings[key] = reading
            self._taken[key] = taken

    def get(self, key: Hashable, max_age: float, read: Callable[[float], GaugeReading | None]) -> GaugeReading | None:
        """Sync callers: the shared reading, or ``read(taken)`` under a per-key lock (threads wait for it)."""
        with self._guard:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:
            ok, reading = self.fresh(key, max_age)
            if ok:
                return reading
            taken = self.clock()
            reading = None
            try:
                reading = read(taken)
            finally:
                self.store(key, reading, taken)  # a failed read also waits out the interval
            return reading


COMPUTE_READS = SharedComputeReads()
