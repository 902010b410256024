"""cost.py: usage change points, merging without double counting, node-seconds, prices, the bill."""

from __future__ import annotations

import json
from typing import Any
from unittest import mock

import pytest

from airflow_azureml import cost
from airflow_azureml.outcomes import JobSnapshot
from airflow_azureml.polling import GaugeReading, JobWatch, PollingPolicy

PRICES = {"spot-c": {"dedicated": 0.3, "spot": 0.06, "source": "manual"}}


def counts(preparing: int = 0, running: int = 0, idle: int = 0, leaving: int = 0, preempted: int = 0) -> dict:
    return {
        "preparingNodeCount": preparing,
        "runningNodeCount": running,
        "idleNodeCount": idle,
        "leavingNodeCount": leaving,
        "preemptedNodeCount": preempted,
        "unusableNodeCount": 0,
    }


def arm(low: bool = True, size: str = "STANDARD_DS3_V2", **state: int) -> dict:
    inner = {"vmPriority": "LowPriority" if low else "Dedicated", "vmSize": size, "nodeStateCounts": counts(**state)}
    inner["currentNodeCount"] = sum(state.values())
    return {"location": "eastus", "properties": {"properties": inner}}


def span(job: str, points: list[list], end: float, compute: str = "spot-c", statuses: list | None = None) -> dict:
    return {"job": job, "compute": compute, "points": points, "end": end, "statuses": statuses or []}


def usage(*spans: dict, tier: str = "low_priority") -> dict:
    computes = {s["compute"]: {"vm_size": "STANDARD_DS3_V2", "location": "eastus", "tier": tier} for s in spans}
    return {"v": 1, "computes": computes, "spans": list(spans)}


def test_counts_from_rest_in_state_order_and_missing_as_none() -> None:
    assert cost.counts_from_rest({"nodeStateCounts": counts(preparing=1, running=2, preempted=3)}) == (1, 2, 0, 0, 3, 0)
    assert cost.counts_from_rest({}) is None
    assert cost.counts_from_rest({"nodeStateCounts": {"runningNodeCount": True, "idleNodeCount": -1}}) == (0,) * 6


def test_watch_keeps_change_points_only_and_reads_while_queued_too() -> None:
    watch = JobWatch(PollingPolicy(interval=1, max_interval=10, jitter=0))
    watch.observe(JobSnapshot(name="j", status="Queued", compute="spot-c"))
    assert watch.wants_usage() and not watch.wants_gauge()
    for taken, state in ((0.0, {"preparing": 2}), (1.0, {"preparing": 2}), (2.0, {"running": 2})):
        reading = GaugeReading.from_rest("spot-c", arm(**state), taken)
        watch.offer_usage(reading)
        watch.offer_gauge(reading)  # not Running: the gauge evidence takes none of it
    assert watch.gauge.samples == 0
    data = watch.usage_dict()
    json.dumps(data)  # JSON all through
    (only,) = data["spans"]
    # a steady stretch is its first and last reading: the change came after the last one
    assert [p[1:] for p in only["points"]] == [[2, 0, 0, 0, 0, 0], [2, 0, 0, 0, 0, 0], [0, 2, 0, 0, 0, 0]]
    assert [p[0] for p in only["points"]] == [pytest.approx(p[0]) for p in only["points"]]
    assert data["computes"]["spot-c"] == {"vm_size": "STANDARD_DS3_V2", "location": "eastus", "tier": "low_priority"}
    assert only["job"] == "j" and only["statuses"][0][1] == "Queued"


