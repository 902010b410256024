"""The simulation that proves the spot policy (issue 11, section 5).

A fixed workload of partitions (one batch job each) runs on a low-priority cluster at eviction rates
from 0 to high, with spot priced at 20 %, 60 % and 95 % of dedicated, under three policies:
always-spot, always-dedicated (the fallback deployment), and ours (``airflow_azureml.spot_policy``,
called as the operator calls it: before each partition's first job and after each preemption, on a
``SpotHistory`` shared by every task on the cluster). Printed per cell: mean cost and makespan per
policy (as ratios to all-dedicated), our regret against the best policy in hindsight, and the
targets with OK/MISS. Writes ``docs/spot_policy.png`` (matplotlib, the ``[bench]`` extra).

The cluster is a fast model of the emulator's bill (``ClusterModel``; ``tests/integration/
test_spot_model.py`` holds it against ``Emulator.bill()``): every allocated node is billed from its
allocation, in every state; an evicted node stays billed (``preempted``) until it is deallocated,
``release`` later, and holds its slot until then (the cluster is full: ``max_instances`` = the job's
nodes), so its replacement is allocated only then and is billed from its own start-up; a
whole-cluster preemption ends the job, and the resubmitted job redoes all of its work.

Evictions: each running spot node is hit at ``rate`` an hour; half of the hits (``--whole-share``)
take the whole cluster (a capacity reclaim: the job is cancelled and resubmitted), the others one
node (its in-flight mini-batch is redone, the job goes on). Same seed, same random streams for every
policy (common random numbers: the regret is not noise).

    python benchmarks/spot_policy.py [--reps 200] [--partitions 48] [--no-plot] [--tune] [--record-start]
"""

from __future__ import annotations

import argparse
import heapq
import math
import random
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere
    sys.path.insert(0, str(ROOT))

from airflow_azureml import spot_policy  # noqa: E402

RATIOS = (0.2, 0.6, 0.95)
RATES = (0.0, 0.25, 0.5, 1.0, 2.0, 3.0, 4.0)  # evictions per spot node-hour
LOW_RATES = (0.0, 0.25, 0.5)  # "low eviction" for the savings target
POLICIES = ("always-spot", "always-dedicated", "ours")
EPOCH = 1_800_000_000.0  # the simulation's clock starts here (epoch seconds, for SpotHistory's decay)
TARGET_REGRET = 0.05
TARGET_SAVINGS = 0.60
TARGET_ABOVE_DEDICATED = 0.05


# ------------------------------------------------------------ the billing model
@dataclass
class NodeLife:
    """One node's life on a cluster, in hours: allocated (preparing) -> ready -> evicted -> deallocated."""

    allocated: float
    ready: float  # end of start-up (may lie after the node's end: it never got ready)
    evicted: float | None = None
    deallocated: float | None = None

    def billed(self, until: float) -> dict[str, float]:
        """Node-hours by state up to ``until``, by the emulator's rules (every state is billed)."""
        end = until if self.deallocated is None else min(self.deallocated, until)
        up_end = end if self.evicted is None else min(self.evicted, end)
        preparing = max(0.0, min(self.ready, up_end) - self.allocated)
        up = max(0.0, up_end - max(self.ready, self.allocated))
        preempted = 0.0 if self.evicted is None else max(0.0, end - self.evicted)
        return {"preparing": preparing, "up": up, "preempted": preempted}


@dataclass
class ClusterModel:
    """The nodes of one low-priority (or dedicated) cluster and their bill; times in any one unit."""

    startup: float
    release: float
    nodes: list[NodeLife] = field(default_factory=list)

    def allocate(self, at: float) -> NodeLife:
        node = NodeLife(allocated=at, ready=at + self.startup)
        self.nodes.append(node)
        return node

    def evict(self, node: NodeLife, at: float) -> float:
        """The node is preempted at ``at``; returns when it is deallocated (its slot free again)."""
        node.evicted = at
        node.deallocated = at + self.release
        return node.deallocated

    def end_job(self, live: list[NodeLife], at: float) -> None:
        """The job ended: its nodes that were not evicted are released at once (the emulator's ``_release``)."""
        for node in live:
            if node.evicted is None and node.deallocated is None:
                node.deallocated = at

    def bill(self, until: float = math.inf) -> dict[str, float]:
        total = {"preparing": 0.0, "up": 0.0, "preempted": 0.0}
        for node in self.nodes:
            for state, value in node.billed(until).items():
                total[state] += value
        total["total"] = total["preparing"] + total["up"] + total["preempted"]
        total["evicted"] = sum(sum(n.billed(until).values()) for n in self.nodes if n.evicted is not None)
        return total


