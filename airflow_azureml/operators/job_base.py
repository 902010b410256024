"""What every job-submitting operator shares: exactly once, waiting, deferral, cancels, resubmission.

Subclasses say what the work is (``work_identity``) and how to submit one job (``submit_job``);
everything else lives here, once.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from airflow_azureml import compat, naming
from airflow_azureml.compat import conf
from airflow_azureml.exceptions import (
    AzureMLConfigError,
    AzureMLError,
    AzureMLJobPreemptedError,
    AzureMLJobQueueTimeoutError,
)
from airflow_azureml.links.studio import AzureMLStudioJobLink, AzureMLStudioPreviousJobLink
from airflow_azureml.operators.base import AzureMLBaseOperator
from airflow_azureml.outcomes import Classification, GaugeEvidence, JobSnapshot, Outcome, classify, exception_for

if TYPE_CHECKING:
    from airflow_azureml.spot_history_store import HistoryStore
    from airflow_azureml.spot_policy import SpotHistory

MAX_CHAIN = 1000  # upper bound on the job names one unit of work can have
MAX_BACKOFF = 600.0
MAX_RECORDED = 200  # jobs remembered as recorded in the shared spot history (a chain is far shorter)
# How long a job may stay out of the jobs LIST after it was created. Azure documents no bound (ARM
# lists are eventually consistent); the tests hold the emulator's LIST up to 60 s behind. A try that
# finds an earlier try's submit unfinished looks for its job this long before submitting again.
LIST_LAG_SECONDS = 90.0
# task_state_store key (one row per DAG run, task and map index; retries and clears share it).
# Renaming it breaks in-flight retries.
STATE_KEY = "azureml_job"
VERDICT_XCOM_KEY = "azureml_verdict"
COST_XCOM_KEY = "azureml_cost"  # the chain's bill (cost.estimate); cost.run_bill combines a run's


@dataclass
class ResubmissionState:
    """Where one unit of work stands for this run of the task.

    ``airflow_canceled`` holds the jobs whose cancel is Airflow's, recorded by ``on_kill`` (or the
    queue-time limit) *before* the cancel was sent: Azure sends nothing that tells such a cancel
    from a person's. The record holds only if the next try first sees the job ``CancelRequested`` or
    ``Canceled``; a job still running then (the cancel failed) is dropped from it and watched.
    ``before_clear`` holds the jobs that had ended, or were being cancelled, when the task was last
    cleared: the clear is the request to run the work again, so their cancel is never final. A job
    still running at the clear is not in it: the try watches it, and a person's cancel is final.
    """

    key: str
    job_names: list[str] = field(default_factory=list)  # the chain, oldest first, as Azure named the jobs
    next_resubmission: int = 0
    preemptions: int = 0  # counted against this run of the task's budget
    counted: list[str] = field(default_factory=list)  # preempted jobs already counted (a retry counts none twice)
    airflow_canceled: list[str] = field(default_factory=list)
    reported_cancels: list[str] = field(default_factory=list)  # a person's cancels a try already failed on
    before_clear: list[str] = field(default_factory=list)
    known: list[str] = field(default_factory=list)  # jobs this run of the task had seen before this try
    backoff_done: str | None = None  # preempted job whose back-off was already spent in the triggerer
    fallback_rule: str | None = None  # the rule that moved this run of the task to the fallback (then it stays)
    fallback_from: int | None = None  # the first resubmission number sent to the fallback
    recorded: list[str] = field(default_factory=list)  # jobs already in the cluster's shared history
    canceled_at: dict[str, float] = field(default_factory=dict)  # when each of Airflow's cancels was recorded
    deferred_on: str | None = None  # the job a try deferred on and has not come back from
    # Jobs a cleared try found Airflow cancelling (its on_kill's, or its trigger's) and cancelled again: the
    # clear asked for the work to run again, so a Running read after that cancel is the cancel not shown yet.
    clear_cancels: list[str] = field(default_factory=list)
    max_tries: int | None = None
    cleared: bool = False
    usage: dict[str, Any] = field(default_factory=dict)  # the chain's node counts, every wait's (cost.py)
    # Written before a submit is sent, cleared once its job is recorded: {"n": resubmission, "at": epoch s}.
    # Found set by the next try, the submit may have created a job that neither its name nor the LIST shows yet.
    submitting: dict[str, Any] | None = None

    @property
    def current(self) -> str | None:
        return self.job_names[-1] if self.job_names else None

    @property
    def resubmits(self) -> int:
        return max(0, len(self.job_names) - 1)

    def to_store(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "job": self.current,
            "jobs": list(self.job_names),
            "preemptions": self.preemptions,
            "counted": list(self.counted),
            "airflow_canceled": list(self.airflow_canceled),
            "reported_cancels": list(self.reported_cancels),
            "before_clear": list(self.before_clear),
            "backoff_done": self.backoff_done,
            "fallback_rule": self.fallback_rule,
            "fallback_from": self.fallback_from,
            "recorded": list(self.recorded[-MAX_RECORDED:]),
            "canceled_at": dict(self.canceled_at),
            "deferred_on": self.deferred_on,
            "clear_cancels": list(self.clear_cancels),
            "max_tries": self.max_tries,
            "usage": self.usage,
            "submitting": self.submitting,
        }


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


@dataclass(frozen=True)
class Listed:
    """A job from the unit's LIST and when Azure created it (ARM ``systemData.createdAt``)."""

    snapshot: JobSnapshot
    created: datetime | None

    @classmethod
    def from_rest(cls, arm_job: dict[str, Any]) -> Listed:
        stamp = (arm_job.get("systemData") or {}).get("createdAt") or (
            (arm_job.get("properties") or {}).get("creationContext") or {}
        ).get("createdAt")
        return cls(JobSnapshot.from_rest(arm_job), parse_time(stamp))

    def order(self) -> tuple[bool, datetime, str]:
        """The same in every run: oldest first, then by name; a job without a creation time last."""
        return (self.created is None, self.created or datetime.max.replace(tzinfo=timezone.utc), self.snapshot.name)