def test_integration_goes_linearly_between_readings_and_holds_after_the_last() -> None:
    one = usage(span("j", [[0, 2, 0, 0, 0, 0, 0], [10, 0, 2, 0, 0, 0, 0], [20, 0, 1, 0, 0, 1, 0]], end=30))
    seconds = cost.integrate(one)["spot-c"]
    # each change came, as likely as not, in the first half between the two reads that saw it
    assert seconds["preparing"] == pytest.approx(10) and seconds["running"] == pytest.approx(10 + 15 + 10)
    assert seconds["preempted"] == pytest.approx(5 + 10)
    steady = usage(span("j", [[0, 0, 2, 0, 0, 0, 0], [10, 0, 2, 0, 0, 0, 0], [12, 0, 0, 0, 0, 0, 0]], end=12))
    assert cost.integrate(steady)["spot-c"]["running"] == pytest.approx(2 * 10 + 2)


def test_the_same_cluster_time_is_counted_once_across_tasks() -> None:
    a = usage(span("a", [[0, 0, 2, 0, 0, 0, 0]], end=10))
    b = usage(span("b", [[5, 0, 2, 0, 0, 0, 0]], end=15))  # another task on the same cluster, overlapping
    both = cost.combine([a, b])
    assert sum(cost.integrate(both)["spot-c"].values()) == 2 * 15  # 0..15, not 10 + 10
    assert sum(cost.integrate(both, jobs={"a"})["spot-c"].values()) == 2 * 10


def test_a_chain_bridges_the_short_gap_between_its_waits_not_a_long_one() -> None:
    first = usage(span("r0", [[0, 0, 0, 0, 0, 2, 0], [10, 0, 0, 0, 0, 2, 0]], end=10))
    second = usage(span("r1", [[12, 0, 0, 0, 0, 2, 0], [20, 0, 0, 0, 0, 2, 0]], end=20))
    chain = cost.merge(cost.merge({}, first), second)
    assert cost.integrate(chain)["spot-c"]["preempted"] == pytest.approx(2 * 20)  # held through the resubmission
    late = usage(span("r1", [[10 + cost.BRIDGE_MAX + 1, 0, 0, 0, 0, 0, 0]], end=400))
    assert cost.integrate(cost.merge(first, late))["spot-c"]["preempted"] == 2 * 10  # not observed: not counted
    assert cost.merge(chain, second) == chain  # a wait delivered twice is kept once


def test_estimate_prices_the_tier_and_defines_the_dedicated_equivalent() -> None:
    # readings at the same moment make a step: r0 runs 100 s on 2 nodes, then they are preempted for 50 s
    lost = span(
        "r0",
        [[0, 0, 2, 0, 0, 0, 0], [100, 0, 2, 0, 0, 0, 0], [100, 0, 0, 0, 0, 2, 0], [150, 0, 0, 0, 0, 2, 0]],
        end=150,
    )
    kept = span(
        "r1",
        [[150, 2, 0, 0, 0, 0, 0], [160, 2, 0, 0, 0, 0, 0], [160, 0, 2, 0, 0, 0, 0], [3600, 0, 2, 0, 0, 0, 0]],
        end=3600,
    )
    report = cost.estimate(usage(lost, kept), PRICES, lost_jobs=["r0"], preemptions=1)
    total_seconds = 2 * 3600
    assert report["node_hours"]["low_priority"] == pytest.approx(total_seconds / 3600)
    assert report["cost"] == pytest.approx(total_seconds * 0.06 / 3600)
    assert report["evicted_node_hours"] == pytest.approx(2 * 50 / 3600)
    assert report["lost_node_hours"] == pytest.approx(2 * 100 / 3600)
    # the work without the lost attempt and the evicted nodes' wait: r1's 3450 s on 2 nodes, at pay-as-you-go
    assert report["dedicated_equivalent"]["node_hours"] == pytest.approx(2 * 3450 / 3600)
    assert report["dedicated_equivalent"]["cost"] == pytest.approx(2 * 3450 * 0.3 / 3600)
    assert report["savings"] == pytest.approx(report["dedicated_equivalent"]["cost"] - report["cost"])
    assert report["savings_pct"] == pytest.approx(100 * report["savings"] / report["dedicated_equivalent"]["cost"])
    assert report["preemptions"] == 1 and report["cost_unknown"] is None