# ------------------------------------------------------------ one job attempt
@dataclass(frozen=True)
class Workload:
    partitions: int = 48
    lanes: int = 4  # partitions scored at once (the mapped task's concurrency)
    nodes: int = 2  # the deployment's instance_count; the cluster's max_instances is the same
    work_hours: float = 0.5  # wall hours of work per partition on all its nodes, if nothing is evicted
    startup_hours: float = 5 / 60
    release_hours: float = 2 / 60  # an evicted node billed as preempted until deallocated
    mini_batch_hours: float = 1 / 60  # what one single-node eviction loses (its in-flight mini-batch)
    resubmit_hours: float = 35 / 3600  # observed preemption -> next job: one poll interval (30 s) + 5 s
    whole_share: float = 0.5
    record_start: bool = False  # ours records each spot job as it starts (SpotHistory.record_start)


@dataclass
class Attempt:
    start: float
    end: float
    completed: bool
    node_hours: float  # billed node-hours of this attempt (all its nodes, every state)
    running_node_hours: float  # hours its nodes were up (exposure to single-node evictions)
    evictions: int  # single-node evictions during it


def spot_attempt(rng: random.Random, w: Workload, rate: float, start: float) -> Attempt:
    """One spot job from its allocation to its completion or its whole-cluster preemption."""
    cluster = ClusterModel(w.startup_hours, w.release_hours)
    whole_rate = w.whole_share * w.nodes * rate  # per job-hour
    single_rate = (1 - w.whole_share) * rate  # per running node-hour
    preempt_at = start + rng.expovariate(whole_rate) if whole_rate > 0 else math.inf
    live: list[NodeLife] = [cluster.allocate(start) for _ in range(w.nodes)]
    events: list[tuple[float, int, str]] = [(node.ready, i, "ready") for i, node in enumerate(live)]
    heapq.heapify(events)
    needed = w.nodes * w.work_hours
    done, active, now, evictions = 0.0, 0, start, 0
    while True:
        next_event = events[0][0] if events else math.inf
        finish = now + (needed - done) / active if active else math.inf
        if finish <= min(next_event, preempt_at):
            cluster.end_job(live, finish)
            return _attempt(cluster, start, finish, True, evictions)
        if preempt_at <= next_event:
            for node in live:
                if node.evicted is None:
                    cluster.evict(node, preempt_at)
            return _attempt(cluster, start, preempt_at, False, evictions)
        at, slot, kind = heapq.heappop(events)
        done += active * (at - now)
        now = at
        node = live[slot]
        if kind == "ready":
            active += 1
            if single_rate > 0:
                heapq.heappush(events, (at + rng.expovariate(single_rate), slot, "evict"))
        else:  # one node evicted: its in-flight mini-batch goes back; a replacement once its slot is free
            active -= 1
            evictions += 1
            done -= (at - node.ready) % w.mini_batch_hours
            free = cluster.evict(node, at)
            live[slot] = cluster.allocate(free)
            heapq.heappush(events, (live[slot].ready, slot, "ready"))


def _attempt(cluster: ClusterModel, start: float, end: float, completed: bool, evictions: int) -> Attempt:
    bill = cluster.bill()
    return Attempt(start, end, completed, bill["total"], bill["up"], evictions)


def dedicated_attempt(w: Workload, start: float) -> Attempt:
    hours = w.startup_hours + w.work_hours
    return Attempt(start, start + hours, True, w.nodes * hours, w.nodes * w.work_hours, 0)


# ------------------------------------------------------------ the workload
Policy = Callable[["Lane", "Sim", float], bool]  # True: the next job goes to the fallback (dedicated)


@dataclass
class Lane:
    partition: int
    rng: random.Random
    preemptions: int = 0
    on_fallback: bool = False
    longest: float = 0.0  # longest preempted attempt of this partition (hours)
    attempt: int = 0

    @property
    def job(self) -> str:
        return f"p{self.partition}-r{self.attempt}"


@dataclass
class Sim:
    w: Workload
    rate: float
    ratio: float
    history: spot_policy.SpotHistory = field(default_factory=spot_policy.SpotHistory)
    prior: spot_policy.Prior = field(default_factory=spot_policy.Prior)
    cost: float = 0.0
    decisions: dict[str, int] = field(default_factory=dict)


def always_spot(lane: Lane, sim: Sim, now: float) -> bool:
    return False


def always_dedicated(lane: Lane, sim: Sim, now: float) -> bool:
    return True


