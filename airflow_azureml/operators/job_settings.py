"""The job operators' shared settings: checked before any API call, and given to the lifecycle as ``Limits``.

Kept apart from ``job_base`` so that what a setting may be, and why, reads in one place; the checks run
in the order the operator always ran them (the first bad setting is the one reported).
"""

from __future__ import annotations

import logging
import math
import re
from dataclasses import replace
from datetime import datetime, timedelta
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


# "+" and one or more of <number>d, <number>h, <number>m, <number>s, in that order: "+6h", "+1d12h", "+1.5h"
_OFFSET = re.compile(r"\+(?:(\d+(?:\.\d+)?)d)?(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s)?")
_GRAMMAR = (
    "an aware datetime, an ISO-8601 time with its UTC offset ('2026-11-02T06:00:00+00:00'), a timedelta > 0, "
    "or an offset after the data interval's end: '+' and whole or decimal numbers of d, h, m, s in that "
    "order ('+6h', '+1d12h', '+90m')"
)
_MAX_OFFSET = timedelta(days=3660)  # ten years: anything beyond is a typo, and overflows datetime arithmetic


def parse_deadline(value: Any) -> datetime | timedelta | None:
    """The operator's ``deadline``, possibly rendered from a template: an absolute time or an offset.

    A naive time is refused (whose 06:00?), as are offsets <= 0 (a deadline before the data it waits for)
    and ISO-8601 durations ("PT6H": one grammar for offsets, the one in the error). Empty text is no
    deadline, as for ``max_queue_time``.
    """
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, datetime):
        if value.tzinfo is None or value.utcoffset() is None:
            raise AzureMLConfigError(f"deadline {value!r} is naive: give its time zone (UTC offset).")
        return value
    if isinstance(value, timedelta):
        return _check_offset(value, value)
    if not isinstance(value, str):
        raise AzureMLConfigError(f"deadline must be {_GRAMMAR}; got {value!r}.")
    text = value.strip()
    if text.startswith("-") and _OFFSET.fullmatch("+" + text[1:]):
        raise AzureMLConfigError(
            f"deadline {value!r} is a negative offset: it must come after the data interval's end."
        )
    if text.startswith("+"):
        found = _OFFSET.fullmatch(text)
        if found is None or not any(found.groups()):
            raise AzureMLConfigError(f"deadline must be {_GRAMMAR}; got {value!r}.")
        days, hours, minutes, seconds = (float(g) if g else 0.0 for g in found.groups())
        try:
            offset = timedelta(days=days, hours=hours, minutes=minutes, seconds=seconds)
        except OverflowError:
            raise AzureMLConfigError(f"deadline {value!r} is too far ahead.") from None
        return _check_offset(offset, value)
    try:
        # Python 3.10's fromisoformat does not read a trailing "Z" (3.11+ does): the same UTC either way
        when = datetime.fromisoformat(text[:-1] + "+00:00" if text.endswith(("Z", "z")) else text)
    except ValueError:
        raise AzureMLConfigError(f"deadline must be {_GRAMMAR}; got {value!r}.") from None
    if when.tzinfo is None:
        raise AzureMLConfigError(f"deadline {value!r} is naive: give its UTC offset, e.g. 2026-11-02T06:00:00+00:00.")
    return when


def _check_offset(offset: timedelta, value: Any) -> timedelta:
    if offset < timedelta(0):
        raise AzureMLConfigError(
            f"deadline {value!r} is a negative offset: it must come after the data interval's end."
        )
    if offset == timedelta(0):
        raise AzureMLConfigError(f"deadline {value!r} must come after the data interval's end (an offset > 0).")
    if offset > _MAX_OFFSET:
        raise AzureMLConfigError(f"deadline {value!r} is too far ahead (at most {_MAX_OFFSET.days} days).")
    return offset


