"""Jobs: command jobs, their life after creation (update, stall, cancel, end), and the jobs API.

``JobStore`` is the part of ``Workspace`` that creates command jobs (checked against a Kubernetes
instance type), keeps a job immutable but for the fields Azure lets a PUT change, stalls a job
(NotResponding), cancels it through CancelRequested, and ends it (releasing its nodes); synthetic jobs,
with fixed timelines and no compute, serve load tests. ``JobRoutes`` is the part of ``Routes`` that
serves the jobs LIST (filters, lag, pages), GET and PUT, the cancel action (logged in the Activity Log)
and run history's run details. Batch jobs are created by ``emulator.invoke``; every job's work is run
by ``emulator.runner``.
"""

from __future__ import annotations

import asyncio
import datetime as dt
from typing import Any
from urllib.parse import urlencode

from aiohttp import web

from airflow_azureml.emulator.activity_log import token_principal
from airflow_azureml.emulator.arm import PROVIDER, short_name
from airflow_azureml.emulator.azure_rules import DEFAULT_NAME, RuleViolation, check_resources, from_compute_entry
from airflow_azureml.emulator.errors import EmulatorError, arm_error, method_not_allowed
from airflow_azureml.emulator.models import TERMINAL_JOB_STATES, Job, utcnow

JOBS_PAGE_SIZE = 100


