"""Cost accounting: node-seconds from the compute's node counts, priced, per task and per DAG run.

The one place for it. The waits (sync and triggerer) sample each compute's ``nodeStateCounts`` through
the shared compute reads (``polling.COMPUTE_READS``); ``UsageRecorder`` keeps only the change points.
The usage travels as plain JSON (trigger event, ``task_state_store``, XCom); this module merges it
across jobs and tasks without counting the same cluster time twice, integrates it into node-seconds by
state and tier, prices it, and formats the bill. Billing rules: docs/billing.md (every allocated node
in every state, evicted ones and replacement start-up included, continuous); definitions: docs/cost.md.
Pure: no I/O, no Airflow, no SDK.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from airflow_azureml.outcomes import node_count, utc_epoch  # utc_epoch: the one ISO 8601 reader

#: Node states as ``nodeStateCounts`` names them (``<state>NodeCount``); every one is billed (billing.md rule 11).
STATES = ("preparing", "running", "idle", "leaving", "preempted", "unusable")
TIERS = ("dedicated", "low_priority")
#: A gap between two waits of one job chain on the same compute (deciding, resubmitting) shorter than this
#: is bridged (the readings on either side joined): the chain's nodes are still billed then (preempted
#: nodes wait to be deallocated). A longer gap (a worker crash and a retry delay) is not counted: nothing was observed.
BRIDGE_MAX = 120.0
USAGE_VERSION = 1
#: The XCom key of a job task's cost report: written by ``operators.job_cost``, read by ``backfill_bill``.
COST_XCOM_KEY = "azureml_cost"


def counts_from_rest(inner: Mapping[str, Any] | None) -> tuple[int, ...] | None:
    """Node counts by state (``STATES`` order) from an AmlCompute's inner properties; None when not sent."""
    counts = (inner or {}).get("nodeStateCounts")
    if not isinstance(counts, Mapping):
        return None
    out = []
    for state in STATES:
        value = counts.get(f"{state}NodeCount", 0)
        out.append(value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0)
    return tuple(out)


@dataclass
class UsageRecorder:
    """One wait's view of its job's compute: node-count change points and the job's status changes.

    Times are wall-clock seconds (``time.time()``), so waits in different processes (worker, triggerer)
    merge. ``end``: the last moment this wait looked (the last poll, or the read once more at the end).
    """

    job: str | None = None
    compute: str | None = None
    info: dict[str, Any] = field(default_factory=dict)  # vm_size, location, tier of the compute
    points: list[list[Any]] = field(default_factory=list)  # [t, preparing, running, idle, leaving, preempted, unusable]
    statuses: list[list[Any]] = field(default_factory=list)  # [t, status] at each change
    end: float | None = None
    # the job's run as run history records it (epoch seconds) and its node count, once the wait saw it end
    run: dict[str, Any] = field(default_factory=dict)  # started_at, ended_at, instance_count
    _last: list[Any] | None = None  # the latest reading (kept as a point when the counts change after it)

    def status(self, at: float, job: str | None, status: str | None, compute: str | None) -> None:
        self.job = job or self.job
        if compute and self.compute is None:
            self.compute = compute
        if status is not None and (not self.statuses or self.statuses[-1][1] != status):
            self.statuses.append([round(at, 3), status])
        self._extend(at)

    def sample(
        self, at: float, compute: str, counts: tuple[int, ...], vm_size: str | None, location: str | None, low: bool
    ) -> None:
        if self.compute not in (None, compute):
            return  # another compute than the job's (the job moved): not this span's
        self.compute = compute
        self.info = {"vm_size": vm_size, "location": location, "tier": "low_priority" if low else "dedicated"}
        last = self._last
        if last is not None and at <= last[0]:
            return  # the same shared reading again, or an older one than one already used
        reading = [round(at, 3), *counts]
        if not self.points or list(self.points[-1][1:]) != list(counts):
            if last is not None and last[0] > self.points[-1][0]:
                self.points.append(last)  # the last reading of the old counts: the change came after it
            self.points.append(reading)
        self._last = reading
        self._extend(at)

    def ran(self, started_at: float | None, ended_at: float | None, instance_count: int | None) -> None:
        """The ended job's run-history start and end times and its node count: each attempt's node time is at
        least their product, whatever the reads saw (``estimate``)."""
        known = {"started_at": started_at, "ended_at": ended_at, "instance_count": instance_count}
        self.run.update({k: v for k, v in known.items() if v is not None})

    def _extend(self, at: float) -> None:
        if self.points:
            self.end = round(max(self.end or at, at), 3)

    def to_dict(self) -> dict[str, Any]:
        """The wait's usage, JSON-serialisable (``merge`` and ``estimate`` read it). A wait that read nothing
        still gives its job's span when run history's times are known (no points: no reads to integrate)."""
        if self.compute is None or not (self.points or _run_of({**self.run, "compute": self.compute})):
            return empty_usage()
        points = [list(p) for p in self.points]
        if self._last is not None and points and self._last[0] > points[-1][0]:
            points.append(list(self._last))
        span = {"job": self.job, "compute": self.compute, "points": points, "end": self.end}
        span["statuses"] = self.statuses
        span.update(self.run)  # optional fields: a usage without them integrates as before
        computes = {self.compute: dict(self.info)} if self.info else {}  # no read: nothing known of the compute
        return {"v": USAGE_VERSION, "computes": computes, "spans": [span]}