def check_count(label: str, value: Any, meaning: str) -> None:
    """A whole number >= 0: ``2.5`` or ``True`` would silently become another budget (``True`` is 1)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise AzureMLConfigError(f"{label} must be a whole number >= 0 ({meaning}), got {value!r}.")
    if value < 0:
        raise AzureMLConfigError(f"{label} must be >= 0 ({meaning}), got {value}.")


def _refused(exc: BaseException) -> bool:
    """The service (or our own validation) refused a request outright: it created nothing."""
    from azure.core.exceptions import HttpResponseError  # azure-core only, not azure.ai.ml

    seen: BaseException | None = exc
    for _ in range(5):  # the hook re-raises the SDK's error as AzureMLError: its status is on the context
        if seen is None:
            return False
        if isinstance(seen, AzureMLConfigError):
            return True
        if isinstance(seen, HttpResponseError) and isinstance(seen.status_code, int):
            return 400 <= seen.status_code < 500 and seen.status_code not in (408, 409, 429)
        seen = seen.__cause__ or seen.__context__
    return False


def parse_time(stamp: Any) -> datetime | None:
    """An ARM timestamp (``Z`` or an offset, 0 to 7 fraction digits) as an aware UTC datetime."""
    if not isinstance(stamp, str) or not stamp:
        return None
    text = stamp.strip().replace("Z", "+00:00")
    head, sep, tail = text.partition(".")
    if sep:  # Azure may send 7 fraction digits; Python reads at most 6
        digits = len(tail) - len(tail.lstrip("0123456789"))
        tail = tail[:digits][:6].ljust(6, "0") + tail[digits:]
        text = f"{head}.{tail}"
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        return None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=timezone.utc)


class AzureMLJobOperatorBase(AzureMLBaseOperator):
    """Submit one job per unit of work, wait for it (polling or deferred), resubmit preemptions.

    Exactly once: the unit of work is identified by the work itself (``work_identity``: for a batch
    invoke the endpoint, deployment, rendered inputs and outputs), or by ``job_identity`` when given.
    Every job carries the unit key and its resubmission number as job properties (and tags where
    the API allows), so a later try finds the unit's jobs with one filtered LIST before it submits
    anything, whatever name Azure gave them. The requested names ``<dag>-<task>-<key>-r<n>`` are
    also looked up, so jobs are found even when the LIST lags.
    """

    operator_extra_links = (AzureMLStudioJobLink(), AzureMLStudioPreviousJobLink())

    def __init__(
        self,
        *,
        max_resubmits: int = 3,
        resubmit_backoff: float = 30.0,
        loop_after: int = 2,
        fallback_after: int | None = None,
        job_identity: str | None = None,
        experiment_name: str | None = None,
        max_queue_time: float | str | None = None,
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        prices: dict[str, dict[str, float]] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.prices = prices  # hourly USD by VM size and tier, set by hand (docs/cost.md); else the prices API
        self._manual_prices: dict[str, dict[str, float]] = {}
        self.max_queue_time = max_queue_time
        self.max_resubmits = max_resubmits
        self.resubmit_backoff = resubmit_backoff
        self.loop_after = loop_after
        self.fallback_after = fallback_after
        self.job_identity = job_identity
        self.experiment_name = experiment_name
        self.deferrable = deferrable
        self._state: ResubmissionState | None = None
        self._context: Any = None
        self._cost_report: dict[str, Any] | None = None  # this run's bill, for the OpenLineage facet

    # ------------------------------------------------------- subclass contract
    def submit_job(self, context: Any, name: str, fallback: str | None, markers: dict[str, str]) -> str | None:
        """Submit one job, requesting ``name``; ``fallback`` is ``fallback_target()`` once the policy moved there.

        ``markers`` must be set as job properties (and tags where possible). Returns the name the
        service gave the job (Azure may ignore the requested one).
        """
        raise NotImplementedError

    def work_identity(self) -> dict[str, Any]:
        """What the job does, rendered: the default identity of the unit of work."""
        raise NotImplementedError

    def fallback_target(self) -> str | None:
        """Where the work goes when spot does not pay (a deployment for batch, a compute for command jobs)."""
        return None

    def check_fallback(self) -> None:
        """Before a unit's first job: the fallback exists and runs on dedicated compute (else a config error)."""

    def _check_dedicated(self, compute: str | None, what: str) -> None:
        from airflow_azureml.specs import short_name

        name = short_name(compute or "")
        facts = self.hook.compute_facts(name) if name else None
        if facts is None:
            raise AzureMLConfigError(f"{what} runs on compute {compute!r}, which does not exist in the workspace.")
        if facts.low_priority:
            raise AzureMLConfigError(
                f"{what} runs on compute {name!r}, a low-priority cluster: a fallback from spot must be dedicated."
            )

    def validate(self) -> None:
        """Check the input without Azure; subclasses extend. Runs before any API call."""
        from airflow_azureml.specs import check_seconds  # not at DAG parse

        if self.max_queue_time not in (None, ""):
            seconds = check_seconds("max_queue_time", self.max_queue_time)  # may arrive rendered; never nan/inf
            self.polling = replace(self.polling, max_queue_time=seconds)
        check_count("max_resubmits", self.max_resubmits, "resubmissions of preempted jobs per run of the task")
        from airflow_azureml.hooks.prices import check_manual_prices

        self._manual_prices = check_manual_prices(self.prices, f"Task {self.task_id!r}: prices")
        check_count("loop_after", self.loop_after, "preemptions resubmitted at once before backing off")
        backoff = self.resubmit_backoff
        if isinstance(backoff, bool) or not isinstance(backoff, (int, float)) or not math.isfinite(backoff):
            raise AzureMLConfigError(f"resubmit_backoff must be a finite number of seconds >= 0, got {backoff!r}.")
        if backoff < 0:
            raise AzureMLConfigError("resubmit_backoff must be >= 0 seconds.")
        if self.fallback_after is not None:
            if isinstance(self.fallback_after, bool) or not isinstance(self.fallback_after, int):
                raise AzureMLConfigError("fallback_after must be an integer >= 1 (preemptions before falling back).")
            if self.fallback_after < 1:
                raise AzureMLConfigError("fallback_after must be >= 1 (preemptions before falling back).")
            if self.fallback_target() is None:
                raise AzureMLConfigError(f"fallback_after needs a fallback: {self._fallback_argument()}.")
            if self.fallback_after > self.max_resubmits:
                raise AzureMLConfigError(
                    f"fallback_after={self.fallback_after} can never fire with max_resubmits={self.max_resubmits}: "
                    "the budget ends the chain first."
                )

    def result(self, state: ResubmissionState, snapshot: JobSnapshot, verdict: Classification) -> dict[str, Any]:
        return {
            "job_name": snapshot.name,
            "job_names": list(state.job_names),
            "status": snapshot.status,
            "output_uri": snapshot.output_uri,
            "resubmits": state.resubmits,
            "preemptions": state.preemptions,
            "verdict": verdict.to_dict(),
            "cost": self._report_cost(self._context, state),
        }

    # ------------------------------------------------------------------- cost
    def _add_usage(self, context: Any, state: ResubmissionState, usage: Any) -> None:
        """Add one wait's node counts to the chain's, and keep them (a retry goes on from them)."""
        from airflow_azureml import cost

        if not usage:
            return
        state.usage = cost.merge(state.usage, usage)
        self._remember(context, state)

    def _estimate_cost(self, state: ResubmissionState) -> dict[str, Any] | None:
        """The chain's estimated bill (``cost.estimate``), or None when it cannot be made; no side effects."""
        from airflow_azureml import cost

        try:
            prices: dict[str, Any] = {}
            for name, info in (state.usage.get("computes") or {}).items():
                if info.get("vm_size"):
                    prices[name] = self.hook.price_quote(info["vm_size"], info.get("location"), self._manual_prices)
            return cost.estimate(state.usage, prices, lost_jobs=state.counted, preemptions=state.preemptions)
        except Exception as exc:  # the bill is a report: it never turns a finished job into a failed task
            from airflow_azureml.redaction import scrub

            self.log.warning("Could not estimate the cost of job chain %s: %s", state.job_names, scrub(str(exc)))
            return None

    def _report_cost(self, context: Any, state: ResubmissionState) -> dict[str, Any] | None:
        """The chain's estimated bill: to the task log (one block), XCom ``azureml_cost`` and Airflow metrics.

        Never fails the task: a price that cannot be read leaves the cost unknown (docs/cost.md).
        """
        from airflow_azureml import cost

        report = self._estimate_cost(state)
        if report is None:
            return None
        ti = context.get("ti") if context is not None else None
        map_index = getattr(ti, "map_index", -1)
        report.update(
            dag_id=self.dag_id,
            task_id=self.task_id,
            map_index=map_index if isinstance(map_index, int) else -1,
            job_names=list(state.job_names),
            observed=cost.observed(state.usage),
            usage=state.usage,
        )
        self.log.info("%s", cost.format_bill(report, title=f"Azure ML cost of {self.task_id}"))
        if ti is not None and hasattr(ti, "xcom_push"):
            ti.xcom_push(key=COST_XCOM_KEY, value=report)
        try:
            Stats = compat.stats()  # airflow.sdk.observability.stats from Airflow 3.2, airflow.stats on 3.1

            for kind, metric, value, tags in cost.metrics(report):
                getattr(Stats, kind)(metric, value, tags=tags)
        except Exception as exc:  # metrics are best effort
            self.log.info("Could not send the cost metrics: %s", type(exc).__name__)
        self._cost_report = {k: v for k, v in report.items() if k not in ("usage", "observed")}
        return self._cost_report

    # --------------------------------------------------------------- identity
    def _unit_key(self) -> str:
        if self.job_identity:
            return naming.work_key(self.dag_id, self.task_id, self.job_identity)
        return naming.unit_key(self.dag_id, self.task_id, self.work_identity())

    def _name(self, state: ResubmissionState, n: int) -> str:
        return naming.job_name(self.dag_id, self.task_id, state.key, n)

    # -------------------------------------------------------------- execution
    def execute(self, context: Any) -> dict[str, Any]:
        state = self._start(context)
        return self._proceed(context, state, self._discover(state), watched=False)

    def execute_complete(self, context: Any, event: dict[str, Any]) -> dict[str, Any]:
        """Back from the job trigger. The state is rebuilt from ``task_state_store`` and the job chain."""
        state = self._start(context)
        state.deferred_on = None  # back from the trigger
        self._discover(state, newest=False)  # the event carries the newest job's snapshot
        self._add_usage(context, state, event.get("usage"))
        if event["status"] == "queue_timeout":
            self._queued_too_long(context, state, event["job_name"], event["message"])
            # moved to the fallback: wait for the cancelled job to end, then the next job goes there
            return self._proceed(context, state, JobSnapshot.from_dict(event["job"]), watched=True)
        if event["status"] == "config_error":  # e.g. the triggerer does not see the connection
            raise AzureMLConfigError(f"Waiting for job {event.get('job_name')} failed: {event.get('message')}")
        if event["status"] != "terminal":
            raise AzureMLError(f"Waiting for job {event.get('job_name')} failed: {event.get('message')}")
        gauge = GaugeEvidence.from_dict(event["gauge_evidence"]) if event.get("gauge_evidence") else None
        snapshot = JobSnapshot.from_dict(event["job"])
        return self._proceed(context, state, snapshot, watched=True, gauge=self._close_gauge(snapshot, gauge))

    def resume_after_backoff(self, context: Any, event: Any = None) -> dict[str, Any]:
        """Back from the resubmission back-off spent in the triggerer: submit the next job, then wait."""
        state = self._start(context)
        return self._proceed(context, state, self._discover(state), watched=False)

    def _start(self, context: Any) -> ResubmissionState:
        self.validate()
        self._context = context
        state = self._load(context, self._unit_key())
        self._state = state
        return state

    def _proceed(
        self,
        context: Any,
        state: ResubmissionState,
        snapshot: JobSnapshot | None,
        *,
        watched: bool,
        gauge: GaugeEvidence | None = None,
    ) -> dict[str, Any]:
        """Until the unit of work succeeds or fails for good: decide, submit, wait (here or deferred)."""
        if snapshot is not None and not watched:
            self._persist_links(context, state, snapshot.name)
        while True:
            if snapshot is None:
                self._submit(context, state)
            elif snapshot.terminal:
                outcome = self._decide(context, state, snapshot, watched=watched, gauge=gauge)
                if outcome is not None:
                    return outcome
            else:
                how = "waiting until it ends" if snapshot.status == "CancelRequested" else "attaching"
                self.log.info("Found job %s from an earlier attempt (%s); %s.", snapshot.name, snapshot.status, how)
            snapshot, gauge = self._wait_current(context, state)
            gauge = self._close_gauge(snapshot, gauge)
            watched = True

    def _wait_current(self, context: Any, state: ResubmissionState) -> tuple[JobSnapshot, GaugeEvidence | None]:
        """Wait for the newest job of the chain: poll here, or defer to the triggerer."""
        name = state.current or ""
        if self.deferrable:
            snapshot = self.hook.job_snapshot(name)  # check before deferring
            if snapshot is not None:  # the compute's nodes now: the triggerer's first read may be seconds away
                self._add_usage(context, state, self.hook.usage_sample(snapshot, self.polling.interval))
            if snapshot is not None and snapshot.terminal:
                return snapshot, None
            state.deferred_on = name  # a clear while deferred: Airflow's trigger on_kill cancels this job
            self._remember(context, state)
            from airflow_azureml.triggers.job import AzureMLJobTrigger  # Airflow's trigger base: not at DAG parse

            self.defer(
                trigger=AzureMLJobTrigger(job_name=name, azure_ml_conn_id=self.azure_ml_conn_id, polling=self.polling),
                method_name="execute_complete",
                timeout=self.execution_timeout,
            )
        while True:
            try:  # the wait samples the compute's preemption gauge while the job runs: the evidence
                snapshot, gauge, usage = self.hook.wait_for_job_evidence(
                    name, self.polling, self._log_status, with_usage=True
                )
                self._add_usage(context, state, usage)
                return snapshot, gauge
            except AzureMLJobQueueTimeoutError as exc:
                self._queued_too_long(context, state, name, str(exc))  # returns once moved to the fallback

    def _close_gauge(self, snapshot: JobSnapshot, gauge: GaugeEvidence | None) -> GaugeEvidence | None:
        """A job seen Canceled after the gauge was sampled while it ran: read the gauge once more, now.

        Azure cancels a job whose cluster lost its nodes at once, and those nodes stay counted as
        preempted until they are deallocated, so this read bounds the run. One read per cancelled job.
        """
        if snapshot.status != "Canceled" or gauge is None or gauge.samples < 1 or gauge.at_end is not None:
            return gauge
        try:
            facts = self.hook.compute_facts(gauge.compute or snapshot.compute)
        except AzureMLError as exc:
            self.log.info("Could not read compute %s for its preemption gauge: %s", gauge.compute, exc)
            return gauge
        return gauge.ended(facts.preempted_node_count if facts is not None else None)

    def _queued_too_long(self, context: Any, state: ResubmissionState, job_name: str, message: str) -> None:
        """No capacity for too long. With a fallback, that is the normal answer: the queued job is
        cancelled (recorded as Airflow's first) and the next job goes to the fallback; returns.

        Without one (or already on it), raises: a retry re-attaches to the still-queued job (no second
        job); on the last try the job is cancelled so that it does not start, and bill, after we stopped.
        """
        from airflow_azureml import spot_policy

        limit = float(self.polling.max_queue_time or 0.0)
        decision = spot_policy.on_queue_timeout(
            has_fallback=self.fallback_target() is not None,
            waited_seconds=limit,  # at least: the wait ended as soon as it saw the limit passed
            max_queue_time=limit,
            on_fallback=self._on_fallback(state, job_name),
        )
        if decision.use_fallback:
            inputs = {"job": job_name, "reason": decision.reason, "wait": message, **decision.inputs}
            self._move_to_fallback(context, state, True, decision.rule, inputs)
            self._record_airflow_cancel(context, job_name)
            self.hook.cancel_job(job_name)
            return
        ti = context["ti"]
        last_try = getattr(ti, "try_number", 1) > getattr(ti, "max_tries", 0)
        if last_try:
            self._record_airflow_cancel(context, job_name)
            self.hook.cancel_job(job_name)
            message += "; last try, cancelled the job"
        else:
            message += "; left it queued for the next try to re-attach"
        raise AzureMLJobQueueTimeoutError(message, job_name=job_name)

    # -------------------------------------------------------------- the chain
    def _discover(self, state: ResubmissionState, *, newest: bool = True) -> JobSnapshot | None:
        """Find the unit's jobs before submitting anything; return the newest one's snapshot.

        Sources, all merged by resubmission number: the jobs carrying the unit key as a property
        (one filtered LIST: Azure may have ignored the requested names), the jobs this run of the
        task remembers, and the requested names ``-r<n>`` after the highest number known (jobs of
        older versions, or a LIST that lags behind a submit).
        """
        by_number: dict[int, str] = {}
        listed_names: set[str] = set()
        for n, jobs in sorted(self._listed(state).items()):
            by_number[n] = self._keep_one(state, n, jobs)
            listed_names.update(job.snapshot.name for job in jobs)
        for name in state.known:  # remembered, but not (yet) listed (a duplicate that lost is listed)
            if name not in listed_names:
                n = max(by_number, default=-1) + 1
                by_number[n] = name
        n = max(by_number, default=-1) + 1
        latest: JobSnapshot | None = None
        while n < MAX_CHAIN:
            snapshot = self.hook.job_snapshot(self._name(state, n))
            if snapshot is None:
                break
            by_number[n], latest = snapshot.name, snapshot
            n += 1
        state.job_names = [by_number[k] for k in sorted(by_number)]
        state.next_resubmission = n
        if state.current is None or not newest:
            if state.cleared:
                self._first_sight(state, None)
            return None
        if latest is None or latest.name != state.current:
            latest = self.hook.job_snapshot(state.current)
        self._first_sight(state, latest)
        return latest

    def _listed(self, state: ResubmissionState, **only: str) -> dict[int, list[Listed]]:
        """The unit's jobs by resubmission number, from one LIST filtered on the unit's property.

        Every job kept carries the filter's properties itself: a LIST that ignores or loosens its
        filter (Azure documents no matching rule) must never hand this unit another unit's job.
        """
        wanted = {naming.UNIT_TAG: state.key, **only}
        listed: dict[int, list[Listed]] = {}
        for item in self.hook.find_job_resources(wanted):
            found = Listed.from_rest(item)
            if any(found.snapshot.properties.get(key) != value for key, value in wanted.items()):
                continue
            try:
                listed.setdefault(int(found.snapshot.properties.get(naming.RESUBMISSION_TAG, "")), []).append(found)
            except ValueError:
                continue
        return listed

    def _keep_one(self, state: ResubmissionState, n: int, jobs: list[Listed]) -> str:
        """One job per resubmission number; cancel the other still-running ones.

        Two jobs of one number exist when the SDK's invoke created two for one call while Azure picked the
        names (azure-sdk-for-python#31166), or when two runs submitted the same work at once. Every run
        keeps the same one, the oldest (then by name), recomputed from the LIST: no run cancels the job
        another run keeps, and a run whose own job lost sees why it was cancelled (``_kept_instead``).
        """
        keep = min(jobs, key=Listed.order).snapshot.name
        for job in jobs:
            if job.snapshot.name != keep and not job.snapshot.terminal:
                self.log.warning(
                    "Job %s duplicates the older job %s of the same unit of work (resubmission %d); cancelling it.",
                    job.snapshot.name,
                    keep,
                    n,
                )
                try:
                    self.hook.cancel_job(job.snapshot.name)
                except AzureMLError as exc:  # another run may be cancelling it too
                    self.log.warning("Could not cancel duplicate job %s: %s", job.snapshot.name, exc)
        return keep

    def _forget_cancels_that_did_not_take(self, context: Any, state: ResubmissionState, job_name: str) -> None:
        """A job of Airflow's cancel that a wait saw Running after the cancel was recorded outlived it:
        a later cancel of it is not Airflow's (a person's, or a preemption), within this try too."""
        since = state.canceled_at.get(job_name)
        if job_name not in state.airflow_canceled or since is None or job_name in state.clear_cancels:
            return
        for span in (state.usage or {}).get("spans") or []:
            if span.get("job") != job_name:
                continue
            if any(status == "Running" and at > since for at, status in span.get("statuses") or []):
                self.log.info("Job %s ran after Airflow's cancel; a later cancel of it is not Airflow's.", job_name)
                state.airflow_canceled.remove(job_name)
                state.canceled_at.pop(job_name, None)
                self._remember(context, state)
                return

    def _kept_instead(self, state: ResubmissionState, snapshot: JobSnapshot) -> str | None:
        """The job kept instead of this cancelled one, when it was cancelled as a duplicate (``_keep_one``)."""
        number = snapshot.properties.get(naming.RESUBMISSION_TAG)
        if snapshot.properties.get(naming.UNIT_TAG) != state.key or number is None or not number.isdigit():
            return None
        jobs = self._listed(state, **{naming.RESUBMISSION_TAG: number}).get(int(number), [])
        if snapshot.name not in {job.snapshot.name for job in jobs}:
            return None
        keep = min(jobs, key=Listed.order).snapshot.name
        return keep if keep != snapshot.name else None

    def _load(self, context: Any, key: str) -> ResubmissionState:
        """This run of the task's state. A new DAG run, or a clear (Airflow raises ``max_tries``), starts
        a fresh resubmission budget; automatic retries share it."""
        ti = context.get("ti")
        max_tries = getattr(ti, "max_tries", None)
        max_tries = max_tries if isinstance(max_tries, int) else None
        recalled = self._recall(context) or {}
        state = ResubmissionState(key=key, max_tries=max_tries)
        if recalled.get("key") != key:  # nothing yet, or another unit of work (the inputs changed)
            return state
        state.known = [str(n) for n in (recalled.get("jobs") or [recalled.get("job")]) if n]
        state.airflow_canceled = list(recalled.get("airflow_canceled") or [])
        state.reported_cancels = list(recalled.get("reported_cancels") or [])
        state.before_clear = list(recalled.get("before_clear") or [])
        state.deferred_on = recalled.get("deferred_on")
        state.clear_cancels = list(recalled.get("clear_cancels") or [])
        state.usage = dict(recalled.get("usage") or {})  # a retry or a clear keeps what the chain has cost
        state.recorded = list(recalled.get("recorded") or [])  # a clear must not record a job twice
        state.canceled_at = dict(recalled.get("canceled_at") or {})
        submitting = recalled.get("submitting")
        state.submitting = dict(submitting) if isinstance(submitting, dict) else None  # kept across a clear too
        previous = recalled.get("max_tries")
        state.cleared = previous is not None and max_tries is not None and previous != max_tries
        if state.cleared:
            self.log.info("The task was cleared: a fresh resubmission budget, continuing the same job chain.")
        else:
            state.preemptions = int(recalled.get("preemptions") or 0)
            state.counted = list(recalled.get("counted") or [])
            state.backoff_done = recalled.get("backoff_done")
            state.fallback_rule = recalled.get("fallback_rule")  # a clear gives spot another chance
            state.fallback_from = recalled.get("fallback_from")
        return state

    def _first_sight(self, state: ResubmissionState, snapshot: JobSnapshot | None) -> None:
        """What this try's first look at the newest job says about the records of earlier tries."""
        changed = False
        ending = snapshot is not None and (snapshot.terminal or snapshot.status == "CancelRequested")
        cancelling = snapshot is not None and (
            snapshot.name == state.deferred_on or snapshot.name in state.airflow_canceled
        )
        if state.cleared and snapshot is not None and not ending and cancelling:
            # Cleared while Airflow was cancelling this job: deferred on it (the trigger's on_kill cancels
            # it) or running it in a worker (on_kill cancelled it, and Azure may still show it Running a
            # while after accepting that). The cancel is Airflow's, not a person's, even if this look
            # comes before it shows; it is sent again here, in case the first did not get through. Then
            # the next job runs: the clear asked for the work to run again.
            self.log.info(
                "The task was cleared while Airflow was cancelling job %s (%s): cancelling it (Airflow's).",
                snapshot.name,
                snapshot.status,
            )
            if snapshot.name not in state.airflow_canceled:
                state.airflow_canceled.append(snapshot.name)
            state.canceled_at.setdefault(snapshot.name, time.time())
            if snapshot.name not in state.clear_cancels:
                state.clear_cancels.append(snapshot.name)
            state.deferred_on = None
            self._remember(self._context, state)
            try:
                self.hook.cancel_job(snapshot.name)
            except Exception as exc:
                from airflow_azureml.redaction import scrub

                self.log.warning("Could not cancel job %s: %s", snapshot.name, scrub(str(exc)))
            changed = True
        elif snapshot is not None and snapshot.name in state.airflow_canceled and not ending:
            # on_kill recorded its cancel, but the cancel never took: the job runs on, and a later cancel
            # of it is not Airflow's.
            self.log.info("Job %s outlived Airflow's cancel (%s); watching it.", snapshot.name, snapshot.status)
            state.airflow_canceled.remove(snapshot.name)
            changed = True
        if state.cleared:  # the jobs that had ended (or were ending) when the person cleared the task
            ended = state.job_names[:-1] + ([snapshot.name] if snapshot is not None and ending else [])
            state.before_clear = sorted(set(state.before_clear) | set(ended))
            state.cleared = False  # once per clear; stored now, so a retry of this try is no clear
            changed = True
        if changed:
            self._remember(self._context, state)

    @staticmethod
    def _recall(context: Any) -> dict[str, Any] | None:
        store = compat.task_state_store(context)  # None before Airflow 3.3: the chain is found by name alone
        value = store.get(STATE_KEY) if store is not None else None
        return value if isinstance(value, dict) else None

    @staticmethod
    def _remember(context: Any, state: ResubmissionState) -> None:
        store = compat.task_state_store(context)
        if store is not None:
            store.set(STATE_KEY, state.to_store())

    def _record_airflow_cancel(self, context: Any, job_name: str) -> None:
        """Written *before* the cancel is sent: the next try must know the cancel was Airflow's."""
        state = self._state
        if state is None:
            return
        if job_name not in state.airflow_canceled:
            state.airflow_canceled.append(job_name)
        state.canceled_at[job_name] = time.time()
        self._remember(context, state)

    # -------------------------------------------------------------- decisions
    def _submit(self, context: Any, state: ResubmissionState, *, decided: bool = False) -> str:
        """Submit the chain's next job. Unless the caller has just decided (after a preemption), the
        spot policy decides first: before a unit's first job, and after a failure, a cancel or a clear."""
        if self.fallback_target() is not None:
            if not state.job_names:
                self.check_fallback()  # before the unit's first job: a missing fallback fails now, not after paying
            if not decided and not state.fallback_rule:
                decision = self._spot_decision(state, None)
                self._move_to_fallback(context, state, decision.use_fallback, decision.rule, decision.log_inputs())
        n = state.next_resubmission
        requested = self._name(state, n)
        earlier = self._job_of_an_unfinished_submit(state, n)
        if earlier is not None:
            self._record_submitted(context, state, n, earlier)
            return earlier
        fallback = self.fallback_target() if state.fallback_rule else None
        where = f" on the fallback {fallback} ({state.fallback_rule})" if fallback else ""
        self.log.info("Submitting job %s (resubmission %d)%s.", requested, n, where)
        state.submitting = {"n": n, "at": time.time()}
        self._remember(context, state)  # before the request: a crash from here on leaves this record
        try:
            name = self.submit_job(context, requested, fallback, naming.job_markers(state.key, n)) or requested
        except Exception as exc:
            # Refused (a 4xx that is not a timeout, conflict or throttle; bad input): no job exists, the next try
            # must not wait for one. Otherwise the job may exist, created late in the call: the wait counts from now.
            state.submitting = None if _refused(exc) else {"n": n, "at": time.time()}
            self._remember(context, state)
            raise
        if name != requested:
            self.log.warning("Azure named the job %s instead of %s; following the name it returned.", name, requested)
            jobs = self._listed(state, **{naming.RESUBMISSION_TAG: str(n)}).get(n, [])
            # Our own job not listed yet (the LIST lags): its age is unknown, so cancel nothing now; a run
            # that sees it and an older one cancels it, and we then follow the older one.
            if name in {job.snapshot.name for job in jobs}:
                kept = self._keep_one(state, n, jobs)
                if kept != name:
                    self.log.warning("Following job %s, the older job of the same unit of work.", kept)
                name = kept
        self._record_submitted(context, state, n, name)
        return name

    def _record_submitted(self, context: Any, state: ResubmissionState, n: int, name: str) -> None:
        state.job_names.append(name)
        state.next_resubmission = n + 1
        state.submitting = None
        self._remember(context, state)  # first thing after the submit returns
        if not self._on_fallback(state, name):
            self._record_start_on_cluster(name)
        self._persist_links(context, state, name)

    def _persist_links(self, context: Any, state: ResubmissionState, current: str) -> None:
        """The current job's Studio link, and every job of the chain's (the previous-job link reads them)."""
        names = [n for n in state.job_names if n != current] + [current]
        urls = [self.hook.studio_job_url(n) for n in names]
        AzureMLStudioJobLink.persist(context, urls[-1], chain=urls)
        if len(urls) > 1:
            shown = ", ".join(url or name for url, name in zip(urls, names, strict=True))
            self.log.info("The job chain in Studio, oldest first: %s", shown)

    def _job_of_an_unfinished_submit(self, state: ResubmissionState, n: int) -> str | None:
        """An earlier try stopped while submitting resubmission ``n`` (a crash between the request and
        the record): its job may exist under a name Azure chose, not yet in the LIST. Look for it by
        its properties and by the requested name until ``LIST_LAG_SECONDS`` after that submit began."""
        pending = state.submitting
        if not pending or pending.get("n") != n:
            return None
        started = float(pending.get("at") or 0.0)
        deadline = started + LIST_LAG_SECONDS
        self.log.warning(
            "An earlier try stopped while submitting resubmission %d; looking for its job until %s "
            "(Azure's LIST can lag behind a new job) before submitting again.",
            n,
            datetime.fromtimestamp(deadline, timezone.utc).strftime("%H:%M:%S UTC"),
        )
        while True:
            jobs = self._listed(state, **{naming.RESUBMISSION_TAG: str(n)}).get(n, [])
            if jobs:
                name = self._keep_one(state, n, jobs)
                self.log.info("Found job %s of that submit; following it instead of submitting again.", name)
                return name
            snapshot = self.hook.job_snapshot(self._name(state, n))
            if snapshot is not None:
                return snapshot.name
            left = deadline - time.time()
            if left <= 0:
                self.log.info("No job of resubmission %d appeared within %.0f s; submitting.", n, LIST_LAG_SECONDS)
                return None
            time.sleep(min(left, max(1.0, self.polling.interval)))

    def _fallback_argument(self) -> str:
        return "fallback_compute"

    @staticmethod
    def _on_fallback(state: ResubmissionState, job_name: str) -> bool:
        """The job was sent to the fallback (the switch may be recorded while an older spot job still waits)."""
        if not state.fallback_rule:
            return False
        if state.fallback_from is None or job_name not in state.job_names:
            return True
        return state.job_names.index(job_name) >= state.fallback_from

    def _move_to_fallback(
        self, context: Any, state: ResubmissionState, use_fallback: bool, rule: str, inputs: dict[str, Any]
    ) -> bool:
        """Log the policy's decision with its inputs; on a switch, persist it before anything is sent."""
        self.log.log(
            logging.WARNING if use_fallback else logging.INFO,
            "Spot policy: %s (rule %s). Inputs: %s",
            f"move to the fallback {self.fallback_target()}" if use_fallback else "stay on spot",
            rule,
            inputs,
        )
        if use_fallback and not state.fallback_rule:
            state.fallback_rule = rule
            state.fallback_from = state.next_resubmission
            self._remember(context, state)
        return use_fallback

    def _report(self, context: Any, snapshot: JobSnapshot, verdict: Classification) -> None:
        """The verdict and its evidence, to the task log and to XCom."""
        self.log.info(
            "Job %s: %s (%s). Evidence: %s", snapshot.name, verdict.outcome.value, verdict.reason, verdict.evidence
        )
        ti = context.get("ti") if context is not None else None
        if ti is not None and hasattr(ti, "xcom_push"):
            ti.xcom_push(key=VERDICT_XCOM_KEY, value={"job_name": snapshot.name, **verdict.to_dict()})

    def _decide(
        self,
        context: Any,
        state: ResubmissionState,
        snapshot: JobSnapshot,
        *,
        watched: bool,
        gauge: GaugeEvidence | None,
    ) -> dict[str, Any] | None:
        """A terminal job becomes a result, an exception, or the next job of the chain (returns None).

        ``watched``: this try waited for the job (else an earlier try or another run did).
        """
        if snapshot.name in state.counted:  # judged a preemption earlier (before a back-off or a crash)
            verdict = Classification(Outcome.PREEMPTED, "preempted (judged so when it ended)")
            return self._resubmit_preempted(context, state, snapshot, verdict)
        self._forget_cancels_that_did_not_take(context, state, snapshot.name)
        verdict = classify(snapshot, gauge=gauge, canceled_by_airflow=snapshot.name in state.airflow_canceled)
        self._report(context, snapshot, verdict)
        outcome = verdict.outcome
        if outcome not in (Outcome.SUCCEEDED, Outcome.PREEMPTED):
            self._close_on_cluster(state, snapshot.name)  # whatever ended it, it no longer runs on the cluster
        if outcome is Outcome.SUCCEEDED:
            if watched:  # this try saw it run: what it took, and that spot let it finish
                self._record_on_cluster(state, snapshot, preempted=False)
            else:
                self._close_on_cluster(state, snapshot.name)
            result = self.result(state, snapshot, verdict)
            self.log.info("Job %s completed: %s", snapshot.name, result)
            return result
        if outcome is Outcome.FAILED:
            if watched:
                raise exception_for(snapshot, verdict)
            self.log.info("Job %s failed in an earlier try; submitting the next job of the chain.", snapshot.name)
            self._submit(context, state)
            return None
        if outcome is Outcome.AIRFLOW_CANCELED:
            self.log.info("Job %s was cancelled by Airflow; submitting the next job of the chain.", snapshot.name)
            self._submit(context, state)
            return None
        if outcome is Outcome.USER_CANCELED:
            kept = self._kept_instead(state, snapshot)
            if kept is not None:  # cancelled as a duplicate of an older job of the unit: follow that one
                self.log.warning("Job %s was cancelled as a duplicate of job %s; following it.", snapshot.name, kept)
                state.job_names[state.job_names.index(snapshot.name)] = kept
                self._remember(context, state)
                return None
            if (
                snapshot.name in state.before_clear
                or snapshot.name in state.reported_cancels
                or (not watched and snapshot.name not in state.known)
            ):
                # The task was cleared after this job started, or a try already failed on this cancel (so
                # this try follows a clear), or the job is unknown to this run of the task (a new DAG run,
                # a backfill): running the work again is the request.
                self.log.info(
                    "Job %s was cancelled by a person earlier; this run asks for the work again: "
                    "submitting the next job of the chain.",
                    snapshot.name,
                )
                self._submit(context, state)
                return None
            state.reported_cancels.append(snapshot.name)
            self._remember(context, state)
            raise exception_for(snapshot, verdict)
        return self._resubmit_preempted(context, state, snapshot, verdict)

    def _resubmit_preempted(
        self, context: Any, state: ResubmissionState, snapshot: JobSnapshot, verdict: Classification
    ) -> None:
        if snapshot.name not in state.counted:
            state.preemptions += 1
            state.counted.append(snapshot.name)
            self._remember(context, state)
            self._record_on_cluster(state, snapshot, preempted=True)
        if state.preemptions > self.max_resubmits:
            raise AzureMLJobPreemptedError(
                f"Job {snapshot.name} was preempted ({verdict.reason}); {state.preemptions} preemption(s) in this "
                f"run of the task, resubmission budget max_resubmits={self.max_resubmits} spent. Clearing the task "
                "starts a fresh budget and continues the same job chain.",
                job_name=snapshot.name,
                status=snapshot.status,
            )
        if self.fallback_target() is not None and not state.fallback_rule:
            self._decide_after_preemption(context, state, snapshot)
        delay = self._loop_backoff(state)
        old = snapshot.name
        if state.backoff_done != old and delay > 0:
            self.log.warning(
                "Preemption %d of job %s (%s). Resubmitting in %.1fs.", state.preemptions, old, verdict.reason, delay
            )
            if self.deferrable:  # the back-off is spent in the triggerer, not in a worker slot
                from airflow.providers.standard.triggers.temporal import TimeDeltaTrigger

                state.backoff_done = old
                self._remember(context, state)
                self.defer(trigger=TimeDeltaTrigger(timedelta(seconds=delay)), method_name="resume_after_backoff")
            else:
                time.sleep(delay)
        new = self._submit(context, state, decided=True)
        self.log.warning(
            "Resubmitted preempted job: reason=%r old=%s new=%s resubmission=%d/%d",
            verdict.reason,
            old,
            new,
            state.preemptions,
            self.max_resubmits,
        )
        return None

    def _loop_backoff(self, state: ResubmissionState) -> float:
        """No fixed back-off: a job resubmitted after a preemption waits in Azure's queue at no cost.

        Only a loop of preemptions backs off (``resubmit_backoff``, doubling, from preemption
        ``loop_after + 1`` on), and never on the fallback, which is not preempted for capacity.
        """
        loops = state.preemptions - self.loop_after
        if loops < 1 or state.fallback_rule:
            return 0.0
        return min(MAX_BACKOFF, self.resubmit_backoff * (2 ** (loops - 1)))

    def _decide_after_preemption(self, context: Any, state: ResubmissionState, snapshot: JobSnapshot) -> bool:
        """After each preemption: the hard limit ``fallback_after``, then the expected cost (``spot_policy``)."""
        decision = self._spot_decision(state, snapshot)
        return self._move_to_fallback(context, state, decision.use_fallback, decision.rule, decision.log_inputs())

    # ------------------------------------------------------------ spot policy
    def spot_target(self) -> str | None:
        """What names the spot cluster this operator's jobs run on: the key of its shared ``SpotHistory``."""
        return None

    def _spot_store(self) -> HistoryStore | None:
        """The spot cluster's shared history store (one per task process: it may read the workspace)."""
        target = self.spot_target()
        if not target:
            return None
        cached = self.__dict__.get("_history_store")
        if cached is None or cached[0] != target:
            cached = (target, self.hook.spot_history_store(target))
            self.__dict__["_history_store"] = cached
        return cached[1]

    def _spot_decision(self, state: ResubmissionState, snapshot: JobSnapshot | None) -> SpotDecision:
        """``spot_policy.decide`` on this cluster's history, the hourly prices and this unit's jobs so far."""
        from airflow_azureml import spot_policy

        store = self._spot_store()
        history, known = store.load() if store else (spot_policy.SpotHistory(), {})
        info = {**known, **self._spot_compute(state)}
        dedicated = spot = None
        if info.get("vm_size"):
            try:
                rates = self.hook.hourly_prices(info["vm_size"], info.get("location"), self._manual_prices)
            except Exception as exc:  # unknown prices turn the expected-cost rule off; they never fail the task
                self.log.info("Could not read prices for %s: %s", info["vm_size"], type(exc).__name__)
                rates = None
            dedicated, spot = rates if rates else (None, None)
        extra: dict[str, Any] = {}
        if isinstance(info.get("startup_hours"), (int, float)) and info["startup_hours"] > 0:
            extra["startup_hours"] = float(info["startup_hours"])
        nodes = snapshot.instance_count if snapshot is not None and snapshot.instance_count else 1
        try:
            inputs = spot_policy.PolicyInputs(
                spot_price=spot,
                dedicated_price=dedicated,
                nodes=max(1, int(nodes)),
                history=history,
                preemptions=state.preemptions,
                fallback_after=self.fallback_after,
                has_fallback=self.fallback_target() is not None,
                on_fallback=bool(state.fallback_rule),
                unit_exposure_hours=max((self._held_hours(state, job) for job in state.counted), default=0.0),
                now=time.time(),
                **extra,
            )
            return SpotDecision(spot_policy.decide(inputs))
        except ValueError as exc:  # a stored value the policy refuses: the hard rules still hold
            hard = self.fallback_after is not None and state.preemptions >= self.fallback_after
            rule = spot_policy.RULE_FALLBACK_AFTER if hard else "policy_inputs_refused"
            reason = f"the policy refused its inputs ({exc}); only fallback_after applies"
            return SpotDecision(spot_policy.Decision(hard, rule, reason))

    def _spot_compute(self, state: ResubmissionState) -> dict[str, Any]:
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

    @staticmethod
    def _held_hours(state: ResubmissionState, job: str) -> float:
        """Hours one job of the chain was seen Running on spot (its waits' status changes)."""
        from airflow_azureml import cost

        usage = state.usage or {}
        spans = [s for s in usage.get("spans") or [] if s.get("job") == job]
        return cost.spot_exposure_hours({**usage, "spans": spans}) if spans else 0.0

    def _record_on_cluster(self, state: ResubmissionState, snapshot: JobSnapshot, *, preempted: bool) -> None:
        """What this job showed of the spot cluster goes to its shared history, once per job.

        Only what a wait observed counts: a job with no compute reading adds nothing. Its hours are
        the time its waits saw it Running, or, when no poll caught it Running, from the first compute
        reading of its wait to the wait's end.
        """
        from airflow_azureml import cost

        store = self._spot_store()
        usage = state.usage or {}
        spans = [s for s in usage.get("spans") or [] if s.get("job") == snapshot.name and s.get("points")]
        if store is None or snapshot.name in state.recorded:
            return
        if not spans:  # no wait of this task saw it run: what it showed is unknown, but it runs no more
            self._close_on_cluster(state, snapshot.name)
            return
        state.recorded.append(snapshot.name)
        self._remember(self._context, state)
        tiers = {((usage.get("computes") or {}).get(s.get("compute")) or {}).get("tier") for s in spans}
        on_spot = "low_priority" in tiers
        job_usage = {**usage, "spans": spans}
        wall = sum(max(0.0, (s.get("end") or s["points"][-1][0]) - s["points"][0][0]) for s in spans) / 3600.0
        held = self._held_hours(state, snapshot.name)
        hours = held if held > 0 else wall  # seen Running: from then (queue time is no exposure); else the wait
        evicted = float(sum(cost.evictions(job_usage).values())) if on_spot else 0.0
        node_hours = sum(sum(v.values()) for v in cost.integrate(job_usage).values()) / 3600.0 if on_spot else 0.0
        seen = self._spot_compute(state)
        job = snapshot.name

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

    def _close_on_cluster(self, state: ResubmissionState, job: str) -> None:
        """A job that failed or was cancelled leaves the cluster's running jobs; the time its waits saw it
        Running is exposure without a preemption. Once per job, like ``_record_on_cluster``."""
        store = self._spot_store()
        if store is None or job in state.recorded or self._on_fallback(state, job):
            return
        state.recorded.append(job)
        self._remember(self._context, state)
        held = self._held_hours(state, job)
        store.update(lambda history, known: (history.record_end(job=job, exposure_hours=held, now=time.time()), known))

    def _record_start_on_cluster(self, job: str) -> None:
        """A job sent to spot counts as exposure from now until it ends (concurrent partitions' too)."""
        store = self._spot_store()
        if store is None or self.fallback_target() is None:
            return
        store.update(lambda history, known: (history.record_start(job, time.time()), known))

    def _log_status(self, snapshot: JobSnapshot) -> None:
        self.log.info("Job %s is %s.", snapshot.name, snapshot.status)

    def on_kill(self) -> None:
        """The task was killed (marked failed, cleared, timed out): cancel the job we started.

        The cancel is recorded in ``task_state_store`` first, so that the next try knows it was
        Airflow's and submits the next job instead of attaching to, or failing on, this one.
        """
        state = self._state
        if state is None or state.current is None:
            return
        self.log.warning("Task killed; cancelling Azure ML job %s.", state.current)
        try:
            self._record_airflow_cancel(self._context, state.current)
        except Exception as exc:  # the cancel matters more than the record
            self.log.error("Could not record the cancel of job %s: %s", state.current, type(exc).__name__)
        try:
            self.hook.cancel_job(state.current)
        except Exception as exc:
            from airflow_azureml.redaction import scrub

            self.log.error("Could not cancel job %s: %s", state.current, scrub(str(exc)))