def ours(lane: Lane, sim: Sim, now: float) -> bool:
    """The operator's call: the cluster's history, this partition's preemptions, both prices known."""
    w = sim.w
    decision = spot_policy.decide(
        spot_policy.PolicyInputs(
            spot_price=sim.ratio,
            dedicated_price=1.0,
            nodes=w.nodes,
            history=sim.history,
            preemptions=lane.preemptions,
            fallback_after=None,
            has_fallback=True,
            on_fallback=lane.on_fallback,
            unit_exposure_hours=lane.longest,
            startup_hours=w.startup_hours,
            release_hours=w.release_hours,
            lost_hours=w.mini_batch_hours / 2,  # the in-flight mini-batch, half done on average
            now=now,
            prior=sim.prior,
        )
    )
    sim.decisions[decision.rule] = sim.decisions.get(decision.rule, 0) + 1
    return decision.use_fallback


POLICY_FUNCS: dict[str, Policy] = {"always-spot": always_spot, "always-dedicated": always_dedicated, "ours": ours}


def run_workload(
    w: Workload, rate: float, ratio: float, policy: Policy, seed: int, prior: spot_policy.Prior | None = None
) -> tuple[float, float, Sim]:
    """Cost (dedicated price 1 per node-hour) and makespan (hours) of the whole workload."""
    sim = Sim(w, rate, ratio, prior=prior or spot_policy.Prior())
    ready: list[tuple[float, int, int]] = []  # (time, tie-break, lane index): a lane free to submit
    lanes: list[Lane | None] = [None] * w.lanes
    pending: list[tuple[float, int, int, Attempt, bool]] = []  # attempts in flight, by end time
    next_partition = 0
    seq = 0
    for index in range(w.lanes):
        heapq.heappush(ready, (0.0, seq, index))
        seq += 1
    makespan = 0.0

    def submit(at: float, index: int) -> None:
        nonlocal seq
        lane = lanes[index]
        assert lane is not None
        now = EPOCH + at * 3600
        dedicated = policy(lane, sim, now)
        lane.on_fallback = dedicated
        lane.attempt += 1
        if not dedicated and w.record_start:  # the operator, as wired today, records jobs only at their end
            sim.history = sim.history.record_start(lane.job, now)
        attempt = dedicated_attempt(w, at) if dedicated else spot_attempt(lane.rng, w, rate, at)
        heapq.heappush(pending, (attempt.end, seq, index, attempt, dedicated))
        seq += 1

    while ready or pending:
        if ready and (not pending or ready[0][0] <= pending[0][0]):
            at, _, index = heapq.heappop(ready)
            if next_partition >= w.partitions:
                continue
            lanes[index] = Lane(next_partition, random.Random(f"{seed}/{next_partition}"))
            next_partition += 1
            submit(at, index)
            continue
        end, _, index, attempt, dedicated = heapq.heappop(pending)
        lane = lanes[index]
        assert lane is not None
        sim.cost += attempt.node_hours * (1.0 if dedicated else ratio)
        now = EPOCH + end * 3600
        hours = attempt.end - attempt.start
        if attempt.completed:
            sim.history = sim.history.record_completion(
                run_hours=hours,
                now=now,
                on_spot=not dedicated,
                evictions=attempt.evictions,
                node_hours=attempt.running_node_hours,
                job=lane.job,
            )
            makespan = max(makespan, end)
            heapq.heappush(ready, (end, seq, index))
            seq += 1
            continue
        sim.history = sim.history.record_preemption(
            exposure_hours=hours,
            now=now,
            evictions=attempt.evictions,
            node_hours=attempt.running_node_hours,
            job=lane.job,
        )
        lane.preemptions += 1
        lane.longest = max(lane.longest, hours)
        # the preempted nodes hold the slots until deallocated; the fallback's are elsewhere
        submit(end + max(w.resubmit_hours, w.release_hours), index)
    return sim.cost, makespan, sim


# ------------------------------------------------------------ the grid
@dataclass
class Cell:
    ratio: float
    rate: float
    cost: dict[str, float]  # mean cost per policy
    makespan: dict[str, float]  # mean makespan per policy (hours)
    rules: dict[str, int]

    @property
    def best(self) -> str:
        return min(("always-spot", "always-dedicated"), key=lambda p: self.cost[p])

    @property
    def regret(self) -> float:
        return self.cost["ours"] / self.cost[self.best] - 1

    def vs_dedicated(self, policy: str = "ours") -> float:
        return self.cost[policy] / self.cost["always-dedicated"]


def run_grid(
    w: Workload, reps: int, seed: int, prior: spot_policy.Prior | None = None, ratios=RATIOS, rates=RATES
) -> list[Cell]:
    cells = []
    for ratio in ratios:
        for rate in rates:
            cost = dict.fromkeys(POLICIES, 0.0)
            span = dict.fromkeys(POLICIES, 0.0)
            rules: dict[str, int] = {}
            for rep in range(reps):
                for name in POLICIES:
                    c, m, sim = run_workload(w, rate, ratio, POLICY_FUNCS[name], seed * 100_003 + rep, prior)
                    cost[name] += c / reps
                    span[name] += m / reps
                    for rule, count in sim.decisions.items():
                        rules[rule] = rules.get(rule, 0) + count
            cells.append(Cell(ratio, rate, cost, span, rules))
    return cells


