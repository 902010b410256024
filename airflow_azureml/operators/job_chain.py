"""Finding a unit of work's jobs in Azure before anything is submitted: the exactly-once reads.

Every job carries the unit key and its resubmission number as job properties, so one filtered LIST
finds the unit's jobs whatever name Azure gave them; the requested names ``<dag>-<task>-<key>-r<n>``
are also looked up, for a LIST that lags. What the reads mean is decided in ``lifecycle``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from airflow_azureml import lifecycle, naming
from airflow_azureml.assets import DatastorePath, parse_datastore_uri
from airflow_azureml.exceptions import AzureMLConfigError, AzureMLError
from airflow_azureml.outcomes import JobSnapshot

if TYPE_CHECKING:
    from airflow_azureml.hooks.azure_ml import AzureMLHook
    from airflow_azureml.lifecycle import ResubmissionState


# How much earlier than the unfinished submit's own clock a job it created may say it was created (clock skew).
CARRIER_CLOCK_SKEW_SECONDS = 120.0


def data_place(uri: Any) -> str:
    """A data URI as one place, however it was written: a datastore URI in its short form (the SDK may send
    the workspace-qualified one; ``assets.parse_datastore_uri`` reads both), any other with no trailing ``/``."""
    text = str(uri or "").strip()
    parsed = parse_datastore_uri(text)
    return DatastorePath(parsed.datastore, parsed.path).uri if parsed else text.rstrip("/")


def job_places(arm_job: dict[str, Any], side: str) -> set[str]:
    """The job's input (``side="inputs"``) or output data places."""
    values = ((arm_job.get("properties") or {}).get(side) or {}).values()
    return {data_place(v.get("uri")) for v in values if isinstance(v, dict) and v.get("uri")}


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


def refused(exc: BaseException) -> bool:
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


