"""cost.py: usage change points, merging without double counting, node-seconds, prices, the bill."""

from __future__ import annotations

import json

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


def ran(one: dict, start: float, end: float, nodes: int | None = None) -> dict:
    """``one`` with its job's run history times (and the nodes its job resource names) kept by the wait."""
    return {**one, "ran": [start, end, nodes]}


def capped(u: dict, max_nodes: int) -> dict:
    """``u`` with the cluster's scaleSettings.maxNodeCount as its reads recorded it."""
    return {**u, "computes": {n: {**info, "max_nodes": max_nodes} for n, info in u["computes"].items()}}


def test_a_lost_attempt_no_read_saw_costs_its_own_time_times_its_nodes() -> None:
    # issue 19/22: r0 started, ran and lost its 2 nodes between two reads (0 nodes, then 2 preempted): by the
    # reads alone it lost nothing, so the bill depended on when the reads landed (test_openlineage on a busy
    # machine). Its run history times (4 s to 6 s) on its 2 nodes are 4 node-seconds lost, whatever the reads.
    reads = [[0, 0, 0, 0, 0, 0, 0], [10, 0, 0, 0, 0, 2, 0]]
    report = cost.estimate(usage(ran(span("r0", reads, end=10), 4.0, 6.0, 2)), PRICES, lost_jobs=["r0"])
    assert report["lost_node_hours"] == pytest.approx(2 * 2 / 3600)
    # the floor takes the nodes the line between the reads placed in ``preempted`` first (one node, one
    # state): the reads' 10 node-seconds there, less their 2 under the floor, plus the floor's 4
    assert report["evicted_node_hours"] == pytest.approx(8 / 3600)
    assert report["node_hours_total"] == pytest.approx(12 / 3600)
    assert report["dedicated_equivalent"]["node_hours"] == 0  # all of it lost
    unnamed = cost.estimate(usage(ran(span("r0", reads, end=10), 4.0, 6.0)), PRICES, lost_jobs=["r0"])
    assert unnamed["lost_node_hours"] == pytest.approx(1 * 2 / 3600)  # none named: the one a Running job holds
    one_node = cost.estimate(capped(usage(ran(span("r0", reads, end=10), 4.0, 6.0, 2)), 1), PRICES, lost_jobs=["r0"])
    assert one_node["lost_node_hours"] == pytest.approx(1 * 2 / 3600)  # never more than the cluster's maxNodeCount
    # the same attempt from two waits is one attempt; a wait that read nothing still brings its run times
    twice = cost.merge(
        usage(ran(span("r0", reads, end=10), 4.0, 6.0, 2)), usage(ran(span("r0", [], end=None), 4, 6, 2))
    )
    assert cost.estimate(twice, PRICES, lost_jobs=["r0"])["lost_node_hours"] == pytest.approx(2 * 2 / 3600)
    # not lost (a failure of its own): the same node time, in the dedicated equivalent instead
    kept = cost.estimate(usage(ran(span("r0", reads, end=10), 4.0, 6.0, 2)), PRICES)
    assert kept["lost_node_hours"] == 0 and kept["dedicated_equivalent"]["node_hours"] == pytest.approx(4 / 3600)


def test_reads_that_saw_the_attempt_run_are_kept_and_the_floor_adds_nothing_to_them() -> None:
    # r0 ran 100 s on 2 nodes, then they were preempted and Azure cancelled it 50 s later (run ends at 150):
    # the read at 125 inside its life saw them preempted, so the floor ends at the read before (100), and the
    # evicted 50 s are evicted time, not lost time as well
    reads = [[0, 0, 2, 0, 0, 0, 0], [100, 0, 2, 0, 0, 0, 0], [125, 0, 0, 0, 0, 2, 0], [150, 0, 0, 0, 0, 2, 0]]
    plain = cost.estimate(usage(span("r0", reads, end=150)), PRICES, lost_jobs=["r0"])
    report = cost.estimate(usage(ran(span("r0", reads, end=150), 0.0, 150.0, 2)), PRICES, lost_jobs=["r0"])
    for key in ("lost_node_hours", "evicted_node_hours", "node_hours_total"):
        assert report[key] == pytest.approx(plain[key]), key
    assert cost.attempt_floors(usage(ran(span("r0", reads, end=150), 0.0, 150.0, 2)))["spot-c"] == [
        cost.Floor("r0", 0.0, 100.0, 2, False)
    ]


def test_a_falling_gauge_hides_no_eviction_from_the_floor() -> None:
    # a shared cluster: k (kept, 1 node) runs throughout; the lost attempt r1 (1 node) runs from 10 s to its
    # end at 40 s. Two nodes of an earlier attempt were preempted (2 at 0 s), deallocated by 15 s (0), then
    # r1's node is evicted (1 at 25 s): below the count at r1's start, a rise over the read before it all the
    # same. So r1's floor ends at 15 s, not 40 s; and the nodes the reads show are k's (its wait looked).
    k = span(
        "k", [[0, 0, 1, 0, 0, 2, 0], [15, 0, 2, 0, 0, 0, 0], [25, 0, 1, 0, 0, 1, 0], [50, 0, 1, 0, 0, 1, 0]], end=50
    )
    r1 = ran(span("r1", [[15, 0, 2, 0, 0, 0, 0], [25, 0, 1, 0, 0, 1, 0]], end=45), 10.0, 40.0, 1)
    assert cost.attempt_floors(usage(k, r1), ["r1"])["spot-c"] == [cost.Floor("r1", 10.0, 15.0, 1, True)]
    report = cost.estimate(usage(k, r1), PRICES, lost_jobs=["r1"])
    assert report["lost_node_hours"] == pytest.approx(1 * 5 / 3600)
    # a read inside the life that saw fewer nodes than the attempt's (its node gone, or not there yet) ends
    # the floor at the read before it, however the preempted count moved
    gone = ran(span("r2", [[0, 0, 1, 0, 0, 0, 0], [20, 0, 0, 0, 0, 0, 0]], end=45), 10.0, 40.0, 1)
    assert cost.attempt_floors(usage(gone))["spot-c"] == []  # from there the reads alone count