def test_spot_can_cost_more_than_dedicated_and_says_so() -> None:
    lost = span("r0", [[0, 0, 2, 0, 0, 0, 0]], end=3000)
    kept = span("r1", [[3000, 0, 2, 0, 0, 0, 0]], end=3600)
    expensive = {"spot-c": {"dedicated": 0.3, "spot": 0.29, "source": "manual"}}
    report = cost.estimate(usage(lost, kept), expensive, lost_jobs=["r0"])
    assert report["savings"] < 0 and report["savings_pct"] < 0
    text = cost.format_bill(report)
    more = f"${-report['savings']:,.4f} more than all-dedicated ({-report['savings_pct']:.1f} % more)"
    assert f"spot cost more     {more}" in text and "savings" not in text


def test_evicted_node_hours_without_a_preemption_say_where_they_come_from() -> None:
    report = cost.estimate(usage(span("j", [[0, 0, 1, 0, 0, 1, 0]], end=3600)), PRICES)
    assert report["preemptions"] == 0 and report["evicted_node_hours"] > 0
    assert "evicted while the jobs ran, billed until deallocated; no job was preempted" in cost.format_bill(report)
    preempted = cost.estimate(usage(span("j", [[0, 0, 1, 0, 0, 1, 0]], end=3600)), PRICES, preemptions=1)
    assert "no job was preempted" not in cost.format_bill(preempted)


def test_nothing_billed_either_way_saves_nothing_rather_than_an_unknown_share() -> None:
    report = cost.estimate(usage(span("j", [[0, 0, 0, 0, 0, 0, 0]], end=10)), PRICES)
    assert report["cost"] == report["dedicated_equivalent"]["cost"] == 0
    assert report["savings"] == 0 and report["savings_pct"] == 0.0
    assert "savings            $0.0000 (0.0 %)" in cost.format_bill(report)


def test_unknown_price_leaves_the_cost_unknown_not_zero() -> None:
    report = cost.estimate(usage(span("j", [[0, 0, 1, 0, 0, 0, 0]], end=10)), {"spot-c": None})
    assert report["cost"] is None and report["savings"] is None and "spot-c" in report["cost_unknown"]
    assert report["node_hours_total"] == pytest.approx(10 / 3600)
    assert "unknown" in cost.format_bill(report)


def test_run_bill_combines_tasks_without_double_counting_and_formats() -> None:
    first = usage(span("a", [[0, 0, 2, 0, 0, 0, 0]], end=3600))
    second = usage(span("b", [[1800, 0, 2, 0, 0, 0, 0]], end=3600))  # the same cluster, the last half hour
    a = {**cost.estimate(first, PRICES), "task_id": "t1", "usage": first}
    b = {**cost.estimate(second, PRICES, preemptions=1), "task_id": "t2", "usage": second}
    bill = cost.run_bill([a, b, None])
    assert bill["node_hours"]["low_priority"] == pytest.approx(2.0)  # the shared half hour once
    assert bill["cost"] == pytest.approx(2 * 0.06) and bill["preemptions"] == 1
    assert [t["task_id"] for t in bill["tasks"]] == ["t1", "t2"]
    text = cost.format_bill(bill, title="Run")
    assert "Run" in text and "savings" in text and "$0.1200" in text
    json.dumps(bill)


def test_metrics_follow_one_naming_scheme_with_tags() -> None:
    report = cost.estimate(usage(span("j", [[0, 0, 1, 0, 0, 0, 0]], end=3600)), PRICES, preemptions=2)
    report.update(dag_id="d", task_id="t")
    sent = cost.metrics(report)
    names = {name for _, name, _, _ in sent}
    assert names <= set(cost.METRICS) and {"azureml.spot.node_hours", "azureml.spot.cost"} <= names
    assert all(name.startswith("azureml.spot.") for name in names)
    node_hours = next(m for m in sent if m[1] == "azureml.spot.node_hours")
    assert node_hours[3] == {"dag_id": "d", "task_id": "t", "compute": "spot-c", "tier": "low_priority"}
    assert ("incr", "azureml.spot.preemptions", 2, {"dag_id": "d", "task_id": "t"}) in sent


