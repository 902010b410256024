"""When to leave spot: the cost-aware spot -> fallback policy, as pure decisions on plain numbers.

The operator asks ``decide`` before the first submission of a unit of work and after each
preemption, and ``on_queue_timeout`` when a job waited for spot capacity longer than
``max_queue_time``; it logs every ``Decision`` (its rule, the expected costs compared and its
inputs). Nothing here reads a clock, a price, Azure or Airflow: the caller passes the numbers,
so this module is cheap to import and every decision can be replayed from its log line.

The rules, in the order they are tried (docs/spot_policy.md gives the reasons):

- ``no_fallback``: nothing to fall back to, so spot it is (only ``max_resubmits`` ends the chain).
- ``on_fallback``: a unit of work that has moved to the fallback stays there (no ping-pong).
- ``fallback_after``: the user's hard limit of preemptions for this unit of work.
- ``max_queue_time``: no spot capacity for too long (``on_queue_timeout``).
- ``prices_unknown`` / ``work_unknown``: without both prices, or without any idea of the work,
  the expected cost is not computed and only the hard rules can switch.
- ``expected_cost``: switch when finishing on spot is expected to cost more than finishing on the
  fallback. The spot side follows the billing rules of docs/billing.md: every allocated node is
  billed, evicted ones (while ``preempted``) and each replacement's start-up included, and a
  job ended by a whole-cluster preemption is resubmitted and redoes the whole job.

The rates come from ``SpotHistory``, what was observed on the spot cluster, shared by every task
that uses it, and fading with a half-life. They are Gamma-Poisson posterior means with a weak
prior (``Prior``): one eviction moves them, but does not make them jump to a conclusion.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

RULE_NO_FALLBACK = "no_fallback"
RULE_ON_FALLBACK = "on_fallback"
RULE_FALLBACK_AFTER = "fallback_after"
RULE_MAX_QUEUE_TIME = "max_queue_time"
RULE_PRICES_UNKNOWN = "prices_unknown"
RULE_WORK_UNKNOWN = "work_unknown"
RULE_EXPECTED_COST = "expected_cost"
RULES = (
    RULE_NO_FALLBACK,
    RULE_ON_FALLBACK,
    RULE_FALLBACK_AFTER,
    RULE_MAX_QUEUE_TIME,
    RULE_PRICES_UNKNOWN,
    RULE_WORK_UNKNOWN,
    RULE_EXPECTED_COST,
)

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
            if not _finite(value) or value <= 0 or (f.name == "first_quantile" and value > 0.5):
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
            if not _finite(value) or value < 0:
                raise ValueError(f"SpotHistory.{name} must be a finite number >= 0, got {value!r}")
        if self.updated_at is not None and not _finite(self.updated_at):
            raise ValueError(f"SpotHistory.updated_at must be epoch seconds, got {self.updated_at!r}")
        if not _finite(self.half_life_hours) or self.half_life_hours <= 0:
            raise ValueError(f"SpotHistory.half_life_hours must be > 0, got {self.half_life_hours!r}")
        if not isinstance(self.running, dict) or not all(
            isinstance(k, str) and _finite(v) for k, v in self.running.items()
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
        _check_hours(exposure_hours=exposure_hours, evictions=evictions, node_hours=node_hours)
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
        _check_hours(run_hours=run_hours, evictions=evictions, node_hours=node_hours)
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
        _check_hours(exposure_hours=exposure_hours)
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
        if not isinstance(running, dict) or not all(isinstance(k, str) and _finite(v) for k, v in running.items()):
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


@dataclass(frozen=True)
class PolicyInputs:
    """Everything one decision needs; prices are per node-hour in any one currency (only their ratio matters).

    ``spot_price``/``dedicated_price``: None when unknown (the expected-cost rule is then off).
    ``nodes``: nodes the job holds (batch: the deployment's instance count).
    ``work_hours_estimate``: wall hours the job runs once its nodes are up, if nobody evicts them;
    None: taken from the history (``mean_run_hours`` minus start-up), else from this unit's longest
    preempted attempt (a lower bound), else unknown.
    ``preemptions``: whole-cluster preemptions of this unit of work in this run of the task.
    ``unit_exposure_hours``: the longest time one of this unit's preempted jobs held its nodes.
    ``now``: epoch seconds, to decay the history to the time of the decision.
    """

    spot_price: float | None
    dedicated_price: float | None
    nodes: int = 1
    history: SpotHistory = field(default_factory=SpotHistory)
    preemptions: int = 0
    fallback_after: int | None = None
    has_fallback: bool = True
    on_fallback: bool = False
    work_hours_estimate: float | None = None
    unit_exposure_hours: float = 0.0
    startup_hours: float = 5 / 60  # a node's start-up (preparing), billed: minutes on AmlCompute
    release_hours: float = 2 / 60  # how long an evicted node stays billed as preempted (unknown; 000)
    lost_hours: float = 0.5 / 60  # work one single-node eviction loses: half a mini-batch on average (no checkpoint)
    now: float | None = None
    prior: Prior = field(default_factory=Prior)

    def __post_init__(self) -> None:
        if isinstance(self.nodes, bool) or not isinstance(self.nodes, int) or self.nodes < 1:
            raise ValueError(f"nodes must be an integer >= 1, got {self.nodes!r}")
        if isinstance(self.preemptions, bool) or not isinstance(self.preemptions, int) or self.preemptions < 0:
            raise ValueError(f"preemptions must be an integer >= 0, got {self.preemptions!r}")
        for name in ("spot_price", "dedicated_price", "work_hours_estimate"):
            value = getattr(self, name)
            if value is not None and (not _finite(value) or value < 0):
                raise ValueError(f"{name} must be a finite number >= 0 or None, got {value!r}")
        _check_hours(
            unit_exposure_hours=self.unit_exposure_hours,
            startup_hours=self.startup_hours,
            release_hours=self.release_hours,
            lost_hours=self.lost_hours,
        )


@dataclass(frozen=True)
class Decision:
    """One decision: where the next job goes, the rule that fired, the costs it compared, its inputs."""

    use_fallback: bool
    rule: str
    reason: str
    spot_cost: float | None = None  # expected cost of finishing on spot, from now (None: not computed)
    fallback_cost: float | None = None  # expected cost of finishing on the fallback, from now
    inputs: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def log_line(self) -> str:
        """One line for the task log: the choice, the rule, the costs and every input."""
        where = "fallback" if self.use_fallback else "spot"
        costs = ""
        if self.spot_cost is not None and self.fallback_cost is not None:
            costs = f" expected spot={self.spot_cost:.6g} fallback={self.fallback_cost:.6g};"
        shown = ", ".join(f"{k}={_short(v)}" for k, v in self.inputs.items())
        return f"Spot policy: {where} (rule {self.rule}: {self.reason});{costs} inputs: {shown}"


# ------------------------------------------------------------------ the formula
def expected_spot_cost(
    *,
    price: float,
    nodes: int,
    work_hours: float,
    preemption_rate: float,
    eviction_rate: float,
    startup_hours: float,
    release_hours: float,
    lost_hours: float,
) -> float:
    """Expected cost of finishing one job on spot, resubmitting after each whole-cluster preemption.

    An attempt takes the start-up ``s`` and the work ``T`` (``L0 = s + T``), plus ``D = (r + s + l) / n``
    for each single-node eviction: ``N`` of them, Poisson with mean ``lambda * n * T`` (``lambda`` per
    node-hour); each leaves its slot evicted-and-billed for ``r``, then a replacement starting up
    (``s``), and loses its in-flight mini-batch (``l``, half a mini-batch on average), while the other
    nodes go on. Whole-cluster preemptions come at ``mu`` an hour; each one ends the attempt, bills
    every node for ``r`` more, and the resubmitted job starts again from nothing. An attempt completes
    with odds ``p = E[e^(-mu L)] = exp(-mu L0 + lambda n T (e^(-mu D) - 1))``, so ``1/p - 1`` attempts
    are preempted before one completes, and the expected billed node-hours are
    ``n * (1/p - 1) * (1/mu + r)`` (``n * (L0 + lambda T (r + s + l))`` when ``mu`` is 0), every one at
    the spot price.
    """
    base = startup_hours + work_hours
    per_eviction = (release_hours + startup_hours + lost_hours) / nodes
    evictions = eviction_rate * nodes * work_hours
    if preemption_rate <= 0:
        return price * nodes * (base + evictions * per_eviction)
    log_odds = preemption_rate * base - evictions * math.expm1(-preemption_rate * per_eviction)  # -ln p
    if log_odds > 700:  # e^700 overflows: spot never finishes at that rate
        return math.inf
    failures = math.expm1(log_odds)  # expected preempted attempts before one completes
    return price * nodes * (failures / preemption_rate + failures * release_hours)


def expected_fallback_cost(*, price: float, nodes: int, work_hours: float, startup_hours: float) -> float:
    """Expected cost of finishing on the fallback (dedicated nodes are not evicted): ``n * (s + T)``."""
    return price * nodes * (startup_hours + work_hours)


# ------------------------------------------------------------------ decisions
def decide(inputs: PolicyInputs) -> Decision:
    """Spot or fallback for the next job of a unit of work: call before its first job and after each preemption.

    Update the cluster's ``SpotHistory`` with the preemption first, then decide on the updated one.
    """
    history = inputs.history.decayed(inputs.now)
    prior = inputs.prior
    mean = history.preemption_rate(prior, inputs.now)
    first = inputs.preemptions == 0
    # Before a unit's first job, thin evidence must not keep it off spot for good (a unit on the
    # fallback adds no spot evidence): the rate is then a quantile of the posterior (its median by
    # default, below the mean while evidence is thin; the two meet as it grows). After a preemption,
    # the mean.
    mu = history.preemption_rate_quantile(prior, prior.first_quantile, inputs.now) if first else mean
    lam = history.eviction_rate(prior)
    work, work_source = _work_hours(inputs, history)
    shown: dict[str, Any] = {
        "preemptions": inputs.preemptions,
        "fallback_after": inputs.fallback_after,
        "has_fallback": inputs.has_fallback,
        "on_fallback": inputs.on_fallback,
        "spot_price": inputs.spot_price,
        "dedicated_price": inputs.dedicated_price,
        "nodes": inputs.nodes,
        "work_hours": work,
        "work_source": work_source,
        "startup_hours": inputs.startup_hours,
        "release_hours": inputs.release_hours,
        "preemption_rate_per_hour": mu,
        "preemption_rate_mean": mean,
        "rate_used": f"quantile {prior.first_quantile:g}" if first else "mean",
        "eviction_rate_per_node_hour": lam,
        "observed_preemptions": history.preemptions,
        "observed_exposure_hours": history.exposure(inputs.now),
        "running_spot_jobs": len(history.running),
        "observed_evictions": history.evictions,
        "observed_node_hours": history.node_hours,
        "observed_spot_completions": history.spot_completions,
        "observed_completed_jobs": history.completed_jobs,
    }
    if not inputs.has_fallback:
        return Decision(False, RULE_NO_FALLBACK, "no fallback deployment or compute configured", inputs=shown)
    if inputs.on_fallback:
        return Decision(True, RULE_ON_FALLBACK, "this unit of work already runs on the fallback", inputs=shown)
    if inputs.fallback_after is not None and inputs.preemptions >= inputs.fallback_after:
        reason = f"{inputs.preemptions} preemption(s) reached fallback_after={inputs.fallback_after}"
        return Decision(True, RULE_FALLBACK_AFTER, reason, inputs=shown)
    if inputs.spot_price is None or inputs.dedicated_price is None:
        missing = [n for n in ("spot_price", "dedicated_price") if getattr(inputs, n) is None]
        reason = f"{' and '.join(missing)} unknown: only the hard rules (fallback_after, max_queue_time) switch"
        return Decision(False, RULE_PRICES_UNKNOWN, reason, inputs=shown)
    if work is None:
        reason = "no estimate of the work (none given, no job completed or preempted on this cluster): staying on spot"
        return Decision(False, RULE_WORK_UNKNOWN, reason, inputs=shown)
    spot = expected_spot_cost(
        price=inputs.spot_price,
        nodes=inputs.nodes,
        work_hours=work,
        preemption_rate=mu,
        eviction_rate=lam,
        startup_hours=inputs.startup_hours,
        release_hours=inputs.release_hours,
        lost_hours=inputs.lost_hours,
    )
    fallback = expected_fallback_cost(
        price=inputs.dedicated_price, nodes=inputs.nodes, work_hours=work, startup_hours=inputs.startup_hours
    )
    if spot > fallback:
        reason = "finishing on spot is expected to cost more than finishing on the fallback"
        return Decision(True, RULE_EXPECTED_COST, reason, spot, fallback, shown)
    reason = "finishing on spot is expected to cost no more than finishing on the fallback"
    return Decision(False, RULE_EXPECTED_COST, reason, spot, fallback, shown)


def on_queue_timeout(
    *, has_fallback: bool, waited_seconds: float, max_queue_time: float, on_fallback: bool = False
) -> Decision:
    """The job waited for spot capacity longer than ``max_queue_time``: move to the fallback if there is one.

    No spot capacity makes dedicated the normal answer, not a failure; ``use_fallback`` False means
    there is nothing to move to (the operator then fails as before). Already on the fallback, a long
    queue is not a spot matter: nothing to switch to either.
    """
    shown = {"waited_seconds": waited_seconds, "max_queue_time": max_queue_time, "has_fallback": has_fallback}
    waited = f"waited {waited_seconds:.0f}s for capacity (max_queue_time={max_queue_time:g}s)"
    if on_fallback:
        return Decision(
            False, RULE_MAX_QUEUE_TIME, f"{waited} on the fallback itself: nothing to switch to", inputs=shown
        )
    if not has_fallback:
        return Decision(False, RULE_MAX_QUEUE_TIME, f"{waited}; no fallback configured", inputs=shown)
    return Decision(True, RULE_MAX_QUEUE_TIME, f"{waited}: switching to the fallback", inputs=shown)


# ------------------------------------------------------------------ helpers
def _work_hours(inputs: PolicyInputs, history: SpotHistory) -> tuple[float | None, str]:
    if inputs.work_hours_estimate is not None:
        return inputs.work_hours_estimate, "given"
    mean = history.mean_run_hours()
    if mean is not None:
        # A completed run's hours include its start-up and, on spot, the slow-down of its single-node
        # evictions (the formula adds that slow-down itself): take both out, for the share of runs on spot.
        spot_share = min(1.0, history.spot_completions / history.completed_jobs)
        slowdown = 1 + spot_share * _eviction_overhead(inputs, history.eviction_rate(inputs.prior))
        return max(mean - inputs.startup_hours, 0.0) / slowdown, "history"
    # No job has completed here yet. A preempted job had not finished its work, nor has a job still
    # running: the work takes longer than the longest of them ran (a lower bound, so spot looks no
    # dearer than the evidence says; it rises with every longer attempt, and the first completion
    # replaces it).
    longest = max(history.longest_preempted_hours, inputs.unit_exposure_hours)
    if inputs.now is not None:
        longest = max([longest, *((inputs.now - start) / 3600 for start in history._live(inputs.now).values())])
    if longest <= inputs.startup_hours:
        return None, "unknown"
    return longest - inputs.startup_hours, "lower_bound"


def _eviction_overhead(inputs: PolicyInputs, eviction_rate: float) -> float:
    """Hours lost per hour of work to single-node evictions.

    Each one leaves its slot evicted (billed), then starting up a replacement, and loses its mini-batch.
    """
    return eviction_rate * (inputs.release_hours + inputs.startup_hours + inputs.lost_hours)


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


def _check_hours(**values: float) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not _finite(value) or value < 0:
            raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _short(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)
