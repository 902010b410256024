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
- ``deadline``: with a deadline, the fallback when the slack no longer covers a plausible preemption
  plus a restart, or when nothing meets the deadline any more (``airflow_azureml.deadline``: the
  fallback then finishes soonest). Otherwise the rules below decide, as they would without one.
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
from dataclasses import asdict, dataclass, field
from typing import Any

from airflow_azureml import deadline as deadlines
from airflow_azureml.spot_history import DEFAULT_HALF_LIFE_HOURS as DEFAULT_HALF_LIFE_HOURS  # re-exported
from airflow_azureml.spot_history import HISTORY_VERSION as HISTORY_VERSION  # re-exported
from airflow_azureml.spot_history import MAX_ENDED as MAX_ENDED  # re-exported
from airflow_azureml.spot_history import MAX_RUNNING_HOURS as MAX_RUNNING_HOURS  # re-exported
from airflow_azureml.spot_history import Prior, SpotHistory, check_hours, finite

RULE_NO_FALLBACK = "no_fallback"
RULE_ON_FALLBACK = "on_fallback"
RULE_FALLBACK_AFTER = "fallback_after"
RULE_MAX_QUEUE_TIME = "max_queue_time"
RULE_DEADLINE = "deadline"
RULE_PRICES_UNKNOWN = "prices_unknown"
RULE_WORK_UNKNOWN = "work_unknown"
RULE_EXPECTED_COST = "expected_cost"
RULES = (
    RULE_NO_FALLBACK,
    RULE_ON_FALLBACK,
    RULE_FALLBACK_AFTER,
    RULE_DEADLINE,
    RULE_MAX_QUEUE_TIME,
    RULE_PRICES_UNKNOWN,
    RULE_WORK_UNKNOWN,
    RULE_EXPECTED_COST,
)


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
    ``deadline``: epoch seconds by which the unit of work must be done (None: no deadline, today's
    rules); needs ``now``. ``restart_hours``: from a preemption to the next job's submission (Azure
    ending the job, a poll seeing it), part of what a preemption costs against a deadline.
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
    deadline: float | None = None
    restart_hours: float = 2 / 60

    def __post_init__(self) -> None:
        if isinstance(self.nodes, bool) or not isinstance(self.nodes, int) or self.nodes < 1:
            raise ValueError(f"nodes must be an integer >= 1, got {self.nodes!r}")
        if isinstance(self.preemptions, bool) or not isinstance(self.preemptions, int) or self.preemptions < 0:
            raise ValueError(f"preemptions must be an integer >= 0, got {self.preemptions!r}")
        for name in ("spot_price", "dedicated_price", "work_hours_estimate"):
            value = getattr(self, name)
            if value is not None and (not finite(value) or value < 0):
                raise ValueError(f"{name} must be a finite number >= 0 or None, got {value!r}")
        check_hours(
            unit_exposure_hours=self.unit_exposure_hours,
            startup_hours=self.startup_hours,
            release_hours=self.release_hours,
            lost_hours=self.lost_hours,
            restart_hours=self.restart_hours,
        )
        if self.deadline is not None:
            if not finite(self.deadline):
                raise ValueError(f"deadline must be finite epoch seconds or None, got {self.deadline!r}")
            if self.now is None:
                raise ValueError("a deadline needs now (epoch seconds) to plan against")


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
    history, mean, mu = _rates(inputs)
    prior = inputs.prior
    first = inputs.preemptions == 0
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
    if inputs.deadline is not None:
        planned = _plan(inputs, work, work_source, mu)
        shown.update(planned.log_inputs())
        passed = planned.hours_left <= 0  # missed already: dedicated nodes would only be late at a higher price
        if not passed and planned.verdict in (deadlines.VERDICT_FALLBACK, deadlines.VERDICT_INFEASIBLE):
            return Decision(True, RULE_DEADLINE, planned.reason, inputs=shown)
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


def deadline_plan(inputs: PolicyInputs) -> deadlines.DeadlinePlan | None:
    """The deadline's verdict on these inputs, as ``decide`` weighs it (None without a deadline).

    The operator asks it before a unit's first job, to say at once what the deadline allows (a warning
    when nothing meets it).
    """
    if inputs.deadline is None:
        return None
    history, _, mu = _rates(inputs)
    work, source = _work_hours(inputs, history)
    return _plan(inputs, work, source, mu)


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
def _rates(inputs: PolicyInputs) -> tuple[SpotHistory, float, float]:
    """The history decayed to ``now``, the posterior mean preemption rate, and the rate a decision uses.

    Before a unit's first job, thin evidence must not keep it off spot for good (a unit on the fallback
    adds no spot evidence): the rate is then a quantile of the posterior (its median by default, below
    the mean while evidence is thin; the two meet as it grows). After a preemption, the mean.
    """
    history = inputs.history.decayed(inputs.now)
    prior = inputs.prior
    mean = history.preemption_rate(prior, inputs.now)
    first = inputs.preemptions == 0
    mu = history.preemption_rate_quantile(prior, prior.first_quantile, inputs.now) if first else mean
    return history, mean, mu


def _plan(inputs: PolicyInputs, work: float | None, source: str, rate: float) -> deadlines.DeadlinePlan:
    """The deadline planner on the policy's own work estimate (``source`` from ``_work_hours``) and rate
    (``now`` is set: ``PolicyInputs`` checks)."""
    assert inputs.deadline is not None and inputs.now is not None
    return deadlines.plan(
        now=inputs.now,
        deadline=inputs.deadline,
        work_hours=work,
        startup_hours=inputs.startup_hours,
        restart_hours=inputs.restart_hours,
        preemption_rate=rate,
        work_is_lower_bound=source == "lower_bound",
    )


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


def _short(value: Any) -> str:
    """Four significant digits; epoch seconds (the deadline, now) whole, or they would read 1.8e+09."""
    if isinstance(value, float):
        return f"{value:.0f}" if abs(value) >= 1e6 else f"{value:.4g}"
    return str(value)
