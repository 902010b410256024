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
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from airflow_azureml.cost import UsageRecorder, counts_from_rest
from airflow_azureml.exceptions import AzureMLConfigError
from airflow_azureml.outcomes import GaugeEvidence, JobSnapshot

# The job state in which the compute's preemptedNodeCount gauge says something about this job.
GAUGE_STATE = "Running"
# Allowed disagreement between this machine's clock and the service's (run history's start and end
# times): a read this close to either is not taken as one made while the job ran.
CLOCK_MARGIN = 1.0
# Reads remembered for the cluster's node count before a job's end.
RECENT_READS = 64
# A read this soon after a poll that saw the job Running was taken while it ran (the read follows the poll).
POLL_READ_SLACK = 1.0
# Reads kept until the job's run times say whether they were taken while it ran (one poll interval's
# worth at the evidence cadence, many times over).
MAX_PENDING_READS = 2000


@dataclass(frozen=True)
class PollingPolicy:
    """How often to look at a job, and when to give up.

    - ``interval``: first delay between polls, seconds.
    - ``max_interval``: cap of the adaptive back-off.
    - ``backoff``: growth factor per poll with an unchanged status.
    - ``jitter``: fraction of random spread, so thousands of waits do not poll in lockstep.
    - ``max_queue_time``: seconds a job may wait in a queued state (no capacity) before we stop.
    - ``max_transient_errors``: consecutive network/5xx errors tolerated; they never count as polls.
    - ``evidence_interval``: seconds between reads of the job's cluster while the job has not ended,
      whatever the status back-off: a preempted node is counted only until it is replaced, so reads
      minutes apart miss preemptions (``benchmarks/verdicts.py``). Reads are shared by every wait on
      the cluster in a process, so this is one compute GET per cluster, not per job.
    """

    interval: float = 30.0
    max_interval: float = 300.0
    backoff: float = 1.5
    jitter: float = 0.1
    max_queue_time: float | None = None
    max_transient_errors: int = 30
    evidence_interval: float = 5.0

    def __post_init__(self) -> None:
        if self.interval <= 0 or self.max_interval < self.interval:
            raise AzureMLConfigError("polling interval must be > 0 and <= max_interval")
        if self.backoff < 1 or not 0 <= self.jitter < 1:
            raise AzureMLConfigError("backoff must be >= 1 and jitter in [0, 1)")
        if self.max_queue_time is not None and self.max_queue_time <= 0:
            raise AzureMLConfigError("max_queue_time must be > 0 seconds")
        if not self.evidence_interval > 0 or math.isinf(self.evidence_interval):
            raise AzureMLConfigError("evidence_interval must be a finite number of seconds > 0")

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
    _last_poll: float | None = None
    # Reads not yet known to be taken while the job ran: the next poll, or the job's run times, decide.
    _pending: list[GaugeReading] = field(default_factory=list)
    _low_priority: bool | None = None  # as the last reading said (None: not read yet)
    _offered_at: float | None = None  # when a compute read was last offered (the evidence cadence)
    _ended_at: float | None = None  # run history's end time, until the first read after it was looked at
    _nodes_before_end: int | None = None  # the cluster's nodes at the last read before the job's end
    _recent: list[GaugeReading] = field(default_factory=list)  # the last reads offered, whether counted or not
    _whole_reads: list[GaugeReading] = field(default_factory=list)  # counted reads with every node preempted
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
        if snapshot.terminal:  # run history's times (of any ended job): the attempt's node time floor
            self.usage.ran(snapshot.started_at, snapshot.ended_at, snapshot.instance_count)
        self._settle(snapshot, now)
        self._last_poll = now
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

    def evidence_delay(self, now: float | None = None) -> float | None:
        """Seconds until the job's cluster should be read again for evidence (``policy.evidence_interval``),
        or None: the job ended, its compute is unknown, or the cluster is not low priority."""
        if self.terminal or self.last_compute is None or self._low_priority is False:
            return None
        if self._offered_at is None:
            return 0.0
        now = time.monotonic() if now is None else now
        return max(0.0, self._offered_at + self.policy.evidence_interval - now)

    def offer_gauge(self, reading: GaugeReading | None, now: float | None = None) -> None:
        """Keep a (possibly shared) compute reading until it is known whether the job ran when it was taken.

        Seen Running at a poll before the read and at the next one (or at a poll just before it, within
        ``POLL_READ_SLACK``: the read that follows a poll), the read counts. A job seen ended
        decides by the start and end times run history recorded. Anything else never counts, nor does a
        read older than one already offered (the same read twice, or a shared one from before).
        """
        self._offered_at = time.monotonic() if now is None else now  # a failed read also waits out the cadence
        if reading is not None and self.terminal:
            if self.gauge.at_end is None and reading.preempted is not None:
                self.gauge = self.gauge.ended(reading.preempted)  # logged with the verdict
            if self._ended_at is not None:
                self._after_end(reading)  # the read at the end: the first after it, if none came before
        if reading is None or self.terminal or self._last_poll is None:
            return
        if self._gauge_taken is not None and reading.taken <= self._gauge_taken:
            return
        self._gauge_taken = reading.taken
        self._low_priority = reading.low_priority
        self._recent = [*self._recent[-(RECENT_READS - 1) :], reading]
        if reading.preempted is None or not reading.low_priority:
            return
        since = self.running_since
        if since is not None and since <= reading.taken <= self._last_poll + POLL_READ_SLACK:
            # between two polls of this Running streak, or just after a poll that saw it Running: it ran then
            self._take(reading)
            return
        self._pending.append(reading)
        if len(self._pending) > MAX_PENDING_READS:  # drop the oldest read that could not be evidence
            drop = next((i for i, r in enumerate(self._pending) if not r.whole_cluster_preempted), 0)
            del self._pending[drop]

    def wants_poll_now(self) -> bool:
        """A read since the last poll found every node preempted: poll the job at once, so that a poll that
        still sees it Running makes that read strong evidence (``_at_end``)."""
        last = self._last_poll
        return (
            not self.terminal
            and last is not None
            and any(r.whole_cluster_preempted and r.taken > last for r in self._pending)
        )

    def _take(self, reading: GaugeReading) -> None:
        """A read taken while the job ran: into the evidence (every-node reads also kept, for the end check)."""
        self.gauge = self.gauge.observe(reading.compute, True, reading.preempted or 0, reading.nodes)
        if reading.whole_cluster_preempted:
            self._whole_reads.append(reading)

    def _settle(self, snapshot: JobSnapshot, now: float) -> None:
        """A poll: which pending reads were taken while the job ran (into ``gauge``), which stay pending."""
        if snapshot.terminal:
            self._at_end(snapshot)
            return
        if not self._pending:
            return
        was_running = self.running_since is not None  # the poll before this one saw Running
        if snapshot.status == GAUGE_STATE and was_running:
            last = self._last_poll if self._last_poll is not None else now
            ran = [r for r in self._pending if last <= r.taken <= now]
            self._pending = [r for r in self._pending if not last <= r.taken <= now]
            for r in sorted(ran, key=lambda r: r.taken):
                self._take(r)
        # else: started, or stopped running, since the last poll: the run times will decide

    def _at_end(self, snapshot: JobSnapshot) -> None:
        """The job was seen ended: run history's times decide the pending reads, and check the counted ones.

        A read after run history's end time never counts, even one between two polls that said Running
        (ARM may show an accepted cancel late). A read with every node preempted that only the run times
        place inside the run (no poll saw the job Running after it: ``wants_poll_now`` asks for one at once)
        may come after a person's cancel request, which ``CancelRequested`` hides from the times: weak
        evidence, as the first read after the end is (the lifecycle reads the Activity Log again first). So is
        one within ``CLOCK_MARGIN`` before the end: Azure may end a job a fraction of a second after such a read
        (seen in ``benchmarks/backfill.py``), and the read after the end may find new nodes beside the lost ones.
        """
        was_running = self.running_since is not None
        start, end = snapshot.started_at, snapshot.ended_at
        ran: list[GaugeReading] = []
        for r in self._pending:
            if end is None or r.at is None or r.at > end - CLOCK_MARGIN:
                continue
            after_running_poll = was_running and self._last_poll is not None and r.taken >= self._last_poll
            if after_running_poll or (start is not None and r.at >= start + CLOCK_MARGIN):
                ran.append(r)
        weak = [r for r in ran if r.whole_cluster_preempted]  # no poll saw it Running after them
        for r in sorted(ran, key=lambda r: r.taken):
            if r not in weak:
                self._take(r)
        if end is not None and self._whole_reads:
            kept = [r.preempted or 0 for r in self._whole_reads if r.at is None or r.at <= end - CLOCK_MARGIN]
            self.gauge = replace(self.gauge, whole_cluster_preempted=max(kept) if kept else None)
        if end is not None and start is not None:  # too close to the end to count as taken while it ran, yet
            # before it, and after its start (a person's cancel of a job still queued is never a loss of its nodes)
            weak += [
                r
                for r in (*self._whole_reads, *self._pending)
                if r.whole_cluster_preempted and r.at is not None and max(start, end - CLOCK_MARGIN) < r.at <= end
            ]
        weak = [r for r in weak if not self._shrank_before(r)]
        if weak:
            self.gauge = self.gauge.near_end(max(r.preempted or 0 for r in weak))
        self._just_after_end(end)
        self._pending = []

    def _just_after_end(self, end: float | None) -> None:
        """Keep what the first read after run history's end time needs (it may be the read at the end).

        Azure may cancel a job within seconds of its nodes' loss, before any read; the nodes then stay
        counted as preempted until they are replaced. So every node of the cluster preempted at the
        first read after the end counts too, if that read came within one evidence interval of the end
        and the cluster had no fewer nodes than at the read before (else the job's own nodes may have
        been released, and the preempted ones be another job's).
        """
        self._ended_at = end
        if end is None:
            return
        before = [r for r in self._recent if r.at is not None and r.at <= end and r.nodes is not None]
        if before:  # any read before the end, counted as evidence or not
            self._nodes_before_end = max(before, key=lambda r: r.taken).nodes
        after = [r for r in self._pending if r.at is not None and r.at > end]
        if after:
            self._after_end(min(after, key=lambda r: r.taken))

    def _after_end(self, first: GaugeReading) -> None:
        """The first read after the job's end (``_just_after_end``); later ones are not looked at."""
        end = self._ended_at
        if end is None or first.at is None or first.at <= end:
            return  # a read from before the end (or too close to it to tell): the first after it is still to come
        self._ended_at = None
        if first.at > end + self.policy.evidence_interval + 2 * CLOCK_MARGIN:
            return
        if not first.low_priority or not first.whole_cluster_preempted:
            return
        if self._nodes_before_end is not None and (first.nodes or 0) < self._nodes_before_end:
            return
        self.gauge = self.gauge.near_end(first.preempted or 0)

    def _shrank_before(self, reading: GaugeReading) -> bool:
        """The cluster had fewer nodes at ``reading`` than at the read before it: this job's nodes may have been
        released (a person's cancel), and the preempted ones left be another job's. Preempted nodes stay counted
        until deallocated, so a preemption does not shrink the cluster."""
        before = [r for r in self._recent if r.taken < reading.taken and r.nodes is not None]
        if reading.nodes is None or not before:
            return False
        return reading.nodes < max(before, key=lambda r: r.taken).nodes

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

    @property
    def whole_cluster_preempted(self) -> bool:
        """Every node of the cluster was preempted at this read."""
        return self.nodes is not None and self.preempted is not None and 0 < self.nodes <= self.preempted

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