def test_observations_for_the_spot_policy() -> None:
    one = usage(
        span(
            "r0",
            [[0, 2, 0, 0, 0, 0, 0], [30, 0, 2, 0, 0, 0, 0], [100, 0, 1, 0, 0, 1, 0], [110, 1, 1, 0, 0, 0, 0]],
            end=200,
            statuses=[[0, "Queued"], [30, "Running"], [200, "Completed"]],
        )
    )
    seen = cost.observed(one)
    assert seen["startup_seconds"] == {"r0": 30}
    assert seen["spot_exposure_hours"] == pytest.approx(170 / 3600)
    assert seen["evictions"] == {"spot-c": 1}
    dedicated = usage(span("d", [[0, 0, 1, 0, 0, 0, 0]], end=10, statuses=[[0, "Running"]]), tier="dedicated")
    assert cost.spot_exposure_hours(dedicated) == 0


def ran(one: dict, started_at: float, ended_at: float, instance_count: int) -> dict:
    """A span with the job's run-history times and node count (recorded when the wait saw it end)."""
    return {**one, "started_at": started_at, "ended_at": ended_at, "instance_count": instance_count}


def test_a_lost_attempt_no_read_saw_running_still_loses_its_nodes_run_time() -> None:
    # r0: read queued (no node) at 0, then preempted nodes at 100; run history says it ran 40..60 on 2 nodes
    outside = ran(span("r0", [[0, 0, 0, 0, 0, 0, 0], [100, 0, 0, 0, 0, 2, 0]], end=100), 40, 60, 2)
    # r1: no read at all (the job ended before any read), but its times and node count are known
    unread = ran({"job": "r1", "compute": "spot-c", "points": [], "end": None, "statuses": []}, 110, 115, 2)
    kept = span("r2", [[120, 0, 2, 0, 0, 0, 0], [220, 0, 2, 0, 0, 0, 0]], end=220)
    report = cost.estimate(usage(outside, kept, unread), PRICES, lost_jobs=["r0", "r1"], preemptions=2)
    assert report["lost_node_hours"] == pytest.approx((2 * 20 + 2 * 5) / 3600)
    # the reads' line put 20 preempted node-seconds inside r0's run: they were its running nodes
    seconds = report["computes"]["spot-c"]["node_seconds"]
    assert seconds["preempted"] == pytest.approx(2 * 100 / 2 - 20)
    assert seconds["running"] == pytest.approx(2 * 100 + 2 * 20 + 2 * 5)
    assert report["dedicated_equivalent"]["node_hours"] == pytest.approx(2 * 100 / 3600)  # r2 only


def test_a_wait_keeps_the_ended_jobs_run_times_even_with_no_read() -> None:
    watch = JobWatch(PollingPolicy(interval=1, max_interval=10, jitter=0))
    watch.observe(JobSnapshot(name="j", status="Running", compute="spot-c", instance_count=2))
    ended = JobSnapshot(name="j", status="Canceled", compute="spot-c", instance_count=2, started_at=40, ended_at=60)
    assert watch.observe(ended) is None
    data = json.loads(json.dumps(watch.usage_dict()))
    (only,) = data["spans"]  # no read at all: the span carries the run, with nothing to integrate
    assert only["points"] == [] and only["end"] is None and data["computes"] == {}
    assert (only["started_at"], only["ended_at"], only["instance_count"]) == (40, 60, 2)
    chain = cost.merge(usage(span("j0", [[0, 0, 2, 0, 0, 0, 0]], end=30)), data)
    assert cost.merge(chain, data) == chain and len(chain["spans"]) == 2  # kept, once
    assert cost.estimate(chain, PRICES, lost_jobs=["j"])["lost_node_hours"] == pytest.approx(2 * 20 / 3600)
    # a batch job's GET gives no node count: the floor is then one node (a job that ran held at least one)
    unsized = {"job": "b", "compute": "spot-c", "points": [], "end": None, "started_at": 40, "ended_at": 60}
    assert cost.estimate(usage(unsized), PRICES, lost_jobs=["b"])["lost_node_hours"] == pytest.approx(20 / 3600)
    nothing = JobWatch(PollingPolicy(interval=1, max_interval=10, jitter=0))
    nothing.observe(JobSnapshot(name="q", status="Canceled", compute="spot-c", instance_count=2))  # never started
    assert nothing.usage_dict() == cost.empty_usage()