def report(cells: list[Cell], w: Workload, reps: int, seconds: float) -> tuple[str, bool]:
    lines = [
        f"workload: {w.partitions} partitions x {w.work_hours:g} h of work on {w.nodes} nodes, {w.lanes} at a time; "
        f"start-up {w.startup_hours * 60:g} min, evicted node billed {w.release_hours * 60:g} min, "
        f"mini-batch {w.mini_batch_hours * 60:g} min; {w.whole_share:.0%} of evictions take the whole cluster; "
        f"spot jobs recorded {'as they start and ' if w.record_start else ''}when they end",
        f"{reps} repetitions per cell, fixed seed; cost and makespan as ratios to always-dedicated "
        f"(dedicated = {w.partitions * w.nodes * (w.startup_hours + w.work_hours):g} node-hours at its price, "
        f"makespan {cells[0].makespan['always-dedicated']:.2f} h)",
        "",
        f"{'spot':>5} {'evict/h':>8} | {'cost: spot':>10} {'dedic.':>7} {'ours':>7} | "
        f"{'span: spot':>10} {'dedic.':>7} {'ours':>7} | {'best':>16} {'regret':>7}  ours: decisions per run by rule",
        "-" * 118,
    ]
    for c in cells:
        ded_cost, ded_span = c.cost["always-dedicated"], c.makespan["always-dedicated"]
        rules = " ".join(f"{k}={v / reps:.1f}" for k, v in sorted(c.rules.items()))
        lines.append(
            f"{c.ratio:>5.0%} {c.rate:>8g} | {c.cost['always-spot'] / ded_cost:>10.3f} {1.0:>7.3f} "
            f"{c.cost['ours'] / ded_cost:>7.3f} | {c.makespan['always-spot'] / ded_span:>10.2f} {1.0:>7.2f} "
            f"{c.makespan['ours'] / ded_span:>7.2f} | {c.best:>16} {c.regret:>+7.1%}  {rules}"
        )
    worst = max(cells, key=lambda c: c.regret)
    low = [c for c in cells if c.ratio == 0.2 and c.rate in LOW_RATES]
    savings = min(1 - c.vs_dedicated() for c in low)
    above = max(cells, key=lambda c: c.vs_dedicated())
    checks = [
        (
            worst.regret <= TARGET_REGRET,
            f"regret <= {TARGET_REGRET:.0%} in every cell: worst {worst.regret:+.1%} "
            f"(spot {worst.ratio:.0%}, {worst.rate:g} evictions/h)",
        ),
        (
            savings >= TARGET_SAVINGS,
            f"savings >= {TARGET_SAVINGS:.0%} vs all-dedicated at low eviction (<= {max(LOW_RATES):g}/h) with spot at "
            f"20 %: least {savings:.1%}",
        ),
        (
            above.vs_dedicated() - 1 <= TARGET_ABOVE_DEDICATED,
            f"never more than {TARGET_ABOVE_DEDICATED:.0%} above all-dedicated: most {above.vs_dedicated() - 1:+.1%} "
            f"(spot {above.ratio:.0%}, {above.rate:g} evictions/h)",
        ),
    ]
    lines.append("")
    lines.extend(f"{'OK  ' if ok else 'MISS'} {text}" for ok, text in checks)
    lines.append(f"({seconds:.0f} s)")
    return "\n".join(lines), all(ok for ok, _ in checks)


def plot(cells: list[Cell], path: Path) -> None:
    try:
        import matplotlib
        import matplotlib.ticker

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install -e '.[bench]'): no plot", file=sys.stderr)
        return
    ratios = sorted({c.ratio for c in cells})
    fig, axes = plt.subplots(1, len(ratios), figsize=(4.2 * len(ratios), 3.8), sharey=True)
    styles = {"always-spot": ("tab:orange", "o"), "always-dedicated": ("tab:blue", "s"), "ours": ("tab:green", "^")}
    for ax, ratio in zip(axes, ratios, strict=True):
        row = [c for c in cells if c.ratio == ratio]
        x = [c.rate for c in row]
        for name in POLICIES:
            colour, marker = styles[name]
            ax.plot(x, [c.vs_dedicated(name) for c in row], marker=marker, color=colour, label=name)
        ax.axhline(1 + TARGET_ABOVE_DEDICATED, color="grey", linestyle=":", linewidth=1)
        ax.set_yscale("log")
        ax.set_yticks([0.2, 0.5, 1, 2, 5])
        ax.yaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
        ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_xticks(range(math.ceil(max(x)) + 1))
        ax.xaxis.set_major_formatter(matplotlib.ticker.FormatStrFormatter("%g"))
        ax.set_title(f"spot at {ratio:.0%} of dedicated")
        ax.set_xlabel("evictions per spot node-hour")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("workload cost / all-dedicated")
    axes[0].legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


