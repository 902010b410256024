"""What every job-submitting operator shares: exactly once, waiting, deferral, cancels, resubmission.

Subclasses say what the work is (``work_identity``) and how to submit one job (``submit_job``). The
lifecycle is decided in ``airflow_azureml.lifecycle`` (pure: a state and an observation in, actions
out); this class gathers the observations and hands the actions to ``job_actions.ActionRunner``, which
carries them out. The other collaborators: the shared settings' checks (``job_settings``), the unit's
jobs in Azure (``job_chain``), the exactly-once submit and the unit journal (``job_submit``), the spot
cluster's history and policy (``job_spot``), the Studio links and verdicts shown (``job_report``), the
bill (``job_cost``).
"""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING, Any

from airflow_azureml import compat, lifecycle, naming
from airflow_azureml.compat import conf
from airflow_azureml.exceptions import AzureMLConfigError, AzureMLError, AzureMLJobQueueTimeoutError
from airflow_azureml.lifecycle import Decision, Limits, ResubmissionState
from airflow_azureml.links.studio import AzureMLStudioJobLink, AzureMLStudioPreviousJobLink
from airflow_azureml.operators import job_actions, job_cost, job_report, job_settings, job_submit
from airflow_azureml.operators.base import AzureMLBaseOperator
from airflow_azureml.operators.job_chain import JobChain
from airflow_azureml.operators.job_settings import check_count as check_count  # re-exported: importable from here
from airflow_azureml.operators.job_spot import SpotCluster
from airflow_azureml.outcomes import Classification, GaugeEvidence, JobSnapshot, Outcome

if TYPE_CHECKING:
    from airflow_azureml.unit_journal import UnitJournal

__all__ = ["AzureMLJobOperatorBase"]  # the re-exported names are documented where they live