def test_the_operators_node_count_fills_only_spans_azure_left_unsized() -> None:
    """A batch job's GET has a null node count: the operator's (the deployment's ``instance_count``) fills it,
    and the floor then takes every node the job held, not one; a count the GET gave is never overwritten."""
    unsized = {"job": "b", "compute": "spot-c", "points": [], "end": None, "started_at": 40, "ended_at": 60}
    sized = ran({"job": "c", "compute": "spot-c", "points": [], "end": None}, 70, 80, 3)
    unread = span("d", [[0, 0, 1, 0, 0, 0, 0]], end=30)  # no run times: no floor, so not asked for
    chain = usage(unsized, sized, unread)
    assert cost.jobs_without_node_count(chain) == {"b": "spot-c"}
    filled = cost.with_node_counts(chain, {"b": 2, "c": 5, "d": 4})
    assert [s.get("instance_count") for s in filled["spans"]] == [2, 3, 4]
    assert cost.jobs_without_node_count(filled) == {}
    assert cost.with_node_counts(chain, {"b": 0})["spans"][0].get("instance_count") is None  # not a count
    assert chain["spans"][0].get("instance_count") is None  # the caller's usage is not changed
    report = cost.estimate(filled, PRICES, lost_jobs=["b", "c"])
    assert report["lost_node_hours"] == pytest.approx((2 * 20 + 3 * 10) / 3600)


def test_an_attempt_the_reads_covered_is_billed_from_the_reads_alone() -> None:
    # r0 ran 0..120 on 2 nodes by run history; the reads saw them run to 100, then evicted until the cancel
    reads = [[0, 0, 2, 0, 0, 0, 0], [100, 0, 2, 0, 0, 0, 0], [100, 0, 0, 0, 0, 2, 0], [150, 0, 0, 0, 0, 2, 0]]
    kept = span("r1", [[150, 0, 2, 0, 0, 0, 0], [3600, 0, 2, 0, 0, 0, 0]], end=3600)
    before = cost.estimate(usage(span("r0", reads, end=150), kept), PRICES, lost_jobs=["r0"], preemptions=1)
    after = cost.estimate(usage(ran(span("r0", reads, end=150), 0, 120, 2), kept), PRICES, lost_jobs=["r0"])
    for key in ("node_hours", "evicted_node_hours", "lost_node_hours", "cost", "dedicated_equivalent"):
        assert after[key] == pytest.approx(before[key]), key  # not the floor on top: the reads' node time is more
    assert after["lost_node_hours"] == pytest.approx(2 * 100 / 3600)  # the evicted nodes' wait stays evicted
    # a read inside the run, with fewer nodes than the job's: only the node time missing from the floor is added
    few = [[0, 0, 0, 0, 0, 0, 0], [50, 0, 2, 0, 0, 0, 0], [150, 0, 0, 0, 0, 0, 0]]
    sparse = ran(span("r0", few, end=150), 0, 100, 2)
    seconds = cost.estimate(usage(sparse), PRICES, lost_jobs=["r0"])["computes"]["spot-c"]["node_seconds"]
    # the reads: 150 node-seconds, 125 of them within the run (0..100); the floor, 200, adds 75 there, not 200
    assert sum(seconds.values()) == pytest.approx(150 + (200 - 125))


