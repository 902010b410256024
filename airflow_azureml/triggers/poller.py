"""Coalesced job polling: one poller per workspace connection and event loop.

Azure Resource Manager throttles reads per subscription (12,000/hour under the legacy limits).
2,000 waits polled one by one every 30 s need 240,000 reads an hour. Here, all waits on the same
connection in one triggerer share one paged LIST per interval of the provider's own jobs (those
with the ``naming.UNIT_TAG`` property), newest first, stopping once every waited job was seen and
after at most ``ceil(waits / page size) + 1`` pages; a job missing from those pages costs a GET, and a job
seen ended one GET of run history's details (its run times; a failed or cancelled job's error), read
``CONCURRENT_READS`` at a time. So a tick costs what the waits need, not what the workspace holds.

Failures are kept where they belong: a 400/403/malformed answer for one job ends that job's wait
only; a token failure, a throttled or failed LIST, or a network error is transient for the waits
it touched, each with its own budget. Nothing ends a wait whose job may still be running because
of another job.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar

from airflow_azureml.exceptions import AzureMLConfigError, AzureMLError
from airflow_azureml.hooks.rest import (
    AsyncRestClient,
    MalformedResponse,
    ResourceNotFound,
    TokenUnavailable,
    TransientRestError,
)
from airflow_azureml.naming import UNIT_TAG
from airflow_azureml.outcomes import JobSnapshot
from airflow_azureml.polling import COMPUTE_READS, GaugeReading, JobWatch, PollingPolicy, TransientBudgetExceeded
from airflow_azureml.redaction import scrub

log = logging.getLogger(__name__)

# Below this many waits, single GETs are cheaper than a page of the job list.
DIRECT_GET_LIMIT = 3
# New waits arriving together (a triggerer picks up triggers in batches) share their first poll.
JOIN_DEBOUNCE = 0.05
# The LIST: the provider's own jobs (every submitted job carries this user property), not archived.
LIST_QUERY = {"listViewType": "ActiveOnly", "properties": UNIT_TAG}
# An evidence read this close to due is taken now (timers wake a little early).
EVIDENCE_SLACK = 0.05
# The page size the cap assumes (ARM's job LIST pages hold 100 jobs here and in the emulator).
LIST_PAGE_SIZE = 100
# Job and run-history reads in flight at once per poller: a tick where many jobs end (a mapped task's
# partitions, a whole-cluster preemption) waits for the slowest few reads, not for their sum.
CONCURRENT_READS = 8


@dataclass
class _Wait:
    job_name: str
    watch: JobWatch
    future: asyncio.Future[dict[str, Any]]
    wait_for_creation: bool = False
    due: float = 0.0
    ended: JobSnapshot | None = None  # seen terminal this tick: resolved after the compute is read once more


@dataclass
class PollerStats:
    ticks: int = 0
    waits_served: int = 0  # what one-GET-per-wait polling would have cost
    list_pages: int = 0
    max_pages_per_tick: int = 0
    list_ticks: int = 0
    job_gets: int = 0
    detail_gets: int = 0
    compute_gets: int = 0
    transient_errors: int = 0
    events: int = 0
    started: float = field(default_factory=time.monotonic)


# What one job read gave: a snapshot, "no such job" (None), or the error that ends or delays its wait.
_Result = JobSnapshot | None | AzureMLError


class WorkspacePoller:
    """Waits on many jobs of one workspace with as few ARM reads as possible."""

    _registry: ClassVar[dict[tuple[str, int], WorkspacePoller]] = {}

    def __init__(self, conn_id: str) -> None:
        self.conn_id = conn_id
        self._waits: dict[str, list[_Wait]] = {}
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._client: AsyncRestClient | None = None
        self._closing = False
        self.stats = PollerStats()
        self._last_page: dict[str, int] = {}  # the LIST page (1-based) each waited job was last found on
        self._poll_now = False  # a read found every node of a waited job's cluster preempted: poll at once

    @classmethod
    def for_connection(cls, conn_id: str) -> WorkspacePoller:
        key = (conn_id, id(asyncio.get_running_loop()))
        poller = cls._registry.get(key)
        if poller is None or poller._closing:
            poller = cls._registry[key] = cls(conn_id)
        return poller

    async def wait(self, job_name: str, policy: PollingPolicy, *, wait_for_creation: bool = False) -> dict[str, Any]:
        """Resolve with the event payload once the job is terminal, queued too long, or unreadable.

        ``wait_for_creation``: a job that does not exist yet is waited for (a sensor), not an error.
        """
        if self._closing:  # this poller's loop has ended and it is closing its client: use a live one
            return await WorkspacePoller.for_connection(self.conn_id).wait(
                job_name, policy, wait_for_creation=wait_for_creation
            )
        wait = _Wait(job_name, JobWatch(policy), asyncio.get_running_loop().create_future(), wait_for_creation)
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

    def _live(self) -> list[_Wait]:
        return [w for group in self._waits.values() for w in group if not w.future.done()]

    async def _get_client(self) -> AsyncRestClient:
        if self._client is None:
            from airflow_azureml.hooks.azure_ml import AzureMLHook

            self._client = await AzureMLHook(azure_ml_conn_id=self.conn_id).async_rest()
        return self._client

    async def _run(self) -> None:
        quiet_ticks = 0  # list mode: consecutive ticks in which no waited job changed
        list_due = 0.0  # list mode: when the next LIST is due (one LIST serves every wait)
        try:
            await self._sleep(JOIN_DEBOUNCE)  # let a burst of new waits share the first poll
            while True:
                waits = self._live()
                if not waits:
                    # No await between this check and ``_closing``: a wait arriving from here on
                    # finds this poller closing and goes to a new one (it never joins a dead loop).
                    break
                list_mode = len(waits) > DIRECT_GET_LIMIT
                now = time.monotonic()
                if list_mode:
                    new = any(w.watch.polls == 0 and w.watch.transient_errors == 0 for w in waits)  # just joined
                    due = waits if now >= list_due or new or self._poll_now else []
                else:
                    due = [w for w in waits if w.due <= now]
                self._poll_now = False
                retry_delay = 0.0
                if due:
                    try:
                        results = await self._poll({w.job_name for w in due}, list_mode)
                    except AzureMLConfigError as exc:  # no such connection, or a bad one: no retry can fix it
                        log.error("Polling jobs on %s: %s", self.conn_id, exc)
                        for wait in due:
                            self._resolve(wait, _error(wait.job_name, scrub(str(exc)), status="config_error"))
                        continue
                    except Exception as exc:  # the tick as a whole failed (token, LIST, client): transient
                        delay = self._tick_failed(due, exc)
                        list_due = time.monotonic() + delay
                        await self._sleep(delay)
                        continue
                    self.stats.ticks += 1
                    self.stats.waits_served += len(due)
                    changed, retry_delay = self._deliver(due, results)
                    quiet_ticks = 0 if changed else quiet_ticks + 1
                    try:
                        await self._sample_gauges(due)
                    finally:
                        self._resolve_ended(due)
                    if list_mode:
                        # One LIST serves every wait, so back off as a whole: slower while nothing changes.
                        policy = min((w.watch.policy for w in waits), key=lambda p: p.interval)
                        list_due = time.monotonic() + max(policy.delay(quiet_ticks), retry_delay)
                # Between polls, the clusters of jobs not yet ended are read at the evidence cadence.
                polled = {id(w) for w in due}
                evidence = [w for w in self._live() if id(w) not in polled and _evidence_due(w)]
                if evidence:
                    await self._sample_gauges(evidence)
                if self._poll_now:
                    poll_delay = 0.0
                elif list_mode and len(self._live()) > DIRECT_GET_LIMIT:
                    poll_delay = max(0.0, list_due - time.monotonic())
                else:
                    poll_delay = self._next_delay()
                await self._sleep(min(poll_delay, self._evidence_delay()), debounce=True)
        finally:
            self._closing = True
            key = (self.conn_id, id(asyncio.get_running_loop()))
            if self._registry.get(key) is self:
                self._registry.pop(key, None)
            for wait in self._live():  # only when the task itself was cancelled (triggerer stopping)
                self._resolve(wait, _error(wait.job_name, "the triggerer's poller stopped"))
            client, self._client = self._client, None
            if client is not None:
                await client.close()

    def _evidence_delay(self) -> float:
        delays = [d for w in self._live() if (d := w.watch.evidence_delay()) is not None]
        return min(delays) if delays else math.inf

    def _tick_failed(self, due: list[_Wait], exc: Exception) -> float:
        """A failure that touched every due wait: each spends its own transient budget. Returns the delay."""
        self.stats.transient_errors += 1
        if not isinstance(exc, TransientRestError):
            log.exception("Polling jobs on %s failed unexpectedly; treating it as transient", self.conn_id)
        retry_after = exc.retry_after if isinstance(exc, TransientRestError) else None
        delays = [d for w in due if (d := self._transient(w, exc, retry_after)) is not None]
        delay = min(delays) if delays else 0.0
        log.warning("Transient error polling jobs on %s (%s); retrying in %.1fs", self.conn_id, exc, delay)
        return delay

    def _transient(self, wait: _Wait, exc: Exception, retry_after: float | None) -> float | None:
        """Spend one of this wait's transient errors: its next delay, or None once its budget ended it."""
        try:
            delay = wait.watch.transient_error(retry_after)
        except TransientBudgetExceeded:
            message = f"gave up after {wait.watch.transient_errors} consecutive transient errors: {exc}"
            self._resolve(wait, _error(wait.job_name, scrub(message)))
            return None
        wait.due = time.monotonic() + delay
        return delay

    async def _sleep(self, delay: float, debounce: bool = False) -> None:
        """Sleep ``delay`` seconds, or until a new wait arrives (then briefly, to batch arrivals)."""
        self._wakeup.clear()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._wakeup.wait(), timeout=max(0.0, delay))
            if debounce:
                await asyncio.sleep(JOIN_DEBOUNCE)

    def _next_delay(self) -> float:
        dues = [w.due for w in self._live()]
        return max(0.0, min(dues) - time.monotonic()) if dues else 0.0

    def _page_cap(self, names: set[str], page_size: int) -> int:
        """``ceil(waits / page size) + 1`` pages, or further while that is cheaper than the GETs it saves.

        As waits end, the jobs still waited for stay spread over the pages their finished neighbours
        fill. A page past the base cap is worth reading when the waited jobs last seen beyond the cap
        outnumber the extra pages (each would cost a GET); jobs never found (older than the history)
        never stretch it.
        """
        base = math.ceil(len(names) / page_size) + 1
        beyond = sorted(page for name in names if (page := self._last_page.get(name, 0)) > base)
        cap = base
        for count, page in enumerate(beyond, start=1):
            if count >= page + 1 - base:  # one page of drift: newer jobs push older ones down
                cap = page + 1
        return cap

    async def _list(self, client: AsyncRestClient, names: set[str]) -> dict[str, dict[str, Any]]:
        """The provider's jobs from at most ``_page_cap`` pages; the rest are read by GET."""
        found: dict[str, dict[str, Any]] = {}
        pages, page_size = 0, LIST_PAGE_SIZE
        seen_on: dict[str, int] = {}
        try:
            async for page in client.list_job_pages(LIST_QUERY):
                pages += 1
                for item in page:
                    if not isinstance(item, dict) or not isinstance(item.get("properties"), dict):
                        continue
                    if item.get("name") in names:
                        found[item["name"]] = item
                        seen_on[item["name"]] = pages
                # Never fewer jobs per page than ARM's usual page: empty or short pages with a
                # nextLink cannot stretch the cap; a service with smaller pages costs GETs instead.
                page_size = max(page_size, len(page))
                if len(found) == len(names) or pages >= self._page_cap(names, page_size):
                    break
        except TokenUnavailable:
            raise  # connection-wide: the whole tick is transient
        except AzureMLError as exc:  # a LIST this identity may not run, or a bad page: fall back to GETs
            log.warning("Listing jobs on %s failed (%s); reading the waited jobs one by one", self.conn_id, exc)
        finally:
            # Jobs not reached keep their old page: a LIST that stopped early says nothing new about them.
            self._last_page = {n: seen_on.get(n, self._last_page.get(n, 0)) for n in names}
            self.stats.list_pages += pages
            self.stats.list_ticks += 1
            self.stats.max_pages_per_tick = max(self.stats.max_pages_per_tick, pages)
        return found

    async def _poll(self, names: set[str], list_mode: bool) -> dict[str, _Result]:
        """Each waited job's snapshot, read ``CONCURRENT_READS`` at a time: mapped tasks end on the same tick, and
        each ended job costs a read of run history that should not queue behind the others'."""
        client = await self._get_client()
        found = await self._list(client, names) if list_mode else {}
        limit = asyncio.Semaphore(CONCURRENT_READS)
        no_token: list[TokenUnavailable] = []  # the tick fails on the first; reads not yet started are skipped

        async def read(name: str) -> _Result:
            async with limit:
                if no_token:
                    return no_token[0]
                try:
                    arm = found.get(name)
                    if arm is None:
                        self.stats.job_gets += 1
                        arm = await client.get_job(name)
                    if client.details_wanted(arm):
                        self.stats.detail_gets += 1
                    return await client.complete_snapshot(arm)
                except ResourceNotFound:
                    return None
                except TokenUnavailable as exc:  # no token for any job: the tick fails, not this job
                    no_token.append(exc)
                    return exc
                except AzureMLError as exc:  # 400, 403, malformed body, throttled: this job only
                    return exc
                except Exception as exc:  # a body of an unexpected shape (tags as a list...): this job only
                    return MalformedResponse(f"job {name}: unexpected response shape ({type(exc).__name__})")

        ordered = sorted(names)
        results = await asyncio.gather(*(read(name) for name in ordered))
        if no_token:
            raise no_token[0]
        return dict(zip(ordered, results, strict=True))

    def _deliver(self, due: list[_Wait], results: dict[str, _Result]) -> tuple[bool, float]:
        """Feed each wait its result; resolve the finished ones. Returns (anything changed, retry delay)."""
        now = time.monotonic()
        changed = False
        retry_delay = 0.0
        for wait in due:
            if wait.future.done():
                continue
            result = results.get(wait.job_name)
            if isinstance(result, TransientRestError):
                self.stats.transient_errors += 1
                delay = self._transient(wait, result, result.retry_after)
                retry_delay = max(retry_delay, delay or 0.0)
                continue
            if isinstance(result, AzureMLError):
                changed = True
                self._resolve(wait, _error(wait.job_name, f"reading job {wait.job_name} failed: {result}"))
                continue
            if result is None:
                if wait.wait_for_creation:
                    wait.due = now + wait.watch.observe_missing()
                    continue
                changed = True
                self._resolve(wait, _error(wait.job_name, f"job {wait.job_name} not found"))
                continue
            delay = wait.watch.observe(result, now)
            changed = changed or wait.watch.unchanged_polls == 0
            if delay is None:
                wait.ended = result  # resolved once its compute is read once more (_resolve_ended)
            elif wait.watch.queue_time_exceeded(now):
                message = (
                    f"job {wait.job_name} stayed {result.status} for more than {wait.watch.policy.max_queue_time}s"
                )
                self._resolve(wait, self._payload(wait, "queue_timeout", result, message))
            else:
                wait.due = now + delay
        return changed, retry_delay

    async def _sample_gauges(self, due: list[_Wait]) -> None:
        """Read the compute of each job not yet ended (and once more of each job seen ended this tick) at
        most once per poll interval or evidence interval, shared by every wait on it: the preemption gauge
        while the job runs, the node counts for the cost estimate while it waits, prepares or runs."""
        by_compute: dict[str, list[_Wait]] = {}
        for wait in due:
            if not wait.future.done() and wait.watch.wants_usage():
                compute = wait.watch.last_compute
                if compute:
                    by_compute.setdefault(compute, []).append(wait)
        if not by_compute:
            return
        client = await self._get_client()
        for compute, waits in by_compute.items():
            key = client.paths.compute(compute)
            max_age = min(min(w.watch.policy.interval, w.watch.policy.evidence_interval) for w in waits)
            if any(w.ended is not None for w in waits):
                max_age = 0.0  # a job seen ended: the first read after its end is evidence (JobWatch), not a shared one
            ok, reading = COMPUTE_READS.fresh(key, max_age)
            if not ok:
                taken = time.monotonic()
                reading = None
                try:
                    self.stats.compute_gets += 1
                    reading = GaugeReading.from_rest(compute, await client.get_compute(compute), taken)
                except AzureMLError as exc:  # a missed sample is missing evidence, never a failed wait
                    log.info("Could not read compute %s for its preemption gauge: %s", compute, exc)
                finally:
                    COMPUTE_READS.store(key, reading, taken)
            now = time.monotonic()
            for wait in waits:
                wait.watch.offer_gauge(reading, now)  # evidence only from readings taken while the job ran
                if wait.watch.wants_poll_now():  # every node preempted: is the job still Running?
                    wait.due = now
                    self._poll_now = True
                wait.watch.offer_usage(reading)

    def _resolve_ended(self, due: list[_Wait]) -> None:
        for wait in due:
            if wait.ended is not None and not wait.future.done():
                self._resolve(wait, self._payload(wait, "terminal", wait.ended))

    def _payload(self, wait: _Wait, status: str, snapshot: JobSnapshot, message: str | None = None) -> dict[str, Any]:
        payload: dict[str, Any] = {
            "status": status,
            "job_name": wait.job_name,
            "job": snapshot.to_dict(),
            "gauge_evidence": wait.watch.gauge.to_dict(),
            "usage": wait.watch.usage_dict(),  # node counts' change points (cost.py), JSON
        }
        if message is not None:
            payload["message"] = message
        return payload

    def _resolve(self, wait: _Wait, payload: dict[str, Any]) -> None:
        self.stats.events += 1
        if not wait.future.done():
            payload.setdefault("gauge_evidence", wait.watch.gauge.to_dict())
            wait.future.set_result(payload)


def _evidence_due(wait: _Wait) -> bool:
    delay = wait.watch.evidence_delay()
    return delay is not None and delay <= EVIDENCE_SLACK


def _error(job_name: str, message: str, status: str = "error") -> dict[str, Any]:
    """A wait that ended without the job's end: ``error`` (the task may retry) or ``config_error`` (it fails)."""
    return {"status": status, "job_name": job_name, "message": message}
