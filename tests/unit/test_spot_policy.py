"""The spot -> fallback policy (airflow_azureml.spot_policy): each rule, the formula, the history's storage.

Pure functions on plain numbers: no Azure, no Airflow, no clock (``now`` is passed in).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from airflow_azureml.spot_policy import (
    RULE_EXPECTED_COST,
    RULE_FALLBACK_AFTER,
    RULE_MAX_QUEUE_TIME,
    RULE_NO_FALLBACK,
    RULE_ON_FALLBACK,
    RULE_PRICES_UNKNOWN,
    RULE_WORK_UNKNOWN,
    RULES,
    Decision,
    PolicyInputs,
    Prior,
    SpotHistory,
    decide,
    expected_fallback_cost,
    expected_spot_cost,
    on_queue_timeout,
)

HOUR = 3600.0
T0 = 1_800_000_000.0  # epoch seconds


def preempted(times: int, each_hours: float, start: float = T0) -> SpotHistory:
    """A cluster that preempted ``times`` jobs, each after ``each_hours`` on its nodes (all seen at ``start``)."""
    history = SpotHistory()
    for _ in range(times):
        history = history.record_preemption(exposure_hours=each_hours, now=start)
    return history


def inputs(**overrides: object) -> PolicyInputs:
    values: dict[str, object] = {
        "spot_price": 0.2,
        "dedicated_price": 1.0,
        "nodes": 2,
        "work_hours_estimate": 0.5,
        "preemptions": 1,
    }
    values.update(overrides)
    return PolicyInputs(**values)  # type: ignore[arg-type]


# ------------------------------------------------------------------ rules
def test_expected_cost_switches_when_spot_is_expected_to_cost_more() -> None:
    bad = preempted(20, 0.1)  # 20 whole-cluster preemptions in 2 hours
    decision = decide(inputs(spot_price=0.6, history=bad))
    assert (decision.use_fallback, decision.rule) == (True, RULE_EXPECTED_COST)
    assert decision.spot_cost is not None and decision.fallback_cost is not None
    assert decision.spot_cost > decision.fallback_cost
    assert decision.inputs["preemption_rate_per_hour"] == pytest.approx((0.1 + 20) / (2 + 2))


def test_expected_cost_keeps_spot_when_it_is_cheaper() -> None:
    calm = SpotHistory().record_completion(run_hours=100, now=T0)  # 100 hours on spot, nothing preempted
    decision = decide(inputs(history=calm, preemptions=0))
    assert (decision.use_fallback, decision.rule) == (False, RULE_EXPECTED_COST)
    assert decision.spot_cost == pytest.approx(0.2 / 1.0 * decision.fallback_cost, rel=0.02)


def test_fallback_after_is_a_hard_limit_whatever_the_costs() -> None:
    calm = SpotHistory().record_completion(run_hours=100, now=T0)
    at_limit = decide(inputs(history=calm, preemptions=2, fallback_after=2))
    assert (at_limit.use_fallback, at_limit.rule) == (True, RULE_FALLBACK_AFTER)
    below = decide(inputs(history=calm, preemptions=1, fallback_after=2))
    assert (below.use_fallback, below.rule) == (False, RULE_EXPECTED_COST)
    assert decide(inputs(spot_price=None, preemptions=3, fallback_after=2)).rule == RULE_FALLBACK_AFTER


def test_unknown_prices_never_switch_on_expected_cost() -> None:
    bad = preempted(50, 0.05)
    for prices in ({"spot_price": None}, {"dedicated_price": None}, {"spot_price": None, "dedicated_price": None}):
        decision = decide(inputs(history=bad, **prices))
        assert (decision.use_fallback, decision.rule) == (False, RULE_PRICES_UNKNOWN)
        assert decision.spot_cost is None and decision.fallback_cost is None
        assert "only the hard rules" in decision.reason


def test_no_fallback_means_spot_and_on_fallback_stays_there() -> None:
    bad = preempted(50, 0.05)
    nothing = decide(inputs(history=bad, has_fallback=False, fallback_after=1, preemptions=5))
    assert (nothing.use_fallback, nothing.rule) == (False, RULE_NO_FALLBACK)
    calm = SpotHistory().record_completion(run_hours=100, now=T0)
    stays = decide(inputs(history=calm, on_fallback=True))
    assert (stays.use_fallback, stays.rule) == (True, RULE_ON_FALLBACK)


def test_work_unknown_stays_on_spot_until_the_cluster_shows_something() -> None:
    fresh = decide(inputs(work_hours_estimate=None, preemptions=0))
    assert (fresh.use_fallback, fresh.rule) == (False, RULE_WORK_UNKNOWN)
    # jobs preempted, none completed: the work takes longer than this unit's preempted job ran
    bad = decide(inputs(work_hours_estimate=None, history=preempted(30, 0.2), spot_price=0.6, unit_exposure_hours=1))
    assert (bad.use_fallback, bad.rule, bad.inputs["work_source"]) == (True, RULE_EXPECTED_COST, "lower_bound")
    assert bad.inputs["work_hours"] == pytest.approx(1 - 5 / 60)
    # ... or than the cluster's longest preempted job, or a job still running there
    cluster = preempted(3, 0.75).record_start("other-task-job", T0)
    seen = decide(inputs(work_hours_estimate=None, history=cluster, now=T0 + 1.5 * HOUR))
    assert seen.inputs["work_hours"] == pytest.approx(1.5 - 5 / 60)
    # completed jobs give it as well
    done = SpotHistory().record_completion(run_hours=0.6, now=T0, on_spot=False)
    assert decide(inputs(work_hours_estimate=None, history=done)).inputs["work_hours"] == pytest.approx(0.6 - 5 / 60)


def test_queue_timeout_switches_to_the_fallback_and_fails_only_without_one() -> None:
    switch = on_queue_timeout(has_fallback=True, waited_seconds=1900, max_queue_time=1800)
    assert (switch.use_fallback, switch.rule) == (True, RULE_MAX_QUEUE_TIME)
    assert switch.inputs == {"waited_seconds": 1900, "max_queue_time": 1800, "has_fallback": True}
    none = on_queue_timeout(has_fallback=False, waited_seconds=1900, max_queue_time=1800)
    assert (none.use_fallback, none.rule) == (False, RULE_MAX_QUEUE_TIME)
    already = on_queue_timeout(has_fallback=True, waited_seconds=1900, max_queue_time=1800, on_fallback=True)
    assert already.use_fallback is False


def test_every_rule_has_a_name_in_the_uniform_log() -> None:
    assert len(set(RULES)) == len(RULES) == 8  # the deadline rule: tests/unit/test_spot_policy_deadline.py
    decision = decide(inputs(spot_price=0.95, history=preempted(5, 0.2)))
    line = decision.log_line()
    assert line.startswith("Spot policy: fallback (rule expected_cost: ")
    for key in ("spot_price=0.95", "nodes=2", "preemptions=1", "observed_preemptions=5", "work_source=given"):
        assert key in line
    assert "expected spot=" in line and "fallback=" in line
    assert json.loads(json.dumps(decision.to_dict()))["rule"] == RULE_EXPECTED_COST  # XCom-ready


# ------------------------------------------------------ no overreaction
def test_one_early_preemption_does_not_drive_a_cheap_spot_cluster_to_the_fallback() -> None:
    once = preempted(1, 0.3)  # the first thing this cluster ever did: one preemption after 18 minutes
    for ratio in (0.2, 0.6):
        decision = decide(inputs(spot_price=ratio, history=once))
        assert (decision.use_fallback, decision.rule) == (False, RULE_EXPECTED_COST), ratio
    # ... a run of them does, at 60 %
    assert decide(inputs(spot_price=0.6, history=preempted(6, 0.2))).use_fallback is True
    # at 95 % the saving is at most 5 %: one early preemption is enough to take the bounded choice
    assert decide(inputs(spot_price=0.95, history=once)).use_fallback is True


def test_estimator_moves_with_evidence_but_not_in_jumps() -> None:
    prior = Prior()
    fresh = SpotHistory()
    assert fresh.preemption_rate(prior) == pytest.approx(0.05)
    once = preempted(1, 0.5)
    assert once.preemption_rate(prior) == pytest.approx(1.1 / 2.5)  # not 1/0.5 = 2 an hour
    calm = once.record_completion(run_hours=40, now=T0 + 10 * HOUR)
    assert calm.preemption_rate(prior) < 0.05  # exposure without preemptions brings it down
    # before a unit's first job the median is used: no higher than the mean
    assert once.preemption_rate_quantile(prior, prior.first_quantile) <= once.preemption_rate(prior)


# ------------------------------------------------------------ history
def test_history_round_trips_through_json_and_reads_nothing_as_empty() -> None:
    history = preempted(3, 0.25).record_completion(
        run_hours=0.7, now=T0 + 2 * HOUR, evictions=2, node_hours=1.2, on_spot=True
    )
    stored = json.loads(json.dumps(history.to_dict()))
    assert stored["version"] == 1
    assert SpotHistory.from_dict(stored) == history
    assert SpotHistory.from_dict(None) == SpotHistory() == SpotHistory.from_dict({})
    assert SpotHistory.from_dict({"preemptions": 2, "someday": "a newer field"}).preemptions == 2


@pytest.mark.parametrize(
    "bad",
    [{"preemptions": "two"}, {"preemptions": -1}, {"exposure_hours": float("nan")}, {"version": 99}, ["x"], "x"],
)
def test_history_refuses_what_is_not_a_history(bad: object) -> None:
    with pytest.raises(ValueError):
        SpotHistory.from_dict(bad)  # type: ignore[arg-type]


def test_history_decays_with_its_half_life_and_not_backwards() -> None:
    history = preempted(4, 0.5)
    stamp = history.updated_at
    assert stamp is not None
    later = history.decayed(stamp + history.half_life_hours * HOUR)
    assert later.preemptions == pytest.approx(2) and later.exposure_hours == pytest.approx(1)
    assert later.updated_at == stamp + history.half_life_hours * HOUR
    assert history.decayed(stamp - 10 * HOUR) == history  # a clock that went back decays nothing
    assert history.decayed(None) == history
    # faded evidence brings the prior back
    assert history.decayed(stamp + 50 * history.half_life_hours * HOUR).preemption_rate(Prior()) == pytest.approx(
        0.05, rel=0.01
    )


def test_running_jobs_count_as_exposure_until_they_end_or_are_lost_track_of() -> None:
    history = preempted(2, 0.5).record_start("job-a", T0)
    assert history.exposure(T0 + 2 * HOUR) == pytest.approx(1 + 2)  # a job still up has survived so far
    assert history.preemption_rate(Prior(), T0 + 2 * HOUR) < history.preemption_rate(Prior())
    ended = history.record_completion(run_hours=2, now=T0 + 2 * HOUR, job="job-a")
    assert ended.running == {} and ended.exposure(T0 + 5 * HOUR) == pytest.approx(ended.exposure_hours)
    stale = history.record_start("job-b", T0 + 49 * HOUR)  # job-a never reported its end
    assert set(stale.running) == {"job-b"}
    assert SpotHistory.from_dict(json.loads(json.dumps(stale.to_dict()))) == stale
    with pytest.raises(ValueError):
        SpotHistory.from_dict({"running": {"job": "yesterday"}})


def test_completion_on_the_fallback_teaches_the_work_not_the_spot_rate() -> None:
    history = preempted(1, 0.5)
    after = history.record_completion(run_hours=0.6, now=T0, on_spot=False)
    assert after.exposure_hours == history.exposure_hours and after.spot_completions == 0
    assert after.completed_jobs == 1 and after.mean_run_hours() == pytest.approx(0.6)
    on_spot = history.record_completion(run_hours=0.6, now=T0, on_spot=True, evictions=1, node_hours=1.1)
    assert on_spot.exposure_hours == pytest.approx(1.1) and on_spot.spot_completions == 1
    assert (on_spot.evictions, on_spot.node_hours) == (1, 1.1)


# ------------------------------------------------------------ formula
def test_expected_spot_cost_follows_the_billing_rules() -> None:
    base = {
        "price": 0.5,
        "nodes": 2,
        "work_hours": 1.0,
        "eviction_rate": 0.0,
        "startup_hours": 0.1,
        "release_hours": 0.05,
        "lost_hours": 0.02,
    }
    # no evictions: every node billed for start-up and work, once
    assert expected_spot_cost(preemption_rate=0.0, **base) == pytest.approx(0.5 * 2 * 1.1)
    assert expected_fallback_cost(price=1.0, nodes=2, work_hours=1.0, startup_hours=0.1) == pytest.approx(2.2)
    # whole-cluster preemptions: each redoes the whole job and bills every node's preempted tail
    mu, length = 0.8, 1.1
    failures = math.exp(mu * length) - 1
    assert expected_spot_cost(preemption_rate=mu, **base) == pytest.approx(0.5 * 2 * (failures / mu + failures * 0.05))
    # single-node evictions: the slot's preempted time, the replacement's start-up and the lost mini-batch
    slower = expected_spot_cost(preemption_rate=0.0, **{**base, "eviction_rate": 2.0})
    assert slower == pytest.approx(0.5 * 2 * (0.1 + 1.0 * (1 + 2.0 * (0.05 + 0.1 + 0.02))))
    costs = [expected_spot_cost(preemption_rate=r, **base) for r in (0.0, 0.1, 1.0, 5.0, 1000.0)]
    assert costs == sorted(costs) and costs[-1] == math.inf


def test_bad_inputs_are_refused() -> None:
    for bad in ({"nodes": 0}, {"nodes": 1.5}, {"spot_price": -1}, {"preemptions": -1}, {"startup_hours": math.inf}):
        with pytest.raises(ValueError):
            inputs(**bad)
    with pytest.raises(ValueError):
        Prior(exposure_hours=0)
    with pytest.raises(ValueError):
        SpotHistory().record_preemption(exposure_hours=-1, now=T0)


def test_decision_is_a_plain_record() -> None:
    decision = Decision(True, RULE_FALLBACK_AFTER, "because", inputs={"a": 1})
    assert decision.to_dict() == {
        "use_fallback": True,
        "rule": RULE_FALLBACK_AFTER,
        "reason": "because",
        "spot_cost": None,
        "fallback_cost": None,
        "inputs": {"a": 1},
    }


def test_importing_the_policy_loads_neither_airflow_nor_azure() -> None:
    code = (
        "import sys, airflow_azureml.spot_policy; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('airflow', 'azure', 'aiohttp', 'requests')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_a_job_that_ended_otherwise_leaves_the_running_jobs_and_adds_its_exposure() -> None:
    """A failed or cancelled spot job: no preemption, no completion, its Running hours survived."""
    start = 1_000_000.0
    history = SpotHistory().record_start("a", start).record_start("b", start)
    ended = history.record_end(job="a", exposure_hours=0.25, now=start + 1800)
    assert set(ended.running) == {"b"}
    assert ended.preemptions == 0 and ended.spot_completions == 0 and ended.completed_jobs == 0
    assert ended.exposure_hours == pytest.approx(0.25, rel=1e-3)
    with pytest.raises(ValueError):
        history.record_end(job="a", exposure_hours=float("nan"), now=start)


def test_an_end_recorded_twice_counts_once() -> None:
    """A write whose answer was lost is retried on a blob that changed: applying it again changes nothing."""
    start = 1_000_000.0
    once = SpotHistory().record_start("a", start).record_preemption(exposure_hours=0.5, now=start + 60, job="a")
    twice = once.record_preemption(exposure_hours=0.5, now=start + 61, job="a")
    assert twice == once
    assert once.record_completion(run_hours=1.0, now=start + 62, job="a") == once
    assert once.record_end(job="a", exposure_hours=0.1, now=start + 63) == once
    assert once.record_start("a", start + 64) == once  # a start recorded late does not bring it back
    assert SpotHistory.from_dict(json.loads(json.dumps(once.to_dict()))) == once
    with pytest.raises(ValueError, match="ended"):
        SpotHistory.from_dict({**once.to_dict(), "ended": "a"})


def test_a_start_seen_again_keeps_the_first_one() -> None:
    """A retry's wait sees a Running job again: its exposure still counts from the first time it was seen."""
    start = 1_000_000.0
    history = SpotHistory().record_start("a", start)
    assert history.record_start("a", start + 600) == history
    assert history.exposure(start + 1800) == pytest.approx(0.5)
