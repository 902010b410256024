"""The bill of one unit's job chain, as the job operators report it (the arithmetic is ``cost``'s)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from airflow_azureml import compat

if TYPE_CHECKING:
    from airflow_azureml.hooks.azure_ml import AzureMLHook
    from airflow_azureml.lifecycle import ResubmissionState

from airflow_azureml.cost import COST_XCOM_KEY  # the chain's bill (cost.estimate); cost.run_bill combines a run's


def chain_end(state: ResubmissionState) -> float | None:
    """When the chain's last job ended, by run history (epoch seconds; its usage keeps ``ended_at``), or None."""
    if not state.job_names:
        return None
    last = state.job_names[-1]
    ends = [
        s.get("ended_at")
        for s in (state.usage or {}).get("spans") or []
        if s.get("job") == last and isinstance(s.get("ended_at"), (int, float))
    ]
    return max(ends) if ends else None


def estimate(
    hook: AzureMLHook, state: ResubmissionState, manual_prices: dict[str, dict[str, float]], log: logging.Logger
) -> dict[str, Any] | None:
    """The chain's estimated bill (``cost.estimate``), or None when it cannot be made; no side effects."""
    from airflow_azureml import cost

    try:
        prices: dict[str, Any] = {}
        for name, info in (state.usage.get("computes") or {}).items():
            if info.get("vm_size"):
                prices[name] = hook.price_quote(info["vm_size"], info.get("location"), manual_prices)
        # the whole chain's preempted attempts, those before a clear too (a clear resets only the budget)
        return cost.estimate(state.usage, prices, lost_jobs=state.lost, preemptions=len(state.lost))
    except Exception as exc:  # the bill is a report: it never turns a finished job into a failed task
        from airflow_azureml.redaction import scrub

        log.warning("Could not estimate the cost of job chain %s: %s", state.job_names, scrub(str(exc)))
        return None


def report(
    hook: AzureMLHook,
    context: Any,
    state: ResubmissionState,
    manual_prices: dict[str, dict[str, float]],
    log: logging.Logger,
    *,
    dag_id: str,
    task_id: str,
    deadline: float | None = None,
    remember: Callable[[ResubmissionState], None] | None = None,
) -> dict[str, Any] | None:
    """The chain's estimated bill: to the task log (one block), XCom ``azureml_cost`` and Airflow metrics.

    Never fails the task: a price that cannot be read leaves the cost unknown (docs/cost.md). Returns
    the bill without its raw usage (the OpenLineage facet's). ``deadline`` (epoch seconds) and when the chain
    ended (``chain_end``, else now) go with the bill, so the UI's savings view can show the margin. The
    preemptions counter counts each of the chain's preemptions once over its reports (``remember`` stores
    how many were counted).
    """
    import time

    from airflow_azureml import cost

    bill = estimate(hook, state, manual_prices, log)
    if bill is None:
        return None
    ti = context.get("ti") if context is not None else None
    map_index = getattr(ti, "map_index", -1)
    bill.update(
        dag_id=dag_id,
        task_id=task_id,
        map_index=map_index if isinstance(map_index, int) else -1,
        job_names=list(state.job_names),
        deadline=cost.iso_time(deadline),
        finished_at=cost.iso_time(chain_end(state) or time.time()),
        observed=cost.observed(state.usage),
        usage=state.usage,
    )
    log.info("%s", cost.format_bill(bill, title=f"Azure ML cost of {task_id}"))
    if ti is not None and hasattr(ti, "xcom_push"):
        ti.xcom_push(key=COST_XCOM_KEY, value=bill)
    _send_metrics(bill, state, log, remember)
    return {k: v for k, v in bill.items() if k not in ("usage", "observed")}


def _send_metrics(
    bill: dict[str, Any],
    state: ResubmissionState,
    log: logging.Logger,
    remember: Callable[[ResubmissionState], None] | None,
) -> None:
    """The bill's metrics, best effort. The preemptions counter goes first, and only once it is sent are its
    preemptions marked counted (a failed send leaves them for the next report; a crash before the mark counts
    them again: at least once)."""
    from airflow_azureml import cost

    preemptions = int(bill.get("preemptions") or 0)
    try:
        Stats = compat.stats()  # airflow.sdk.observability.stats from Airflow 3.2, airflow.stats on 3.1
        sent = cost.metrics(bill, preemptions - state.reported_preemptions)
        sent.sort(key=lambda metric: metric[1] != "azureml.spot.preemptions")
        for kind, metric, value, tags in sent:
            getattr(Stats, kind)(metric, value, tags=tags)
            if metric == "azureml.spot.preemptions" and preemptions > state.reported_preemptions:
                state.reported_preemptions = preemptions
                if remember is not None:
                    remember(state)
    except Exception as exc:  # metrics are best effort: never a failed task, never another error than the chain's
        log.info("Could not send the cost metrics: %s", type(exc).__name__)
