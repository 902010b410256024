"""The spot policy's ``deadline`` rule: after the hard rules, before the cost rule; no deadline, no change."""

from __future__ import annotations

from dataclasses import replace

import pytest

from airflow_azureml import deadline
from airflow_azureml.spot_policy import (
    RULE_DEADLINE,
    RULE_EXPECTED_COST,
    RULE_FALLBACK_AFTER,
    RULE_NO_FALLBACK,
    RULE_ON_FALLBACK,
    RULE_PRICES_UNKNOWN,
    RULE_WORK_UNKNOWN,
    RULES,
    PolicyInputs,
    SpotHistory,
    deadline_plan,
    decide,
)

T0 = 1_800_000_000.0
HOUR = 3600.0
CALM = SpotHistory().record_completion(run_hours=100, now=T0)  # 100 h on spot, nothing preempted
BAD = SpotHistory()
for _ in range(20):
    BAD = BAD.record_preemption(exposure_hours=0.1, now=T0)


def inputs(**overrides: object) -> PolicyInputs:
    values: dict[str, object] = {
        "spot_price": 0.2,
        "dedicated_price": 1.0,
        "nodes": 2,
        "work_hours_estimate": 1.0,
        "preemptions": 0,
        "history": CALM,
        "now": T0,
        "startup_hours": 0.1,
        "restart_hours": 0.05,
    }
    values.update(overrides)
    return PolicyInputs(**values)  # type: ignore[arg-type]


def test_the_rule_sits_after_the_hard_rules_and_before_the_cost_rule() -> None:
    assert RULES.index(RULE_FALLBACK_AFTER) < RULES.index(RULE_DEADLINE) < RULES.index(RULE_PRICES_UNKNOWN)


@pytest.mark.parametrize(
    ("hours_left", "use_fallback", "rule"),
    [
        (10.0, False, RULE_EXPECTED_COST),  # slack covers a preemption: the cost rule decides (spot is cheap)
        (2.0, True, RULE_DEADLINE),  # slack 0.9 h < margin 1.15 h: the fallback
        (0.5, True, RULE_DEADLINE),  # infeasible: the fallback still finishes soonest
    ],
)
def test_the_deadline_rule(hours_left: float, use_fallback: bool, rule: str) -> None:
    decision = decide(inputs(deadline=T0 + hours_left * HOUR))
    assert (decision.use_fallback, decision.rule) == (use_fallback, rule), decision.reason
    shown = decision.inputs
    assert shown["deadline"] == T0 + hours_left * HOUR and shown["deadline_now"] == T0
    assert "deadline_slack_hours" in shown and "deadline_margin_hours" in shown
    line = decision.log_line()
    assert f"deadline={T0 + hours_left * HOUR:.0f}," in line and f"deadline_now={T0:.0f}," in line


def test_a_roomy_deadline_leaves_the_cost_rule_to_move_off_a_bad_cluster() -> None:
    decision = decide(inputs(history=BAD, preemptions=1, spot_price=0.6, deadline=T0 + 100 * HOUR))
    assert (decision.use_fallback, decision.rule) == (True, RULE_EXPECTED_COST)


def test_the_hard_rules_come_first() -> None:
    tight = T0 + 0.5 * HOUR
    assert decide(inputs(has_fallback=False, deadline=tight)).rule == RULE_NO_FALLBACK
    assert decide(inputs(on_fallback=True, deadline=tight)).rule == RULE_ON_FALLBACK
    assert decide(inputs(preemptions=1, fallback_after=1, deadline=tight)).rule == RULE_FALLBACK_AFTER


def test_unknown_work_leaves_the_deadline_unchecked() -> None:
    decision = decide(inputs(work_hours_estimate=None, history=SpotHistory(), deadline=T0 + HOUR))
    assert (decision.use_fallback, decision.rule) == (False, RULE_WORK_UNKNOWN)
    assert decision.inputs["deadline_verdict"] == deadline.VERDICT_UNKNOWN