def test_a_usage_from_before_the_run_times_integrates_as_before() -> None:
    old = {
        "v": 1,
        "computes": {"spot-c": {"vm_size": "STANDARD_DS3_V2", "location": "eastus", "tier": "low_priority"}},
        "spans": [{"job": "r0", "compute": "spot-c", "points": [[0, 0, 2, 0, 0, 0, 0]], "end": 100, "statuses": []}],
    }
    report = cost.estimate(old, PRICES, lost_jobs=["r0"])
    assert report["lost_node_hours"] == pytest.approx(2 * 100 / 3600)
    assert report["node_hours_total"] == pytest.approx(2 * 100 / 3600)
    newer = usage(ran(span("r1", [[100, 0, 2, 0, 0, 0, 0]], end=200), 100, 200, 2))
    both = cost.merge(old, newer)
    assert both["v"] == cost.USAGE_VERSION == 1
    assert cost.estimate(both, PRICES, lost_jobs=["r0"])["node_hours_total"] == pytest.approx(2 * 200 / 3600)


def test_attempts_running_at_once_are_floored_once_and_never_below_zero_evicted() -> None:
    """Two lost attempts of 2 nodes ran 40..60 at once; the reads at 40 and 60 show 2 preempted nodes. Each
    stretch is floored once: 4 nodes x 20 s, the reads' 2 preempted nodes among them, none evicted below 0."""
    reads = [[40, 0, 0, 0, 0, 2, 0], [60, 0, 0, 0, 0, 2, 0]]
    a = ran(span("a", reads, end=60), 40, 60, 2)
    b = ran(span("b", reads, end=60), 40, 60, 2)
    report = cost.estimate(usage(a, b), PRICES, lost_jobs=["a", "b"], preemptions=2)
    seconds = report["computes"]["spot-c"]["node_seconds"]
    assert min(seconds.values()) >= 0 and report["evicted_node_hours"] >= 0
    assert sum(seconds.values()) == pytest.approx(4 * 20)
    assert report["lost_node_hours"] == pytest.approx(4 * 20 / 3600)


def test_a_compute_without_node_counts_gets_no_floor() -> None:
    """A Kubernetes compute sends no nodeStateCounts: no reads, no tier, and it is not billed (billing.md)."""
    failed = {"job": "k", "compute": "aks-c", "points": [], "end": None, "statuses": []}
    chain = {"v": 1, "computes": {}, "spans": [ran(failed, 0, 3600, 2)]}
    report = cost.estimate(chain, {}, lost_jobs=[])
    assert report["node_hours_total"] == 0 and report["cost"] == 0 and report["cost_unknown"] is None


def _invoke(**kwargs: Any) -> Any:
    from airflow_azureml.operators import AzureMLInvokeBatchEndpointOperator

    op = AzureMLInvokeBatchEndpointOperator(
        task_id="t",
        endpoint_name="ep",
        deployment_name="spot",
        inputs={"d": "azureml://datastores/ws/paths/in/"},
        **kwargs,
    )
    op.__dict__["hook"] = mock.MagicMock()
    op.__dict__["_remember"] = lambda context, state: None
    return op


def _ended(job: str, compute: str = "spot-c") -> dict:
    return usage({"job": job, "compute": compute, "points": [], "end": None, "started_at": 40, "ended_at": 60})