def empty_usage() -> dict[str, Any]:
    return {"v": USAGE_VERSION, "computes": {}, "spans": []}


def _valid(usage: Any) -> dict[str, Any]:
    if not isinstance(usage, Mapping) or not isinstance(usage.get("spans"), list):
        return empty_usage()
    return {"v": USAGE_VERSION, "computes": dict(usage.get("computes") or {}), "spans": list(usage["spans"])}


def merge(chain: Any, wait: Any, *, bridge: bool = True) -> dict[str, Any]:
    """Add one wait's usage to a job chain's. ``bridge``: a short gap since the chain's last span on the
    same compute is bridged to the new span's first reading (``BRIDGE_MAX``); spans themselves never add up twice
    (``integrate`` takes the union of their time)."""
    out, new = _valid(chain), _valid(wait)
    out["computes"].update(new["computes"])
    spans = [dict(s) for s in out["spans"]]
    for span in new["spans"]:
        if not span.get("points") and _run_of(span) is None:
            continue
        if bridge and span.get("points"):
            start = span["points"][0][0]
            before = [s for s in spans if s.get("compute") == span.get("compute") and s.get("end") is not None]
            if before:
                last = max(before, key=lambda s: (s["end"], s["points"][0][0]))  # the latest span
                if 0 <= start - last["end"] <= BRIDGE_MAX:
                    last["end"] = start
        if not any(s.get("job") == span.get("job") and s.get("points") == span.get("points") for s in spans):
            spans.append(dict(span))  # the same wait delivered twice (a retried event) is kept once
    out["spans"] = spans
    return out


def jobs_without_node_count(usage: Any) -> dict[str, str]:
    """Job -> compute of the jobs whose run times a wait recorded but not their node count (a batch job's GET
    has none): the floor would take one node for them (``_run_of``)."""
    return {
        str(s["job"]): str(s["compute"])
        for s in _valid(usage)["spans"]
        if s.get("job") and _run_of(s) and not _nodes_known(s)
    }


def with_node_counts(usage: Any, counts: Mapping[str, int]) -> dict[str, Any]:
    """``usage`` with ``counts[job]`` as the node count of each of its spans that has none: the count the
    operator knows (the invoke's ``instance_count``, else the deployment's), which Azure's job GET omits."""
    out = _valid(usage)
    out["spans"] = [
        {**s, "instance_count": counts[s["job"]]}
        if s.get("job") in counts and not _nodes_known(s) and node_count(counts[s["job"]]) is not None
        else s
        for s in out["spans"]
    ]
    return out


def _nodes_known(span: Mapping[str, Any]) -> bool:
    return node_count(span.get("instance_count")) is not None


def combine(usages: Iterable[Any]) -> dict[str, Any]:
    """Usage of several tasks (a DAG run): spans side by side, no bridging between tasks."""
    out = empty_usage()
    for usage in usages:
        out = merge(out, usage, bridge=False)
    return out