def tune(w: Workload, reps: int, seed: int) -> None:
    """How the prior was chosen: the worst regret (and the targets) for a grid of prior weights."""
    print(f"{'prior preemptions':>18} {'over hours':>10} | {'worst regret':>12} {'at':>14} | targets")
    for exposure in (0.5, 2.0, 8.0):
        for count in (0.025, 0.1, 0.4):
            prior = spot_policy.Prior(preemptions=count, exposure_hours=exposure, evictions=count, node_hours=exposure)
            cells = run_grid(w, reps, seed, prior)
            worst = max(cells, key=lambda c: c.regret)
            _, ok = report(cells, w, reps, 0)
            print(
                f"{count:>18g} {exposure:>10g} | {worst.regret:>+12.1%} {f'{worst.ratio:.0%}/{worst.rate:g}':>14} | "
                f"{'all OK' if ok else 'MISS'}"
            )


# ------------------------------------------------------------ deadline cells (issue 22, section 2)
TICK_HOURS = 5 / 60  # the grid the traces use (skypilot-org/spot-traces: 5-minute ticks)
DEADLINE_SLACKS = (1.1, 1.5, 2.0)  # the deadline as a multiple of the all-dedicated makespan
DEADLINE_POLICIES = ("always-spot", "always-dedicated", "ours", "ours+deadline", "uniform-progress")
PROCESSES = ("poisson", "regime", "bursty")
TARGET_OPTIMUM = 0.15  # ours with a deadline within 15 % of the hindsight optimum at 1.5x slack


@dataclass(frozen=True)
class DeadlineWork:
    """A chain of units of work on one lane, due by one deadline; times in ticks, prices per node-tick.

    Each unit is one job: a start-up tick, then its work; a preemption ends the job, and the unit is
    redone from nothing (the operator's model). A finished unit stays done: the workload's progress.
    """

    units: int = 12
    startup_ticks: int = 1
    work_ticks: int = 6
    ratio: float = 0.3  # spot price / dedicated price

    @property
    def unit_ticks(self) -> int:
        return self.startup_ticks + self.work_ticks

    @property
    def makespan_ticks(self) -> int:
        """All on dedicated: never preempted."""
        return self.units * self.unit_ticks


def preemption_times(process: str, rng: random.Random, hours: float) -> list[float]:
    """Whole-cluster preemption times (hours) from one synthetic process, up to ``hours``.

    - ``poisson``: stationary, 0.5 an hour.
    - ``regime``: calm (0.1 an hour, 3 h on average) and storms (2 an hour, 45 min on average), switching as
      a two-state Markov chain that starts in its stationary state (0.48 an hour in the long run).
    - ``bursty``: bursts start at 0.15 an hour; each brings 1 + Geometric(1/3) preemptions (3 on average)
      10 minutes apart on average (0.45 an hour in the long run).
    """
    times: list[float] = []
    if process == "poisson":
        t = rng.expovariate(0.5)
        while t < hours:
            times.append(t)
            t += rng.expovariate(0.5)
    elif process == "regime":
        calm_rate, storm_rate, calm_mean, storm_mean = 0.1, 2.0, 3.0, 0.75
        storm = rng.random() < storm_mean / (calm_mean + storm_mean)
        t = 0.0
        while t < hours:
            end = t + rng.expovariate(1 / (storm_mean if storm else calm_mean))
            rate = storm_rate if storm else calm_rate
            at = t + rng.expovariate(rate)
            while at < min(end, hours):
                times.append(at)
                at += rng.expovariate(rate)
            t, storm = end, not storm
    elif process == "bursty":
        t = rng.expovariate(0.15)
        while t < hours:
            at = t
            count = 1
            while rng.random() < 2 / 3:
                count += 1
            for _ in range(count):
                times.append(at)
                at += rng.expovariate(6.0)  # 10 minutes apart on average
            t += rng.expovariate(0.15)
        times = sorted(x for x in times if x < hours)
    else:
        raise ValueError(f"unknown process {process!r}")
    return times


