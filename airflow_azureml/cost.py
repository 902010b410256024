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

#: Node states as ``nodeStateCounts`` names them (``<state>NodeCount``); every one is billed (billing.md rule 11).
STATES = ("preparing", "running", "idle", "leaving", "preempted", "unusable")
TIERS = ("dedicated", "low_priority")
_PREEMPTED = STATES.index("preempted")
_RUNNING = STATES.index("running")
#: A gap between two waits of one job chain on the same compute (deciding, resubmitting) shorter than this
#: is bridged (the readings on either side joined): the chain's nodes are still billed then (preempted
#: nodes wait to be deallocated). A longer gap (a worker crash and a retry delay) is not counted: nothing was observed.
BRIDGE_MAX = 120.0
USAGE_VERSION = 1
#: Run history's clock and this machine's may differ (the same allowance as ``polling.CLOCK_MARGIN``): a read
#: this close to an attempt's start or end is not taken as one made inside its life (``attempt_floors``).
CLOCK_MARGIN = 1.0


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
    # [start, end, nodes]: when the job ran, as run history recorded it (read for a failed or cancelled job),
    # and the nodes the job resource names (None: not named). The floor of its node time (``attempt_floors``).
    ran: list[Any] | None = None
    _last: list[Any] | None = None  # the latest reading (kept as a point when the counts change after it)

    def status(self, at: float, job: str | None, status: str | None, compute: str | None) -> None:
        self.job = job or self.job
        if compute and self.compute is None:
            self.compute = compute
        if status is not None and (not self.statuses or self.statuses[-1][1] != status):
            self.statuses.append([round(at, 3), status])
        self._extend(at)

    def run_times(self, start: float | None, end: float | None, nodes: int | None) -> None:
        """The job's run history times (read for a failed or cancelled job) and the nodes its resource names."""
        ok = all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in (start, end))
        if ok and end > start:  # type: ignore[operator]
            self.ran = [round(float(start), 3), round(float(end), 3), _nodes(nodes)]  # type: ignore[arg-type]

    def sample(
        self,
        at: float,
        compute: str,
        counts: tuple[int, ...],
        vm_size: str | None,
        location: str | None,
        low: bool,
        max_nodes: int | None = None,
    ) -> None:
        if self.compute not in (None, compute):
            return  # another compute than the job's (the job moved): not this span's
        self.compute = compute
        self.info = {"vm_size": vm_size, "location": location, "tier": "low_priority" if low else "dedicated"}
        if _nodes(max_nodes) is not None:  # scaleSettings.maxNodeCount: caps the attempts' floors
            self.info["max_nodes"] = max_nodes
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

    def _extend(self, at: float) -> None:
        if self.points:
            self.end = round(max(self.end or at, at), 3)

    def to_dict(self) -> dict[str, Any]:
        """The wait's usage, JSON-serialisable (``merge`` and ``estimate`` read it). A wait that read no
        node counts still gives its job's run times (``ran``): they bill the attempt without any read."""
        if (not self.points and self.ran is None) or self.compute is None:
            return empty_usage()
        points = [list(p) for p in self.points]
        if self._last is not None and points and self._last[0] > points[-1][0]:
            points.append(list(self._last))
        span = {"job": self.job, "compute": self.compute, "points": points, "end": self.end}
        span["statuses"] = self.statuses
        if self.ran is not None:
            span["ran"] = list(self.ran)
        computes = {self.compute: dict(self.info)} if self.info else {}
        return {"v": USAGE_VERSION, "computes": computes, "spans": [span]}