# task_state_store key (one row per DAG run, task and map index; retries and clears share it).
# Renaming it breaks in-flight retries.
STATE_KEY = "azureml_job"
VERDICT_XCOM_KEY = job_report.VERDICT_XCOM_KEY
COST_XCOM_KEY = job_cost.COST_XCOM_KEY


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
        on_ambiguous_cancel: str = "fail",
        evidence_wait: float = 900.0,
        deadline: datetime | timedelta | str | None = None,
        on_infeasible_deadline: str = "fallback",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        # a deadline not even the fallback meets: "fallback" (finish as early as it can) or "fail" (before any job)
        self.on_infeasible_deadline = on_infeasible_deadline
        # when the unit must be done: an aware time, or an offset after the data interval's end (docs/operators.md)
        self.deadline = deadline
        self._deadline: datetime | timedelta | None = None  # parsed by validate()
        self._deadline_at: float | None = None  # resolved against the run (epoch seconds) by _start()
        # a cancel that no witness tells from lost capacity: "fail" (a person's, final) or "resubmit"
        self.on_ambiguous_cancel = on_ambiguous_cancel
        self.evidence_wait = evidence_wait  # with "resubmit": seconds to wait for the Activity Log first
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
        self._fresh_start = False  # in ``execute`` (not back from a deferral or a back-off): see _may_fail_fast
        self._cost_report: dict[str, Any] | None = None  # this run's bill, for the OpenLineage facet
        self._journaled: dict[int, str] = {}  # the unit journal's jobs, read when the task state had none

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

    def carries_unit(self, arm_job: dict[str, Any]) -> bool:
        """Does this ARM job carry this unit's work, by what Azure keeps of every job (its data paths...)?

        Asked only of jobs without the unit's properties, for a submit that an earlier try did not see
        return (``JobChain.carried``). False: the job kind keeps its requested name (a command job's PUT).
        """
        return False

    def submit_markers(self, fallback: str | None) -> dict[str, str]:
        """Job properties to add to the unit's own (``naming.job_markers``), read before the submit is recorded
        as under way: a read that fails or hangs here leaves no submit for the next try to look for."""
        return {}

    def superseded_by(self, snapshot: JobSnapshot) -> str | None:
        """Asked of a unit's completed job that an earlier try or another DAG run saw end: why its result is
        no longer this work's (what runs it changed since), or None to reuse it."""
        return None

    def fallback_target(self) -> str | None:
        """Where the work goes when spot does not pay (a deployment for batch, a compute for command jobs)."""
        return None

    def check_fallback(self) -> None:
        """Before a unit's first job: the fallback exists and runs on dedicated compute (else a config error)."""

    def _check_dedicated(self, compute: str | None, what: str) -> None:
        job_settings.check_dedicated(self.hook, compute, what)

    def validate(self) -> None:
        """Check the input without Azure; subclasses extend. Runs before any API call."""
        self.polling = job_settings.with_max_queue_time(self.polling, self.max_queue_time)
        self._manual_prices = job_settings.check_settings(self)
        self._deadline = job_settings.parse_deadline(self.deadline)

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

    # ---------------------------------------------------------- collaborators
    def _limits(self) -> Limits:
        return job_settings.limits(self)

    @property
    def _chain(self) -> JobChain:
        has_carrier = type(self).carries_unit is not AzureMLJobOperatorBase.carries_unit
        carrier = self.carries_unit if has_carrier else None  # none: no unfiltered LIST for it
        return JobChain(self.hook, self._name, self.log, journaled=self._journaled, carrier=carrier)

    def _journal(self, key: str) -> UnitJournal | None:
        """The unit's journal (``unit_journal``), one per task process; None where no container is known."""
        return job_submit.unit_journal(self.hook, key, self.__dict__, self.log)

    def _recall_journal(self, state: ResubmissionState) -> None:
        """The task state knows no job of this unit: the journal may (Airflow 3.1/3.2, a lost or new record)."""
        journaled = job_submit.recall_journal(self._journal(state.key), state, self.log)
        if journaled is not None:
            self._journaled = journaled

    def _spot(self) -> SpotCluster:
        """The spot cluster's history and policy, with this operator's settings as they are now."""
        return SpotCluster(
            self.hook,
            self.spot_target(),
            has_fallback=self.fallback_target() is not None,
            fallback_after=self.fallback_after,
            manual_prices=self._manual_prices,
            remember=lambda state: self._remember(self._context, state),
            log=self.log,
            stores=self.__dict__.setdefault("_history_stores", {}),  # one per task process and target
            deadline=self._deadline_at,
            fail_infeasible=self._may_fail_fast() if self.on_infeasible_deadline == "fail" else None,
        )

    def _may_fail_fast(self) -> bool:
        """``on_infeasible_deadline="fail"`` applies on the task instance's first try, in ``execute`` only: a
        retry, a clear or a resume may follow a job an earlier run of the task sent that no record shows yet (a
        lost task state, a lagging LIST), and failing then would leave it unwatched. There the deadline is a
        warning and the unit finishes on the fallback, as by default."""
        ti = self._context.get("ti") if self._context is not None else None
        return self._fresh_start and getattr(ti, "try_number", 1) == 1

    def spot_target(self) -> str | None:
        """What names the spot cluster this operator's jobs run on: the key of its shared ``SpotHistory``."""
        return None

    # ------------------------------------------------------------------- cost
    def _add_usage(self, context: Any, state: ResubmissionState, usage: Any) -> None:
        """Add one wait's node counts to the chain's, and keep them (a retry goes on from them)."""
        from airflow_azureml import cost

        if not usage:
            return
        if state.evidence_waited is not None and state.evidence_waited == state.current:
            # A look during the wait for late evidence: the job had ended, and its nodes were counted when it was
            # first seen so; a reading now (minutes later, maybe another job's nodes) would be bridged onto it.
            return
        usage = cost.with_node_counts(usage, self._node_counts(state, cost.jobs_without_node_count(usage)))
        state.usage = cost.merge(state.usage, usage)
        self._remember(context, state)

    def _node_counts(self, state: ResubmissionState, jobs: dict[str, str]) -> dict[str, int]:
        """``job_nodes`` of each job (job -> the compute it ran on); a read that fails leaves the count unknown
        (the bill is a report: it never fails the task)."""
        counts: dict[str, int] = {}
        for job, compute in jobs.items():
            try:
                nodes = self.job_nodes(state, job, compute)
            except Exception as exc:
                from airflow_azureml.redaction import scrub

                self.log.warning("Could not read the node count of job %s for its bill: %s", job, scrub(str(exc)))
                continue
            if nodes is not None:
                counts[job] = nodes
        return counts

    def job_nodes(self, state: ResubmissionState, job_name: str, compute: str) -> int | None:
        """How many nodes ``job_name`` held on ``compute``, when Azure's job GET does not say (a batch job's);
        None: unknown, and the bill's floor then takes one node (docs/cost.md)."""
        return None

    def _estimate_cost(self, state: ResubmissionState) -> dict[str, Any] | None:
        return job_cost.estimate(self.hook, state, self._manual_prices, self.log)

    def _report_cost(self, context: Any, state: ResubmissionState) -> dict[str, Any] | None:
        report = job_cost.report(
            self.hook,
            context,
            state,
            self._manual_prices,
            self.log,
            dag_id=self.dag_id,
            task_id=self.task_id,
            deadline=self._deadline_at,
            remember=lambda counted: self._remember(context, counted),
        )
        if report is not None:
            self._cost_report = report
        return report

    # --------------------------------------------------------------- identity
    def _unit_key(self) -> str:
        if self.job_identity:
            return naming.work_key(self.dag_id, self.task_id, self.job_identity)
        return naming.unit_key(self.dag_id, self.task_id, self.work_identity())

    def _name(self, state: ResubmissionState, n: int) -> str:
        return naming.job_name(self.dag_id, self.task_id, state.key, n)

    # -------------------------------------------------------------- execution
    def execute(self, context: Any) -> dict[str, Any]:
        self._fresh_start = True
        state = self._start(context)
        snapshot, gauge = self._ended_evidence(context, state, self._discover(state))
        return self._proceed(context, state, snapshot, watched=False, gauge=gauge)

    def _ended_evidence(
        self, context: Any, state: ResubmissionState, snapshot: JobSnapshot | None
    ) -> tuple[JobSnapshot | None, GaugeEvidence | None]:
        """The job an earlier try deferred on and never came back from, found cancelled: the read of its
        cluster now, which is the read just after its end if the job ended moments ago (``JobWatch``; else it
        is no evidence).

        Airflow can fail a deferred try whose trigger fired at once, on the executor's late report of the
        deferral (apache/airflow#67287, #72716): its retry starts here with the event, and the gauge evidence
        in it, lost. Only that job: one ended before a clear, cancelled by Airflow, judged or reported
        already, or another run's, is decided as before (``lifecycle.after_cancel``), with no read.
        """
        if snapshot is None or snapshot.status != "Canceled" or snapshot.name != state.deferred_on:
            return snapshot, None
        decided = (state.lost, state.airflow_canceled, state.before_clear, state.reported_cancels)
        if any(snapshot.name in names for names in decided):
            return snapshot, None
        ended = self.hook.ended_job_evidence(snapshot.name, self.polling)
        if ended is None:  # not ended after all (a stale read): the wait follows it
            return snapshot, None
        snapshot, gauge, usage = ended
        self._add_usage(context, state, usage)
        return snapshot, gauge

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
        found_ending = event.get("found_ending")  # this try found the job being cancelled (_proceed)
        if found_ending == "unknown" and snapshot.name in state.known:
            # unknown to the run when this try found it being cancelled: this try's own record (before the
            # deferral) is what knows it now
            state.known.remove(snapshot.name)
        return self._proceed(context, state, snapshot, watched=not found_ending, gauge=gauge)

    def resume_after_backoff(self, context: Any, event: Any = None) -> dict[str, Any]:
        """Back from the resubmission back-off spent in the triggerer: submit the next job, then wait."""
        state = self._start(context)
        return self._proceed(context, state, self._discover(state), watched=False)

    def _start(self, context: Any) -> ResubmissionState:
        self.validate()
        self._context = context
        self._deadline_at, source = job_settings.resolve_deadline(self._deadline, context, self._dag, self.log)
        if self._deadline_at is not None:
            when = datetime.fromtimestamp(self._deadline_at, tz=timezone.utc).isoformat(timespec="seconds")
            self.log.info("Deadline of this unit of work: %s (%s).", when, source)
        ti = context.get("ti")
        max_tries = getattr(ti, "max_tries", None)
        state = ResubmissionState.from_store(
            self._unit_key(), self._recall(context), max_tries if isinstance(max_tries, int) else None
        )
        if state.cleared:
            self.log.info("The task was cleared: a fresh resubmission budget, continuing the same job chain.")
        if not state.known and state.submitting is None:
            self._recall_journal(state)
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
            job_report.persist_links(self.hook, context, state, snapshot.name, self.log)
        # A job already ended, or being cancelled, at this try's first look: its end is not one this try watched
        # happen, however many waits follow (an evidence wait reads it again), so it is decided as a job found
        # ended is (lifecycle.after_cancel). Across a deferral the trigger's event says so.
        unwatched: set[str] = set()
        if snapshot is not None and not watched and (snapshot.terminal or snapshot.status == "CancelRequested"):
            unwatched.add(snapshot.name)
        while True:
            if snapshot is None:
                self._actions(context).submit(state)
            elif snapshot.terminal:
                outcome = self._decide(context, state, snapshot, watched=snapshot.name not in unwatched, gauge=gauge)
                if outcome is not None:
                    return outcome
            found_ending: str | None = None
            if snapshot is not None and not snapshot.terminal:
                how = "waiting until it ends" if snapshot.status == "CancelRequested" else "attaching"
                self.log.info("Found job %s from an earlier attempt (%s); %s.", snapshot.name, snapshot.status, how)
                if snapshot.name in unwatched:
                    found_ending = "known" if snapshot.name in state.known else "unknown"
            snapshot, gauge = self._wait_current(context, state, found_ending=found_ending)  # reads at the end too

    def _discover(self, state: ResubmissionState, *, newest: bool = True) -> JobSnapshot | None:
        """Find the unit's jobs before submitting anything (``JobChain.discover``); the newest one's snapshot."""
        latest = self._chain.discover(state)
        if state.current is None or not newest:
            if state.cleared:
                self._apply(self._context, state, lifecycle.first_sight(state, None, time.time()))
            return None
        if latest is None or latest.name != state.current:
            latest = self.hook.job_snapshot(state.current)
        self._apply(self._context, state, lifecycle.first_sight(state, latest, time.time()))
        return latest

    def _decide(
        self,
        context: Any,
        state: ResubmissionState,
        snapshot: JobSnapshot,
        *,
        watched: bool,
        gauge: GaugeEvidence | None,
    ) -> dict[str, Any] | None:
        """A terminal job becomes a result, an exception, or the next job of the chain (returns None)."""
        judged_before = snapshot.name in state.lost
        activity = None
        if snapshot.status == "Canceled" and not judged_before:  # (Airflow's record may be dropped in verdict)
            activity = self.hook.job_cancel_requests(snapshot)  # who sent a cancel through ARM, if anyone
        decision, verdict = lifecycle.verdict(state, snapshot, gauge, activity)
        self._apply(context, state, decision)
        if not judged_before:
            job_report.report_verdict(context, snapshot, verdict, self.log)
        superseded = None
        # only where the task state store tells this run's retry (which reuses its job) from a new run or a clear
        reusable = verdict.outcome is Outcome.SUCCEEDED and not watched and compat.has_task_state_store()
        if reusable and lifecycle.may_supersede(state, snapshot.name):
            superseded = self.superseded_by(snapshot)
        decision = lifecycle.on_end(
            state, snapshot.name, verdict, self._limits(), watched=watched, now=time.time(), superseded=superseded
        )
        return self._apply(context, state, decision, snapshot, verdict)

    def _wait_current(
        self, context: Any, state: ResubmissionState, *, found_ending: str | None = None
    ) -> tuple[JobSnapshot, GaugeEvidence | None]:
        """Wait for the newest job of the chain: poll here, or defer to the triggerer (``found_ending``: this
        try found it being cancelled, which the trigger's event carries back)."""
        name = state.current or ""
        while self.deferrable:
            snapshot = self.hook.job_snapshot(name)  # check before deferring
            if snapshot is not None:  # the compute's nodes now: the triggerer's first read may be seconds away
                self._add_usage(context, state, self.hook.usage_sample(snapshot, self.polling.interval))
            if snapshot is not None and snapshot.terminal:
                # Ended already (a preemption Azure cancels at once can end a job before this look): one poll
                # more, with the read of the cluster just after the end that tells a preemption from a person's
                # cancel (returning without it judged such a preemption a person's). Should that poll find it
                # not ended (a stale read), the job is waited for in the triggerer after all.
                ended = self.hook.ended_job_evidence(name, self.polling)
                if ended is not None:
                    snapshot, gauge, usage = ended
                    self._add_usage(context, state, usage)
                    return snapshot, gauge
                continue
            if snapshot is not None:
                self._on_status(snapshot)
            state.deferred_on = name  # a clear while deferred: the next try cancels this job (first_sight)
            self._remember(context, state)
            from airflow_azureml.triggers.job import AzureMLJobTrigger  # Airflow's base: not at DAG parse

            self.defer(
                trigger=AzureMLJobTrigger(
                    job_name=name,
                    azure_ml_conn_id=self.azure_ml_conn_id,
                    polling=self.polling,
                    found_ending=found_ending,
                ),
                method_name="execute_complete",
                timeout=self.execution_timeout,
            )
        while True:
            try:  # the wait samples the compute's preemption gauge while the job runs: the evidence
                snapshot, gauge, usage = self.hook.wait_for_job_evidence(
                    name, self.polling, self._on_status, with_usage=True
                )
                self._add_usage(context, state, usage)
                return snapshot, gauge
            except AzureMLJobQueueTimeoutError as exc:
                self._queued_too_long(context, state, name, str(exc))  # returns once moved to the fallback

    def _queued_too_long(self, context: Any, state: ResubmissionState, job_name: str, message: str) -> None:
        """No capacity for too long: returns once moved to the fallback, else raises (``lifecycle``)."""
        from airflow_azureml import spot_policy

        limit = float(self.polling.max_queue_time or 0.0)
        decision = spot_policy.on_queue_timeout(
            has_fallback=self.fallback_target() is not None,
            waited_seconds=limit,  # at least: the wait ended as soon as it saw the limit passed
            max_queue_time=limit,
            on_fallback=state.on_fallback(job_name),
        )
        if decision.use_fallback:
            inputs = {"job": job_name, "reason": decision.reason, "wait": message, **decision.inputs}
            self._actions(context).move_to_fallback(state, True, decision.rule, inputs)
            last_try = False
        else:
            ti = context["ti"]
            last_try = getattr(ti, "try_number", 1) > getattr(ti, "max_tries", 0)
        decided = lifecycle.on_queue_timeout(
            state,
            job_name,
            message,
            self._limits(),
            use_fallback=decision.use_fallback,
            last_try=last_try,
            now=time.time(),
        )
        self._apply(context, state, decided)

    # ------------------------------------------------------ carrying out actions
    def _actions(self, context: Any) -> job_actions.ActionRunner:
        """What carries out the lifecycle's actions in this try (``job_actions``)."""
        return job_actions.ActionRunner(self, context)

    def _apply(
        self,
        context: Any,
        state: ResubmissionState,
        decision: Decision,
        snapshot: JobSnapshot | None = None,
        verdict: Classification | None = None,
    ) -> dict[str, Any] | None:
        """Carry out the decision's actions in order (``ActionRunner.apply``); a ``Finish`` returns the result."""
        return self._actions(context).apply(state, decision, snapshot, verdict)

    def _back_off(self, action: lifecycle.BackOff) -> None:
        if action.in_triggerer:  # the back-off is spent in the triggerer, not in a worker slot
            from airflow.providers.standard.triggers.temporal import TimeDeltaTrigger

            self.defer(trigger=TimeDeltaTrigger(timedelta(seconds=action.seconds)), method_name="resume_after_backoff")
        else:
            time.sleep(action.seconds)

    def _fallback_argument(self) -> str:
        return "fallback_compute"

    # ------------------------------------------------------------- the record
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

    def _on_status(self, snapshot: JobSnapshot) -> None:
        """A wait saw the job's status change. Running on spot: its exposure counts from now (issue 18 §3:
        a job queued for capacity is not exposed, and counting its queue time made spot look safer)."""
        self.log.info("Job %s is %s.", snapshot.name, snapshot.status)
        state = self._state
        if snapshot.status == "Running" and state is not None and not state.on_fallback(snapshot.name):
            self._spot().started(snapshot.name)

    def on_kill(self) -> None:
        """The task was killed (marked failed, cleared, timed out): cancel the job we started.

        The cancel is recorded in ``task_state_store`` first, so that the next try knows it was
        Airflow's and submits the next job instead of attaching to, or failing on, this one.
        """
        state = self._state
        if state is None or state.current is None:
            return
        if state.current in state.lost or state.evidence_waited == state.current:
            # it ended (a back-off, or the wait for late evidence, came after): recording a cancel of it as
            # Airflow's would make the retry submit the next job whatever the Activity Log shows
            self.log.warning("Task killed while job %s had already ended; nothing to cancel.", state.current)
            return
        job_actions.cancel_on_kill(self.hook, state, lambda killed: self._remember(self._context, killed), self.log)