class JobChain:
    """The reads (and the duplicate cancels) that find one unit's jobs; ``requested(state, n)`` names them."""

    def __init__(
        self,
        hook: AzureMLHook,
        requested: Callable[[ResubmissionState, int], str],
        log: logging.Logger,
        *,
        journaled: dict[int, str] | None = None,
        carrier: Callable[[dict[str, Any]], bool] | None = None,
    ):
        self.hook = hook
        self.requested = requested
        self.log = log
        self.journaled = journaled or {}  # the unit journal's jobs by number (``unit_journal``)
        self.carrier = carrier  # does an ARM job carry this unit's work (its data paths, endpoint...)?

    def listed(self, state: ResubmissionState, **only: str) -> dict[int, list[Listed]]:
        """The unit's jobs by resubmission number, from one LIST filtered on the unit's property.

        Every job kept carries the filter's properties itself: a LIST that ignores or loosens its
        filter (Azure documents no matching rule) must never hand this unit another unit's job.
        """
        wanted = {naming.UNIT_TAG: state.key, **only}
        found: dict[int, list[Listed]] = {}
        for item in self.hook.find_job_resources(wanted):
            job = Listed.from_rest(item)
            if any(job.snapshot.properties.get(key) != value for key, value in wanted.items()):
                continue
            try:
                found.setdefault(int(job.snapshot.properties.get(naming.RESUBMISSION_TAG, "")), []).append(job)
            except ValueError:
                continue
        return found

    def keep_one(self, n: int, jobs: list[Listed]) -> str:
        """One job per resubmission number; cancel the other still-running ones.

        Two jobs of one number exist when the SDK's invoke created two for one call while Azure picked the
        names (azure-sdk-for-python#31166), or when two runs submitted the same work at once. Every run
        keeps the same one, the oldest (then by name), recomputed from the LIST: no run cancels the job
        another run keeps, and a run whose own job lost sees why it was cancelled (``kept_instead``).
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

    def of_number(self, state: ResubmissionState, n: int) -> list[Listed]:
        return self.listed(state, **{naming.RESUBMISSION_TAG: str(n)}).get(n, [])

    def discover(self, state: ResubmissionState) -> JobSnapshot | None:
        """Set the unit's chain in ``state``; return the last requested name found (its snapshot).

        Sources, merged by resubmission number: the jobs carrying the unit key as a property (one
        filtered LIST: Azure may have ignored the requested names), the jobs this run of the task
        remembers, and the requested names ``-r<n>`` after the highest number known (jobs of older
        versions, or a LIST that lags behind a submit).
        """
        by_number: dict[int, str] = {}
        listed_names: set[str] = set()
        for n, jobs in sorted(self.listed(state).items()):
            by_number[n] = self.keep_one(n, jobs)
            listed_names.update(job.snapshot.name for job in jobs)
        for n, name in sorted(self.journaled.items()):  # Azure dropped or ignored the properties
            if name not in listed_names and name not in by_number.values():
                by_number.setdefault(n, name)
        by_number = lifecycle.merge_chain(by_number, listed_names, state.known)
        n = max(by_number, default=-1) + 1
        latest: JobSnapshot | None = None
        while n < lifecycle.MAX_CHAIN:
            snapshot = self.hook.job_snapshot(self.requested(state, n))
            if snapshot is None:
                break
            by_number[n], latest = snapshot.name, snapshot
            n += 1
        state.job_names = [by_number[k] for k in sorted(by_number)]
        state.next_resubmission = n
        return latest

    def kept_instead(self, state: ResubmissionState, snapshot: JobSnapshot) -> str | None:
        """The job kept instead of this cancelled one, when it was cancelled as a duplicate (``keep_one``)."""
        number = snapshot.properties.get(naming.RESUBMISSION_TAG)
        if snapshot.properties.get(naming.UNIT_TAG) != state.key or number is None or not number.isdigit():
            return None
        jobs = self.of_number(state, int(number))
        if snapshot.name not in {job.snapshot.name for job in jobs}:
            return None
        keep = min(jobs, key=Listed.order).snapshot.name
        return keep if keep != snapshot.name else None

    def of_unfinished_submit(self, state: ResubmissionState, n: int, interval: float) -> str | None:
        """An earlier try stopped while submitting resubmission ``n`` (a crash between the request and
        the record): its job may exist under a name Azure chose, not yet in the LIST. Look for it by its
        properties and by the requested name until ``LIST_LAG_SECONDS`` after that submit began."""
        pending = state.submitting
        if not pending or pending.get("n") != n:
            return None
        began = min(float(pending.get("at") or 0.0), time.time())  # a clock ahead never stretches the wait
        deadline = began + lifecycle.LIST_LAG_SECONDS
        self.log.warning(
            "An earlier try stopped while submitting resubmission %d; looking for its job until %s "
            "(Azure's LIST can lag behind a new job) before submitting again.",
            n,
            datetime.fromtimestamp(deadline, timezone.utc).strftime("%H:%M:%S UTC"),
        )
        while True:
            jobs = self.of_number(state, n)
            if jobs:
                name = self.keep_one(n, jobs)
                self.log.info("Found job %s of that submit; following it instead of submitting again.", name)
                return name
            snapshot = self.hook.job_snapshot(self.requested(state, n))
            if snapshot is not None:
                return snapshot.name
            carried = self.carried(state, began)
            if carried is not None:
                return carried
            left = deadline - time.time()
            if left <= 0:
                self.log.info(
                    "No job of resubmission %d appeared within %.0f s; submitting.", n, lifecycle.LIST_LAG_SECONDS
                )
                return None
            time.sleep(min(left, max(1.0, interval)))

    def carried(self, state: ResubmissionState, since: float) -> str | None:
        """A job that carries this unit's work but no unit property, created since the unfinished submit began.

        Azure may drop an invoke's properties and ignore its name: the data paths, endpoint, deployment and
        experiment of the job are then what identify it (``carrier``), from one unfiltered LIST. A job with
        another unit's property, or already in a chain this run knows, is never taken.
        """
        if self.carrier is None:
            return None
        taken = set(state.job_names) | set(state.known) | set(self.journaled.values())
        earliest = since - CARRIER_CLOCK_SKEW_SECONDS
        found: list[Listed] = []
        for item in self.hook.find_job_resources({}):
            job = Listed.from_rest(item)
            if naming.UNIT_TAG in job.snapshot.properties or job.snapshot.name in taken:
                continue
            if job.created is None or job.created.timestamp() < earliest or not self.carrier(item):
                continue
            found.append(job)
        if not found:
            return None
        name = min(found, key=Listed.order).snapshot.name
        self.log.warning(
            "Job %s carries this unit's work (data paths, endpoint, deployment, experiment) but not its "
            "properties (Azure dropped them); following it as the earlier try's job instead of submitting again.",
            name,
        )
        return name

    def follow_returned(self, state: ResubmissionState, n: int, requested: str, name: str) -> str:
        """Azure named the job otherwise than requested: follow the oldest listed job of that number."""
        self.log.warning("Azure named the job %s instead of %s; following the name it returned.", name, requested)
        jobs = self.of_number(state, n)
        # Our own job not listed yet (the LIST lags): its age is unknown, so cancel nothing now; a run that
        # sees it and an older one cancels it, and we then follow the older one.
        if name in {job.snapshot.name for job in jobs}:
            kept = self.keep_one(n, jobs)
            if kept != name:
                self.log.warning("Following job %s, the older job of the same unit of work.", kept)
            return kept
        return name