def next_hits(times: list[float], ticks: int) -> list[int]:
    """``next_hits[t]``: the first tick at or after ``t`` in which a preemption falls (``ticks`` when none)."""
    hit = [False] * ticks
    for at in times:
        tick = int(at / TICK_HOURS)
        if tick < ticks:
            hit[tick] = True
    out = [ticks] * (ticks + 1)
    for t in range(ticks - 1, -1, -1):
        out[t] = t if hit[t] else out[t + 1]
    return out


@dataclass
class Chain:
    """An online policy's view at a decision point: before a unit's job, or after its preemption."""

    w: DeadlineWork
    deadline: int  # ticks from the start
    t: int = 0
    done: int = 0
    preemptions: int = 0  # of the current unit
    on_fallback: bool = False  # the current unit moved to the fallback (it stays there)
    history: spot_policy.SpotHistory = field(default_factory=spot_policy.SpotHistory)
    rules: dict[str, int] = field(default_factory=dict)


ChainPolicy = Callable[[Chain], bool]  # True: the next job goes to dedicated


def chain_ours(with_deadline: bool) -> ChainPolicy:
    """``spot_policy.decide`` as the operator calls it. With a deadline, each unit's own deadline is the
    workload's less the dedicated time of the units queued behind it (what each task of a chain is given)."""

    def policy(c: Chain) -> bool:
        w = c.w
        behind = (w.units - c.done - 1) * w.unit_ticks
        deadline = EPOCH + (c.deadline - behind) * TICK_HOURS * 3600 if with_deadline else None
        decision = spot_policy.decide(
            spot_policy.PolicyInputs(
                spot_price=w.ratio,
                dedicated_price=1.0,
                nodes=1,
                history=c.history,
                preemptions=c.preemptions,
                has_fallback=True,
                on_fallback=c.on_fallback,
                startup_hours=w.startup_ticks * TICK_HOURS,
                release_hours=0.0,
                lost_hours=0.0,
                restart_hours=0.0,  # the next job starts in the tick after the preemption's
                now=EPOCH + c.t * TICK_HOURS * 3600,
                deadline=deadline,
            )
        )
        c.rules[decision.rule] = c.rules.get(decision.rule, 0) + 1
        return decision.use_fallback

    return policy


def uniform_progress(c: Chain) -> bool:
    """Uniform Progress (Wu et al., NSDI '24), written from its description, at this model's decision points.

    Progress (units done) is kept at least proportional to the time elapsed over the deadline window:
    behind that line the next job goes to dedicated, on or ahead of it to spot. Jobs here are whole units
    (a preempted one is redone), so a switch happens before a job, not inside one. With the safety net
    the paper's policies share: when the time left cannot absorb one more lost attempt before the rest
    finishes on dedicated, dedicated.
    """
    w = c.w
    left = c.deadline - c.t
    if left < (w.units - c.done + 1) * w.unit_ticks:
        return True
    return c.done * c.deadline < w.units * c.t  # behind: done / units < t / deadline


CHAIN_POLICIES: dict[str, ChainPolicy] = {
    "always-spot": lambda c: False,
    "always-dedicated": lambda c: True,
    "ours": chain_ours(False),
    "ours+deadline": chain_ours(True),
    "uniform-progress": uniform_progress,
}


def run_chain(w: DeadlineWork, hits: list[int], deadline: int, policy: ChainPolicy) -> tuple[float, int, Chain]:
    """Cost (dedicated node-ticks) and finish tick of the chain under ``policy`` on one trace."""
    horizon = len(hits) - 1
    seed = spot_policy.SpotHistory().record_completion(
        run_hours=w.unit_ticks * TICK_HOURS, now=EPOCH - 3600, on_spot=False
    )  # a cluster seen before: the work of a unit is known, its preemption rate is not
    c = Chain(w, deadline, history=seed)
    cost = 0.0
    while c.done < w.units and c.t < horizon:
        dedicated = policy(c)
        now = EPOCH + c.t * TICK_HOURS * 3600
        if dedicated:
            cost += w.unit_ticks
            c.t += w.unit_ticks
            c.history = c.history.record_completion(
                run_hours=w.unit_ticks * TICK_HOURS, now=EPOCH + c.t * TICK_HOURS * 3600, on_spot=False
            )
            c.done, c.preemptions, c.on_fallback = c.done + 1, 0, False
            continue
        hit = hits[min(c.t, horizon)]
        if hit >= c.t + w.unit_ticks:
            cost += w.unit_ticks * w.ratio
            c.t += w.unit_ticks
            c.history = c.history.record_completion(
                run_hours=w.unit_ticks * TICK_HOURS, now=EPOCH + c.t * TICK_HOURS * 3600, on_spot=True
            )
            c.done, c.preemptions, c.on_fallback = c.done + 1, 0, False
            continue
        lost = hit - c.t + 1  # the preemption's tick is billed
        cost += lost * w.ratio
        c.t = hit + 1
        c.history = c.history.record_preemption(exposure_hours=lost * TICK_HOURS, now=now + lost * TICK_HOURS * 3600)
        c.preemptions += 1
    return cost, c.t if c.done == w.units else horizon, c