class JobStore:
    """The part of ``Workspace`` (emulator.workspace) that holds the jobs and changes their state."""

    def put_command_job(self, name: str, body: dict[str, Any]) -> tuple[Job, bool]:
        props = dict(body.get("properties") or {})
        existing = self.jobs.get(name)
        if existing is not None:
            if self.behaviour.immutable_jobs:
                self._update_job(existing, props)
            return existing, False
        if props.get("jobType", "Command") == "Command" and not str(props.get("command") or "").strip():
            raise EmulatorError(400, "UserError", "A command job needs a command (CommandJob.command is required)")
        compute_name = short_name(props.get("computeId")) or ""
        compute = self.computes.get(compute_name)
        if compute is None:
            raise EmulatorError(400, "UserError", f"Compute {props.get('computeId')!r} not found")
        if compute.compute_type == "Kubernetes":
            resources = props.get("resources") or {}
            itype = self.check_instance_type(compute, resources.get("instanceType"))
            _check_fits(resources.get("properties") or {}, itype, resources.get("instanceType") or DEFAULT_NAME)
        job = Job(
            name=name,
            job_type=props.get("jobType", "Command"),
            compute=compute_name,
            experiment_name=props.get("experimentName") or "Default",
            properties={k: v for k, v in props.items() if k not in ("status", "computeId", "jobType")},
            submitted=props,
        )
        self.jobs[name] = job
        self._runners[name] = self._spawn(self._run_command(job, compute))
        return job, True

    def _update_job(self, job: Job, props: dict[str, Any]) -> None:
        """A PUT of an existing job: only Azure's mutable fields may change; the rest must be identical."""
        baseline = job.submitted if job.submitted is not None else job.properties
        old, new = _immutable_view(baseline), _immutable_view(props)
        changed = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
        stored = job.properties.setdefault("properties", {}) or {}
        altered = [k for k, v in (props.get("properties") or {}).items() if k in stored and stored[k] != v]
        if changed or altered:
            prop = (changed[0][:1].upper() + changed[0][1:]) if changed else "Properties"
            raise EmulatorError(
                400,
                "UserError",
                "A job with this name already exists. If you are trying to create a new job, use a different name. "
                f"If you are trying to update an existing job, the existing job's {prop} cannot be changed. "
                "Only description, tags, displayName, properties, and isArchived can be updated.",
                {"messageParameters": {"property": f" {prop}"}, "innerError": {"code": "Immutable"}},
            )
        for key in ("description", "displayName", "isArchived"):
            if key in props:
                job.properties[key] = props[key]
        job.properties["tags"] = {**(job.properties.get("tags") or {}), **(props.get("tags") or {})}
        stored.update(props.get("properties") or {})
        job.modified = utcnow()

    def stall_job(self, name: str, seconds: float) -> Job:
        """The job stops responding for ``seconds`` (status NotResponding), then resumes where it was."""
        job = self.jobs.get(name)
        if job is None:
            raise EmulatorError(404, "UserError", f"Job {name!r} not found")
        if job.status != "Running":
            raise EmulatorError(409, "Conflict", f"Job {name!r} is {job.status}; only a Running job can stall")
        job.stalled = True
        job.set_status("NotResponding")
        self._spawn(self._resume(job, seconds))
        return job

    async def _resume(self, job: Job, seconds: float) -> None:
        await asyncio.sleep(seconds)
        if job.status == "NotResponding":
            job.set_status("Running")

    async def _while_stalled(self, job: Job) -> None:
        while job.status == "NotResponding" or self._held(job):
            await asyncio.sleep(self.timing.tick)

    def _held(self, job: Job) -> bool:
        return job.status == "Running" and job.compute in self.held_clusters and job.name not in self.released_jobs

    def hold_cluster(self, name: str, held: bool = True) -> None:
        """Hold (or let go) the Running jobs on a cluster before their end; see ``held_clusters``."""
        if held:
            self.held_clusters.add(name)
        else:
            self.held_clusters.discard(name)

    def release_job(self, name: str) -> None:
        self.released_jobs.add(name)

    def hold_job(self, name: str) -> None:
        """Hold a released job again (its cluster still held): it takes no new work, so it stays Running."""
        self.released_jobs.discard(name)

    def _now_running(self, job: Job) -> None:
        job.set_status("Running")
        if self.behaviour.stall_seconds > 0 and not job.stalled:
            self.stall_job(job.name, self.behaviour.stall_seconds)

    def create_synthetic_jobs(
        self,
        prefix: str,
        durations: list[float],
        queue_seconds: float = 0.0,
        properties: dict[str, str] | None = None,
    ) -> list[str]:
        """Jobs with fixed timelines and no compute, for load tests of the waiting side.

        ``properties``: user properties every job carries, as a submitter's would (a load test of
        waits on the provider's own jobs needs the property its job LIST filters on).
        """
        names = []
        for index, duration in enumerate(durations):
            name = f"{prefix}-{index:05d}"
            if name in self.jobs:
                raise EmulatorError(409, "UserError", f"A job named {name!r} already exists in this workspace")
            job = Job(
                name=name,
                job_type="Command",
                compute="",
                properties={"displayName": name, "properties": dict(properties or {})},
            )
            self.jobs[name] = job
            self._runners[name] = self._spawn(self._run_synthetic(job, queue_seconds, float(duration)))
            names.append(name)
        return names

    def cancel_job(self, name: str) -> Job:
        job = self.jobs.get(name)
        if job is None:
            raise EmulatorError(404, "UserError", f"Job {name!r} not found")
        if job.status in TERMINAL_JOB_STATES:
            return job
        job.cancel_requested = True  # kept for tests only: nothing on the wire tells who canceled
        if self.behaviour.cancel_lag_seconds > 0:  # accepted now, seen later: reads still show the job running
            self._spawn(self._land_cancel(job, self.behaviour.cancel_lag_seconds))
            return job
        job.set_status("CancelRequested")
        self._spawn(self._finish_cancel(job))
        return job

    async def _land_cancel(self, job: Job, lag: float) -> None:
        await asyncio.sleep(lag)
        if job.status not in TERMINAL_JOB_STATES:
            job.set_status("CancelRequested")
            await self._finish_cancel(job)

    async def _finish_cancel(self, job: Job) -> None:
        await asyncio.sleep(self.behaviour.cancel_requested_seconds or self.timing.tick)
        if job.status == "CancelRequested":
            self._end_job(job, "Canceled")

    def _end_job(self, job: Job, status: str, *, error: dict[str, Any] | None = None) -> None:
        if job.status in TERMINAL_JOB_STATES:
            return
        job.error = error
        job.set_status(status)
        runner = self._runners.pop(job.name, None)
        current = asyncio.current_task()
        if runner is not None and runner is not current and not runner.done():
            runner.cancel()
        self._release(self.computes.get(job.compute), job)


_READ_ONLY_JOB_FIELDS = frozenset({"status", "services"})
_MUTABLE_JOB_FIELDS = frozenset({"description", "tags", "displayName", "properties", "isArchived"})


def _immutable_view(props: dict[str, Any]) -> dict[str, Any]:
    """The job fields Azure will not change on a PUT, with absent and null treated alike."""
    return {
        k: _without_nulls(v)
        for k, v in props.items()
        if k not in _READ_ONLY_JOB_FIELDS and k not in _MUTABLE_JOB_FIELDS and v is not None
    }


def _without_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


def _check_fits(resource_props: dict[str, Any], itype: dict[str, Any], name: str) -> None:
    """Reject a job whose ``resources`` do not fit the instance type, by the service's rules (``azure_rules``)."""
    if not resource_props.get("resources"):
        return  # the job takes the instance type's own resources
    try:
        check_resources(resource_props.get("resources"), from_compute_entry(name, itype))
    except RuleViolation as exc:
        raise EmulatorError(400, "UserError", str(exc)) from None


