"""Coalesced job polling: one poller per workspace connection and event loop.

Azure Resource Manager throttles reads per subscription (12,000/hour under the legacy limits).
2,000 waits polled one by one every 30 s need 240,000 reads an hour. Here, all waits on the same
connection in one triggerer share one paged LIST of the workspace's jobs per interval (newest
first, stopping once every waited job was seen); only a job missing from the list, or one that
needs its error details, costs a GET.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar

from airflow_azureml.hooks.rest import AsyncRestClient, ResourceNotFound, TransientRestError
from airflow_azureml.outcomes import JobSnapshot
from airflow_azureml.polling import JobWatch, PollingPolicy, TransientBudgetExceeded

log = logging.getLogger(__name__)

# Below this many waits, single GETs are cheaper than a page of the job list.
DIRECT_GET_LIMIT = 3
# New waits arriving together (a triggerer picks up triggers in batches) share their first poll.
JOIN_DEBOUNCE = 0.05


@dataclass
class _Wait:
    job_name: str
    watch: JobWatch
    future: asyncio.Future[dict[str, Any]]
    due: float = 0.0


@dataclass
class PollerStats:
    ticks: int = 0
    waits_served: int = 0  # what one-GET-per-wait polling would have cost
    list_pages: int = 0
    job_gets: int = 0
    detail_gets: int = 0
    transient_errors: int = 0
    events: int = 0
    started: float = field(default_factory=time.monotonic)


class WorkspacePoller:
    """Waits on many jobs of one workspace with as few ARM reads as possible."""

    _registry: ClassVar[dict[tuple[str, int], WorkspacePoller]] = {}

    def __init__(self, conn_id: str) -> None:
        self.conn_id = conn_id
        self._waits: dict[str, list[_Wait]] = {}
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._client: AsyncRestClient | None = None
        self.stats = PollerStats()

    @classmethod
    def for_connection(cls, conn_id: str) -> WorkspacePoller:
        key = (conn_id, id(asyncio.get_running_loop()))
        poller = cls._registry.get(key)
        if poller is None:
            poller = cls._registry[key] = cls(conn_id)
        return poller

    async def wait(self, job_name: str, policy: PollingPolicy) -> dict[str, Any]:
        """Resolve with the event payload once the job is terminal, queued too long, or unreadable."""
        wait = _Wait(job_name, JobWatch(policy), asyncio.get_running_loop().create_future())
        self._waits.setdefault(job_name, []).append(wait)
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run(), name=f"azureml-poller-{self.conn_id}")
        self._wakeup.set()
        try:
            return await wait.future
        finally:
            waits = self._waits.get(job_name, [])
            if wait in waits:
                waits.remove(wait)
            if not waits:
                self._waits.pop(job_name, None)

    async def _get_client(self) -> AsyncRestClient:
        if self._client is None:
            from airflow_azureml.hooks.azure_ml import AzureMLHook

            self._client = await AzureMLHook(azure_ml_conn_id=self.conn_id).async_rest()
        return self._client

    async def _run(self) -> None:
        errors = 0
        quiet_ticks = 0  # list mode: consecutive ticks in which no waited job changed
        try:
            client = await self._get_client()
            await self._sleep(JOIN_DEBOUNCE)  # let a burst of new waits share the first poll
            while self._waits:
                waits = [w for group in self._waits.values() for w in group]
                list_mode = len(waits) > DIRECT_GET_LIMIT
                now = time.monotonic()
                due = waits if list_mode else [w for w in waits if w.due <= now]
                if due:
                    try:
                        snapshots = await self._poll(client, {w.job_name for w in due}, list_mode)
                        errors = 0
                    except TransientRestError as exc:
                        errors += 1
                        self.stats.transient_errors += 1
                        try:
                            delay = due[0].watch.transient_error(exc.retry_after)
                        except TransientBudgetExceeded:
                            self._fail_all(f"gave up after {errors} consecutive transient errors: {exc}")
                            continue
                        log.warning("Transient error polling jobs (%s); retrying in %.1fs", exc, delay)
                        await self._sleep(delay)
                        continue
                    self.stats.ticks += 1
                    self.stats.waits_served += len(due)
                    changed = self._deliver(due, snapshots)
                    quiet_ticks = 0 if changed else quiet_ticks + 1
                if list_mode and self._waits:
                    # One LIST serves every wait, so back off as a whole: slower while nothing changes.
                    policy = min((w.watch.policy for w in waits), key=lambda p: p.interval)
                    await self._sleep(policy.delay(quiet_ticks), debounce=True)
                else:
                    await self._sleep(self._next_delay(), debounce=True)
        except Exception as exc:  # never leave waiters hanging
            log.exception("Job poller for %s crashed", self.conn_id)
            self._fail_all(f"poller crashed: {type(exc).__name__}: {exc}")
        finally:
            if self._client is not None:
                await self._client.close()
                self._client = None
            self._registry.pop((self.conn_id, id(asyncio.get_running_loop())), None)

    async def _sleep(self, delay: float, debounce: bool = False) -> None:
        """Sleep ``delay`` seconds, or until a new wait arrives (then briefly, to batch arrivals)."""
        self._wakeup.clear()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._wakeup.wait(), timeout=max(0.0, delay))
            if debounce:
                await asyncio.sleep(JOIN_DEBOUNCE)

    def _next_delay(self) -> float:
        dues = [w.due for waits in self._waits.values() for w in waits]
        return max(0.0, min(dues) - time.monotonic()) if dues else 0.0

    async def _poll(self, client: AsyncRestClient, names: set[str], list_mode: bool) -> dict[str, JobSnapshot | None]:
        found: dict[str, dict[str, Any]] = {}
        if list_mode:
            pages_before = client.list_pages
            async for item in client.list_jobs({"listViewType": "ActiveOnly"}):
                if item.get("name") in names:
                    found[item["name"]] = item
                    if len(found) == len(names):
                        break
            self.stats.list_pages += client.list_pages - pages_before
        result: dict[str, JobSnapshot | None] = {}
        for name in names:
            arm = found.get(name)
            if arm is None:
                self.stats.job_gets += 1
                try:
                    arm = await client.get_job(name)
                except ResourceNotFound:
                    result[name] = None
                    continue
            status = (arm.get("properties") or {}).get("status")
            if status in ("Failed", "Canceled"):
                self.stats.detail_gets += 1
            result[name] = await client.complete_snapshot(arm)
        return result

    def _deliver(self, due: list[_Wait], snapshots: dict[str, JobSnapshot | None]) -> bool:
        """Feed each wait its snapshot; resolve the finished ones. Returns whether anything changed."""
        now = time.monotonic()
        changed = False
        for wait in due:
            if wait.future.done():
                continue
            snapshot = snapshots.get(wait.job_name)
            if snapshot is None:
                changed = True
                self._resolve(
                    wait, {"status": "error", "job_name": wait.job_name, "message": f"job {wait.job_name} not found"}
                )
                continue
            delay = wait.watch.observe(snapshot, now)
            changed = changed or wait.watch.unchanged_polls == 0
            if delay is None:
                self._resolve(wait, {"status": "terminal", "job_name": wait.job_name, "job": snapshot.to_dict()})
            elif wait.watch.queue_time_exceeded(now):
                self._resolve(
                    wait,
                    {
                        "status": "queue_timeout",
                        "job_name": wait.job_name,
                        "job": snapshot.to_dict(),
                        "message": f"job {wait.job_name} stayed {snapshot.status} for more than "
                        f"{wait.watch.policy.max_queue_time}s",
                    },
                )
            else:
                wait.due = now + delay
        return changed

    def _resolve(self, wait: _Wait, payload: dict[str, Any]) -> None:
        self.stats.events += 1
        if not wait.future.done():
            wait.future.set_result(payload)

    def _fail_all(self, message: str) -> None:
        for waits in list(self._waits.values()):
            for wait in waits:
                self._resolve(wait, {"status": "error", "job_name": wait.job_name, "message": message})