def test_the_invoke_asks_the_deployment_its_job_ran_on_once_per_process() -> None:
    """By the compute the job ran on: the deployment the chain sent it to first, then the other one (a clear
    or a lost try state forgets the switch to the fallback); each deployment read once."""
    from airflow_azureml.lifecycle import ResubmissionState

    deployments = {"spot": ("spot-c", 2), "dedicated": ("dedicated-c", 3)}
    op = _invoke(fallback_deployment="dedicated")
    op.hook.deployment_nodes.side_effect = lambda endpoint, deployment: deployments[deployment]
    state = ResubmissionState(key="k", job_names=["a", "b", "c"], fallback_rule="deadline", fallback_from=2)
    for job, compute in (("a", "spot-c"), ("b", "spot-c"), ("c", "dedicated-c")):
        op._add_usage(None, state, _ended(job, compute))
    assert [(s["job"], s["instance_count"]) for s in state.usage["spans"]] == [("a", 2), ("b", 2), ("c", 3)]
    assert sorted(c.args for c in op.hook.deployment_nodes.call_args_list) == [("ep", "dedicated"), ("ep", "spot")]
    # cleared: the switch is forgotten, but the job ran on the dedicated compute, so it is the fallback's count
    cleared = _invoke(fallback_deployment="dedicated")
    cleared.hook.deployment_nodes.side_effect = lambda endpoint, deployment: deployments[deployment]
    cleared._add_usage(None, state := ResubmissionState(key="k", job_names=["c"]), _ended("c", "dedicated-c"))
    assert state.usage["spans"][0]["instance_count"] == 3
    # a compute neither deployment runs on now: unknown (the one-node floor), not a guess
    cleared._add_usage(None, state := ResubmissionState(key="k", job_names=["d"]), _ended("d", "old-c"))
    assert "instance_count" not in state.usage["spans"][0]
    given = _invoke(instance_count=4)  # the invoke's own override: no read
    given._add_usage(None, state := ResubmissionState(key="k", job_names=["a"]), _ended("a"))
    assert state.usage["spans"][0]["instance_count"] == 4 and given.hook.deployment_nodes.call_count == 0