def _union(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    merged: list[tuple[float, float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return merged


def integrate(
    usage: Any,
    *,
    jobs: set[str] | None = None,
    exclude: set[str] | None = None,
    window: tuple[float, float] | None = None,
) -> dict[str, dict[str, float]]:
    """Node-seconds by state per compute, over the union of the spans' times (``jobs``/``exclude``: which
    spans' times count; ``window``: only within these times); readings of one compute from any span are
    readings of the same cluster.

    Between two readings the counts go linearly from one to the other: a node that came or went between
    them did so, as likely as not, in the first half (the trapezoid; a hold at the earlier reading would
    count every end late and every start early, and the polls that find a job ended are the sparse ones,
    backed off). The spans keep the last reading before each change, so a steady stretch stays steady.
    After a span's last reading its counts hold until the span's end (the last poll).
    """
    usage = _valid(usage)
    out: dict[str, dict[str, float]] = {}
    by_compute: dict[str, list[dict[str, Any]]] = {}
    for span in usage["spans"]:
        if span.get("points") and span.get("end") is not None:
            by_compute.setdefault(span["compute"], []).append(span)
    for compute, spans in by_compute.items():
        points = sorted((p for s in spans for p in s["points"]), key=lambda p: p[0])
        times = [p[0] for p in points]
        chosen = [
            s
            for s in spans
            if (jobs is None or s.get("job") in jobs) and (exclude is None or s.get("job") not in exclude)
        ]
        seconds = dict.fromkeys(STATES, 0.0)
        for start, end in _union([(s["points"][0][0], s["end"]) for s in chosen]):
            if window is not None:
                start, end = max(start, window[0]), min(end, window[1])
                if end <= start:
                    continue
            _add_seconds(points, times, start, end, seconds)
        out[compute] = seconds
    return out


def _add_seconds(
    points: list[list[Any]], times: list[float], start: float, end: float, seconds: dict[str, float]
) -> None:
    """Add the node-seconds by state of ``[start, end]`` from sorted ``points`` (``integrate``'s rule)."""
    index = max(0, bisect.bisect_right(times, start) - 1)
    while index < len(points):
        t0 = points[index][0]
        t1 = points[index + 1][0] if index + 1 < len(points) else math.inf
        a, b = max(start, t0), min(end, t1)
        if b > a:
            here = points[index][1:]
            there = points[index + 1][1:] if t1 < math.inf and t1 > t0 else here
            for i, state in enumerate(STATES):
                if t1 == math.inf or there is here:
                    seconds[state] += here[i] * (b - a)
                else:  # linear from t0 to t1: the mean of the values at a and b, times (b - a)
                    va = here[i] + (there[i] - here[i]) * (a - t0) / (t1 - t0)
                    vb = here[i] + (there[i] - here[i]) * (b - t0) / (t1 - t0)
                    seconds[state] += (va + vb) / 2 * (b - a)
        if t1 >= end:
            break
        index += 1


# --------------------------------------------------------------- the estimate
def _run_of(span: Mapping[str, Any]) -> tuple[str, float, float, int] | None:
    """``(compute, start, end, nodes)`` of a span's job as run history recorded it, or None (not recorded:
    a usage from before these fields, a job that never started). ``nodes``: the job's ``instance_count`` (a batch job's
    GET has none: the operator adds it, ``with_node_counts``), or 1 when unknown: a job that ran held one node."""
    start, end, nodes = span.get("started_at"), span.get("ended_at"), span.get("instance_count")
    numbers = [v for v in (start, end) if isinstance(v, (int, float)) and not isinstance(v, bool)]
    if len(numbers) != 2 or not span.get("compute") or not end > start:
        return None
    return str(span["compute"]), float(start), float(end), node_count(nodes) or 1


def _window_seconds(
    points: list[list[Any]],
    times: list[float],
    intervals: list[tuple[float, float]],
    ends: list[float],
    a: float,
    b: float,
) -> dict[str, float]:
    """Node-seconds by state within ``[a, b]`` of the merged, sorted ``intervals`` (``ends``: their ends), from
    sorted ``points`` (``integrate``'s rule between readings)."""
    seconds = dict.fromkeys(STATES, 0.0)
    for start, end in intervals[bisect.bisect_right(ends, a) :]:
        if start >= b:
            break
        _add_seconds(points, times, max(start, a), min(end, b), seconds)
    return seconds


def _attempt_floors(
    usage: dict[str, Any],
    total: dict[str, dict[str, float]],
    useful: dict[str, dict[str, float]],
    lost: set[str],
    added: list[tuple[str, float, float, float, float]] | None = None,
) -> None:
    """Node time is at least, at each moment, the nodes of the attempts running then by run history's times
    (``instance_count`` each, one when unknown): the cluster held their nodes whether a read fell inside their
    run or not. In place; only for computes the reads priced (AmlCompute; a Kubernetes compute is not billed).

    Swept per compute over the stretches between the attempts' start and end times, each stretch once (so
    attempts running at once never move the same node time twice). Within a stretch the reads refine it:
    the cluster's node time is the larger of the reads' and the floor, never their sum. Where a read fell
    inside the stretch its states stand and only node time the reads missed is added as running; where none
    did, the line between the reads on either side says nothing of its states, so up to the floor its
    evicted node time counts as the attempts' running nodes. The added time goes to the dedicated equivalent
    in the share of the attempts that were not lost. ``added``, when given, collects what each stretch added,
    for ``_priced_windows``. docs/cost.md states the error bound."""
    runs: dict[tuple[str, str], tuple[float, float, int]] = {}
    for span in usage["spans"]:
        run = _run_of(span)
        if run is None or not (usage["computes"].get(run[0]) or {}).get("tier"):
            continue
        key = (run[0], str(span.get("job") or ""))
        known = runs.get(key)  # several waits of one job: the same times (the widest, should they differ)
        runs[key] = run[1:] if known is None else (min(run[1], known[0]), max(run[2], known[1]), max(run[3], known[2]))
    by_compute: dict[str, list[tuple[str, float, float, int]]] = {}
    for (compute, job), (start, end, nodes) in runs.items():
        by_compute.setdefault(compute, []).append((job, start, end, nodes))
    for compute, attempts in sorted(by_compute.items()):
        spans = [s for s in usage["spans"] if s.get("compute") == compute and s.get("points") and s.get("end")]
        points = sorted((p for s in spans for p in s["points"]), key=lambda p: p[0])
        times = [p[0] for p in points]
        intervals = _union([(s["points"][0][0], s["end"]) for s in spans])
        ends = [end for _, end in intervals]
        edges = sorted({t for _, start, end, _ in attempts for t in (start, end)})
        here = total.setdefault(compute, dict.fromkeys(STATES, 0.0))
        kept = useful.setdefault(compute, dict.fromkeys(STATES, 0.0))
        for a, b in itertools.pairwise(edges):
            active = [(job, nodes) for job, start, end, nodes in attempts if start <= a and b <= end]
            if not active:
                continue
            floor = sum(nodes for _, nodes in active) * (b - a)
            seen = _window_seconds(points, times, intervals, ends, a, b) if points else dict.fromkeys(STATES, 0.0)
            everything = sum(seen.values())
            inside = bisect.bisect_right(times, a) < bisect.bisect_left(times, b)  # a read strictly inside
            if inside:
                running, moved = max(0.0, floor - everything), 0.0
            else:
                running = max(0.0, floor - (everything - seen["preempted"]))
                moved = min(running, seen["preempted"])
            here["running"] += running
            here["preempted"] = max(0.0, here["preempted"] - moved)
            share = sum(n for job, n in active if job not in lost) / sum(n for _, n in active)
            kept["running"] += running * share
            if added is not None:  # (compute, from, to, node time added, all-dedicated node time added)
                added.append((compute, a, b, running - moved, running * share))


def estimate(
    usage: Any,
    prices: Mapping[str, Mapping[str, Any] | None],
    *,
    lost_jobs: Iterable[str] = (),
    preemptions: int = 0,
    timelines: Mapping[str, Mapping[str, list[tuple[float, float | None]]]] | None = None,
) -> dict[str, Any]:
    """The bill of a job chain (or a run): node-hours by tier, evicted node-hours, cost, the all-dedicated
    equivalent and the savings. ``prices``: per compute ``{"dedicated": USD/h, "spot": USD/h, "source"}``
    or None (unknown); ``lost_jobs``: the attempts lost to preemption (not part of the dedicated
    equivalent); ``timelines``: per compute, rates that changed over time (``rate_timelines``), so that each
    node-second is priced at the rate in force then; the node time itself does not depend on them.
    Node time from the reads, and per attempt at least its run time on its nodes as run history
    recorded them (``_attempt_floors``). Definitions: docs/cost.md."""
    usage = _valid(usage)
    lost = set(lost_jobs)
    total = integrate(usage)
    useful = integrate(usage, exclude=lost)
    added: list[tuple[str, float, float, float, float]] = []
    _attempt_floors(usage, total, useful, lost, added)
    computes: dict[str, Any] = {}
    hours_by_tier = dict.fromkeys(TIERS, 0.0)
    cost: float | None = 0.0
    equivalent_hours = 0.0
    equivalent_cost: float | None = 0.0
    unknown: list[str] = []
    for name, seconds in sorted(total.items()):
        info = usage["computes"].get(name) or {}
        tier = info.get("tier") if info.get("tier") in TIERS else "dedicated"
        price = prices.get(name) or {}
        rate = price.get("spot" if tier == "low_priority" else "dedicated")
        dedicated_rate = price.get("dedicated")
        node_seconds = sum(seconds.values())
        # the work's node time without the lost attempts and without evicted nodes waiting to go
        kept = useful.get(name, {})
        eq_seconds = sum(v for s, v in kept.items() if s != "preempted")
        entry_cost = None if rate is None else node_seconds * rate / 3600.0
        windows: list[dict[str, Any]] = []
        timeline = (timelines or {}).get(name)
        if timeline and node_seconds > 0:
            windows = _priced_windows(usage, name, lost, added, timeline)
            rate, dedicated_rate = windows[-1]["hourly_price"], windows[-1]["dedicated_hourly_price"]
            entry_cost = None if any(w["cost"] is None for w in windows) else sum(w["cost"] for w in windows)
        computes[name] = {
            "vm_size": info.get("vm_size"),
            "location": info.get("location"),
            "tier": tier,
            "node_seconds": {s: round(v, 3) for s, v in seconds.items()},
            "node_hours": node_seconds / 3600.0,
            "hourly_price": rate,
            "dedicated_hourly_price": dedicated_rate,
            "price_source": price.get("source"),
            # from the Retail Prices API: when the rate used took effect, and when it was read
            "price_effective_from": (price.get("effective_from") or {}).get(
                "spot" if tier == "low_priority" else "dedicated"
            ),
            "dedicated_price_effective_from": (price.get("effective_from") or {}).get("dedicated"),
            "price_retrieved_at": price.get("retrieved_at"),
            "cost": entry_cost,
        }
        if len(windows) > 1:
            computes[name]["price_windows"] = windows
        took_effect = utc_epoch(computes[name]["price_effective_from"])
        first_seen = min(
            (s["points"][0][0] for s in usage["spans"] if s.get("compute") == name and s.get("points")), default=None
        )
        if took_effect is not None and first_seen is not None and took_effect > first_seen and not windows:
            # the rate took effect after this usage began: its earlier node time is priced at it too (the rate
            # before is not in this quote; a range's bill over reports that saw both splits it: run_bill)
            computes[name]["price_changed_during"] = True
        hours_by_tier[tier] += node_seconds / 3600.0
        equivalent_hours += eq_seconds / 3600.0
        if node_seconds > 0 and entry_cost is None:
            unknown.append(name)
        cost = None if cost is None or (entry_cost is None and node_seconds > 0) else cost + (entry_cost or 0.0)
        if equivalent_cost is not None:
            if windows:
                parts = [w["dedicated_equivalent_cost"] for w in windows]
                equivalent_cost = None if any(p is None for p in parts) else equivalent_cost + sum(parts)
            elif dedicated_rate is None and eq_seconds > 0:
                equivalent_cost = None
            else:
                equivalent_cost += eq_seconds * (dedicated_rate or 0.0) / 3600.0
    evicted = sum(s.get("preempted", 0.0) for s in total.values()) / 3600.0
    lost_seconds = sum(sum(v for st, v in s.items() if st != "preempted") for s in total.values()) - sum(
        sum(v for st, v in s.items() if st != "preempted") for s in useful.values()
    )
    savings, pct = _savings(cost, equivalent_cost)
    return {
        "currency": "USD",
        "computes": computes,
        "node_hours": hours_by_tier,
        "node_hours_total": sum(hours_by_tier.values()),
        "preemptions": int(preemptions),
        "lost_jobs": sorted(lost),
        "evicted_node_hours": evicted,
        "lost_node_hours": max(0.0, lost_seconds) / 3600.0,
        "cost": cost,
        "dedicated_equivalent": {"node_hours": equivalent_hours, "cost": equivalent_cost},
        "savings": savings,
        "savings_pct": pct,
        "cost_unknown": (f"no price for {', '.join(unknown)}" if unknown else None),
    }


def _savings(cost: float | None, equivalent_cost: float | None) -> tuple[float | None, float | None]:
    """The savings against all-dedicated, and as a percentage of it."""
    savings = None if cost is None or equivalent_cost is None else equivalent_cost - cost
    if savings is None:
        return None, None
    if equivalent_cost:
        return savings, 100.0 * savings / equivalent_cost
    return savings, (0.0 if savings == 0 else None)  # nothing billed either way: nothing saved, not "unknown"


def rate_at(timeline: list[tuple[float, float | None]], t: float) -> float | None:
    """The rate in force at ``t`` in ``[(since, rate), ...]`` (in the order the reports were read): the latest
    to take effect by ``t``, of equal times the one read last; before the earliest, the earliest one."""
    in_force = [(since, i) for i, (since, _) in enumerate(timeline) if since <= t]
    if not in_force:
        first = min(since for since, _ in timeline)
        in_force = [(since, i) for i, (since, _) in enumerate(timeline) if since == first]
    return timeline[max(in_force)[1]][1]


def _priced_windows(
    usage: dict[str, Any],
    compute: str,
    lost: set[str],
    added: list[tuple[str, float, float, float, float]],
    timeline: Mapping[str, list[tuple[float, float | None]]],
) -> list[dict[str, Any]]:
    """``compute``'s node time cut where one of its rates took effect, each stretch priced at the rates in force
    then: ``{"from", "hourly_price", "dedicated_hourly_price", "node_hours", "cost", "dedicated_equivalent_cost"}``
    for each stretch with node time, adjacent stretches at the same rates merged.

    The node time of a stretch is the reads' there (an integral, exact over any cut) plus the share of each
    attempt floor's added time that falls in it (by time: where in a floor's stretch the reads missed the nodes
    is not known), so the stretches add up to the unwindowed node time exactly."""
    cuts = sorted({since for rates in timeline.values() for since, _ in rates if math.isfinite(since)})
    out: list[dict[str, Any]] = []
    for a, b in itertools.pairwise([-math.inf, *cuts, math.inf]):
        seconds = sum(integrate(usage, window=(a, b)).get(compute, {}).values())
        kept = sum(
            v for s, v in integrate(usage, exclude=lost, window=(a, b)).get(compute, {}).items() if s != "preempted"
        )
        for name, start, end, more, more_kept in added:
            overlap = min(end, b) - max(start, a)
            if name == compute and overlap > 0 and end > start:
                seconds += more * overlap / (end - start)
                kept += more_kept * overlap / (end - start)
        if seconds <= 0 and kept <= 0:
            continue
        rate, dedicated = rate_at(timeline["rate"], a), rate_at(timeline["dedicated"], a)
        stretch = {
            "from": None if a == -math.inf else iso_time(a),
            "hourly_price": rate,
            "dedicated_hourly_price": dedicated,
            "node_hours": seconds / 3600.0,
            "cost": None if rate is None else seconds * rate / 3600.0,
            "dedicated_equivalent_cost": None if dedicated is None else kept * dedicated / 3600.0,
        }
        last = out[-1] if out else None
        if last and (last["hourly_price"], last["dedicated_hourly_price"]) == (rate, dedicated):
            last["node_hours"] += stretch["node_hours"]
            for key in ("cost", "dedicated_equivalent_cost"):
                last[key] = None if last[key] is None or stretch[key] is None else last[key] + stretch[key]
        else:
            out.append(stretch)
    return out


def rate_timelines(reports: Iterable[Mapping[str, Any]]) -> tuple[dict[str, dict[str, list[Any]]], set[str]]:
    """Per compute, the rates its reports quote and since when (``{"rate": [(since, USD/h)], "dedicated":
    [...]}``), for ``estimate(timelines=...)``; and the computes priced at one rate instead, because a report
    does not say since when its rate was in force (prices set by hand, a report from before)."""
    timelines: dict[str, dict[str, list[Any]]] = {}
    undated: set[str] = set()
    for report in reports:
        for name, entry in (report.get("computes") or {}).items():
            if entry.get("hourly_price") is None and entry.get("dedicated_hourly_price") is None:
                continue
            pairs = {
                "rate": (utc_epoch(entry.get("price_effective_from")), entry.get("hourly_price")),
                "dedicated": (
                    utc_epoch(entry.get("dedicated_price_effective_from")),
                    entry.get("dedicated_hourly_price"),
                ),
            }
            if any(since is None for since, _ in pairs.values()):
                undated.add(name)
                continue
            line = timelines.setdefault(name, {"rate": [], "dedicated": []})
            for kind, pair in pairs.items():
                line[kind].append(pair)
    for name in undated:
        timelines.pop(name, None)
    # a compute whose rates never changed needs no timeline
    changed = {
        name: line
        for name, line in timelines.items()
        if len({rate for _, rate in line["rate"]}) > 1 or len({rate for _, rate in line["dedicated"]}) > 1
    }
    return changed, undated


# ----------------------------------------------------- observations for policies
def spot_exposure_hours(usage: Any) -> float:
    """Hours the chain's jobs were seen Running on low-priority computes (first Running poll to the next
    status change, or the end of the wait)."""
    usage = _valid(usage)
    seconds = 0.0
    for span in usage["spans"]:
        if (usage["computes"].get(span.get("compute")) or {}).get("tier") != "low_priority":
            continue
        statuses = span.get("statuses") or []
        if not statuses:  # no poll's status kept (a record written by hand, or cut short): nothing seen Running
            continue
        for (at, status), nxt in zip(statuses, [*statuses[1:], [span.get("end"), None]], strict=True):
            if status == "Running" and nxt[0] is not None:
                seconds += max(0.0, nxt[0] - at)
    return seconds / 3600.0


def startup_seconds(usage: Any) -> dict[str, float | None]:
    """Per attempt (job): seconds from the first reading with a node preparing to the first with none
    preparing and some running or idle. None: not observed (the job ended first, or no reading)."""
    out: dict[str, float | None] = {}
    for span in _valid(usage)["spans"]:
        job = span.get("job") or ""
        began = None
        for t, preparing, running, idle, *_ in span.get("points") or []:
            if began is None and preparing > 0:
                began = t
            elif began is not None and preparing == 0 and running + idle > 0:
                out[job] = t - began
                break
        out.setdefault(job, None)
    return out


def evictions(usage: Any) -> dict[str, int]:
    """Per compute: the rises of the preempted node count between consecutive readings (a lower bound of
    the nodes evicted: an eviction deallocated between two reads is not seen)."""
    usage = _valid(usage)
    out: dict[str, int] = {}
    by_compute: dict[str, list[list[Any]]] = {}
    for span in usage["spans"]:
        by_compute.setdefault(span.get("compute") or "", []).extend(span.get("points") or [])
    for compute, points in by_compute.items():
        points = sorted(points, key=lambda p: p[0])
        index = 1 + STATES.index("preempted")
        out[compute] = sum(max(0, b[index] - a[index]) for a, b in itertools.pairwise(points))
    return out


def observed(usage: Any) -> dict[str, Any]:
    """What the spot policy may use from a chain's usage: exposure, evictions, start-up per attempt."""
    return {
        "spot_exposure_hours": spot_exposure_hours(usage),
        "evictions": evictions(usage),
        "startup_seconds": startup_seconds(usage),
    }


# ------------------------------------------------------------ per DAG run
def run_bill(task_costs: Iterable[Mapping[str, Any] | None]) -> dict[str, Any]:
    """The DAG run's bill from its tasks' ``azureml_cost`` XCom values (``None`` entries are skipped).

    The tasks' usage is combined per compute over the union of their times, so two tasks waiting on one
    cluster at once are not billed twice; each compute is priced as its tasks' reports priced it. Where the
    reports quote a compute at rates that took effect at different times (a spot price that moved during a
    backfill), each node-second is priced at the rate in force then (``price_windows``).
    """
    reports = [dict(c) for c in task_costs if isinstance(c, Mapping)]
    usage = combine(r.get("usage") for r in reports)
    prices: dict[str, dict[str, Any]] = {}
    for report in reports:
        for name, entry in (report.get("computes") or {}).items():
            if entry.get("hourly_price") is None and entry.get("dedicated_hourly_price") is None:
                continue
            spot = entry.get("hourly_price") if entry.get("tier") == "low_priority" else None
            prices.setdefault(name, {"dedicated": entry.get("dedicated_hourly_price"), "spot": spot})
            if entry.get("dedicated_hourly_price") is not None:  # the rates seen last, where no date orders them
                prices[name]["dedicated"] = entry["dedicated_hourly_price"]
            prices[name]["source"] = entry.get("price_source")
            prices[name]["retrieved_at"] = entry.get("price_retrieved_at")
            tier_key = "spot" if entry.get("tier") == "low_priority" else "dedicated"
            prices[name]["effective_from"] = {
                tier_key: entry.get("price_effective_from"),
                "dedicated": entry.get("dedicated_price_effective_from"),
            }
            if spot is not None:
                prices[name]["spot"] = spot
    lost = {j for r in reports for j in r.get("lost_jobs") or []}
    preemptions = sum(int(r.get("preemptions") or 0) for r in reports)
    timelines, undated = rate_timelines(reports)
    bill = estimate(usage, prices, lost_jobs=lost, preemptions=preemptions, timelines=timelines)
    for name in undated & set(bill["computes"]):
        bill["computes"][name]["price_undated"] = True  # priced at one rate, the one seen last
    keys = ("task_id", "map_index", "cost", "savings", "savings_pct", "preemptions")
    bill["tasks"] = [{k: r.get(k) for k in keys} for r in reports]
    return bill


#: The metric names (docs/cost.md). Gauges unless said; tags: dag_id, task_id, and compute and tier where named.
METRICS = {
    "azureml.spot.node_hours": "node-hours of one compute (tags compute, tier)",
    "azureml.spot.evicted_node_hours": "node-hours of evicted nodes until deallocated (tags compute, tier)",
    "azureml.spot.cost": "estimated cost in USD of one compute (tags compute, tier)",
    "azureml.spot.preemptions": "counter: preemptions of the task's job chain",
    "azureml.spot.dedicated_equivalent_cost": "USD the work would have cost on dedicated nodes",
    "azureml.spot.savings": "USD saved against all-dedicated (negative: spot cost more)",
    "azureml.spot.savings_pct": "savings as a percentage of the all-dedicated cost",
}


def metrics(
    report: Mapping[str, Any], new_preemptions: int | None = None
) -> list[tuple[str, str, float, dict[str, str]]]:
    """``(Stats method, name, value, tags)`` for a task's report; unknown values are left out.

    ``azureml.spot.preemptions`` is a counter: it goes up by ``new_preemptions``, those no earlier report of
    the chain counted (a failed try's, before a retry or a clear), by default the report's own."""
    base = {"dag_id": str(report.get("dag_id") or ""), "task_id": str(report.get("task_id") or "")}
    out: list[tuple[str, str, float, dict[str, str]]] = []
    for name, entry in sorted((report.get("computes") or {}).items()):
        tags = {**base, "compute": name, "tier": str(entry.get("tier"))}
        seconds = entry.get("node_seconds") or {}
        out.append(("gauge", "azureml.spot.node_hours", float(entry.get("node_hours") or 0.0), tags))
        out.append(("gauge", "azureml.spot.evicted_node_hours", float(seconds.get("preempted", 0.0)) / 3600.0, tags))
        if entry.get("cost") is not None:
            out.append(("gauge", "azureml.spot.cost", float(entry["cost"]), tags))
    preemptions = int(report.get("preemptions") or 0) if new_preemptions is None else new_preemptions
    out.append(("incr", "azureml.spot.preemptions", max(0, preemptions), base))
    equivalent = (report.get("dedicated_equivalent") or {}).get("cost")
    for name, value in (
        ("azureml.spot.dedicated_equivalent_cost", equivalent),
        ("azureml.spot.savings", report.get("savings")),
        ("azureml.spot.savings_pct", report.get("savings_pct")),
    ):
        if value is not None:
            out.append(("gauge", name, float(value), base))
    return out


def price_note(entry: Mapping[str, Any]) -> str:
    """Which price a compute was billed at, and from when: its source, since when the rate was in force (the
    Retail Prices API's ``effectiveStartDate``) and when it was read (cached a day)."""
    parts = [str(entry.get("price_source") or "no price")]
    if entry.get("price_effective_from"):
        parts.append(f"rate in force since {entry['price_effective_from']}")
    if entry.get("price_retrieved_at"):
        parts.append(f"read {entry['price_retrieved_at']}")
    if entry.get("price_changed_during"):
        parts.append("it took effect during this usage, whose earlier node time is priced at it too")
    return ", ".join(parts)


def money(value: float | None) -> str:
    return "unknown" if value is None else f"${value:,.4f}"


def iso_time(epoch: float | None) -> str | None:
    """An epoch time as the reports carry it: ISO 8601 in UTC, to the second (None stays None)."""
    if epoch is None:
        return None
    from datetime import datetime, timezone

    return datetime.fromtimestamp(epoch, tz=timezone.utc).isoformat(timespec="seconds")


def _evicted_context(bill: Mapping[str, Any]) -> str:
    """Why evicted node-hours can show when no job was preempted: the cluster is shared, its nodes are billed."""
    if bill.get("evicted_node_hours", 0.0) > 0 and not bill.get("preemptions"):
        return " (nodes of the cluster evicted while the jobs ran, billed until deallocated; no job was preempted)"
    return ""


def format_bill(bill: Mapping[str, Any], title: str = "Azure ML cost") -> str:
    """One readable block (task log, the run's report)."""
    hours = bill.get("node_hours") or {}
    eq = bill.get("dedicated_equivalent") or {}
    lines = [
        f"{title} (estimate, {bill.get('currency', 'USD')}; docs/cost.md)",
        f"  node-hours         spot {hours.get('low_priority', 0.0):.4f}, dedicated {hours.get('dedicated', 0.0):.4f}",
        f"  preemptions        {bill.get('preemptions', 0)}; evicted node-hours "
        f"{bill.get('evicted_node_hours', 0.0):.4f}{_evicted_context(bill)}, lost to preempted attempts "
        f"{bill.get('lost_node_hours', 0.0):.4f}",
        f"  estimated cost     {money(bill.get('cost'))}",
        f"  all-dedicated      {money(eq.get('cost'))} ({eq.get('node_hours', 0.0):.4f} node-hours at pay-as-you-go)",
    ]
    savings, pct = bill.get("savings"), bill.get("savings_pct")
    if savings is not None and savings < 0:  # not "savings $-0.0003 (-110.8 %)"
        more = "" if pct is None else f" ({-pct:.1f} % more)"
        lines.append(f"  spot cost more     {money(-savings)} more than all-dedicated{more}")
    else:
        lines.append(f"  savings            {money(savings)}" + ("" if pct is None else f" ({pct:.1f} %)"))
    for name, entry in sorted((bill.get("computes") or {}).items()):
        rate = entry.get("hourly_price")
        windows = entry.get("price_windows") or []
        if len(windows) > 1:  # the price moved: each stretch at the rate in force then
            lines.append(
                f"  {name}: {entry.get('tier')} {entry.get('vm_size')} in {entry.get('location')}, "
                f"{entry.get('node_hours', 0.0):.4f} node-hours at {len(windows)} rates ({price_note(entry)})"
            )
            for window in windows:
                price, payg = window["hourly_price"], window["dedicated_hourly_price"]
                lines.append(
                    f"    from {window['from'] or 'the start'}: {window['node_hours']:.4f} node-hours at "
                    f"{'unknown' if price is None else f'${price}/h'}, {money(window['cost'])} "
                    f"(pay-as-you-go {'unknown' if payg is None else f'${payg}/h'})"
                )
            continue
        lines.append(
            f"  {name}: {entry.get('tier')} {entry.get('vm_size')} in {entry.get('location')}, "
            f"{entry.get('node_hours', 0.0):.4f} node-hours at {'unknown' if rate is None else f'${rate}/h'}"
            f" ({price_note(entry)})"
        )
    if bill.get("cost_unknown"):
        lines.append(f"  cost unknown: {bill['cost_unknown']}")
    return "\n".join(lines)


if __name__ == "__main__":  # python -m airflow_azureml.cost: the bill of a range of DAG runs (a backfill)
    from airflow_azureml.backfill_bill import main

    raise SystemExit(main())
