"""The deadline planner (airflow_azureml.deadline): tables of verdicts on plain numbers, no clock."""

from __future__ import annotations

import math

import pytest

from airflow_azureml.deadline import (
    DEFAULT_QUANTILE,
    VERDICT_FALLBACK,
    VERDICT_INFEASIBLE,
    VERDICT_SPOT,
    VERDICT_UNKNOWN,
    plan,
    plausible_loss_hours,
)

NOW = 1_800_000_000.0
HOUR = 3600.0


def at(hours: float) -> float:
    return NOW + hours * HOUR


# work 1 h, start-up 0.1 h, restart 0.05 h, rate 0.05/h: fastest finish 1.1 h; margin = attempt 1.1 + 0.05
@pytest.mark.parametrize(
    ("hours_left", "work", "rate", "verdict"),
    [
        (10.0, 1.0, 0.05, VERDICT_SPOT),  # slack 8.9 h >> margin 1.15 h
        (2.25, 1.0, 0.05, VERDICT_SPOT),  # slack 1.15 h: exactly the margin
        (2.2, 1.0, 0.05, VERDICT_FALLBACK),  # slack 1.1 h: a late preemption would leave too little
        (1.1, 1.0, 0.05, VERDICT_FALLBACK),  # slack 0: only the fallback, just in time
        (1.0, 1.0, 0.05, VERDICT_INFEASIBLE),  # 0.1 h short even on the fallback
        (-1.0, None, 0.05, VERDICT_INFEASIBLE),  # past already: no work finishes, known or not
        (5.0, None, 0.05, VERDICT_UNKNOWN),  # no work estimate: cannot be checked
        (2.0, 0.0, 0.05, VERDICT_SPOT),  # no work left: start-up alone
        (1.5, 1.0, 100.0, VERDICT_SPOT),  # a preemption is near-certain and early: it loses ~0.05 h
    ],
)
def test_verdicts(hours_left: float, work: float | None, rate: float, verdict: str) -> None:
    planned = plan(
        now=NOW,
        deadline=at(hours_left),
        work_hours=work,
        startup_hours=0.1,
        restart_hours=0.05,
        preemption_rate=rate,
    )
    assert planned.verdict == verdict, planned.reason


def test_the_numbers_of_a_plan() -> None:
    planned = plan(
        now=NOW, deadline=at(3.0), work_hours=1.0, startup_hours=0.1, restart_hours=0.05, preemption_rate=0.05
    )
    assert planned.fastest_finish == pytest.approx(at(1.1))
    assert planned.slack_hours == pytest.approx(1.9)
    assert planned.lost_hours == pytest.approx(1.1)  # the 0.99 quantile (92 h) is past the attempt
    assert planned.margin_hours == pytest.approx(1.15)
    shown = planned.log_inputs()
    assert shown["deadline"] == at(3.0) and shown["deadline_now"] == NOW
    assert shown["deadline_slack_hours"] == pytest.approx(1.9) and shown["deadline_verdict"] == VERDICT_SPOT


def test_an_infeasible_plan_says_by_how_much() -> None:
    planned = plan(now=NOW, deadline=at(0.5), work_hours=1.0, startup_hours=0.1, restart_hours=0, preemption_rate=0)
    assert planned.verdict == VERDICT_INFEASIBLE
    assert planned.fastest_finish == pytest.approx(at(1.1))
    assert "0.6 h short" in planned.reason


def test_the_fallback_start_up_is_its_own() -> None:
    slow = plan(
        now=NOW,
        deadline=at(1.15),
        work_hours=1.0,
        startup_hours=0.1,
        restart_hours=0.0,
        preemption_rate=0.0,
        fallback_startup_hours=0.2,
    )
    assert slow.verdict == VERDICT_INFEASIBLE  # 1.2 h on the fallback


@pytest.mark.parametrize(
    ("attempt", "rate", "quantile", "expected"),
    [
        (2.0, 0.0, DEFAULT_QUANTILE, 2.0),  # no preemption seen is no promise: the whole attempt
        (2.0, 0.05, DEFAULT_QUANTILE, 2.0),  # the quantile (92 h) lies past the attempt
        (2.0, 10.0, 0.99, -math.log(0.01) / 10.0),  # 0.46 h: at that rate it comes early
        (2.0, 10.0, 0.5, math.log(2) / 10.0),
    ],
)
def test_plausible_loss(attempt: float, rate: float, quantile: float, expected: float) -> None:
    assert plausible_loss_hours(attempt, rate, quantile) == pytest.approx(expected)


@pytest.mark.parametrize(
    "bad",
    [
        {"now": math.nan},
        {"deadline": math.inf},
        {"deadline": True},
        {"work_hours": -1.0},
        {"startup_hours": math.nan},
        {"restart_hours": -0.1},
        {"preemption_rate": -1.0},
        {"quantile": 1.0},
        {"quantile": 0.0},
    ],
)
def test_refuses_bad_numbers(bad: dict[str, float]) -> None:
    values: dict[str, object] = {
        "now": NOW,
        "deadline": at(5),
        "work_hours": 1.0,
        "startup_hours": 0.1,
        "restart_hours": 0.05,
        "preemption_rate": 0.05,
        **bad,
    }
    with pytest.raises(ValueError):
        plan(**values)  # type: ignore[arg-type]


def test_no_clock_no_airflow_no_azure() -> None:
    import ast
    from pathlib import Path

    import airflow_azureml.deadline as module

    tree = ast.parse(Path(module.__file__).read_text())
    imported = {
        alias.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names
    } | {node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    assert imported <= {"__future__", "math", "dataclasses", "typing"}
