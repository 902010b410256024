"""The verdicts' confusion matrix: how often a preemption is resubmitted, and a person's cancel is not.

A fast model of the wait, swept over randomised timelines (fixed seed). It drives the provider's real
parts: ``polling.JobWatch`` (the poll schedule and its back-off, the evidence cadence between polls,
which reads count as taken while the job ran) and ``outcomes.classify``; then the operator's
``on_ambiguous_cancel`` rule. Only Azure is modelled: when a job starts and ends, what the cluster's
``preemptedNodeCount`` and ``currentNodeCount`` say at each read, and run history's start and end
times (with a clock skew). ``tests/integration/test_verdict_model.py`` holds the model to the
emulator through the real SDK waits (sync and deferred).

Swept: the preemption time, uniform over the job's whole life (also before the first read); Azure's
delay from lost nodes to Canceled, 0-120 s; node replacement, 0-10 min after the loss; poll intervals
5, 30, 60, 120 s and the default back-off (30 s growing to 300 s); single- and multi-node clusters,
dedicated to the job or shared with another job; a person's cancel through a logged path (the Azure
Activity Log shows it 0-15 min later) and an unlogged one (Studio's); a person's cancel of job A while
job B's nodes on the same cluster are preempted; and, after every person's cancel, whole-cluster
preemptions at 1 an hour (a person's cancel followed at once by one must stay a person's).

Printed: the matrix per poll setting, each target OK or MISS, the delay from a preemption to the
decision to resubmit (p50, max; the evidence wait included), what the cadence costs in compute reads,
and the corners of the sweep that leave no evidence. The baseline in the same run
is the wait without the evidence cadence (the cluster read only at polls).

    python benchmarks/verdicts.py [--runs 16000] [--seed 7] [--unlogged-runs 200000] [--processes 2]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import random
import statistics
import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.airflow_home import use_a_scratch_airflow_home

use_a_scratch_airflow_home()  # the provider's modules below import Airflow

from airflow_azureml import lifecycle  # noqa: E402
from airflow_azureml.lifecycle import BackOff, CheckDuplicate, Limits, ResubmissionState, Resubmit  # noqa: E402
from airflow_azureml.lifecycle_verdict import EVIDENCE_RECHECK  # noqa: E402
from airflow_azureml.outcomes import ActivityEvidence, GaugeEvidence, JobSnapshot, Outcome, classify  # noqa: E402
from airflow_azureml.polling import GaugeReading, JobWatch, PollingPolicy  # noqa: E402

WALL = 1_700_000_000.0  # the model's epoch: the wait's monotonic 0 is this wall-clock time
MAX_STEPS = 100_000  # a wait that takes more steps than this is a hang
DEFAULT_BACKOFF = PollingPolicy()  # 30 s growing by 1.5 to 300 s, jitter 10 %
SETTINGS: dict[str, PollingPolicy] = {
    "5 s": PollingPolicy(interval=5, max_interval=5, jitter=0),
    "30 s": PollingPolicy(interval=30, max_interval=30, jitter=0),
    "60 s": PollingPolicy(interval=60, max_interval=60, jitter=0),
    "120 s": PollingPolicy(interval=120, max_interval=120, jitter=0),
    "backoff 30-300 s": DEFAULT_BACKOFF,
}
# Whole-cluster preemptions that strike the cluster anyway, at this rate, after a person's cancel: a read
# then must not turn the person's cancel into a preemption. Far above what published spot traces show
# for one cluster, so the false-resubmission figure is an upper bound.
BACKGROUND_PREEMPTIONS_PER_HOUR = 1.0
LOG_LAG_MAX = 900.0  # the Activity Log's ingestion lag, 0-15 min
EVIDENCE_WAIT = Limits().evidence_wait  # what "resubmit" waits for late evidence before resubmitting
KINDS = ("preemption", "person (logged)", "person (unlogged)", "person's cancel of A, B preempted")


@dataclass(frozen=True)
class Timeline:
    """One job's life on one cluster, in seconds from the submit (Azure's side of the model)."""

    kind: str
    nodes: int  # the cluster's nodes (currentNodeCount, preempted ones included)
    job_nodes: int  # the job's own (instance_count)
    shared: bool  # another job runs on the cluster too
    start: float  # Queued -> Running
    length: float  # how long it would run
    end: float  # when it ended (Canceled, or Completed)
    status_at_end: str
    lost_at: float | None  # every node of the cluster preempted (a preemption), or B's nodes (A-while-B)
    lost_nodes: int  # how many nodes the loss took
    replaced_after: float  # the lost nodes stop counting as preempted this long after the loss
    cancel_requested_at: float | None  # CancelRequested from then until ``end`` (a person's or Azure's cancel)
    skew: float  # run history's clock minus ours
    logged_after: float | None = None  # a logged cancel shows in the Activity Log this long after it was sent

    def activity(self, t: float) -> ActivityEvidence:
        """The Activity Log as read at ``t``: the cancel request, once ingested, if it went through ARM."""
        if self.cancel_requested_at is None or self.logged_after is None:
            return ActivityEvidence(read=True)
        if t < self.cancel_requested_at + self.logged_after:
            return ActivityEvidence(read=True)
        return ActivityEvidence(read=True, cancels=(("a-person", WALL + self.cancel_requested_at),))

    def status(self, t: float) -> str:
        if t < self.start:
            return "Queued"
        if t >= self.end:
            return self.status_at_end
        if self.cancel_requested_at is not None and t >= self.cancel_requested_at:
            return "CancelRequested"
        return "Running"

    def preempted(self, t: float) -> int:
        if self.lost_at is not None and self.lost_at <= t < self.lost_at + self.replaced_after:
            return self.lost_nodes
        return 0

    def snapshot(self, t: float) -> JobSnapshot:
        status = self.status(t)
        ended = status in ("Canceled", "Completed")
        return JobSnapshot(
            name="a",
            status=status,
            compute="spot",
            instance_count=self.job_nodes,
            started_at=WALL + self.start + self.skew if ended else None,
            ended_at=WALL + self.end + self.skew if ended else None,
        )

    def reading(self, t: float) -> GaugeReading:
        return GaugeReading("spot", True, self.preempted(t), t, self.nodes, at=WALL + t)


def draw(rng: random.Random, kind: str) -> Timeline:
    nodes = rng.choice((1, 2, 4))
    shared = nodes > 1 and rng.random() < 0.5
    job_nodes = max(1, nodes // 2) if shared else nodes
    start = rng.uniform(0, 120)  # the queue and the nodes' start-up
    length = 8 * (900 ** rng.random())  # 8 s to 2 h, log-uniform: short jobs as often as long ones
    skew = rng.uniform(-0.5, 0.5)
    base = dict(nodes=nodes, job_nodes=job_nodes, shared=shared, start=start, length=length, skew=skew)
    if kind == "preemption":
        lost = start + rng.uniform(0, length)
        delay = rng.uniform(0, 120)  # Azure's delay from lost nodes to Canceled
        replaced = rng.uniform(0, 600)
        return Timeline(
            kind,
            **base,
            end=lost + delay,
            status_at_end="Canceled",
            lost_at=lost,
            lost_nodes=nodes,
            replaced_after=replaced,
            # Azure's own cancel shows CancelRequested too (as the emulator's does), from some time after the loss
            cancel_requested_at=lost + rng.uniform(0, delay),
        )
    cancel = start + rng.uniform(0, length)
    landed = cancel + rng.uniform(0, 60)  # CancelRequested until then: Azure documents no bound
    if kind == "person's cancel of A, B preempted":
        shared, nodes = True, max(nodes, 2)
        job_nodes = max(1, nodes // 2)
        other = nodes - job_nodes  # B's nodes only: the cluster is not wholly preempted
        return Timeline(
            kind,
            nodes=nodes,
            job_nodes=job_nodes,
            shared=True,
            start=start,
            length=length,
            end=landed,
            status_at_end="Canceled",
            lost_at=cancel + rng.uniform(-60, 60),
            lost_nodes=other,
            replaced_after=rng.uniform(0, 600),
            cancel_requested_at=cancel,
            skew=skew,
            logged_after=rng.uniform(0, LOG_LAG_MAX),  # the person's cancel of A went through ARM
        )
    background = cancel + rng.expovariate(BACKGROUND_PREEMPTIONS_PER_HOUR / 3600)
    return Timeline(
        kind,
        **base,
        end=landed,
        status_at_end="Canceled",
        lost_at=background,
        lost_nodes=nodes,
        replaced_after=rng.uniform(0, 600),
        cancel_requested_at=cancel,
        logged_after=rng.uniform(0, LOG_LAG_MAX) if kind == "person (logged)" else None,
    )


@dataclass
class Result:
    outcome: Outcome
    ambiguous: bool
    seen_ended: float | None  # when the wait saw the job ended (None: a hang)
    reads: int
    witness: str = ""
    snapshot: JobSnapshot | None = None
    gauge: GaugeEvidence | None = None
    timeline: Timeline | None = None


def wait(timeline: Timeline, policy: PollingPolicy, rng: random.Random) -> Result:
    """The sync wait's loop (``AzureMLHook.wait_for_job_evidence``; the triggerer's poller runs the same
    ``JobWatch`` schedule), on the model's clock."""
    watch = JobWatch(policy, started=0.0)
    t = rng.uniform(0, 2)  # the first poll, just after the submit
    reads = 0
    for _ in range(MAX_STEPS):
        snapshot = timeline.snapshot(t)
        delay = watch.observe(snapshot, now=t)
        if delay is None:
            watch.offer_gauge(timeline.reading(t + 0.2), now=t + 0.3)  # the wait's read at the end
            verdict = classify(snapshot, gauge=watch.gauge, activity=timeline.activity(t + 0.5))
            return Result(
                verdict.outcome, verdict.ambiguous, t, reads, verdict.witness, snapshot, watch.gauge, timeline
            )
        next_poll = t + delay
        now = t + 0.2  # the compute read follows the job read
        while True:
            reads += 1
            watch.offer_gauge(timeline.reading(now), now=now + 0.1)
            if watch.wants_poll_now():  # as the waits do: every node preempted, poll the job at once
                next_poll = now + 0.2
                break
            evidence = watch.evidence_delay(now=now + 0.1)
            if evidence is None or now + 0.1 + evidence >= next_poll:
                break
            now = now + 0.1 + evidence
        t = next_poll
    return Result(Outcome.RUNNING, False, None, reads)


