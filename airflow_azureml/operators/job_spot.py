"""The spot cluster as the job operators see it: its shared history, and the policy that reads it.

A collaborator of ``operators/job_base.py`` behind five calls: ``decide`` (stay on spot or move to the
fallback), ``check_deadline`` (before a unit's first job: can anything still meet its deadline?),
``record`` (what a watched job showed), ``close`` (a job's end closes its running entry) and
``started`` (a job seen Running on spot counts as exposure from now). The rules are in ``spot_policy``;
the store is ``spot_history_store``; this module only wires them to one unit's jobs.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, NoReturn

if TYPE_CHECKING:
    from airflow_azureml.hooks.azure_ml import AzureMLHook
    from airflow_azureml.lifecycle import ResubmissionState
    from airflow_azureml.outcomes import JobSnapshot
    from airflow_azureml.spot_history_store import HistoryStore
    from airflow_azureml.spot_policy import PolicyInputs, SpotHistory


@dataclass(frozen=True)
class SpotDecision:
    """A ``spot_policy.Decision`` as the operator logs it."""

    decision: Any

    @property
    def use_fallback(self) -> bool:
        return bool(self.decision.use_fallback)

    @property
    def rule(self) -> str:
        return str(self.decision.rule)

    def log_inputs(self) -> dict[str, Any]:
        d = self.decision
        costs = {"expected_spot": d.spot_cost, "expected_fallback": d.fallback_cost} if d.spot_cost is not None else {}
        return {"reason": d.reason, **costs, **d.inputs}


def held_hours(state: ResubmissionState, job: str) -> float:
    """Hours one job of the chain was seen Running on spot (its waits' status changes)."""
    from airflow_azureml import cost

    usage = state.usage or {}
    spans = [s for s in usage.get("spans") or [] if s.get("job") == job]
    return cost.spot_exposure_hours({**usage, "spans": spans}) if spans else 0.0


def spot_compute(state: ResubmissionState) -> dict[str, Any]:
    """What the chain's compute reads say of the spot cluster: size, region, a start-up time."""
    from airflow_azureml import cost

    usage = state.usage or {}
    for name, info in (usage.get("computes") or {}).items():
        if (info or {}).get("tier") == "low_priority" and info.get("vm_size"):
            found = {"name": name, "vm_size": info["vm_size"], "location": info.get("location")}
            startups = [v for v in cost.startup_seconds(usage).values() if v]
            if startups:
                found["startup_hours"] = sorted(startups)[len(startups) // 2] / 3600.0
            return found
    return {}


class SpotCluster:
    """One task's view of its spot cluster: ``target`` keys the shared history (None: no spot history).

    ``remember`` stores the unit's state: a job is marked recorded there before its record is written,
    so a retry or a clear never records it twice. ``stores`` caches the history stores by target.
    ``deadline``: the unit's deadline, resolved (epoch seconds; None: none). ``fail_infeasible``: True, a deadline
    nothing meets fails the task (``on_infeasible_deadline="fail"`` on a first try's start); False, asked for but
    not applicable here (a later try, a resume); None, not asked for.
    """

    def __init__(
        self,
        hook: AzureMLHook,
        target: str | None,
        *,
        has_fallback: bool,
        fallback_after: int | None,
        manual_prices: dict[str, dict[str, float]],
        remember: Callable[[ResubmissionState], None],
        log: logging.Logger,
        stores: dict[str, HistoryStore] | None = None,
        deadline: float | None = None,
        fail_infeasible: bool | None = None,
    ) -> None:
        self.deadline = deadline
        self.fail_infeasible = fail_infeasible
        self.hook = hook
        self.target = target
        self.has_fallback = has_fallback
        self.fallback_after = fallback_after
        self.manual_prices = manual_prices
        self.remember = remember
        self.log = log
        self._stores: dict[str, HistoryStore] = {} if stores is None else stores

    def store(self) -> HistoryStore | None:
        """The shared history store (kept in ``stores``: finding it may read the workspace)."""
        if not self.target:
            return None
        if self.target not in self._stores:
            self._stores[self.target] = self.hook.spot_history_store(self.target)
        return self._stores[self.target]

    def decide(self, state: ResubmissionState, snapshot: JobSnapshot | None) -> SpotDecision:
        """``spot_policy.decide`` on this cluster's history, the hourly prices and this unit's jobs so far."""
        from airflow_azureml import spot_policy

        try:
            return SpotDecision(spot_policy.decide(self._inputs(state, snapshot, prices=True)))
        except ValueError as exc:  # a stored value the policy refuses: the hard rules still hold
            hard = self.fallback_after is not None and state.preemptions >= self.fallback_after
            rule = spot_policy.RULE_FALLBACK_AFTER if hard else "policy_inputs_refused"
            reason = f"the policy refused its inputs ({exc}); only fallback_after applies"
            return SpotDecision(spot_policy.Decision(hard, rule, reason))

    def check_deadline(self, state: ResubmissionState) -> None:
        """Before a unit's first job: say at once what the deadline allows, as a warning when nothing meets it.

        By default never fails the task: the work estimate comes from the cluster's history (other units' jobs
        too), and Airflow's own deadline alerts notify, they do not stop a run. A deadline nothing can meet sends
        the unit to the fallback to finish as early as it can (``spot_policy.decide``); one already past is
        missed and not applied. With ``fail_infeasible`` (``on_infeasible_deadline="fail"``: late output is
        worth nothing) both fail the task instead, before any job is sent (docs/spot_policy.md).
        """
        from airflow_azureml import deadline as deadlines
        from airflow_azureml import spot_policy

        try:
            planned = spot_policy.deadline_plan(self._inputs(state, None, prices=False))
        except ValueError as exc:  # a stored value the policy refuses: nothing to check against
            self.log.info("The deadline cannot be checked: the policy refused its inputs (%s).", exc)
            return
        if planned is None:
            return
        deadline, now = _when(planned.deadline), _when(planned.now)
        work = "unknown" if planned.work_hours is None else f"{planned.work_hours:.3g} h"
        if planned.verdict == deadlines.VERDICT_INFEASIBLE and planned.hours_left <= 0:
            if self.fail_infeasible:
                self._fail(f"Deadline {deadline} has passed (now {now}).", "run it without the deadline")
            self.log.warning(
                "Deadline %s has passed (now %s): it is missed already and not applied; the unit runs as it would "
                "without a deadline.",
                deadline,
                now,
            )
            return
        if planned.verdict == deadlines.VERDICT_INFEASIBLE:
            fastest = "unknown" if planned.fastest_finish is None else _when(planned.fastest_finish)
            on = "even on dedicated compute" if self.has_fallback else "even on spot with no preemption (no fallback)"
            said = (
                f"Deadline {deadline} cannot be met {on}: now {now}, work estimate {work} (the cluster's history), "
                f"fastest finish {fastest} ({planned.reason})."
            )
            if self.fail_infeasible:
                instead = "finish on the fallback as early as it can" if self.has_fallback else "run on spot anyway"
                self._fail(said, instead)
            then = "The unit goes to the fallback to finish as early as it can."
            then = then if self.has_fallback else "With no fallback, it runs on spot."
            if self.fail_infeasible is False:
                then += " (on_infeasible_deadline='fail' applies to a first try's start only: a later try or a resume "
                then += "may follow a job sent before, which failing would leave unwatched.)"
            self.log.warning("%s %s", said, then)
            return
        if planned.verdict == deadlines.VERDICT_UNKNOWN and planned.work_hours is not None:
            # only a lower bound of the work: no promise that a late preemption still leaves time
            self.log.warning("Deadline %s: spot is tried without its promise (%s).", deadline, planned.reason)
            return
        if planned.verdict == deadlines.VERDICT_UNKNOWN:
            self.log.info("Deadline %s: it cannot be checked yet (%s).", deadline, planned.reason)
            return
        self.log.info(
            "Deadline %s: %s; now %s, work estimate %s, fastest finish %s, slack %.3g h, margin %.3g h.",
            deadline,
            "spot may be tried" if planned.verdict == deadlines.VERDICT_SPOT else "only the fallback still makes it",
            now,
            work,
            _when(planned.fastest_finish or planned.now),
            planned.slack_hours or 0.0,
            planned.margin_hours or 0.0,
        )

    def _inputs(self, state: ResubmissionState, snapshot: JobSnapshot | None, *, prices: bool) -> PolicyInputs:
        """The policy's inputs now: the cluster's history, this unit's jobs, the deadline, and the hourly
        prices when ``prices`` (a read of the prices API; the deadline needs none)."""
        from airflow_azureml import spot_policy

        store = self.store()
        history, known = store.load() if store else (spot_policy.SpotHistory(), {})
        info = {**known, **spot_compute(state)}
        dedicated = spot = None
        if prices and info.get("vm_size"):
            try:
                rates = self.hook.hourly_prices(info["vm_size"], info.get("location"), self.manual_prices)
            except Exception as exc:  # unknown prices turn the expected-cost rule off; they never fail the task
                self.log.info("Could not read prices for %s: %s", info["vm_size"], type(exc).__name__)
                rates = None
            dedicated, spot = rates if rates else (None, None)
        extra: dict[str, Any] = {}
        if isinstance(info.get("startup_hours"), (int, float)) and info["startup_hours"] > 0:
            extra["startup_hours"] = float(info["startup_hours"])
        nodes = snapshot.instance_count if snapshot is not None and snapshot.instance_count else 1
        return spot_policy.PolicyInputs(
            spot_price=spot,
            dedicated_price=dedicated,
            nodes=max(1, int(nodes)),
            history=history,
            preemptions=state.preemptions,
            fallback_after=self.fallback_after,
            has_fallback=self.has_fallback,
            on_fallback=bool(state.fallback_rule),
            unit_exposure_hours=max((held_hours(state, job) for job in state.lost), default=0.0),
            now=time.time(),
            deadline=self.deadline,
            **extra,
        )

    def _fail(self, said: str, instead: str) -> NoReturn:
        """``on_infeasible_deadline="fail"``: the task fails here, before any job is sent; not retried."""
        from airflow_azureml.exceptions import AzureMLDeadlineError

        raise AzureMLDeadlineError(
            f"{said} No job was sent (on_infeasible_deadline='fail'): move the deadline, or set "
            f"on_infeasible_deadline='fallback' to {instead}."
        )

    def record(self, state: ResubmissionState, job: str, *, preempted: bool) -> None:
        """What this job showed of the spot cluster goes to its shared history, once per job.

        Only what a wait observed counts: a job with no compute reading adds nothing. Its hours are
        the time its waits saw it Running, or, when no poll caught it Running, from the first compute
        reading of its wait to the wait's end.
        """
        from airflow_azureml import cost

        store = self.store()
        usage = state.usage or {}
        spans = [s for s in usage.get("spans") or [] if s.get("job") == job and s.get("points")]
        if store is None or job in state.recorded:
            return
        if not spans:  # no wait of this task saw it run: what it showed is unknown, but it runs no more
            self.close(state, job)
            return
        state.recorded.append(job)
        self.remember(state)
        tiers = {((usage.get("computes") or {}).get(s.get("compute")) or {}).get("tier") for s in spans}
        on_spot = "low_priority" in tiers
        job_usage = {**usage, "spans": spans}
        wall = sum(max(0.0, (s.get("end") or s["points"][-1][0]) - s["points"][0][0]) for s in spans) / 3600.0
        held = held_hours(state, job)
        hours = held if held > 0 else wall  # seen Running: from then (queue time is no exposure); else the wait
        evicted = float(sum(cost.evictions(job_usage).values())) if on_spot else 0.0
        node_hours = sum(sum(v.values()) for v in cost.integrate(job_usage).values()) / 3600.0 if on_spot else 0.0
        seen = spot_compute(state)

        def change(history: SpotHistory, known: dict[str, Any]) -> tuple[SpotHistory, dict[str, Any]]:
            now = time.time()
            if preempted:
                history = history.record_preemption(
                    exposure_hours=hours, now=now, evictions=evicted, node_hours=node_hours, job=job
                )
            else:
                history = history.record_completion(
                    run_hours=hours, now=now, on_spot=on_spot, evictions=evicted, node_hours=node_hours, job=job
                )
            return history, {**known, **seen}

        store.update(change)

    def close(self, state: ResubmissionState, job: str) -> None:
        """A job that failed or was cancelled leaves the cluster's running jobs; the time its waits saw it
        Running is exposure without a preemption. Once per job, like ``record``."""
        store = self.store()
        if store is None or job in state.recorded or state.on_fallback(job):
            return
        state.recorded.append(job)
        self.remember(state)
        held = held_hours(state, job)
        store.update(lambda history, known: (history.record_end(job=job, exposure_hours=held, now=time.time()), known))

    def started(self, job: str) -> None:
        """A spot job a wait saw Running counts as exposure from now until it ends (concurrent partitions'
        too). Its queue time never counts; a deferred job's exposure is recorded at its end."""
        store = self.store()
        if store is None or not self.has_fallback:
            return
        store.update(lambda history, known: (history.record_start(job, time.time()), known))


def _when(epoch: float) -> str:
    """Epoch seconds as an ISO-8601 UTC time, to the second (as the log and the error show a deadline)."""
    return datetime.fromtimestamp(epoch, tz=timezone.utc).isoformat(timespec="seconds")