def test_unknown_prices_do_not_switch_off_the_deadline() -> None:
    decision = decide(inputs(spot_price=None, deadline=T0 + 2 * HOUR))
    assert (decision.use_fallback, decision.rule) == (True, RULE_DEADLINE)


@pytest.mark.parametrize(
    "case",
    [
        {},
        {"history": BAD, "preemptions": 1, "spot_price": 0.6},
        {"history": BAD, "preemptions": 3, "fallback_after": 2},
        {"spot_price": None},
        {"work_hours_estimate": None, "history": SpotHistory()},
        {"has_fallback": False},
        {"on_fallback": True},
    ],
)
def test_no_deadline_no_change(case: dict[str, object]) -> None:
    """Without a deadline the decision is today's, to the last logged input (no deadline keys)."""
    decision = decide(inputs(**case))
    assert not any(key.startswith("deadline") for key in decision.inputs)
    far = decide(inputs(**case, deadline=T0 + 1000 * HOUR))  # a deadline that never binds changes no choice
    assert (far.use_fallback, far.rule, far.spot_cost, far.fallback_cost) == (
        decision.use_fallback,
        decision.rule,
        decision.spot_cost,
        decision.fallback_cost,
    )


def test_deadline_plan_uses_the_cost_rules_work_estimate() -> None:
    # no estimate given: from the history's completed runs, less start-up (as the cost rule takes it)
    history = SpotHistory().record_completion(run_hours=2.1, now=T0)
    planned = deadline_plan(inputs(work_hours_estimate=None, history=history, deadline=T0 + 10 * HOUR))
    assert planned is not None and planned.work_hours == pytest.approx(2.0, rel=0.01)
    assert deadline_plan(inputs()) is None  # no deadline


def test_a_deadline_needs_now() -> None:
    with pytest.raises(ValueError, match="now"):
        inputs(now=None, deadline=T0)
    with pytest.raises(ValueError, match="deadline"):
        inputs(deadline=float("nan"))


def test_a_decision_replays_from_its_inputs() -> None:
    decision = decide(inputs(deadline=T0 + 2 * HOUR))
    again = decide(replace(inputs(), deadline=decision.inputs["deadline"]))
    assert again == decision


PREEMPTED_AT_HALF_HOUR = SpotHistory().record_preemption(exposure_hours=0.5, now=T0)  # no job completed yet


def test_a_lower_bound_of_the_work_never_promises_that_spot_leaves_time() -> None:
    """Only preempted attempts so far: the work is at least the longest of them, maybe much more. Slack that
    covers a preemption of the bound says nothing of the real work (1.5 h here would miss a 2 h deadline
    after one late preemption), so the deadline does not vouch for spot; the other rules decide."""
    case = inputs(work_hours_estimate=None, history=PREEMPTED_AT_HALF_HOUR, preemptions=1, deadline=T0 + 2 * HOUR)
    planned = deadline_plan(case)
    assert planned is not None and planned.work_hours == pytest.approx(0.4)
    assert planned.verdict == deadline.VERDICT_UNKNOWN, planned.reason
    assert "lower bound" in planned.reason
    assert decide(case).inputs["deadline_verdict"] == deadline.VERDICT_UNKNOWN


@pytest.mark.parametrize(
    ("hours_left", "verdict"),
    [
        (0.9, deadline.VERDICT_FALLBACK),  # slack 0.4 h < a preemption of even the bound: the real work needs more
        (0.3, deadline.VERDICT_INFEASIBLE),  # not even the bound fits
    ],
)
def test_a_lower_bound_still_decides_what_it_proves(hours_left: float, verdict: str) -> None:
    case = inputs(
        work_hours_estimate=None, history=PREEMPTED_AT_HALF_HOUR, preemptions=1, deadline=T0 + hours_left * HOUR
    )
    decision = decide(case)
    assert decision.inputs["deadline_verdict"] == verdict
    assert (decision.use_fallback, decision.rule) == (True, RULE_DEADLINE)