class JobRoutes:
    """The part of ``Routes`` (emulator.routes) that serves the jobs and their run details."""

    async def list_jobs(self, request: web.Request) -> web.Response:
        self._check_scope(request)
        q = request.query
        jobs = list(reversed(self.ws.jobs.values()))  # newest first, as the service lists them
        lag = self.ws.behaviour.list_lag_seconds
        if lag > 0:  # an index that lags behind the resource store
            cutoff = utcnow() - dt.timedelta(seconds=lag)
            jobs = [j for j in jobs if j.created <= cutoff]
        if q.get("jobType"):
            jobs = [j for j in jobs if j.job_type.lower() == q["jobType"].lower()]
        if q.get("tag"):
            jobs = [j for j in jobs if q["tag"] in (j.properties.get("tags") or {})]
        if q.get("properties") and not self.ws.behaviour.list_ignores_properties_filter:
            for pair in q["properties"].split(","):
                key, _, value = pair.partition("=")
                jobs = [
                    j
                    for j in jobs
                    if (j.to_arm(self.ws_id)["properties"].get("properties") or {}).get(key) == value
                    or (not value and key in (j.properties.get("properties") or {}))
                ]
        if q.get("statuses"):  # emulator extension, not in the 2024-10-01 swagger
            wanted = {s.strip() for s in q["statuses"].split(",")}
            jobs = [j for j in jobs if j.status in wanted]
        if q.get("listViewType", "ActiveOnly") == "ArchivedOnly":
            jobs = []
        skip = int(q.get("$skip", "0") or 0)
        page = jobs[skip : skip + JOBS_PAGE_SIZE]
        body: dict[str, Any] = {"value": [j.to_arm(self.ws_id) for j in page]}
        if skip + JOBS_PAGE_SIZE < len(jobs):
            params = {k: v for k, v in q.items() if k != "$skip"}
            params["$skip"] = str(skip + JOBS_PAGE_SIZE)
            body["nextLink"] = f"{self.base_url}{request.path}?{urlencode(params)}"
        return web.json_response(body)

    async def job(self, request: web.Request) -> web.Response:
        self._check_scope(request)
        name = request.match_info["name"]
        if request.method == "GET":
            job = self.ws.jobs.get(name)
            if job is None:
                return arm_error(404, "UserError", f"Job {name} not found in workspace {self.workspace}")
            return web.json_response(job.to_arm(self.ws_id))
        if request.method == "PUT":
            try:
                job, created = self.ws.put_command_job(name, await request.json())
            except EmulatorError as exc:  # immutability errors carry MFE's messageParameters/innerError
                return arm_error(exc.status, exc.code, exc.message, exc.extra)
            headers = {"Location": str(request.url)} if created else {}  # a created job's 201 names itself
            return web.json_response(job.to_arm(self.ws_id), status=201 if created else 200, headers=headers)
        return method_not_allowed()

    async def cancel_job(self, request: web.Request) -> web.Response:
        """202 with the JSON ``null``, ``Location`` to ``mfeOperationResults/jc:<workspace id>:<job>`` and a
        one-hour timeout (job.cancel)."""
        self._check_scope(request)
        name = request.match_info["name"]
        self.ws.cancel_job(name)
        auth = request.headers.get("Authorization", "")
        caller = token_principal(auth[7:] if auth[:7].lower() == "bearer " else "").get("oid", "")
        self.activity.job_cancel(  # ARM logs the action with its caller (emulator.activity_log)
            resource_id=f"{self.ws_id}/jobs/{name}",
            resource_group=self.rg,
            caller=caller,
            lag_seconds=self.ws.behaviour.activity_log_lag_seconds,
        )
        loc = (
            f"{self.base_url}/subscriptions/{self.sub}/providers/{PROVIDER}/locations/{self.location}"
            f"/mfeOperationResults/jc:{self._workspace_guid()}:{name}?api-version=2024-10-01"
        )
        headers = {"Location": loc, "x-ms-async-operation-timeout": "PT1H", "Retry-After": self.lro_retry_after}
        return web.json_response(None, status=202, headers=headers)

    async def run_details(self, request: web.Request) -> web.Response:
        self._check_scope(request)
        job = self.ws.jobs.get(request.match_info["run"])
        if job is None:
            return arm_error(404, "UserError", f"Run {request.match_info['run']} not found")
        return web.json_response(job.to_run_details())
