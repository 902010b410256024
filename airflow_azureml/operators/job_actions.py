"""Carrying out the lifecycle's actions, in order, for one job operator's try.

``lifecycle`` decides and returns actions; ``ActionRunner`` does them with the operator's collaborators
(``job_chain``, ``job_spot``, ``job_submit``) and the operator's own parts (its subclass contract, its
task state, its back-off). It decides nothing: a continuation (``Resubmit``, ``CheckDuplicate``) asks
``lifecycle`` again with what it read. Kept apart from ``job_base``, which gathers the observations.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from airflow_azureml import lifecycle
from airflow_azureml.exceptions import AzureMLJobPreemptedError, AzureMLJobQueueTimeoutError
from airflow_azureml.lifecycle import Decision, ResubmissionState
from airflow_azureml.operators.job_report import persist_links
from airflow_azureml.operators.job_submit import UnitSubmitter
from airflow_azureml.outcomes import Classification, JobSnapshot, exception_for

if TYPE_CHECKING:
    from airflow_azureml.hooks.azure_ml import AzureMLHook
    from airflow_azureml.operators.job_base import AzureMLJobOperatorBase


def error_for(action: lifecycle.Raise, snapshot: JobSnapshot | None, verdict: Classification | None) -> Exception:
    """The exception a ``Raise`` fails the task with (its kind says which)."""
    if action.kind == "queue_timeout":
        return AzureMLJobQueueTimeoutError(action.message, job_name=action.job)
    assert snapshot is not None and verdict is not None
    if action.kind == "budget_spent":
        return AzureMLJobPreemptedError(action.message, job_name=action.job, status=snapshot.status)
    return exception_for(snapshot, verdict)


def cancel(hook: AzureMLHook, action: lifecycle.Cancel, log: logging.Logger) -> None:
    """Airflow's cancel, already recorded: a tolerant one only logs a failure (it is sent again later)."""
    if not action.tolerant:
        hook.cancel_job(action.job)
        return
    try:
        hook.cancel_job(action.job)
    except Exception as exc:
        from airflow_azureml.redaction import scrub

        log.warning("Could not cancel job %s: %s", action.job, scrub(str(exc)))


def cancel_on_kill(
    hook: AzureMLHook, state: ResubmissionState, remember: Callable[[ResubmissionState], None], log: logging.Logger
) -> None:
    """The task was killed while its job ran: Airflow's cancel, recorded (``remember``) before it is sent."""
    job = state.current or ""
    log.warning("Task killed; cancelling Azure ML job %s.", job)
    try:
        state.record_airflow_cancel(job, time.time())
        remember(state)
    except Exception as exc:  # the cancel matters more than the record
        log.error("Could not record the cancel of job %s: %s", job, type(exc).__name__)
    try:
        hook.cancel_job(job)
    except Exception as exc:
        from airflow_azureml.redaction import scrub

        log.error("Could not cancel job %s: %s", job, scrub(str(exc)))