def _nodes(value: Any) -> int | None:
    """A positive node count, else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


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
    out["computes"].update({name: info for name, info in new["computes"].items() if info})
    spans = [dict(s) for s in out["spans"]]
    for span in new["spans"]:
        if not span.get("points") and not span.get("ran"):
            continue
        if bridge and span.get("points"):
            start = span["points"][0][0]
            before = [
                s
                for s in spans
                if s.get("compute") == span.get("compute") and s.get("end") is not None and s.get("points")
            ]
            if before:
                last = max(before, key=lambda s: (s["end"], s["points"][0][0]))  # the latest span
                if 0 <= start - last["end"] <= BRIDGE_MAX:
                    last["end"] = start
        same = [s for s in spans if s.get("job") == span.get("job") and s.get("points") == span.get("points")]
        if not same:
            spans.append(dict(span))  # the same wait delivered twice (a retried event) is kept once
        elif span.get("ran") and not same[0].get("ran"):
            same[0]["ran"] = span["ran"]
    out["spans"] = spans
    return out


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
    usage: Any, *, jobs: set[str] | None = None, exclude: set[str] | None = None
) -> dict[str, dict[str, float]]:
    """Node-seconds by state per compute, over the union of the spans' times (``jobs``/``exclude``: which
    spans' times count); readings of one compute from any span are readings of the same cluster.

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
        out[compute] = seconds
    return out


# ------------------------------------------------- the attempts' own node time
@dataclass(frozen=True)
class Floor:
    """An attempt's node time by its own record: ``nodes`` held from ``start`` to ``end`` (wall-clock)."""

    job: str
    start: float
    end: float
    nodes: int
    lost: bool


def _runs(spans: Iterable[Mapping[str, Any]]) -> dict[str, tuple[float, float, int | None]]:
    """Per job: its run history times and named nodes (the widest record, if waits kept more than one)."""
    out: dict[str, tuple[float, float, int | None]] = {}
    for span in spans:
        ran, job = span.get("ran"), span.get("job")
        if not isinstance(job, str) or not isinstance(ran, list) or len(ran) != 3:
            continue
        start, end, nodes = ran
        numbers = (start, end)
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in numbers):
            continue
        if end <= start:
            continue
        old = out.get(job)
        if old is None or end - start > old[1] - old[0]:
            out[job] = (float(start), float(end), _nodes(nodes))
    return out


def attempt_floors(usage: Any, lost_jobs: Iterable[str] = ()) -> dict[str, list[Floor]]:
    """Per compute: each attempt's node time by its own record, which no read timing can lose.

    An attempt whose run history times the waits kept (``ran``: a failed or cancelled job) held its nodes
    from ``startTimeUtc`` to ``endTimeUtc``: the ``instanceCount`` its job resource names, or one when it
    names none (a Running job holds a node), never more than the cluster's ``maxNodeCount``. The reads
    refine it. A read inside the attempt's life (``CLOCK_MARGIN`` from either end) that saw fewer
    non-preempted nodes on the cluster than the attempt's, or the preempted count rise over the read
    before it (whatever it did before: a falling gauge hides nothing), says the nodes were not all there:
    the floor ends at the read before that one, and from there the reads alone count. One floor per
    attempt, each from its own record: floors of different attempts add up (``account``), none hides another.
    """
    usage = _valid(usage)
    lost = set(lost_jobs)
    by_compute: dict[str, list[Mapping[str, Any]]] = {}
    for span in usage["spans"]:
        if isinstance(span, Mapping) and isinstance(span.get("compute"), str):
            by_compute.setdefault(span["compute"], []).append(span)
    preempted = 1 + _PREEMPTED
    out: dict[str, list[Floor]] = {}
    for compute, spans in by_compute.items():
        runs = _runs(spans)
        if not runs:
            continue
        cap = _nodes((usage["computes"].get(compute) or {}).get("max_nodes"))
        points = sorted((p for s in spans for p in s.get("points") or []), key=lambda p: p[0])
        floors = []
        for job, (start, end, named) in sorted(runs.items()):
            nodes = min(named or 1, cap) if cap else named or 1
            last = start
            for before, read in itertools.pairwise(points):
                if not start + CLOCK_MARGIN < read[0] < end - CLOCK_MARGIN:
                    continue
                seen = sum(read[1:]) - read[preempted]  # the cluster's nodes not preempted
                if seen < nodes or read[preempted] > before[preempted]:
                    last = max(start, before[0])  # its nodes went (or were not yet there) after ``before``
                    break
            else:
                last = end
            if last > start:
                floors.append(Floor(job, start, last, nodes, job in lost))
        out[compute] = floors
    return out


