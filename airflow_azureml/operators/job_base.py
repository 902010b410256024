"""What every job-submitting operator shares: exactly-once names, waiting, deferral, resubmission.

Subclasses say how to submit one job (``submit_job``) and which compute it normally runs on
(``default_compute``); everything else lives here, once.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field, replace
from typing import Any

from airflow.sdk import conf

from airflow_azureml import naming
from airflow_azureml.exceptions import (
    AzureMLConfigError,
    AzureMLError,
    AzureMLJobPreemptedError,
    AzureMLJobQueueTimeoutError,
)
from airflow_azureml.links.studio import AzureMLStudioJobLink
from airflow_azureml.operators.base import AzureMLBaseOperator
from airflow_azureml.outcomes import Classification, JobSnapshot, Outcome, classify, exception_for
from airflow_azureml.specs import check_compute_name, check_seconds, short_name
from airflow_azureml.triggers.job import AzureMLJobTrigger

MAX_CHAIN = 1000  # upper bound on the job names one unit of work can have
# task_state_store key: the newest job of this task instance, preemptions so far, and the cluster's
# preempted-node count when it was submitted. Renaming it breaks in-flight retries.
STATE_KEY = "azureml_job"


@dataclass
class ResubmissionState:
    """Where one unit of work stands: its job chain, preemptions so far, and the job being watched."""

    key: str
    job_names: list[str] = field(default_factory=list)
    preemptions: int = 0
    preempted_baseline: int | None = None
    canceled_by_airflow: bool = False

    @property
    def current(self) -> str | None:
        return self.job_names[-1] if self.job_names else None

    @property
    def resubmits(self) -> int:
        return max(0, len(self.job_names) - 1)


class AzureMLJobOperatorBase(AzureMLBaseOperator):
    """Submit one job per unit of work, wait for it (polling or deferred), resubmit preemptions.

    Exactly once: the job name is ``<dag>-<task>-<hash>-r<n>``, the hash covering ``job_identity``
    (default: run id and map index). Before submitting, the chain ``-r0, -r1, ...`` is looked up,
    so a retry attaches to a running job, returns a completed one, and never pays twice.
    """

    operator_extra_links = (AzureMLStudioJobLink(),)

    def __init__(
        self,
        *,
        max_resubmits: int = 3,
        resubmit_backoff: float = 30.0,
        fallback_compute: str | None = None,
        fallback_after: int | None = None,
        job_identity: str | None = None,
        experiment_name: str | None = None,
        max_queue_time: float | str | None = None,
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.max_queue_time = max_queue_time
        self.max_resubmits = max_resubmits
        self.resubmit_backoff = resubmit_backoff
        self.fallback_compute = fallback_compute
        self.fallback_after = fallback_after
        self.job_identity = job_identity
        self.experiment_name = experiment_name
        self.deferrable = deferrable
        self._state: ResubmissionState | None = None

    # ------------------------------------------------------- subclass contract
    def submit_job(self, context: Any, name: str, compute: str | None) -> None:
        """Submit one job named ``name``; ``compute`` overrides the default target (fallback)."""
        raise NotImplementedError

    def default_compute(self) -> str | None:
        """The compute the job runs on when not falling back; used as preemption evidence."""
        return None

    def validate(self) -> None:
        """Check the input without Azure; subclasses extend. Runs before any API call."""
        if self.max_queue_time not in (None, ""):
            seconds = check_seconds("max_queue_time", self.max_queue_time)  # may arrive rendered; never nan/inf
            self.polling = replace(self.polling, max_queue_time=seconds)
        if self.max_resubmits < 0:
            raise AzureMLConfigError("max_resubmits must be >= 0.")
        if self.fallback_compute is not None:
            check_compute_name(short_name(self.fallback_compute))
            if self.fallback_after is None or self.fallback_after < 1:
                raise AzureMLConfigError(
                    "fallback_compute needs fallback_after >= 1 (preemptions before falling back)."
                )

    def result(self, state: ResubmissionState, snapshot: JobSnapshot) -> dict[str, Any]:
        return {
            "job_name": snapshot.name,
            "job_names": list(state.job_names),
            "status": snapshot.status,
            "output_uri": snapshot.output_uri,
            "resubmits": state.resubmits,
            "preemptions": state.preemptions,
        }

    # --------------------------------------------------------------- identity
    def _unit_key(self, context: Any) -> str:
        if self.job_identity:
            return naming.work_key(self.dag_id, self.task_id, self.job_identity)
        return naming.work_key(self.dag_id, self.task_id, context["run_id"], getattr(context["ti"], "map_index", -1))

    def _name(self, state: ResubmissionState, n: int) -> str:
        return naming.job_name(self.dag_id, self.task_id, state.key, n)

    # -------------------------------------------------------------- execution
    def execute(self, context: Any) -> dict[str, Any]:
        self.validate()
        state = ResubmissionState(key=self._unit_key(context))
        self._state = state
        snapshot = self._discover(state, self._recall(context))
        if snapshot is None or not self._is_reusable(snapshot):
            snapshot = None
            self._submit(context, state)
        else:
            self.log.info("Found job %s from an earlier attempt (%s); attaching.", snapshot.name, snapshot.status)
            AzureMLStudioJobLink.persist(context, self.hook.studio_job_url(snapshot.name))
        return self._wait(context, state, snapshot)

    def execute_complete(self, context: Any, event: dict[str, Any]) -> dict[str, Any]:
        """Back from the triggerer. The resubmission state is rebuilt from the job-name chain."""
        self.validate()
        state = ResubmissionState(key=self._unit_key(context))
        self._state = state
        self._discover(state, self._recall(context))
        if event["status"] == "queue_timeout":
            self._give_up_queued(context, event["job_name"], event["message"])
        if event["status"] != "terminal":
            raise AzureMLError(f"Waiting for job {event.get('job_name')} failed: {event.get('message')}")
        return self._wait(context, state, JobSnapshot.from_dict(event["job"]))

    def _wait(self, context: Any, state: ResubmissionState, snapshot: JobSnapshot | None) -> dict[str, Any]:
        """Wait (polling here, or deferring) until the unit of work succeeds or fails for good."""
        while True:
            if snapshot is None or not snapshot.terminal:
                if self.deferrable:
                    snapshot = self.hook.job_snapshot(state.current or "")  # check before deferring
                    if snapshot is None or not snapshot.terminal:
                        self.defer(
                            trigger=AzureMLJobTrigger(
                                job_name=state.current or "",
                                azure_ml_conn_id=self.azure_ml_conn_id,
                                polling=self.polling,
                            ),
                            method_name="execute_complete",
                            timeout=self.execution_timeout,
                        )
                else:
                    try:
                        snapshot = self.hook.wait_for_job(state.current or "", self.polling, self._log_status)
                    except AzureMLJobQueueTimeoutError as exc:
                        self._give_up_queued(context, state.current or "", str(exc))
            outcome = self._handle_terminal(context, state, snapshot)
            if outcome is not None:
                return outcome
            snapshot = None  # a resubmission happened; wait for the new job

    def _give_up_queued(self, context: Any, job_name: str, message: str) -> None:
        """No capacity for too long. A retry re-attaches to the still-queued job (no second job);
        on the last try the job is cancelled so that it does not start, and bill, after we stopped."""
        ti = context["ti"]
        last_try = getattr(ti, "try_number", 1) > getattr(ti, "max_tries", 0)
        if last_try:
            self.hook.cancel_job(job_name)
            message += "; last try, cancelled the job"
        else:
            message += "; left it queued for the next try to re-attach"
        raise AzureMLJobQueueTimeoutError(message, job_name=job_name)

    def _discover(self, state: ResubmissionState, recalled: dict[str, Any] | None = None) -> JobSnapshot | None:
        """Walk the deterministic chain ``-r0, -r1, ...``; return the newest job's snapshot.

        ``task_state_store`` remembers the newest job this task instance submitted, so the walk starts
        there; it still goes on past it, which closes the crash-between-submit-and-persist gap.
        Earlier jobs of the chain that were preempted count against ``max_resubmits``.
        """
        start = 0
        if recalled and str(recalled.get("job", "")).startswith(self._name(state, 0)[:-1]):
            start = int(str(recalled["job"]).rsplit("-r", 1)[1])
            state.job_names = [self._name(state, n) for n in range(start)]
            state.preemptions = int(recalled.get("preemptions") or 0)
            state.preempted_baseline = recalled.get("preempted_baseline")
        chain: list[JobSnapshot] = []
        for n in range(start, MAX_CHAIN):
            snapshot = self.hook.job_snapshot(self._name(state, n))
            if snapshot is None:
                break
            state.job_names.append(snapshot.name)
            chain.append(snapshot)
        if len(chain) > 1 or (chain and chain[-1].name != (recalled or {}).get("job")):
            state.preempted_baseline = None  # the remembered baseline belongs to another job
        state.preemptions += sum(1 for s in chain[:-1] if classify(s).outcome is Outcome.PREEMPTED)
        return chain[-1] if chain else None

    @staticmethod
    def _recall(context: Any) -> dict[str, Any] | None:
        store = context.get("task_state_store")
        value = store.get(STATE_KEY) if store is not None else None
        return value if isinstance(value, dict) else None

    @staticmethod
    def _remember(context: Any, state: ResubmissionState) -> None:
        store = context.get("task_state_store")
        if store is not None:
            store.set(
                STATE_KEY,
                {
                    "job": state.current,
                    "preemptions": state.preemptions,
                    "preempted_baseline": state.preempted_baseline,
                },
            )

    @staticmethod
    def _is_reusable(snapshot: JobSnapshot) -> bool:
        """Running, completed or preempted jobs continue the chain; a job that failed or was cancelled
        in an earlier Airflow try is replaced (the retry is the user's or the retry policy's decision)."""
        if not snapshot.terminal:
            return True
        return classify(snapshot).outcome in (Outcome.SUCCEEDED, Outcome.PREEMPTED)

    def _submit(self, context: Any, state: ResubmissionState) -> str:
        n = len(state.job_names)
        name = self._name(state, n)
        compute = self._target_compute(state)
        facts = self.hook.compute_facts(compute or self.default_compute())
        state.preempted_baseline = facts.preempted_node_count if facts else None
        self.log.info("Submitting job %s (resubmission %d).", name, n)
        self.submit_job(context, name, compute)
        state.job_names.append(name)
        self._remember(context, state)  # first thing after the submit returns
        AzureMLStudioJobLink.persist(context, self.hook.studio_job_url(name))
        return name

    def _target_compute(self, state: ResubmissionState) -> str | None:
        if self.fallback_compute and self.fallback_after and state.preemptions >= self.fallback_after:
            return self.fallback_compute
        return None

    def _classify(self, state: ResubmissionState, snapshot: JobSnapshot) -> Classification:
        facts = self.hook.compute_facts(snapshot.compute) if snapshot.status == "Canceled" else None
        return classify(
            snapshot,
            compute=facts,
            preempted_baseline=state.preempted_baseline,
            canceled_by_airflow=state.canceled_by_airflow,
        )

    def _handle_terminal(self, context: Any, state: ResubmissionState, snapshot: JobSnapshot) -> dict[str, Any] | None:
        """Turn a terminal job into a result, an exception, or a resubmission (returns None)."""
        verdict = self._classify(state, snapshot)
        if verdict.outcome is Outcome.SUCCEEDED:
            result = self.result(state, snapshot)
            self.log.info("Job %s completed: %s", snapshot.name, result)
            return result
        if verdict.outcome in (Outcome.FAILED, Outcome.USER_CANCELED):
            raise exception_for(snapshot, verdict)
        state.preemptions += 1
        if state.preemptions > self.max_resubmits:
            raise AzureMLJobPreemptedError(
                f"Job {snapshot.name} was preempted ({verdict.reason}); {state.preemptions} preemption(s), "
                f"resubmission budget max_resubmits={self.max_resubmits} spent.",
                job_name=snapshot.name,
                status=snapshot.status,
            )
        delay = min(600.0, self.resubmit_backoff * (2 ** (state.preemptions - 1)))
        old = snapshot.name
        self.log.warning(
            "Preemption %d of job %s (%s). Resubmitting in %.1fs.", state.preemptions, old, verdict.reason, delay
        )
        time.sleep(delay)
        new = self._submit(context, state)
        self.log.warning(
            "Resubmitted preempted job: reason=%r old=%s new=%s resubmission=%d/%d",
            verdict.reason,
            old,
            new,
            state.resubmits,
            self.max_resubmits,
        )
        return None

    def _log_status(self, snapshot: JobSnapshot) -> None:
        self.log.info("Job %s is %s.", snapshot.name, snapshot.status)

    def on_kill(self) -> None:
        """The task was killed (marked failed, cleared, timed out): cancel the job we started."""
        state = self._state
        if state is None or state.current is None:
            return
        state.canceled_by_airflow = True
        self.log.warning("Task killed; cancelling Azure ML job %s.", state.current)
        try:
            self.hook.cancel_job(state.current)
        except Exception as exc:
            from airflow_azureml.redaction import scrub

            self.log.error("Could not cancel job %s: %s", state.current, scrub(str(exc)))