def decide(result: Result, on_ambiguous: str) -> float | None:
    """The lifecycle's own decisions on the ended job (``lifecycle.verdict``, ``on_end``, ``after_cancel``), as
    the operator carries them out: when it decides to resubmit (model seconds), or None (the try fails).
    A wait for late evidence moves the clock on and asks again, with the Activity Log as it is then."""
    assert result.snapshot is not None and result.timeline is not None and result.seen_ended is not None
    limits = Limits(on_ambiguous_cancel="resubmit" if on_ambiguous == "resubmit" else "fail")
    state = ResubmissionState(key="k", job_names=[result.snapshot.name], next_resubmission=1)
    t, gauge = result.seen_ended + 0.5, result.gauge
    for _ in range(4 + int(EVIDENCE_WAIT // EVIDENCE_RECHECK)):  # the wait looks again every EVIDENCE_RECHECK
        activity = result.timeline.activity(t)
        decision, found = lifecycle.verdict(state, result.snapshot, gauge, activity)
        decision = lifecycle.on_end(decision.state, result.snapshot.name, found, limits, watched=True, now=t)
        last = decision.actions[-1]
        if isinstance(last, CheckDuplicate):
            decision = lifecycle.after_cancel(
                decision.state, last.job, watched=True, kept_instead=None, limits=limits, resubmit=last.resubmit, now=t
            )
            last = decision.actions[-1]
        state = decision.state
        if isinstance(last, Resubmit):
            return t
        if not isinstance(last, lifecycle.Wait):
            return None
        t += next(a.seconds for a in decision.actions if isinstance(a, BackOff))
        gauge = None  # the wait's reads are not repeated: the try after the wait has the kept reason only
    raise AssertionError("the lifecycle kept waiting")


def resubmitted(result: Result, on_ambiguous: str) -> bool:
    return decide(result, on_ambiguous) is not None


def decided_after(result: Result, lost_at: float) -> float:
    """From the loss to the decision to resubmit (the evidence wait included)."""
    when = decide(result, "fail")
    assert when is not None
    return when - lost_at


def corner(timeline: Timeline, policy: PollingPolicy) -> str:
    """Why a preemption left no evidence (the model knows what the wait could not)."""
    if timeline.replaced_after < policy.evidence_interval:
        return "nodes replaced within one evidence interval of the loss"
    if timeline.lost_at is not None and timeline.lost_at < timeline.start + min(policy.interval, 30):
        return "lost within the first poll interval of the run"
    return "other"


def one_timeline(tag: str, i: int, kind: str, label: str, policy: PollingPolicy) -> tuple[Timeline, Result]:
    """Timeline ``i`` of ``kind`` and its wait at poll setting ``label``, each from its own seeded generator
    (common random numbers: timeline *i* is the same at every poll setting, and a change to how one kind is
    drawn leaves the others' timelines as they were)."""
    timeline = draw(random.Random(f"{tag}-{i}"), kind)
    random.seed(f"{tag}-{label}-{i}-jitter")  # the back-off's jitter (PollingPolicy.delay) draws from here
    return timeline, wait(timeline, policy, random.Random(f"{tag}-{label}-{i}"))


def sweep(runs: int, seed: int, cadence: bool) -> dict[str, Any]:
    table: dict[str, Any] = {}
    for label, base in SETTINGS.items():
        policy = base if cadence else replace(base, evidence_interval=1e9)  # baseline: reads only at polls
        rows: dict[str, dict[str, int]] = {kind: {"n": 0, "fail": 0, "resubmit": 0, "hang": 0} for kind in KINDS}
        delays: list[float] = []
        corners: dict[str, int] = {}
        reads: list[float] = []
        waited: list[int] = []
        for i in range(runs):
            kind = KINDS[i % len(KINDS)]
            timeline, result = one_timeline(str(seed), i, kind, label, policy)
            row = rows[kind]
            row["n"] += 1
            if result.seen_ended is None:
                row["hang"] += 1
                continue
            row_resubmitted = resubmitted(result, "fail")
            row["fail"] += row_resubmitted
            row["resubmit"] += resubmitted(result, "resubmit")
            if result.seen_ended >= 3600:  # waits of an hour or more: what the cadence costs an hour
                reads.append(result.reads / (result.seen_ended / 3600))
            if kind == "preemption" and result.witness == "gauge_near_end":
                waited.append(1)
            if kind == "preemption":
                if row_resubmitted and timeline.lost_at is not None:
                    delays.append(decided_after(result, timeline.lost_at))
                elif not row_resubmitted:
                    key = corner(timeline, policy)
                    corners[key] = corners.get(key, 0) + 1
        table[label] = {
            "rows": rows,
            "delays": delays,
            "corners": corners,
            "reads_per_hour": reads,
            "waited": len(waited),
        }
    return table


def unlogged_chunk(task: tuple[int, str, int, int]) -> int:
    """Unlogged persons' cancels resubmitted under the default ``"fail"``, of timelines ``lo``..``hi`` - 1 of that
    kind alone at one poll setting. Timeline *i* is drawn from its own generator, so chunks add up to the same
    count however they are split between processes."""
    seed, label, lo, hi = task
    hits = 0
    for i in range(lo, hi):
        _, result = one_timeline(f"{seed}-unlogged", i, "person (unlogged)", label, SETTINGS[label])
        hits += result.seen_ended is not None and resubmitted(result, "fail")
    return hits


UNLOGGED_CHUNK = 5000


def unlogged_rates(runs: int, seed: int, processes: int) -> dict[str, tuple[int, int]]:
    """The unlogged persons' rate at every poll setting, from ``runs`` timelines of that kind alone per setting:
    the matrix's quarter share (4,000) leaves the rate a sampling error of about 0.15 point, as large as its
    distance from the 1 % target. ``processes`` > 1 splits the timelines between worker processes."""
    tasks = [
        (seed, label, lo, min(lo + UNLOGGED_CHUNK, runs)) for label in SETTINGS for lo in range(0, runs, UNLOGGED_CHUNK)
    ]
    if processes > 1:
        with multiprocessing.get_context("spawn").Pool(processes) as pool:
            counts = pool.map(unlogged_chunk, tasks, chunksize=1)
    else:
        counts = [unlogged_chunk(task) for task in tasks]
    hits = {label: 0 for label in SETTINGS}
    for (_, label, _, _), count in zip(tasks, counts, strict=True):
        hits[label] += count
    return {label: (hits[label], runs) for label in SETTINGS}


def wilson(hits: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """The 95 % Wilson interval of a share, in percent."""
    if n == 0:
        return 0.0, 100.0
    share = hits / n
    centre = (share + z * z / (2 * n)) / (1 + z * z / n)
    half = z * ((share * (1 - share) / n + z * z / (4 * n * n)) ** 0.5) / (1 + z * z / n)
    return 100 * max(0.0, centre - half), 100 * min(1.0, centre + half)


def pct(part: int, whole: int) -> float:
    return 100.0 * part / whole if whole else 0.0


def report(
    table: dict[str, Any], title: str, targets: bool, unlogged: dict[str, tuple[int, int]] | None = None
) -> list[str]:
    print(f"\n## {title}")
    print(f"{'poll':<18}{'kind':<36}{'n':>6}{'resubmitted, fail':>20}{'resubmitted, resubmit':>24}{'hangs':>7}")
    misses: list[str] = []
    for label, data in table.items():
        for kind, row in data["rows"].items():
            print(
                f"{label:<18}{kind:<36}{row['n']:>6}{pct(row['fail'], row['n']):>19.2f}%"
                f"{pct(row['resubmit'], row['n']):>23.2f}%{row['hang']:>7}"
            )
        if not targets:
            continue
        bound = 97.0 if label == "120 s" else 99.0
        recall = pct(data["rows"]["preemption"]["fail"], data["rows"]["preemption"]["n"])
        row = data["rows"]["person (unlogged)"]
        hits, n = unlogged[label] if unlogged else (row["fail"], row["n"])
        low, high = wilson(hits, n)
        print(
            f"{'':<18}unlogged persons' cancels resubmitted, {n} timelines of that kind alone: "
            f"{pct(hits, n):.2f} % (95 % interval {low:.2f}-{high:.2f} %)"
        )
        checks = [
            (f"preemptions resubmitted >= {bound:.0f} %", recall >= bound),
            ("0 logged persons' cancels resubmitted", data["rows"]["person (logged)"]["fail"] == 0),
            ("<= 1 % of unlogged persons' cancels resubmitted (the 95 % interval's top)", high <= 1.0),
            ("0 hangs", all(r["hang"] == 0 for r in data["rows"].values())),
        ]
        delays = sorted(data["delays"])
        p50 = statistics.median(delays) if delays else float("nan")
        worst = delays[-1] if delays else float("nan")
        reads = statistics.median(data["reads_per_hour"]) if data["reads_per_hour"] else 0
        share = pct(data["waited"], data["rows"]["preemption"]["n"])
        print(
            f"{'':<18}preemption -> decision to resubmit: p50 {p50:.0f} s, max {worst:.0f} s "
            f"({share:.1f} % waited {EVIDENCE_WAIT:.0f} s for the Activity Log: seen only near its end); "
            f"compute reads per hour of a wait, median {reads:.0f}"
        )
        for name, ok in checks:
            print(f"{'':<18}{'OK  ' if ok else 'MISS'} {name} (default on_ambiguous_cancel='fail')")
            if not ok:
                misses.append(f"{label}: {name}")
        for key, count in sorted(data["corners"].items(), key=lambda kv: -kv[1]):
            print(f"{'':<18}no evidence: {count} preemption(s), {key}")
    return misses


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=16000, help="timelines per poll setting (a quarter per kind)")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--unlogged-runs",
        type=int,
        default=200000,
        help="unlogged persons' cancels per poll setting for that target's rate (0: the matrix's own quarter)",
    )
    parser.add_argument(
        "--processes",
        type=int,
        default=os.cpu_count() or 1,
        help="worker processes for the unlogged persons' timelines (the same counts at any number)",
    )
    args = parser.parse_args(argv)
    print(f"verdicts: {args.runs} timelines per poll setting, seed {args.seed}")
    print("columns: the share of each kind resubmitted under on_ambiguous_cancel='fail' (the default) and 'resubmit'")
    baseline = sweep(args.runs, args.seed, cadence=False)
    report(baseline, "baseline: the cluster read only at polls (no evidence cadence)", targets=False)
    table = sweep(args.runs, args.seed, cadence=True)
    unlogged = unlogged_rates(args.unlogged_runs, args.seed, args.processes)
    title = f"the provider: reads every {DEFAULT_BACKOFF.evidence_interval:.0f} s between polls"
    misses = report(table, title, True, unlogged if args.unlogged_runs > 0 else None)
    base_recall = {k: pct(v["rows"]["preemption"]["fail"], v["rows"]["preemption"]["n"]) for k, v in baseline.items()}
    new_recall = {k: pct(v["rows"]["preemption"]["fail"], v["rows"]["preemption"]["n"]) for k, v in table.items()}
    print("\n## preemptions resubmitted, provider / baseline")
    for label in SETTINGS:
        print(f"{label:<18}{new_recall[label]:6.2f}% / {base_recall[label]:6.2f}%")
    print("\nresult:", "every target OK" if not misses else "MISS: " + "; ".join(misses))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