def account(usage: Any, lost_jobs: Iterable[str] = ()) -> dict[str, dict[str, Any]]:
    """Per compute: node-seconds by state (``seconds``), those of the lost attempts (``lost``, not
    preempted) and of the rest of the work (``useful``, not preempted): the reads (``integrate``) with
    the attempts' own node time (``attempt_floors``) under them.

    At each moment the cluster's nodes not preempted are the most of what the reads say (linear between
    two readings, while a wait looked) and the sum of the floors of the attempts then alive (capped by
    ``maxNodeCount``); all its nodes the most of the reads' total and that sum, so a floor takes the
    nodes the reads placed in the ``preempted`` state before it adds any (one node, one state), and what
    the floors add is ``running``. Of the nodes not preempted, the kept attempts' floors are useful work
    first, then the lost attempts' floors are lost, and the rest is lost only while nothing but lost
    attempts' waits looked (as ``integrate(exclude=lost)`` has it). A moment is counted once, however many
    waits, tasks and attempts saw it: a run's usage gives the run's bill.
    """
    usage = _valid(usage)
    lost = set(lost_jobs)
    floors = attempt_floors(usage, lost)
    by_compute: dict[str, list[Mapping[str, Any]]] = {}
    for span in usage["spans"]:
        if isinstance(span, Mapping) and isinstance(span.get("compute"), str):
            by_compute.setdefault(span["compute"], []).append(span)
    out: dict[str, dict[str, Any]] = {}
    for compute, spans in by_compute.items():
        seen = [s for s in spans if s.get("points") and s.get("end") is not None]
        mine = floors.get(compute) or []
        if not seen and not mine:
            continue
        cap = _nodes((usage["computes"].get(compute) or {}).get("max_nodes"))
        points = sorted((p for s in seen for p in s["points"]), key=lambda p: p[0])
        out[compute] = _sweep(
            points,
            _union([(s["points"][0][0], s["end"]) for s in seen]),
            _union([(s["points"][0][0], s["end"]) for s in seen if s.get("job") not in lost]),
            mine,
            cap,
        )
    return out


@dataclass(frozen=True)
class _Moment:
    """What holds over one piece of ``_sweep``: who looked, and the floors (nodes) then alive."""

    looked: bool  # some wait looked (the reads count)
    only_lost_looked: bool  # only lost attempts' waits looked
    lost: float  # the lost attempts' floors, capped
    kept: float  # the other attempts' floors, capped
    both: float  # all floors, capped


def _counts_at(points: list[list[Any]], index: int, t: float) -> list[float]:
    """The reads' counts at ``t`` (``points[index]`` the last reading at or before it): linear to the next."""
    here = points[index]
    if index + 1 >= len(points) or points[index + 1][0] <= here[0]:
        return [float(v) for v in here[1:]]
    there = points[index + 1]
    w = (t - here[0]) / (there[0] - here[0])
    return [h + (x - h) * w for h, x in zip(here[1:], there[1:], strict=True)]


def _split(counts: list[float], m: _Moment) -> list[float]:
    """Node counts by state with the floors under them, then the lost and the useful nodes (not preempted)."""
    not_preempted = sum(counts) - counts[_PREEMPTED]
    nodes = max(not_preempted, m.both)  # not preempted
    everything = max(sum(counts), m.both)  # a floor takes the nodes the reads put in ``preempted`` first
    lost = min(nodes - m.kept, max(m.lost, not_preempted if m.only_lost_looked else 0.0))
    out = list(counts)
    out[_RUNNING] += nodes - not_preempted
    out[_PREEMPTED] = everything - nodes
    return [*out, lost, nodes - lost]


