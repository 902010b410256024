"""A deadline for one unit of work: while spot still fits, when only the fallback does, when nothing does.

``spot_policy.decide`` asks ``plan`` after its hard rules and before its cost rule; the operator asks it
once more before a unit's first job, to fail at once on a deadline nothing can meet. Pure: no clock, no
I/O, no Airflow or Azure import (the caller passes ``now``), so every verdict replays from its log line.

The model is the operator's: a unit of work is one job, and a preempted job is resubmitted and redoes
all of its work. So a spot attempt that is preempted costs the wall time it ran (its start-up included)
plus the time to notice the preemption and submit again (``restart_hours``), and the unit then still
needs the whole of its work. The fallback (dedicated nodes) is never preempted: its start-up plus the
work is the fastest the unit can finish, ``fastest_finish``; the hours left after it are the slack.

- ``infeasible``: the slack is negative. Not even the fallback finishes by the deadline.
- ``fallback``: the slack does not cover a plausible preemption plus a restart. Trying spot now could
  leave too little time to finish on the fallback afterwards.
- ``spot``: it does. Spot may be tried, and the cost rule decides as it would without a deadline.
- ``unknown``: no estimate of the work, so the deadline cannot be checked yet. A deadline already past is
  ``infeasible`` even then.

"Plausible" (``plausible_loss_hours``): preemptions arrive at ``preemption_rate`` an hour (Poisson, as in
``spot_policy``), so the time to the next one is exponential. A preemption is plausible up to the
``quantile`` (0.99 by default) of that time, and it can take no more than the attempt it ends. At any
rate where spot pays, that quantile lies far beyond one attempt, so the margin is the whole attempt plus
a restart, which is what a preemption just before the end costs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

VERDICT_SPOT = "spot"
VERDICT_FALLBACK = "fallback"
VERDICT_INFEASIBLE = "infeasible"
VERDICT_UNKNOWN = "unknown"
DEFAULT_QUANTILE = 0.99  # a preemption is "plausible" up to this quantile of the time to the next one
_EPSILON_HOURS = 1e-9


@dataclass(frozen=True)
class DeadlinePlan:
    """What the deadline allows for the next job of a unit of work, and the numbers behind it (hours, epoch s)."""

    verdict: str
    reason: str
    deadline: float  # epoch seconds
    now: float  # epoch seconds
    hours_left: float  # from now to the deadline
    work_hours: float | None  # the unit's remaining work (None: unknown)
    fastest_finish: float | None = None  # epoch seconds: now + start-up + work on the fallback
    slack_hours: float | None = None  # hours left after the fastest finish
    margin_hours: float | None = None  # a plausible preemption's lost hours plus a restart
    lost_hours: float | None = None  # the plausible preemption's lost hours alone

    def log_inputs(self) -> dict[str, Any]:
        """The plan's numbers as a decision's log shows them."""
        return {
            "deadline": self.deadline,
            "deadline_now": self.now,
            "deadline_hours_left": self.hours_left,
            "deadline_fastest_finish": self.fastest_finish,
            "deadline_slack_hours": self.slack_hours,
            "deadline_margin_hours": self.margin_hours,
            "deadline_verdict": self.verdict,
        }


def plausible_loss_hours(attempt_hours: float, preemption_rate: float, quantile: float = DEFAULT_QUANTILE) -> float:
    """Wall hours a plausible preemption takes from a spot attempt of ``attempt_hours``.

    The time to the next preemption is exponential at ``preemption_rate`` (per hour); its ``quantile`` is
    ``-ln(1 - q) / rate``. A preemption loses the attempt up to it, so never more than the attempt.
    A rate of 0 is no evidence of safety here: the whole attempt is at stake.
    """
    _check(attempt_hours=attempt_hours, preemption_rate=preemption_rate)
    if not 0 < quantile < 1:
        raise ValueError(f"quantile must lie strictly between 0 and 1, got {quantile!r}")
    if preemption_rate <= 0:
        return attempt_hours
    return min(attempt_hours, -math.log1p(-quantile) / preemption_rate)


def plan(
    *,
    now: float,
    deadline: float,
    work_hours: float | None,
    startup_hours: float,
    restart_hours: float,
    preemption_rate: float,
    fallback_startup_hours: float | None = None,
    quantile: float = DEFAULT_QUANTILE,
    work_is_lower_bound: bool = False,
) -> DeadlinePlan:
    """The verdict for the next job (``VERDICT_*``), given the remaining work and the time left.

    ``now``/``deadline``: epoch seconds. ``work_hours``: the unit's remaining work once its nodes are up
    (None: unknown). ``startup_hours``: a spot node's start-up; ``fallback_startup_hours`` the fallback's
    (default: the same). ``restart_hours``: from a preemption to the next job's submission.
    ``preemption_rate``: whole-cluster preemptions an hour, as the cost rule uses it.
    ``work_is_lower_bound``: the work is only known to take at least ``work_hours`` (no job completed yet).
    A bound proves "infeasible" and "fallback" (the real work needs still more time), never "spot": that
    verdict is then ``VERDICT_UNKNOWN``.
    """
    for name, value in (("now", now), ("deadline", deadline)):
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"{name} must be finite epoch seconds, got {value!r}")
    fallback_startup = startup_hours if fallback_startup_hours is None else fallback_startup_hours
    _check(startup_hours=startup_hours, restart_hours=restart_hours, fallback_startup_hours=fallback_startup)
    if work_hours is not None:
        _check(work_hours=work_hours)
    left = (deadline - now) / 3600.0
    base = {"deadline": float(deadline), "now": float(now), "hours_left": left, "work_hours": work_hours}
    if work_hours is None:
        if left <= 0:
            reason = f"the deadline passed {-left:.3g} h ago: no work finishes by then"
            return DeadlinePlan(VERDICT_INFEASIBLE, reason, **base)
        reason = "no estimate of the work yet (no job completed or preempted here): the deadline cannot be checked"
        return DeadlinePlan(VERDICT_UNKNOWN, reason, **base)
    fastest = fallback_startup + work_hours
    slack = left - fastest
    finish = now + fastest * 3600.0
    if slack < 0:
        reason = (
            f"not even the fallback finishes in time: {fastest:.3g} h of start-up and work from now, "
            f"{left:.3g} h left, {-slack:.3g} h short"
        )
        return DeadlinePlan(VERDICT_INFEASIBLE, reason, **base, fastest_finish=finish, slack_hours=slack)
    lost = plausible_loss_hours(startup_hours + work_hours, preemption_rate, quantile)
    margin = lost + restart_hours
    numbers = dict(fastest_finish=finish, slack_hours=slack, margin_hours=margin, lost_hours=lost)
    if slack < margin - _EPSILON_HOURS:  # a rounding error of the float sums is no lack of slack
        reason = (
            f"slack {slack:.3g} h does not cover a plausible preemption plus a restart ({margin:.3g} h): "
            "only the fallback still makes the deadline"
        )
        return DeadlinePlan(VERDICT_FALLBACK, reason, **base, **numbers)
    if work_is_lower_bound:
        reason = (
            f"slack {slack:.3g} h covers a plausible preemption plus a restart ({margin:.3g} h) of the work's lower "
            f"bound, {work_hours:.3g} h (no job completed yet), but the work may take longer: the deadline cannot "
            "vouch for spot"
        )
        return DeadlinePlan(VERDICT_UNKNOWN, reason, **base, **numbers)
    reason = f"slack {slack:.3g} h covers a plausible preemption plus a restart ({margin:.3g} h)"
    return DeadlinePlan(VERDICT_SPOT, reason, **base, **numbers)


def _check(**values: float) -> None:
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
