"""The one polling and back-off policy, shared by the worker's sync wait and the triggerer's async wait.

A fixed 30 s poll costs a 6-hour job 720 reads. Adaptive back-off grows the interval while
the job's status stays the same, so a long job costs a few dozen reads, and resets on a change.
"""

from __future__ import annotations

import random
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from airflow_azureml.exceptions import AzureMLConfigError
from airflow_azureml.outcomes import JobSnapshot


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
        base = min(self.max_interval, self.interval * (self.backoff ** max(0, unchanged_polls)))
        spread = base * self.jitter
        return max(0.0, base + (rng or random).uniform(-spread, spread))

    def error_delay(self, consecutive_errors: int, retry_after: float | None) -> float:
        """Delay after a throttled or failed request: ``Retry-After`` when the service sent one."""
        if retry_after is not None:
            return max(0.0, retry_after)
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

    def observe(self, snapshot: JobSnapshot, now: float | None = None) -> float | None:
        """Record a poll. Returns the delay before the next one, or None if the job is terminal."""
        now = time.monotonic() if now is None else now
        self.polls += 1
        self.transient_errors = 0
        if snapshot.status == self.last_status:
            self.unchanged_polls += 1
        else:
            self.unchanged_polls = 0
            self.last_status = snapshot.status
        if snapshot.queued:
            self.queued_since = self.queued_since if self.queued_since is not None else now
        else:
            self.queued_since = None
        if snapshot.terminal:
            return None
        return self.policy.delay(self.unchanged_polls)

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