def hindsight_optimum(w: DeadlineWork, hits: list[int], deadline: int) -> float:
    """The cheapest schedule that meets the deadline knowing the trace: dynamic programming over (unit, tick).

    At each tick a unit may start on dedicated, start on spot (only where no preemption falls inside its
    job: knowing the trace, a job that would be preempted is never worth starting, waiting is free), or
    wait a tick.
    """
    u, n = w.unit_ticks, w.units
    inf = math.inf
    best = [[inf] * (deadline + 2) for _ in range(n + 1)]
    for t in range(deadline + 1):
        best[n][t] = 0.0
    for t in range(deadline, -1, -1):
        for i in range(n - 1, -1, -1):
            value = best[i][t + 1] if t + 1 <= deadline else inf
            if t + u <= deadline:
                after = best[i + 1][t + u]
                value = min(value, u + after)
                if hits[t] >= t + u:
                    value = min(value, u * w.ratio + after)
            best[i][t] = value
    return best[0][0]


POISSON_RATE = 0.5  # preemption_times("poisson"): an hour


def online_optimum(w: DeadlineWork, deadline: int, rate: float = POISSON_RATE) -> tuple[ChainPolicy, float]:
    """The cheapest policy that never misses the deadline, knowing the Poisson process but not the trace: a
    dynamic programme over (units done, tick) with the chance ``p`` that a preemption falls in a tick. The
    bound of the 15 % target: on a memoryless process no online policy can expect less (waiting teaches
    nothing), whereas the hindsight optimum never starts a job that a preemption would end.

    Returns the policy (to run on the same traces as the others) and its expected cost from the start.
    """
    p = 1 - math.exp(-rate * TICK_HOURS)
    u, n, r = w.unit_ticks, w.units, w.ratio
    inf = math.inf
    value = [[inf] * (deadline + 2) for _ in range(n + 1)]
    spot = [[False] * (deadline + 2) for _ in range(n + 1)]
    for t in range(deadline + 1):
        value[n][t] = 0.0
    for t in range(deadline, -1, -1):
        for i in range(n - 1, -1, -1):
            if t + u > deadline or value[i + 1][t + u] == inf:
                continue  # nothing finishes the rest by the deadline from here
            best = u + value[i + 1][t + u]  # dedicated
            expected, survive = 0.0, 1.0
            for k in range(u):  # a preemption in the job's k-th tick: k + 1 ticks billed, the unit redone
                after = value[i][t + k + 1] if t + k + 1 <= deadline else inf
                if after == inf:  # a preemption then could miss the deadline: spot is no option here
                    expected = inf
                    break
                expected += survive * p * ((k + 1) * r + after)
                survive *= 1 - p
            expected += survive * (u * r + value[i + 1][t + u])
            if expected < best:
                best, spot[i][t] = expected, True
            value[i][t] = best

    def policy(c: Chain) -> bool:
        return not (c.t <= deadline and spot[c.done][c.t])

    return policy, value[0][0]


@dataclass
class DeadlineCell:
    process: str
    slack: float
    cost: dict[str, float]  # mean cost per policy, and "optimum"
    misses: dict[str, int]

    def ratio(self, policy: str) -> float:
        return self.cost[policy] / self.cost["optimum"]


def run_deadline_grid(w: DeadlineWork, reps: int, seed: int) -> list[DeadlineCell]:
    """Every policy on the same traces (common random numbers): one trace per process and repetition."""
    cells = []
    horizon = 20 * w.makespan_ticks  # always-spot may take long; nothing runs past this
    for process in PROCESSES:
        traces = [
            next_hits(
                preemption_times(process, random.Random(f"{seed}/{process}/{rep}"), horizon * TICK_HOURS), horizon
            )
            for rep in range(reps)
        ]
        for slack in DEADLINE_SLACKS:
            deadline = round(slack * w.makespan_ticks)
            cost = dict.fromkeys((*DEADLINE_POLICIES, "optimum"), 0.0)
            misses = dict.fromkeys(DEADLINE_POLICIES, 0)
            policies = dict(CHAIN_POLICIES)
            if process == "poisson":  # the bound: the best policy that knows the process, not the trace
                policies["online-optimum"], _ = online_optimum(w, deadline)
                cost["online-optimum"], misses["online-optimum"] = 0.0, 0
            for hits in traces:
                cost["optimum"] += hindsight_optimum(w, hits, deadline) / reps
                for name, chain_policy in policies.items():
                    c, finish, _ = run_chain(w, hits, deadline, chain_policy)
                    cost[name] += c / reps
                    misses[name] += finish > deadline
            cells.append(DeadlineCell(process, slack, cost, misses))
    return cells


