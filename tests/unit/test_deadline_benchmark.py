"""The deadline cells of benchmarks/spot_policy.py on a few hand-made and random traces (fast)."""

from __future__ import annotations

import random

import pytest

from benchmarks.spot_policy import (
    CHAIN_POLICIES,
    PROCESSES,
    TICK_HOURS,
    DeadlineWork,
    hindsight_optimum,
    next_hits,
    preemption_times,
    run_chain,
)

W = DeadlineWork(units=4)


def trace(*ticks: int, length: int = 400) -> list[int]:
    return next_hits([(t + 0.5) * TICK_HOURS for t in ticks], length)


def test_next_hits() -> None:
    hits = trace(3, 7, length=10)
    assert hits[:9] == [3, 3, 3, 3, 7, 7, 7, 7, 10]


def test_a_calm_trace_is_all_spot_for_everyone_that_may() -> None:
    calm = trace()
    deadline = int(1.5 * W.makespan_ticks)
    spot_cost = W.units * W.unit_ticks * W.ratio
    assert hindsight_optimum(W, calm, deadline) == pytest.approx(spot_cost)
    for name in ("always-spot", "ours", "ours+deadline", "uniform-progress"):
        cost, finish, _ = run_chain(W, calm, deadline, CHAIN_POLICIES[name])
        assert (cost, finish) == (pytest.approx(spot_cost), W.units * W.unit_ticks), name


def test_a_late_preemption_with_no_slack_left_moves_the_last_units_to_dedicated() -> None:
    deadline = W.makespan_ticks + W.unit_ticks  # room for one lost attempt
    hits = trace(W.unit_ticks - 1)  # the first unit is preempted in its last tick
    _, finish, chain = run_chain(W, hits, deadline, CHAIN_POLICIES["ours+deadline"])
    assert finish <= deadline
    assert chain.rules.get("deadline", 0) >= 1


@pytest.mark.parametrize("process", PROCESSES)
@pytest.mark.parametrize("slack", [1.1, 1.5])
def test_ours_with_a_deadline_never_misses_and_the_optimum_is_a_lower_bound(process: str, slack: float) -> None:
    deadline = round(slack * W.makespan_ticks)
    horizon = 20 * W.makespan_ticks
    for rep in range(8):
        rng = random.Random(f"test/{process}/{rep}")
        hits = next_hits(preemption_times(process, rng, horizon * TICK_HOURS), horizon)
        best = hindsight_optimum(W, hits, deadline)
        for name, policy in CHAIN_POLICIES.items():
            cost, finish, _ = run_chain(W, hits, deadline, policy)
            if finish <= deadline:
                assert cost >= best - 1e-9, name
        assert run_chain(W, hits, deadline, CHAIN_POLICIES["ours+deadline"])[1] <= deadline
        assert run_chain(W, hits, deadline, CHAIN_POLICIES["always-dedicated"])[1] <= deadline


def test_the_online_optimum_is_dedicated_without_slack_spot_with_plenty_and_its_expectation_is_its_mean() -> None:
    from benchmarks.spot_policy import Chain, online_optimum

    tight, expected = online_optimum(W, W.makespan_ticks)  # no room for one lost tick: all dedicated
    assert expected == pytest.approx(W.units * W.unit_ticks) and tight(Chain(W, W.makespan_ticks))
    loose, _ = online_optimum(W, 4 * W.makespan_ticks)  # spot at 30 % with plenty of time: spot
    assert not loose(Chain(W, 4 * W.makespan_ticks))
    deadline = int(1.5 * W.makespan_ticks)
    policy, expected = online_optimum(W, deadline)
    costs, misses = [], 0
    for rep in range(400):
        rng = random.Random(f"online/{rep}")
        hits = next_hits(preemption_times("poisson", rng, 20 * W.makespan_ticks * TICK_HOURS), 20 * W.makespan_ticks)
        cost, finish, _ = run_chain(W, hits, deadline, policy)
        costs.append(cost)
        misses += finish > deadline
        assert cost >= hindsight_optimum(W, hits, deadline) - 1e-9
    assert misses == 0
    assert sum(costs) / len(costs) == pytest.approx(expected, rel=0.05)  # the programme's expectation
