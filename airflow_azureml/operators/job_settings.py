"""The job operators' shared settings: checked before any API call, and given to the lifecycle as ``Limits``.

Kept apart from ``job_base`` so that what a setting may be, and why, reads in one place; the checks run
in the order the operator always ran them (the first bad setting is the one reported).
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from airflow_azureml.exceptions import AzureMLConfigError
from airflow_azureml.lifecycle import Limits

if TYPE_CHECKING:
    from airflow_azureml.hooks.azure_ml import AzureMLHook
    from airflow_azureml.operators.job_base import AzureMLJobOperatorBase
    from airflow_azureml.polling import PollingPolicy


def check_count(label: str, value: Any, meaning: str) -> None:
    """A whole number >= 0: ``2.5`` or ``True`` would silently become another budget (``True`` is 1)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise AzureMLConfigError(f"{label} must be a whole number >= 0 ({meaning}), got {value!r}.")
    if value < 0:
        raise AzureMLConfigError(f"{label} must be >= 0 ({meaning}), got {value}.")


def with_max_queue_time(polling: PollingPolicy, max_queue_time: float | str | None) -> PollingPolicy:
    """The polling policy with the operator's ``max_queue_time``, which may arrive rendered (never nan/inf)."""
    if max_queue_time in (None, ""):
        return polling
    from airflow_azureml.specs import check_seconds  # not at DAG parse

    return replace(polling, max_queue_time=check_seconds("max_queue_time", max_queue_time))


def check_settings(op: AzureMLJobOperatorBase) -> dict[str, dict[str, float]]:
    """Check the other shared settings without Azure; returns the prices set by hand, checked."""
    check_count("max_resubmits", op.max_resubmits, "resubmissions of preempted jobs per run of the task")
    if op.on_ambiguous_cancel not in ("fail", "resubmit"):
        raise AzureMLConfigError(
            f"on_ambiguous_cancel must be 'fail' or 'resubmit', got {op.on_ambiguous_cancel!r}: what a cancel "
            "that no witness tells from lost capacity means (docs/operators.md)."
        )
    wait = op.evidence_wait
    if isinstance(wait, bool) or not isinstance(wait, (int, float)) or not math.isfinite(wait) or wait < 0:
        raise AzureMLConfigError(f"evidence_wait must be a finite number of seconds >= 0, got {wait!r}.")
    from airflow_azureml.hooks.prices import check_manual_prices

    manual_prices = check_manual_prices(op.prices, f"Task {op.task_id!r}: prices")
    check_count("loop_after", op.loop_after, "preemptions resubmitted at once before backing off")
    backoff = op.resubmit_backoff
    if isinstance(backoff, bool) or not isinstance(backoff, (int, float)) or not math.isfinite(backoff):
        raise AzureMLConfigError(f"resubmit_backoff must be a finite number of seconds >= 0, got {backoff!r}.")
    if backoff < 0:
        raise AzureMLConfigError("resubmit_backoff must be >= 0 seconds.")
    if op.fallback_after is not None:
        if isinstance(op.fallback_after, bool) or not isinstance(op.fallback_after, int):
            raise AzureMLConfigError("fallback_after must be an integer >= 1 (preemptions before falling back).")
        if op.fallback_after < 1:
            raise AzureMLConfigError("fallback_after must be >= 1 (preemptions before falling back).")
        if op.fallback_target() is None:
            raise AzureMLConfigError(f"fallback_after needs a fallback: {op._fallback_argument()}.")
        if op.fallback_after > op.max_resubmits:
            raise AzureMLConfigError(
                f"fallback_after={op.fallback_after} can never fire with max_resubmits={op.max_resubmits}: "
                "the budget ends the chain first."
            )
    return manual_prices


def limits(op: AzureMLJobOperatorBase) -> Limits:
    """The settings the lifecycle reads, as it reads them."""
    return Limits(
        max_resubmits=op.max_resubmits,
        loop_after=op.loop_after,
        resubmit_backoff=float(op.resubmit_backoff),
        fallback=op.fallback_target(),
        deferrable=bool(op.deferrable),
        on_ambiguous_cancel="resubmit" if op.on_ambiguous_cancel == "resubmit" else "fail",
        evidence_wait=float(op.evidence_wait),
    )


def check_dedicated(hook: AzureMLHook, compute: str | None, what: str) -> None:
    """A fallback must run on a dedicated cluster that exists (one read): spot falling back to spot is no fallback."""
    from airflow_azureml.specs import short_name

    name = short_name(compute or "")
    facts = hook.compute_facts(name) if name else None
    if facts is None:
        raise AzureMLConfigError(f"{what} runs on compute {compute!r}, which does not exist in the workspace.")
    if facts.low_priority:
        raise AzureMLConfigError(
            f"{what} runs on compute {name!r}, a low-priority cluster: a fallback from spot must be dedicated."
        )