def _sweep(
    points: list[list[Any]],
    windows: list[tuple[float, float]],
    kept_windows: list[tuple[float, float]],
    floors: list[Floor],
    cap: int | None,
) -> dict[str, Any]:
    """``account`` for one compute: cut time where any term bends, so the trapezoid is exact on each piece."""
    times = [p[0] for p in points]
    events: dict[float, list[float]] = {}  # time -> [Δ looked, Δ kept looked, Δ lost floor, Δ kept floor]
    changes = [(windows, 0), (kept_windows, 1)]
    for spans, i in changes:
        for a, b in spans:
            events.setdefault(a, [0.0] * 4)[i] += 1
            events.setdefault(b, [0.0] * 4)[i] -= 1
    for f in floors:
        i = 2 if f.lost else 3
        events.setdefault(f.start, [0.0] * 4)[i] += f.nodes
        events.setdefault(f.end, [0.0] * 4)[i] -= f.nodes
    seconds = dict.fromkeys(STATES, 0.0)
    lost = useful = 0.0
    state = [0.0] * 4

    def capped(n: float) -> float:
        return max(0.0, n if cap is None else min(cap, n))

    for a, b in itertools.pairwise(sorted(set(events) | set(times))):
        state = [x + d for x, d in zip(state, events.get(a, [0.0] * 4), strict=True)]
        index = bisect.bisect_right(times, a) - 1
        looked = state[0] > 0.5 and index >= 0
        m = _Moment(looked, looked and state[1] < 0.5, capped(state[2]), capped(state[3]), capped(state[2] + state[3]))
        if not looked and m.both <= 0:
            continue

        def counts(t: float, index: int = index, looked: bool = looked) -> list[float]:
            return _counts_at(points, index, t) if looked else [0.0] * len(STATES)

        # the terms bend where the reads' nodes (not preempted, or all) cross a floor's level: cut there
        cuts = {a, b}
        ca, cb = counts(a), counts(b)
        levels = {m.both, m.lost, m.kept, m.both - m.kept, m.lost + m.kept}
        for fa, fb in ((sum(ca) - ca[_PREEMPTED], sum(cb) - cb[_PREEMPTED]), (sum(ca), sum(cb))):
            if fb != fa:
                cuts.update(t for t in (a + (lv - fa) * (b - a) / (fb - fa) for lv in levels) if a < t < b)
        for u, v in itertools.pairwise(sorted(cuts)):
            piece = [(x + y) / 2 * (v - u) for x, y in zip(_split(counts(u), m), _split(counts(v), m), strict=True)]
            for i, st in enumerate(STATES):
                seconds[st] += piece[i]
            lost += piece[-2]
            useful += piece[-1]
    return {"seconds": seconds, "lost": lost, "useful": useful}


# --------------------------------------------------------------- the estimate
def estimate(
    usage: Any,
    prices: Mapping[str, Mapping[str, Any] | None],
    *,
    lost_jobs: Iterable[str] = (),
    preemptions: int = 0,
) -> dict[str, Any]:
    """The bill of a job chain (or a run): node-hours by tier, evicted node-hours, cost, the all-dedicated
    equivalent and the savings. ``prices``: per compute ``{"dedicated": USD/h, "spot": USD/h, "source"}``
    or None (unknown); ``lost_jobs``: the attempts lost to preemption (not part of the dedicated
    equivalent). Definitions: docs/cost.md."""
    usage = _valid(usage)
    lost = set(lost_jobs)
    accounts = account(usage, lost)
    total = {name: entry["seconds"] for name, entry in accounts.items()}
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
        eq_seconds = accounts[name]["useful"]
        entry_cost = None if rate is None else node_seconds * rate / 3600.0
        computes[name] = {
            "vm_size": info.get("vm_size"),
            "location": info.get("location"),
            "tier": tier,
            "node_seconds": {s: round(v, 3) for s, v in seconds.items()},
            "node_hours": node_seconds / 3600.0,
            "hourly_price": rate,
            "dedicated_hourly_price": dedicated_rate,
            "price_source": price.get("source"),
            "cost": entry_cost,
        }
        hours_by_tier[tier] += node_seconds / 3600.0
        equivalent_hours += eq_seconds / 3600.0
        if node_seconds > 0 and entry_cost is None:
            unknown.append(name)
        cost = None if cost is None or (entry_cost is None and node_seconds > 0) else cost + (entry_cost or 0.0)
        if equivalent_cost is not None:
            if dedicated_rate is None and eq_seconds > 0:
                equivalent_cost = None
            else:
                equivalent_cost += eq_seconds * (dedicated_rate or 0.0) / 3600.0
    evicted = sum(s.get("preempted", 0.0) for s in total.values()) / 3600.0
    lost_seconds = sum(entry["lost"] for entry in accounts.values())
    savings = None if cost is None or equivalent_cost is None else equivalent_cost - cost
    if savings is None:
        pct = None
    elif equivalent_cost:
        pct = 100.0 * savings / equivalent_cost
    else:  # nothing billed either way (a run too short to price): nothing saved, not "unknown"
        pct = 0.0 if savings == 0 else None
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
    cluster at once are not billed twice; each compute is priced as its tasks' reports priced it.
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
            prices[name]["source"] = entry.get("price_source")
            if spot is not None:
                prices[name]["spot"] = spot
    lost = {j for r in reports for j in r.get("lost_jobs") or []}
    bill = estimate(usage, prices, lost_jobs=lost, preemptions=sum(int(r.get("preemptions") or 0) for r in reports))
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


