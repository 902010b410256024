"""What was observed on one spot cluster, shared by every task that uses it: ``SpotHistory`` and its ``Prior``.

The rates the spot policy (``spot_policy``) reads come from here: Gamma-Poisson posterior means with a
weak prior, over counts that fade with a half-life. Kept apart from the policy's rules so that the
record, its updates and its stored form read in one place; ``spot_history_store`` keeps it in a blob.
Pure: no clock, no I/O, no Airflow or Azure import (the caller passes ``now``).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

HISTORY_VERSION = 1
_COUNTS = (
    "preemptions",
    "exposure_hours",
    "evictions",
    "node_hours",
    "spot_completions",
    "completed_jobs",
    "completed_hours",
    "longest_preempted_hours",
)
MAX_ENDED = 500  # job names remembered as ended (far more than one cluster's jobs between two updates)
MAX_RUNNING_HOURS = 48.0  # a job "running" longer than this was lost track of (a worker died): its entry is dropped
DEFAULT_HALF_LIFE_HOURS = 168.0  # a week: spot capacity changes with region and demand (000), old evidence fades


@dataclass(frozen=True)
class Prior:
    """What is assumed before anything was observed: pseudo-counts added to the cluster's history.

    0.1 whole-cluster preemptions over 2 hours of exposure: a rate of 0.05 an hour, the top of the
    lowest eviction-rate band the Azure portal shows for Spot sizes (0-5 %), with a tenth of the
    weight of one event. The 2 hours are what matter, and were chosen with
    ``benchmarks/spot_policy.py --tune`` (docs/spot_policy.md has its output): with half an hour, one
    unlucky preemption looks like a bad cluster and the regret target is missed where spot is
    cheaper; with 8 hours a bad cluster is learnt too slowly and it is missed where spot is dearer.
    ``first_quantile``: before a unit's first job the rate is this quantile of the posterior (the
    median: below the mean while evidence is thin), so that a streak does not keep new units off
    spot for good (a unit on the fallback adds no spot evidence).
    """

    preemptions: float = 0.1  # whole-cluster (job-ending) preemptions
    exposure_hours: float = 2.0  # hours a spot job held its nodes
    evictions: float = 0.1  # single-node evictions (the job went on with a replacement)
    node_hours: float = 2.0  # spot node-hours those were counted over
    first_quantile: float = 0.5  # before a unit's first job: this quantile of the rate (the median)

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not finite(value) or value <= 0 or (f.name == "first_quantile" and value > 0.5):
                raise ValueError(f"Prior.{f.name} must be a finite number > 0 (a quantile <= 0.5), got {value!r}")


@dataclass(frozen=True)
class SpotHistory:
    """What was observed on one spot cluster, across tasks: persist one per compute (``to_dict``).

    Counts are decayed (exponentially, ``half_life_hours``) to the time of the last update, so old
    evidence fades back to the prior. Update it when a spot job gets its nodes (``record_start``:
    a job still running has survived so far, and leaving its exposure out would overstate the rate
    right after any preemption), and when a job on the cluster ends: ``record_preemption`` when it
    was preempted (whole cluster, job ended), ``record_completion`` when it completed (on spot, or on
    the fallback: then only the work it took is learnt).
    """

    preemptions: float = 0.0  # whole-cluster preemptions that ended a job
    exposure_hours: float = 0.0  # hours spot jobs held nodes (from allocation to their end)
    evictions: float = 0.0  # single-node evictions of jobs that went on (from the compute's gauge)
    node_hours: float = 0.0  # spot node-hours in which those evictions were counted
    spot_completions: float = 0.0  # jobs that completed on spot
    completed_jobs: float = 0.0  # completed jobs, any tier: what one unit of work takes
    completed_hours: float = 0.0  # their run hours, from allocation to the end (start-up included)
    longest_preempted_hours: float = 0.0  # the longest a preempted job had run: the work takes longer
    updated_at: float | None = None  # epoch seconds of the last update (the caller's clock)
    half_life_hours: float = DEFAULT_HALF_LIFE_HOURS
    running: dict[str, float] = field(default_factory=dict)  # spot jobs holding nodes: name -> epoch seconds
    # the last jobs whose end was recorded: an update applied twice (a write whose answer was lost, then
    # retried on a changed blob) or a late start changes nothing (``MAX_ENDED`` kept, oldest dropped first)
    ended: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        for name in _COUNTS:
            value = getattr(self, name)
            if not finite(value) or value < 0:
                raise ValueError(f"SpotHistory.{name} must be a finite number >= 0, got {value!r}")
        if self.updated_at is not None and not finite(self.updated_at):
            raise ValueError(f"SpotHistory.updated_at must be epoch seconds, got {self.updated_at!r}")
        if not finite(self.half_life_hours) or self.half_life_hours <= 0:
            raise ValueError(f"SpotHistory.half_life_hours must be > 0, got {self.half_life_hours!r}")
        if not isinstance(self.running, dict) or not all(
            isinstance(k, str) and finite(v) for k, v in self.running.items()
        ):
            raise ValueError("SpotHistory.running maps job names to epoch seconds")
        if not isinstance(self.ended, list) or not all(isinstance(k, str) for k in self.ended):
            raise ValueError("SpotHistory.ended lists job names")

    # ------------------------------------------------------------ updates
    def decayed(self, now: float | None) -> SpotHistory:
        """The counts as they weigh at ``now`` (epoch seconds); a clock that went back decays nothing."""
        if now is None:
            return self
        if self.updated_at is None:
            return replace(self, updated_at=now)
        if now <= self.updated_at:
            return self
        factor = 0.5 ** ((now - self.updated_at) / 3600.0 / self.half_life_hours)
        return replace(
            self,
            preemptions=self.preemptions * factor,
            exposure_hours=self.exposure_hours * factor,
            evictions=self.evictions * factor,
            node_hours=self.node_hours * factor,
            spot_completions=self.spot_completions * factor,
            completed_jobs=self.completed_jobs * factor,
            completed_hours=self.completed_hours * factor,
            updated_at=now,
        )

    def record_start(self, job: str, now: float) -> SpotHistory:
        """The spot job ``job`` got its nodes at ``now``: its exposure counts from now until it ends."""
        if job in self.ended or job in self.running:
            return self  # ended already, or started: a start recorded late (or again) changes nothing
        base = self.decayed(now)
        return replace(base, running={**base._live(now), job: now}, updated_at=now)

    def _ended(self, job: str | None) -> list[str]:
        return self.ended if job is None else [*self.ended, job][-MAX_ENDED:]

    def record_preemption(
        self,
        *,
        exposure_hours: float,
        now: float,
        evictions: float = 0,
        node_hours: float = 0,
        job: str | None = None,
    ) -> SpotHistory:
        """A spot job ended by a whole-cluster preemption after holding nodes ``exposure_hours``.

        ``evictions``/``node_hours``: single-node evictions the job had seen before, and its spot
        node-hours (0 when unknown: the estimate then keeps the prior's eviction rate). ``job``: its
        name, as given to ``record_start``.
        """
        check_hours(exposure_hours=exposure_hours, evictions=evictions, node_hours=node_hours)
        if job is not None and job in self.ended:
            return self  # recorded already
        base = self.decayed(now)
        return replace(
            base,
            running=base._live(now, without=job),
            ended=base._ended(job),
            preemptions=base.preemptions + 1,
            exposure_hours=base.exposure_hours + exposure_hours,
            longest_preempted_hours=max(base.longest_preempted_hours, exposure_hours),
            evictions=base.evictions + evictions,
            node_hours=base.node_hours + node_hours,
            updated_at=now,
        )

    def record_completion(
        self,
        *,
        run_hours: float,
        now: float,
        on_spot: bool = True,
        evictions: float = 0,
        node_hours: float = 0,
        job: str | None = None,
    ) -> SpotHistory:
        """A job completed after ``run_hours`` from allocation to its end.

        On spot it is exposure without a preemption (the evidence that keeps the rate low); on the
        fallback only its work counts (a dedicated node is never evicted).
        """
        check_hours(run_hours=run_hours, evictions=evictions, node_hours=node_hours)
        if job is not None and job in self.ended:
            return self  # recorded already
        base = self.decayed(now)
        return replace(
            base,
            running=base._live(now, without=job),
            ended=base._ended(job),
            exposure_hours=base.exposure_hours + (run_hours if on_spot else 0.0),
            evictions=base.evictions + (evictions if on_spot else 0.0),
            node_hours=base.node_hours + (node_hours if on_spot else 0.0),
            spot_completions=base.spot_completions + (1 if on_spot else 0),
            completed_jobs=base.completed_jobs + 1,
            completed_hours=base.completed_hours + run_hours,
            updated_at=now,
        )

    def record_end(self, *, job: str, exposure_hours: float, now: float) -> SpotHistory:
        """A spot job ended some other way (failed, cancelled, gave up queueing): it no longer runs, and the
        ``exposure_hours`` its nodes ran were survived without a preemption."""
        check_hours(exposure_hours=exposure_hours)
        if job in self.ended:
            return self  # recorded already
        base = self.decayed(now)
        return replace(
            base,
            running=base._live(now, without=job),
            ended=base._ended(job),
            exposure_hours=base.exposure_hours + exposure_hours,
            updated_at=now,
        )

    def _live(self, now: float, without: str | None = None) -> dict[str, float]:
        """The running jobs, less ``without`` and those lost track of."""
        oldest = now - MAX_RUNNING_HOURS * 3600
        return {k: v for k, v in self.running.items() if k != without and v >= oldest}

    # ---------------------------------------------------------- estimates
    def exposure(self, now: float | None = None) -> float:
        """Hours of spot exposure: the ended jobs', plus the running jobs' so far (when ``now`` is given)."""
        if now is None:
            return self.exposure_hours
        return self.exposure_hours + sum(max(0.0, now - v) / 3600 for v in self._live(now).values())

    def preemption_rate(self, prior: Prior, now: float | None = None) -> float:
        """Whole-cluster preemptions per hour a job holds nodes: (prior + observed) / (prior + exposure)."""
        return (prior.preemptions + self.preemptions) / (prior.exposure_hours + self.exposure(now))

    def preemption_rate_quantile(self, prior: Prior, q: float, now: float | None = None) -> float:
        """The ``q`` quantile of the rate's Gamma posterior (Wilson-Hilferty; 0 when it is that unsure)."""
        shape = prior.preemptions + self.preemptions
        rate = prior.exposure_hours + self.exposure(now)
        z = _normal_quantile(q)
        cube = 1 - 1 / (9 * shape) + z * math.sqrt(1 / (9 * shape))
        return max(cube, 0.0) ** 3 * shape / rate

    def eviction_rate(self, prior: Prior) -> float:
        """Single-node evictions per spot node-hour, by the same estimator."""
        return (prior.evictions + self.evictions) / (prior.node_hours + self.node_hours)

    def mean_run_hours(self) -> float | None:
        """What a completed job took on this cluster, on average (None before the first completion)."""
        if self.completed_jobs <= 1e-9:
            return None
        return self.completed_hours / self.completed_jobs

    # ------------------------------------------------------------ storage
    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (an Airflow Variable holds it)."""
        return {"version": HISTORY_VERSION, **asdict(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> SpotHistory:
        """Read ``to_dict``'s output back; nothing stored yet (None, ``{}``) is an empty history.

        Raises ``ValueError`` for a value that is not a history (the caller starts a fresh one and
        says so: losing evidence only brings the prior back).
        """
        if not data:
            return cls()
        if not isinstance(data, dict):
            raise ValueError(f"a spot history is a JSON object, got {type(data).__name__}")
        version = data.get("version", HISTORY_VERSION)
        if version != HISTORY_VERSION:
            raise ValueError(f"spot history version {version!r} is not {HISTORY_VERSION}")
        values: dict[str, Any] = {}
        running = data.get("running") or {}
        if not isinstance(running, dict) or not all(isinstance(k, str) and finite(v) for k, v in running.items()):
            raise ValueError("spot history field 'running' must map job names to epoch seconds")
        values["running"] = {k: float(v) for k, v in running.items()}
        ended = data.get("ended") or []
        if not isinstance(ended, list) or not all(isinstance(k, str) for k in ended):
            raise ValueError("spot history field 'ended' must list job names")
        values["ended"] = list(ended)[-MAX_ENDED:]
        for f in fields(cls):
            if f.name in ("running", "ended"):
                continue
            value = data.get(f.name)
            if value is None:
                continue  # absent (an older writer): the default
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"spot history field {f.name!r} must be a number, got {value!r}")
            values[f.name] = float(value)
        return cls(**values)


# ------------------------------------------------------------------ helpers
def _normal_quantile(q: float) -> float:
    """The standard normal's ``q`` quantile (Acklam's rational approximation, |error| < 1.2e-9 in the tails)."""
    a = (
        -39.69683028665376,
        220.9460984245205,
        -275.9285104469687,
        138.3577518672690,
        -30.66479806614716,
        2.506628277459239,
    )
    b = (-54.47609879822406, 161.5858368580409, -155.6989798598866, 66.80131188771972, -13.28068155288572)
    c = (
        -0.007784894002430293,
        -0.3223964580411365,
        -2.400758277161838,
        -2.549732539343734,
        4.374664141464968,
        2.938163982698783,
    )
    d = (0.007784695709041462, 0.3224671290700398, 2.445134137142996, 3.754408661907416)
    if q < 0.02425:
        t = math.sqrt(-2 * math.log(q))
        return (((((c[0] * t + c[1]) * t + c[2]) * t + c[3]) * t + c[4]) * t + c[5]) / (
            (((d[0] * t + d[1]) * t + d[2]) * t + d[3]) * t + 1
        )
    if q > 1 - 0.02425:
        return -_normal_quantile(1 - q)
    t = q - 0.5
    r = t * t
    return (
        (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5])
        * t
        / (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1)
    )


def check_hours(**values: float) -> None:
    """Each value a finite number >= 0: a nan or a negative count would poison the shared history for good."""
    for name, value in values.items():
        if isinstance(value, bool) or not finite(value) or value < 0:
            raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")


def finite(value: Any) -> bool:
    """A real, finite number (``True`` is no count), as every stored value and policy input must be."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