def deadline_report(cells: list[DeadlineCell], w: DeadlineWork, reps: int, seconds: float) -> tuple[str, bool]:
    short = {"always-spot": "spot", "always-dedicated": "dedic.", "ours": "ours", "ours+deadline": "ours+dl"}
    short["uniform-progress"] = "UP"
    names = [short[p] for p in DEADLINE_POLICIES]
    lines = [
        f"deadline cells: {w.units} units in a chain, each {w.startup_ticks} start-up + {w.work_ticks} work ticks of "
        f"{TICK_HOURS * 60:g} min (all-dedicated makespan {w.makespan_ticks * TICK_HOURS:g} h); spot at "
        f"{w.ratio:.0%} of dedicated; a preemption redoes the unit; {reps} traces per process, the same for "
        "every policy",
        "",
        f"{'process':>8} {'slack':>5} | cost / hindsight optimum: "
        + " ".join(f"{n:>7}" for n in names)
        + " | misses: "
        + " ".join(f"{n:>7}" for n in names),
        "-" * 120,
    ]
    for c in cells:
        lines.append(
            f"{c.process:>8} {c.slack:>4g}x | {'':>25}"
            + " ".join(f"{c.ratio(p):>7.3f}" for p in DEADLINE_POLICIES)
            + f" | {'':>7}"
            + " ".join(f"{c.misses[p]:>7d}" for p in DEADLINE_POLICIES)
        )
    missed = sum(c.misses["ours+deadline"] for c in cells)
    checks = [(missed == 0, f"0 misses for ours with a deadline where dedicated alone meets it: {missed}")]
    for process in PROCESSES:
        row = [c for c in cells if c.process == process]
        ours = sum(c.cost["ours+deadline"] for c in row)
        up = sum(c.cost["uniform-progress"] for c in row)
        checks.append((ours <= up, f"{process}: cost no higher than Uniform Progress: ours {ours / up:.3f} x UP"))
        mid = [c for c in row if c.slack == 1.5]
        if mid:
            gap = mid[0].ratio("ours+deadline") - 1
            checks.append(
                (gap <= TARGET_OPTIMUM, f"{process}: within {TARGET_OPTIMUM:.0%} of the optimum at 1.5x: {gap:+.1%}")
            )
    lines.append("")
    for c in cells:
        if "online-optimum" in c.cost:
            lines.append(
                f"{c.process} {c.slack:g}x: the best policy that knows the process but not the trace (a dynamic "
                f"programme) costs {c.ratio('online-optimum'):.3f} x the hindsight optimum "
                f"({c.misses['online-optimum']} misses); ours with a deadline "
                f"{c.cost['ours+deadline'] / c.cost['online-optimum'] - 1:+.1%} over it"
            )
    lines.extend(f"{'OK  ' if ok else 'MISS'} {text}" for ok, text in checks)
    lines.append(f"({seconds:.0f} s)")
    return "\n".join(lines), all(ok for ok, _ in checks)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=200)
    parser.add_argument("--partitions", type=int, default=Workload.partitions)
    parser.add_argument("--whole-share", type=float, default=Workload.whole_share)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--plot", type=Path, default=ROOT / "docs" / "spot_policy.png")
    parser.add_argument("--no-plot", action="store_true")
    parser.add_argument("--tune", action="store_true", help="print the worst regret for a grid of priors")
    parser.add_argument(
        "--record-start", action="store_true", help="record each spot job as it starts (running exposure counts)"
    )
    parser.add_argument(
        "--deadline", action="store_true", help="the deadline cells (synthetic preemption processes) instead"
    )
    args = parser.parse_args(argv)
    if args.deadline:
        started = time.perf_counter()
        work = DeadlineWork()
        text, ok = deadline_report(run_deadline_grid(work, args.reps, args.seed), work, args.reps, 0)
        print(text.replace("(0 s)", f"({time.perf_counter() - started:.0f} s)"))
        return 0 if ok else 1
    w = replace(Workload(), partitions=args.partitions, whole_share=args.whole_share, record_start=args.record_start)
    if args.tune:
        tune(w, max(20, args.reps // 5), args.seed)
        return 0
    started = time.perf_counter()
    cells = run_grid(w, args.reps, args.seed)
    text, ok = report(cells, w, args.reps, time.perf_counter() - started)
    print(text)
    if not args.no_plot:
        plot(cells, args.plot)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())


__all__: list[Any] = ["ClusterModel", "NodeLife", "Workload", "run_workload", "spot_attempt"]