def metrics(report: Mapping[str, Any]) -> list[tuple[str, str, float, dict[str, str]]]:
    """``(Stats method, name, value, tags)`` for a task's report; unknown values are left out."""
    base = {"dag_id": str(report.get("dag_id") or ""), "task_id": str(report.get("task_id") or "")}
    out: list[tuple[str, str, float, dict[str, str]]] = []
    for name, entry in sorted((report.get("computes") or {}).items()):
        tags = {**base, "compute": name, "tier": str(entry.get("tier"))}
        seconds = entry.get("node_seconds") or {}
        out.append(("gauge", "azureml.spot.node_hours", float(entry.get("node_hours") or 0.0), tags))
        out.append(("gauge", "azureml.spot.evicted_node_hours", float(seconds.get("preempted", 0.0)) / 3600.0, tags))
        if entry.get("cost") is not None:
            out.append(("gauge", "azureml.spot.cost", float(entry["cost"]), tags))
    out.append(("incr", "azureml.spot.preemptions", int(report.get("preemptions") or 0), base))
    equivalent = (report.get("dedicated_equivalent") or {}).get("cost")
    for name, value in (
        ("azureml.spot.dedicated_equivalent_cost", equivalent),
        ("azureml.spot.savings", report.get("savings")),
        ("azureml.spot.savings_pct", report.get("savings_pct")),
    ):
        if value is not None:
            out.append(("gauge", name, float(value), base))
    return out


def _money(value: float | None) -> str:
    return "unknown" if value is None else f"${value:,.4f}"


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
        f"  estimated cost     {_money(bill.get('cost'))}",
        f"  all-dedicated      {_money(eq.get('cost'))} ({eq.get('node_hours', 0.0):.4f} node-hours at pay-as-you-go)",
    ]
    savings, pct = bill.get("savings"), bill.get("savings_pct")
    if savings is not None and savings < 0:  # not "savings $-0.0003 (-110.8 %)"
        more = "" if pct is None else f" ({-pct:.1f} % more)"
        lines.append(f"  spot cost more     {_money(-savings)} more than all-dedicated{more}")
    else:
        lines.append(f"  savings            {_money(savings)}" + ("" if pct is None else f" ({pct:.1f} %)"))
    for name, entry in sorted((bill.get("computes") or {}).items()):
        rate = entry.get("hourly_price")
        lines.append(
            f"  {name}: {entry.get('tier')} {entry.get('vm_size')} in {entry.get('location')}, "
            f"{entry.get('node_hours', 0.0):.4f} node-hours at {'unknown' if rate is None else f'${rate}/h'}"
            f" ({entry.get('price_source') or 'no price'})"
        )
    if bill.get("cost_unknown"):
        lines.append(f"  cost unknown: {bill['cost_unknown']}")
    return "\n".join(lines)