class ActionRunner:
    """Carries out decisions for ``op`` in the try whose Airflow context is ``context``."""

    def __init__(self, op: AzureMLJobOperatorBase, context: Any) -> None:
        self.op = op
        self.context = context

    def apply(
        self,
        state: ResubmissionState,
        decision: Decision,
        snapshot: JobSnapshot | None = None,
        verdict: Classification | None = None,
    ) -> dict[str, Any] | None:
        """Carry out the decision's actions in order; a ``Finish`` returns the result.

        The decision's changes to the state take effect at its ``Remember`` actions, and only the fields
        it changed: what a collaborator changed meanwhile (``recorded``, ``usage``) stays.
        """
        op = self.op
        for action in decision.actions:
            if isinstance(action, lifecycle.Log):
                op.log.log(action.level, "%s", action.message)
            elif isinstance(action, lifecycle.Remember):
                for name, value in action.changes:
                    setattr(state, name, value)
                op._remember(self.context, state)
            elif isinstance(action, lifecycle.Cancel):
                cancel(op.hook, action, op.log)
            elif isinstance(action, lifecycle.Record):
                if action.kind == "ended":
                    op._spot().close(state, action.job)
                else:
                    op._spot().record(state, action.job, preempted=action.kind == "preempted")
            elif isinstance(action, lifecycle.CheckDeadline):
                op._spot().check_deadline(state)  # before the unit's first job: nothing can meet it, nothing is sent
            elif isinstance(action, lifecycle.CheckFallback):
                op.check_fallback()  # before the unit's first job: a missing fallback fails now, not after paying
            elif isinstance(action, lifecycle.AskSpotPolicy):
                answer = op._spot().decide(state, snapshot if action.after else None)
                self.move_to_fallback(state, answer.use_fallback, answer.rule, answer.log_inputs())
            elif isinstance(action, lifecycle.Resubmit):  # a continuation: the decision's last action
                then = lifecycle.resubmit(state, action.job, action.reason, op._limits())
                return self.apply(state, then, snapshot, verdict)
            elif isinstance(action, lifecycle.CheckDuplicate):  # a continuation too
                assert snapshot is not None
                kept = op._chain.kept_instead(state, snapshot)
                then = lifecycle.after_cancel(
                    state,
                    action.job,
                    watched=action.watched,
                    kept_instead=kept,
                    limits=op._limits(),
                    resubmit=action.resubmit,
                    now=time.time(),
                )
                return self.apply(state, then, snapshot, verdict)
            elif isinstance(action, lifecycle.BackOff):
                op._back_off(action)
            elif isinstance(action, lifecycle.Submit):
                new = self.submit(state, decided=action.decided)
                if action.after:
                    op.log.warning(
                        "Resubmitted preempted job: reason=%r old=%s new=%s resubmission=%d/%d",
                        action.reason,
                        action.after,
                        new,
                        state.preemptions,
                        op.max_resubmits,
                    )
            elif isinstance(action, lifecycle.Finish):
                assert snapshot is not None and verdict is not None
                result = op.result(state, snapshot, verdict)
                op.log.info("Job %s completed: %s", snapshot.name, result)
                return result
            elif isinstance(action, lifecycle.Raise):
                if state.job_names:  # a chain that ends in failure was billed too: its report goes out as well
                    op._report_cost(self.context, state)
                raise error_for(action, snapshot, verdict)
            # lifecycle.Wait: the loop waits for the chain's newest job
        return None

    def submit(self, state: ResubmissionState, *, decided: bool = False) -> str:
        """Submit the chain's next job, exactly once (``job_submit``), after what comes before a submit."""
        op = self.op
        self.apply(state, Decision(state, lifecycle.before_submit(state, op._limits(), decided=decided)))
        submitter = UnitSubmitter(
            op._chain,
            lambda: op._journal(state.key),
            requested=op._name,
            send=lambda name, fallback, markers: op.submit_job(self.context, name, fallback, markers),
            extra_markers=op.submit_markers,
            remember=lambda recorded: op._remember(self.context, recorded),
            log=op.log,
        )
        name = submitter.submit(state, op.polling.interval, op.fallback_target)
        persist_links(op.hook, self.context, state, name, op.log)
        return name

    def move_to_fallback(self, state: ResubmissionState, use_fallback: bool, rule: str, inputs: dict[str, Any]) -> bool:
        """Log the policy's decision with its inputs; on a switch, persist it before anything is sent."""
        op = self.op
        op.log.log(
            logging.WARNING if use_fallback else logging.INFO,
            "Spot policy: %s (rule %s). Inputs: %s",
            f"move to the fallback {op.fallback_target()}" if use_fallback else "stay on spot",
            rule,
            inputs,
        )
        self.apply(state, lifecycle.moved_to_fallback(state, use_fallback, rule))
        return use_fallback