def test_each_attempt_has_its_own_floor_none_hides_another() -> None:
    # r0: the reads saw it (preparing from 0 s, running 10-100 s on 2 nodes: 200 node-seconds lost, more than
    # its run times' 180); r1: no read inside its life (155-160 s, 2 nodes). A floor per compute compared
    # with the reads' total (the reverted 74ad706) let r0's extra reads hide r1's 10 node-seconds.
    r0 = ran(
        span(
            "r0", [[0, 2, 0, 0, 0, 0, 0], [10, 0, 2, 0, 0, 0, 0], [100, 0, 2, 0, 0, 0, 0], [100, 0, 0, 0, 0, 2, 0]], 110
        ),
        10.0,
        100.0,
        2,
    )
    r1 = ran(span("r1", [[150, 0, 0, 0, 0, 0, 0], [170, 0, 0, 0, 0, 0, 0]], end=170), 155.0, 160.0, 2)
    report = cost.estimate(usage(r0, r1), PRICES, lost_jobs=["r0", "r1"])
    assert report["lost_node_hours"] == pytest.approx((200 + 10) / 3600)


def test_overlapping_attempts_on_a_shared_cluster_count_once_in_the_run() -> None:
    # two tasks' lost attempts on one cluster, one node each, no read inside either life: a (5-15 s) and
    # b (10-18 s) overlap from 10 to 15 s. Two attempts hold two nodes: 18 node-seconds; on a cluster of one
    # node (maxNodeCount 1) they cannot both have held one, and the run counts that node's 13 s once.
    a_use = usage(ran(span("a", [[0, 0, 0, 0, 0, 0, 0], [20, 0, 0, 0, 0, 0, 0]], end=20), 5.0, 15.0, 1))
    b_use = usage(ran(span("b", [[2, 0, 0, 0, 0, 0, 0], [22, 0, 0, 0, 0, 0, 0]], end=22), 10.0, 18.0, 1))
    for most, lost in ((2, 10 + 8), (1, 13)):
        tasks = [capped(a_use, most), capped(b_use, most)]
        reports = [
            {**cost.estimate(u, PRICES, lost_jobs=[j], preemptions=1), "task_id": j, "usage": u}
            for u, j in zip(tasks, "ab", strict=True)
        ]
        bill = cost.run_bill(reports)
        assert bill["lost_node_hours"] == pytest.approx(lost / 3600)
        assert bill["node_hours_total"] == pytest.approx(lost / 3600)  # nothing else: the reads saw no node
        assert sum(r["lost_node_hours"] for r in reports) == pytest.approx(18 / 3600)  # each task's own, 10 + 8
    # where the reads already billed an attempt's nodes, its floor adds none: a kept job's two nodes and the
    # lost attempt's one, all seen by the reads (3 running from 0 to 30 s), on a cluster of three
    seen = capped(
        usage(
            span("k", [[0, 0, 3, 0, 0, 0, 0], [30, 0, 3, 0, 0, 0, 0]], end=30),
            ran(span("c", [[0, 0, 3, 0, 0, 0, 0], [30, 0, 3, 0, 0, 0, 0]], end=30), 5.0, 25.0, 1),
        ),
        3,
    )
    bill = cost.estimate(seen, PRICES, lost_jobs=["c"])
    assert bill["node_hours_total"] == pytest.approx(3 * 30 / 3600)  # the reads' figure, nothing added
    assert bill["lost_node_hours"] == pytest.approx(1 * 20 / 3600)  # c's node, carved out of the kept time
    assert bill["dedicated_equivalent"]["node_hours"] == pytest.approx((3 * 30 - 20) / 3600)


def test_watch_keeps_the_run_times_and_the_cluster_size_of_an_ended_job() -> None:
    watch = JobWatch(PollingPolicy(interval=1, max_interval=10, jitter=0))
    watch.observe(JobSnapshot(name="j", status="Running", compute="spot-c"))
    sized = arm(running=2)
    sized["properties"]["properties"]["scaleSettings"] = {"maxNodeCount": 4, "minNodeCount": 0}
    watch.offer_usage(GaugeReading.from_rest("spot-c", sized, 0.0))
    watch.observe(JobSnapshot(name="j", status="Failed", compute="spot-c", started_at=100.0, ended_at=102.5))
    data = watch.usage_dict()
    (only,) = data["spans"]
    assert only["ran"] == [100.0, 102.5, None] and data["computes"]["spot-c"]["max_nodes"] == 4
    # a wait that got no read at all still reports the attempt, and adds no empty compute description
    blind = JobWatch(PollingPolicy(interval=1, max_interval=10, jitter=0))
    blind.observe(
        JobSnapshot(name="j", status="Failed", compute="spot-c", started_at=1.0, ended_at=3.0, instance_count=2)
    )
    assert blind.usage_dict()["spans"][0]["ran"] == [1.0, 3.0, 2] and blind.usage_dict()["computes"] == {}
    merged = cost.merge(data, blind.usage_dict())
    assert merged["computes"]["spot-c"]["max_nodes"] == 4


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