def test_a_node_count_that_cannot_be_read_never_fails_the_task(
    capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    from airflow_azureml.lifecycle import ResubmissionState

    op = _invoke()
    op.hook.deployment_nodes.side_effect = RuntimeError("read failed: sig=c2VjcmV0c2VjcmV0")
    state = ResubmissionState(key="k", job_names=["a"])
    op._add_usage(None, state, _ended("a"))  # no exception
    (span,) = state.usage["spans"]
    assert "instance_count" not in span  # unknown: the floor takes one node
    captured = capsys.readouterr()  # the operator's log: structlog's stdout (3.3), or stdlib logging
    logged = captured.out + captured.err + caplog.text
    assert "Could not read the node count of job a" in logged and "c2VjcmV0c2VjcmV0" not in logged, logged


def test_a_clear_keeps_the_attempts_preemption_lost_in_the_bill() -> None:
    """A clear starts a fresh resubmission budget, not a fresh bill: the attempt lost before it is still lost
    (else the all-dedicated equivalent counts it as useful work and the savings are overstated)."""
    import logging

    from airflow_azureml.lifecycle import Limits, ResubmissionState, on_preemption
    from airflow_azureml.operators import job_cost

    lost = span("r0", [[0, 0, 2, 0, 0, 0, 0], [100, 0, 2, 0, 0, 0, 0], [100, 0, 0, 0, 0, 2, 0]], end=150)
    kept = span("r1", [[150, 2, 0, 0, 0, 0, 0], [160, 0, 2, 0, 0, 0, 0], [3600, 0, 2, 0, 0, 0, 0]], end=3600)
    before = ResubmissionState(key="k", job_names=["r0"], max_tries=1, usage=usage(lost))
    before = on_preemption(before, "r0", "every node preempted", Limits(max_resubmits=0)).state  # budget spent
    before.job_names.append("r1")
    before.usage = usage(lost, kept)
    cleared = ResubmissionState.from_store("k", before.to_store(), max_tries=2)  # a clear raises max_tries
    assert cleared.cleared and cleared.preemptions == 0 and cleared.counted == []

    from types import SimpleNamespace

    hook = SimpleNamespace(price_quote=lambda *args: PRICES["spot-c"])  # the prices, set by hand
    bill = job_cost.estimate(hook, cleared, {}, logging.getLogger("test"))  # type: ignore[arg-type]
    uncleared = job_cost.estimate(hook, before, {}, logging.getLogger("test"))  # type: ignore[arg-type]
    assert bill is not None and uncleared is not None
    assert bill["lost_node_hours"] == uncleared["lost_node_hours"] >= 2 * 100 / 3600  # r0 ran 100 s on 2 nodes
    assert bill["preemptions"] == 1 == uncleared["preemptions"]
    assert bill["dedicated_equivalent"] == uncleared["dedicated_equivalent"]


def test_the_preemptions_counter_counts_each_preemption_once_over_a_chains_reports(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A failed try reports its bill, and so does the retry or clear that finishes the chain: the counter goes
    up by the preemptions no earlier report counted (the bill itself always shows the whole chain's)."""
    import logging
    from types import SimpleNamespace

    from airflow_azureml import compat
    from airflow_azureml.lifecycle import ResubmissionState
    from airflow_azureml.operators import job_cost

    sent: list[tuple[str, float]] = []
    stats = SimpleNamespace(
        incr=lambda name, value, tags: sent.append((name, value)), gauge=lambda name, value, tags: None
    )
    monkeypatch.setattr(compat, "stats", lambda: stats)
    hook = SimpleNamespace(price_quote=lambda *args: PRICES["spot-c"])
    stored: list[dict] = []
    lost = span("r0", [[0, 0, 2, 0, 0, 0, 0], [100, 0, 0, 0, 0, 2, 0]], end=150, statuses=[[0, "Running"]])
    state = ResubmissionState(key="k", job_names=["r0"], lost=["r0"], usage=usage(lost))

    def report() -> dict:
        bill = job_cost.report(
            hook,
            {},
            state,
            {},
            logging.getLogger("t"),
            dag_id="d",
            task_id="t",
            remember=lambda s: stored.append(s.to_store()),
        )
        assert bill is not None
        return bill

    assert report()["preemptions"] == 1  # the failed try's report
    state = ResubmissionState.from_store("k", stored[-1], max_tries=None)  # the retry reads the stored record
    state.job_names = ["r0", "r1"]
    assert report()["preemptions"] == 1  # the retry's: the bill still shows it
    state.lost.append("r1")
    report()
    assert [value for name, value in sent if name == "azureml.spot.preemptions"] == [1, 0, 1]


def test_a_metric_or_a_state_write_that_fails_never_fails_the_report(monkeypatch: pytest.MonkeyPatch) -> None:
    """Metrics are best effort: a failed write of the counted mark, or a failed send, leaves the bill as it is;
    preemptions whose counter was not sent stay uncounted (the next report sends them)."""
    import logging
    from types import SimpleNamespace

    from airflow_azureml import compat
    from airflow_azureml.lifecycle import ResubmissionState
    from airflow_azureml.operators import job_cost

    hook = SimpleNamespace(price_quote=lambda *args: PRICES["spot-c"])
    lost = span("r0", [[0, 0, 2, 0, 0, 0, 0], [100, 0, 0, 0, 0, 2, 0]], end=150, statuses=[[0, "Running"]])
    state = ResubmissionState(key="k", job_names=["r0"], lost=["r0"], usage=usage(lost))

    def broken_store(_: ResubmissionState) -> None:
        raise RuntimeError("the Execution API is down")

    ok = SimpleNamespace(incr=lambda *a, **k: None, gauge=lambda *a, **k: None)
    monkeypatch.setattr(compat, "stats", lambda: ok)
    log = logging.getLogger("t")
    bill = job_cost.report(hook, {}, state, {}, log, dag_id="d", task_id="t", remember=broken_store)
    assert bill is not None and bill["preemptions"] == 1

    state.reported_preemptions = 0

    def down(*args: object, **kwargs: object) -> None:
        raise OSError("statsd unreachable")

    monkeypatch.setattr(compat, "stats", lambda: SimpleNamespace(incr=down, gauge=down))
    assert job_cost.report(hook, {}, state, {}, log, dag_id="d", task_id="t") is not None
    assert state.reported_preemptions == 0  # not sent: still to count