def resolve_deadline(
    parsed: datetime | timedelta | None, context: Any, dag: Any, log: logging.Logger
) -> tuple[float | None, str]:
    """The deadline in epoch seconds, and where it came from; (None, "") for none.

    An offset counts from the run's ``data_interval_end``, else its logical date, else its ``run_after``; in
    a backfill run an offset (or the DAG's alert) is not applied, its interval being old by design. Without
    the operator's own, the DAG's deadline alert (Airflow 3.1+) is used where the task can resolve it: a
    logical-date or fixed-time reference plus a fixed interval (the earliest of several). Others (queued
    at, average runtime, a Variable's interval) are ignored with one info log.
    """
    if isinstance(parsed, datetime):
        return parsed.timestamp(), f"deadline {parsed.isoformat()}"
    run = context.get("dag_run")
    run_type = getattr(run, "run_type", None)
    if str(getattr(run_type, "value", run_type) or "").lower() == "backfill":
        # a backfill's intervals are old by design: a deadline counted from them passed long ago
        log.info("This run is a backfill: a deadline relative to its interval is not applied (an absolute one is).")
        return None, ""
    if isinstance(parsed, timedelta):
        anchor, what = context.get("data_interval_end"), "the data interval's end"
        if anchor is None:
            anchor, what = context.get("logical_date"), "the logical date"
        if anchor is None:  # an asset-triggered or manual run without a logical date: when it was due to run
            anchor, what = getattr(run, "run_after", None), "the run's run_after"
        if anchor is None:
            raise AzureMLConfigError(
                "deadline is an offset, but this run has no data interval or logical date to count it from: "
                "give an absolute time (ISO-8601 with its UTC offset)."
            )
        return (anchor + parsed).timestamp(), f"deadline {parsed} after {what} {anchor.isoformat()}"
    return _dag_alert(context, dag, log)


def _dag_alert(context: Any, dag: Any, log: logging.Logger) -> tuple[float | None, str]:
    """The earliest deadline alert of the DAG that a task can resolve (duck-typed: no Airflow import)."""
    alerts = getattr(dag, "deadline", None) if dag is not None else None
    if not alerts:
        return None, ""
    if not isinstance(alerts, (list, tuple)):
        alerts = [alerts]
    found: list[tuple[float, str]] = []
    skipped: list[str] = []
    for alert in alerts:
        reference, interval = getattr(alert, "reference", None), getattr(alert, "interval", None)
        kind = type(reference).__name__
        anchor = None
        if kind == "DagRunLogicalDateDeadline":
            anchor = context.get("logical_date")
        elif kind == "FixedDatetimeDeadline":
            anchor = getattr(reference, "_datetime", None)
        if not isinstance(interval, timedelta) or not isinstance(anchor, datetime) or anchor.tzinfo is None:
            skipped.append(kind)
            continue
        found.append(((anchor + interval).timestamp(), f"the DAG's deadline alert ({kind} + {interval})"))
    if not found:
        log.info(
            "The DAG's deadline alert (%s) cannot be resolved to a time in the task (only a logical-date or "
            "fixed-time reference with a fixed interval can): the work runs without a deadline.",
            ", ".join(skipped),
        )
        return None, ""
    return min(found)


def check_settings(op: AzureMLJobOperatorBase) -> dict[str, dict[str, float]]:
    """Check the other shared settings without Azure; returns the prices set by hand, checked."""
    check_count("max_resubmits", op.max_resubmits, "resubmissions of preempted jobs per run of the task")
    if op.on_ambiguous_cancel not in ("fail", "resubmit"):
        raise AzureMLConfigError(
            f"on_ambiguous_cancel must be 'fail' or 'resubmit', got {op.on_ambiguous_cancel!r}: what a cancel "
            "that no witness tells from lost capacity means (docs/operators.md)."
        )
    if op.on_infeasible_deadline not in ("fallback", "fail", "", None):  # empty (a template's nothing): the default
        raise AzureMLConfigError(
            f"on_infeasible_deadline must be 'fallback' or 'fail', got {op.on_infeasible_deadline!r}: what a deadline "
            "that not even the fallback can meet means (docs/spot_policy.md)."
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
        deadline=getattr(op, "_deadline_at", None),
    )


def check_dedicated(hook: AzureMLHook, compute: str | None, what: str) -> None:
    """A fallback must run on a dedicated cluster that exists (one read): spot falling back to spot is no fallback."""
    from airflow_azureml.asset_refs import short_name

    name = short_name(compute or "")
    facts = hook.compute_facts(name) if name else None
    if facts is None:
        raise AzureMLConfigError(f"{what} runs on compute {compute!r}, which does not exist in the workspace.")
    if facts.low_priority:
        raise AzureMLConfigError(
            f"{what} runs on compute {name!r}, a low-priority cluster: a fallback from spot must be dedicated."
        )
