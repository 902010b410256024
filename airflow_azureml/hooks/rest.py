"""Thin ARM/run-history REST clients over azure-core, sync (workers) and native asyncio (triggerer).

Job and compute reads go through here rather than ``MLClient`` because the SDK has no async
client, and because both paths must parse the same documents the same way. Retries are not
done by azure-core here: the caller's ``PollingPolicy`` decides (one back-off policy).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import copy
import json
import logging
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from airflow_azureml.exceptions import AzureMLError
from airflow_azureml.outcomes import TERMINAL_STATES, JobSnapshot
from airflow_azureml.redaction import scrub

if TYPE_CHECKING:
    from azure.core.credentials import TokenCredential
    from azure.core.credentials_async import AsyncTokenCredential

    from airflow_azureml.hooks.connection import AzureMLConnectionSettings

log = logging.getLogger(__name__)

API_VERSION = "2024-10-01"
USER_AGENT = "airflow-azureml/0.1"
ASYNC_USER_AGENT = "airflow-azureml/0.1 (asyncio)"
TRANSIENT_STATUS = frozenset({408, 429, 500, 502, 503, 504})
_TOKEN_SLACK = 300  # refresh tokens five minutes before they expire
# Seconds an answer may take to arrive (azure-core's default is 300): a host that accepts the connection and
# then says nothing must not hold a wait, or the triggerer's tick of every wait on the connection, for minutes.
READ_TIMEOUT = 60.0
# After a failed look-up of run history's host, completed jobs skip their details (only their bill's floor)
# for this long rather than each paying the two ARM reads again; failed and cancelled jobs still look it up.
HISTORY_RETRY = 300.0
# The Activity Log's REST API (Activity Logs - List) and the operation a job cancel through ARM is logged as.
ACTIVITY_LOG_API_VERSION = "2015-04-01"
JOB_CANCEL_OPERATION = "microsoft.machinelearningservices/workspaces/jobs/cancel/action"
ACTIVITY_LOG_MAX_PAGES = 20


class TransientRestError(AzureMLError):
    """A throttled, 5xx or dropped request: safe to retry after ``retry_after`` seconds (if given)."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class TokenUnavailable(TransientRestError):
    """No token: Entra ID unreachable or failing, a credential that stopped working, or a token ARM refuses
    even after renewal. Connection-wide and transient: the credential is rebuilt from the connection."""


class ResourceNotFound(AzureMLError):
    """The resource does not exist (HTTP 404)."""


class MalformedResponse(AzureMLError):
    """The service answered 2xx with a body that is not the document asked for (not retried)."""


_CLAIMS = re.compile(r'claims="([^"]*)"')


def claims_challenge(www_authenticate: str | None) -> str | None:
    """The decoded claims of a ``WWW-Authenticate`` challenge (CAE, conditional access), if it has any.

    ARM sends them base64-encoded; ``get_token(..., claims=...)`` wants the JSON, and a token asked for
    with claims is never served from the credential's cache.
    """
    match = _CLAIMS.search(www_authenticate or "")
    if not match or not match.group(1):
        return None
    raw = match.group(1)
    try:
        decoded = base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)).decode()
        json.loads(decoded)
        return decoded
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return raw if raw.lstrip().startswith("{") else None


def _retry_after(headers: Any) -> float | None:
    value = headers.get("Retry-After") or headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


def _check(status: int, headers: Any, text: str, what: str) -> None:
    if status < 400:
        return
    if status == 404:
        raise ResourceNotFound(f"{what}: not found")
    detail = scrub(text, limit=500)  # scrub first: a cut could leave part of a secret
    if status in TRANSIENT_STATUS:
        raise TransientRestError(f"{what}: HTTP {status}: {detail}", _retry_after(headers))
    raise AzureMLError(f"{what}: HTTP {status}: {detail}")


def _query(url: str, params: dict[str, str] | None) -> dict[str, str]:
    """ARM calls carry ``api-version``; a next-page or discovery URL already has its own query."""
    return {} if urlparse(url).query else {"api-version": API_VERSION, **(params or {})}


def _build(method: str, url: str, params: dict[str, str] | None, token: str, user_agent: str) -> Any:
    from azure.core.rest import HttpRequest

    headers = {"Authorization": f"Bearer {token}", "User-Agent": user_agent}
    return HttpRequest(method, url, params=_query(url, params), headers=headers)


def _result(response: Any, what: str) -> Any:
    text = response.text()
    _check(response.status_code, response.headers, text, what)
    if not text:
        return {}
    try:
        return json.loads(text)
    except ValueError:
        raise MalformedResponse(f"{what}: HTTP {response.status_code} with a body that is not JSON") from None


def job_document(doc: Any, what: str) -> dict[str, Any]:
    """A job resource has a name and a string status; anything else would wait forever on "Unknown"."""
    props = doc.get("properties") if isinstance(doc, dict) else None
    if not isinstance(props, dict) or not isinstance(props.get("status"), str) or not doc.get("name"):
        raise MalformedResponse(f"{what}: the answer is not a job document")
    return doc


def _history_base(settings: AzureMLConnectionSettings, discovery: dict[str, Any]) -> str:
    """Run history's host: discovery's ``api``, as azure-ai-ml uses it. In Azure's recordings ``history``
    names another host (``<region>.experiments.azureml.net``) that the SDK never calls."""
    return str(discovery.get("api") or discovery.get("history") or settings.resource_manager_url)


def needs_details(arm_job: dict[str, Any]) -> bool:
    """An ended job: only run history has its start and end times (the bill's floor of every attempt's node
    time, completed ones included: docs/cost.md) and a failed or cancelled job's error and warnings."""
    return (arm_job.get("properties") or {}).get("status") in TERMINAL_STATES


def _completed(arm_job: dict[str, Any]) -> bool:
    """A completed job, whose run-history details only refine its bill (never its verdict)."""
    return (arm_job.get("properties") or {}).get("status") == "Completed"


def details_unread(arm_job: dict[str, Any], exc: Exception) -> None:
    """Run history's details could not be read. For a completed job they only refine its bill: log it and go
    on without them (its node time is then the cluster reads'). For a failed or cancelled job they may hold
    the verdict's evidence: raise."""
    if not _completed(arm_job):
        raise exc
    log.warning(
        "Could not read run history's details of completed job %s (%s); its bill counts the cluster reads only.",
        arm_job.get("name"),
        scrub(str(exc), limit=300),
    )


def _connection_errors() -> tuple[type[Exception], ...]:
    from azure.core.exceptions import ServiceRequestError, ServiceResponseError

    return (ServiceRequestError, ServiceResponseError)


class _Paths:
    """URLs of the resources we read, relative to the ARM endpoint."""

    def __init__(self, settings: AzureMLConnectionSettings) -> None:
        self.settings = settings
        self.ws = settings.workspace_path

    def url(self, relative: str) -> str:
        return f"{self.settings.resource_manager_url}{self.ws}{relative}"

    def job(self, name: str) -> str:
        return self.url(f"/jobs/{name}")

    def compute(self, name: str) -> str:
        return self.url(f"/computes/{name}")

    def run_details(self, history_base: str, name: str) -> str:
        return f"{history_base.rstrip('/')}/history/v1.0{self.ws}/runs/{name}/details"

    def activity_log(self) -> str:
        sub = self.settings.subscription_id
        insights = "providers/Microsoft.Insights/eventtypes/management/values"
        return f"{self.settings.resource_manager_url}/subscriptions/{sub}/{insights}"


def _utc_text(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


def job_cancels(events: list[Any], job_id: str) -> list[tuple[str, float]]:
    """The cancel requests of one job among Activity Log events: (caller, when), one per request.

    Matched case-insensitively on the operation and the resource id (ARM's casing of both varies);
    a request's events (Started, Accepted, ...) share its correlation id.
    """
    from airflow_azureml.outcomes import utc_epoch

    seen: dict[str, tuple[str, float]] = {}
    for event in events:
        if not isinstance(event, dict):
            continue
        operation = event.get("operationName")
        name = operation.get("value") if isinstance(operation, dict) else operation
        if str(name or "").lower() != JOB_CANCEL_OPERATION or str(event.get("resourceId") or "").lower() != job_id:
            continue
        status = event.get("status")
        if str((status.get("value") if isinstance(status, dict) else status) or "").lower() == "failed":
            continue  # a cancel ARM refused (no permission, say) cancelled nothing
        when = utc_epoch(event.get("eventTimestamp"))
        key = str(event.get("correlationId") or event.get("eventDataId") or len(seen))
        if when is not None and (key not in seen or when < seen[key][1]):
            seen[key] = (str(event.get("caller") or ""), when)
    return sorted(seen.values(), key=lambda c: c[1])


class _ClientBase:
    """What the sync and async clients share: URLs, the cached token, the run-history base URL.

    ``credential_factory`` rebuilds the credential from the connection (read again, so a rotated
    secret is picked up) after a token failure or a 401 that the cached token cannot answer.
    """

    def __init__(self, settings: AzureMLConnectionSettings, credential: Any, credential_factory: Any = None) -> None:
        self.paths = _Paths(settings)
        self._credential = credential
        self._factory = credential_factory
        self._scope = settings.arm_scope
        self._token: Any = None
        self._history_base: str | None = None
        self._history_failed_at: float | None = None  # monotonic time of the last failed look-up of run history
        self._rebuild = False  # the credential failed: build a new one before the next token
        self._token_failed_at: float | None = None  # monotonic time of the last failed token
        self._token_error: TokenUnavailable | None = None  # and its error
        self.credentials_built = 1

    def details_wanted(self, arm_job: dict[str, Any]) -> bool:
        """``needs_details``, except a completed job's while run history's host could not be found lately: its
        details only refine the bill, and each look-up costs two ARM reads (workspace, discovery)."""
        if not needs_details(arm_job):
            return False
        failed = self._history_failed_at
        return not (_completed(arm_job) and failed is not None and time.monotonic() - failed < HISTORY_RETRY)

    def _token_stale(self) -> bool:
        return self._token is None or self._token.expires_on - _TOKEN_SLACK < time.time()

    def _token_failed(self, exc: Exception) -> TokenUnavailable:
        self._rebuild = True
        self._token = None
        self._token_failed_at = time.monotonic()
        self._token_error = TokenUnavailable(f"could not get a token: {type(exc).__name__}: {scrub(str(exc))[:300]}")
        return self._token_error

    def own_identity(self) -> set[str]:
        """The object and application ids in this client's current token (who its requests are logged as)."""
        if self._token is None:
            return set()
        try:
            payload = str(self._token.token).split(".")[1]
            claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
        except (IndexError, ValueError, binascii.Error):
            return set()
        return {str(claims[k]) for k in ("oid", "appid", "azp") if isinstance(claims, dict) and claims.get(k)}

    def _activity_query(self, since: float, until: float, resource_id: str) -> dict[str, str]:
        text = f"eventTimestamp ge '{_utc_text(since)}' and eventTimestamp le '{_utc_text(until)}'"
        return {"api-version": ACTIVITY_LOG_API_VERSION, "$filter": f"{text} and resourceUri eq '{resource_id}'"}

    @staticmethod
    def _renewal(response: Any) -> str | None:
        return claims_challenge(response.headers.get("WWW-Authenticate") or response.headers.get("www-authenticate"))


class RestClient(_ClientBase):
    """Synchronous reads and cancels for one workspace."""

    def __init__(
        self,
        settings: AzureMLConnectionSettings,
        credential: TokenCredential,
        credential_factory: Callable[[], TokenCredential] | None = None,
    ) -> None:
        from azure.core import PipelineClient
        from azure.core.pipeline.transport import RequestsTransport

        super().__init__(settings, credential, credential_factory)
        self._client = PipelineClient(
            base_url=settings.resource_manager_url,
            policies=[],
            transport=RequestsTransport(
                connection_verify=settings.connection_verify, connection_timeout=30, read_timeout=READ_TIMEOUT
            ),
        )

    def _auth(self, *, renew: bool = False, claims: str | None = None) -> str:
        """A token; ``renew`` after a 401: with the challenge's claims, or from a rebuilt credential.

        azure-identity serves ``get_token`` from its cache until the token expires by its own clock, so
        asking the same credential again after a 401 returns the very token ARM just refused.
        """
        if not (renew or self._rebuild or self._token_stale()):
            return str(self._token.token)
        try:
            if (self._rebuild or (renew and not claims)) and self._factory is not None:
                old, self._credential = self._credential, self._factory()
                self.credentials_built += 1
                self._rebuild = False
                _close_quietly(old)
            self._token = (
                self._credential.get_token(self._scope, claims=claims)
                if claims
                else self._credential.get_token(self._scope)
            )
        except Exception as exc:  # azure-identity: ClientAuthenticationError, connection errors, a broken connection
            raise self._token_failed(exc) from None
        return str(self._token.token)

    def request(self, method: str, url: str, *, params: dict[str, str] | None = None, what: str = "") -> Any:
        claims: str | None = None
        for attempt in (1, 2):
            request = _build(method, url, params, self._auth(renew=attempt == 2, claims=claims), USER_AGENT)
            try:
                response = self._client.send_request(request)
            except _connection_errors() as exc:
                raise TransientRestError(f"{what or url}: connection error: {scrub(str(exc))}") from None
            if response.status_code == 401:
                if attempt == 1:
                    claims = self._renewal(response)  # expired, revoked or challenged: renew once
                    continue
                self._rebuild = True
                raise TokenUnavailable(f"{what or url}: HTTP 401 with a renewed token")
            return _result(response, what or f"{method} {url}")
        return {}

    def get_job(self, name: str) -> dict[str, Any]:
        what = f"GET job {name}"
        return job_document(self.request("GET", self.paths.job(name), what=what), what)

    def get_compute(self, name: str) -> dict[str, Any] | None:
        try:
            return self.request("GET", self.paths.compute(name), what=f"GET compute {name}")
        except ResourceNotFound:
            return None

    def get_batch_resource(self, endpoint: str, deployment: str | None = None) -> dict[str, Any] | None:
        """A batch endpoint, or one of its deployments; None when it does not exist."""
        relative = f"/batchEndpoints/{endpoint}" + (f"/deployments/{deployment}" if deployment else "")
        try:
            return self.request("GET", self.paths.url(relative), what=f"GET {relative.lstrip('/')}")
        except ResourceNotFound:
            return None

    def history_base(self) -> str:
        if self._history_base is None:
            try:
                workspace = self.request("GET", self.paths.url(""), what="GET workspace")
                discovery_url = (workspace.get("properties") or {}).get("discoveryUrl")
                discovery = self.request("GET", discovery_url, what="GET discovery") if discovery_url else {}
            except Exception:
                self._history_failed_at = time.monotonic()
                raise
            self._history_base = _history_base(self.paths.settings, discovery)
        return self._history_base

    def get_run_details(self, name: str) -> dict[str, Any]:
        url = self.paths.run_details(self.history_base(), name)
        return self.request("GET", url, what=f"GET run details {name}")

    def snapshot(self, name: str) -> JobSnapshot:
        """The job's status; for an ended job also run history's start and end times, and its error and warnings.

        The job exists once ARM returns it: a 404 from run history (lagging, or no run record) leaves
        the details out, it never makes the job "not found".
        """
        arm = self.get_job(name)
        details = None
        if self.details_wanted(arm):
            try:
                details = self.get_run_details(name)
            except ResourceNotFound:
                log.warning("Run history has no details for job %s (yet); its run times and error are unknown.", name)
            except Exception as exc:  # a completed job's details are best effort: never fail or stall its wait
                details_unread(arm, exc)
        return JobSnapshot.from_rest(arm, details)

    def cancel_job(self, name: str) -> None:
        self.request("POST", self.paths.job(name) + "/cancel", what=f"cancel job {name}")

    def job_cancels(self, name: str, since: float, until: float) -> list[tuple[str, float]]:
        """The cancel requests of job ``name`` that the Activity Log shows between ``since`` and ``until``."""
        job_id = self.paths.job(name)[len(self.paths.settings.resource_manager_url) :]
        url: str | None = self.paths.activity_log()
        query: dict[str, str] | None = self._activity_query(since, until, job_id)
        events: list[Any] = []
        for _ in range(ACTIVITY_LOG_MAX_PAGES):
            page = self.request("GET", str(url), params=query, what="read the Activity Log")
            value = page.get("value") if isinstance(page, dict) else None
            if not isinstance(value, list):
                raise MalformedResponse("read the Activity Log: the answer holds no list of events")
            events.extend(value)
            url, query = page.get("nextLink"), None
            if not url:
                return job_cancels(events, job_id.lower())
            if not isinstance(url, str) or not url.startswith(self.paths.settings.resource_manager_url + "/"):
                raise MalformedResponse("read the Activity Log: a nextLink outside Azure Resource Manager")
        raise MalformedResponse(f"read the Activity Log: more than {ACTIVITY_LOG_MAX_PAGES} pages of events")

    def list_jobs(self, params: dict[str, str]) -> Iterator[dict[str, Any]]:
        url: str | None = self.paths.url("/jobs")
        query: dict[str, str] | None = params
        while url:
            page = self.request("GET", url, params=query, what="LIST jobs")
            yield from page.get("value") or []
            url, query = page.get("nextLink"), None

    def close(self) -> None:
        self._client.close()
        _close_quietly(self._credential)


class AsyncRestClient(_ClientBase):
    """The same reads on native asyncio (aiohttp), for triggers. No threads, no sync SDK."""

    def __init__(
        self,
        settings: AzureMLConnectionSettings,
        credential: AsyncTokenCredential,
        credential_factory: Callable[[], Awaitable[AsyncTokenCredential]] | None = None,
    ) -> None:
        from azure.core import AsyncPipelineClient
        from azure.core.pipeline.transport import AioHttpTransport

        super().__init__(settings, credential, credential_factory)
        self._client = AsyncPipelineClient(
            base_url=settings.resource_manager_url,
            policies=[],
            transport=AioHttpTransport(
                connection_verify=settings.connection_verify, connection_timeout=30, read_timeout=READ_TIMEOUT
            ),
        )
        self.list_pages = 0
        # A poller reads several jobs at once: one token refresh and one run-history look-up serve them all.
        self._auth_lock = asyncio.Lock()
        self._history_lock = asyncio.Lock()
        self._history_error: Exception | None = None  # the last failed look-up's error

    async def _auth(self, *, renew: bool = False, claims: str | None = None, rejected: str | None = None) -> str:
        """As ``RestClient._auth``, on asyncio (the factory reads the connection with ``aget_connection``).

        Concurrent reads refresh the token once: a read that waited while another refreshed it takes that
        token (for a renewal after a 401: one other than ``rejected``, the token ARM refused), and one that
        waited while the refresh failed fails at once with that refresh's error rather than asking again.
        """
        if not (renew or self._rebuild or self._token_stale()):
            return str(self._token.token)
        asked = time.monotonic()
        async with self._auth_lock:
            failed, error = self._token_failed_at, self._token_error
            if failed is not None and failed >= asked and error is not None:
                raise _again(error, TokenUnavailable) from None
            fresh = not (self._rebuild or self._token_stale())
            # a claims challenge (continuous access evaluation) is answered with its claims, never another token
            taken = fresh and rejected is not None and not claims and str(self._token.token) != rejected
            if fresh and (not renew or taken):
                return str(self._token.token)
            return await self._refresh_token(renew, claims)

    async def _refresh_token(self, renew: bool, claims: str | None) -> str:
        try:
            if (self._rebuild or (renew and not claims)) and self._factory is not None:
                old, self._credential = self._credential, await self._factory()
                self.credentials_built += 1
                self._rebuild = False
                await _aclose_quietly(old)
            self._token = await (
                self._credential.get_token(self._scope, claims=claims)
                if claims
                else self._credential.get_token(self._scope)
            )
        except Exception as exc:
            raise self._token_failed(exc) from None
        return str(self._token.token)

    async def request(self, method: str, url: str, *, params: dict[str, str] | None = None, what: str = "") -> Any:
        claims: str | None = None
        token: str | None = None
        for attempt in (1, 2):
            token = await self._auth(renew=attempt == 2, claims=claims, rejected=token)
            request = _build(method, url, params, token, ASYNC_USER_AGENT)
            try:
                response = await self._client.send_request(request)  # body is loaded (stream=False)
            except _connection_errors() as exc:
                raise TransientRestError(f"{what or url}: connection error: {scrub(str(exc))}") from None
            if response.status_code == 401:
                if attempt == 1:
                    claims = self._renewal(response)
                    continue
                self._rebuild = True
                raise TokenUnavailable(f"{what or url}: HTTP 401 with a renewed token")
            return _result(response, what or f"{method} {url}")
        return {}

    async def get_job(self, name: str) -> dict[str, Any]:
        what = f"GET job {name}"
        return job_document(await self.request("GET", self.paths.job(name), what=what), what)

    async def get_compute(self, name: str) -> dict[str, Any] | None:
        try:
            return await self.request("GET", self.paths.compute(name), what=f"GET compute {name}")
        except ResourceNotFound:
            return None

    async def history_base(self) -> str:
        """As ``RestClient.history_base``; concurrent reads look it up once (a failed look-up fails the reads that
        waited on it with its own error: a 403 stays a 403, a throttled read stays transient)."""
        if self._history_base is not None:
            return self._history_base
        asked = time.monotonic()
        async with self._history_lock:
            failed, error = self._history_failed_at, self._history_error
            if failed is not None and failed >= asked and error is not None:
                raise _again(error, TransientRestError) from None
            if self._history_base is None:
                try:
                    workspace = await self.request("GET", self.paths.url(""), what="GET workspace")
                    discovery_url = (workspace.get("properties") or {}).get("discoveryUrl")
                    discovery = await self.request("GET", discovery_url, what="GET discovery") if discovery_url else {}
                except Exception as exc:
                    self._history_failed_at, self._history_error = time.monotonic(), _again(exc, TransientRestError)
                    raise
                self._history_base = _history_base(self.paths.settings, discovery)
            return self._history_base

    async def get_run_details(self, name: str) -> dict[str, Any]:
        url = self.paths.run_details(await self.history_base(), name)
        return await self.request("GET", url, what=f"GET run details {name}")

    async def snapshot(self, name: str) -> JobSnapshot:
        return await self.complete_snapshot(await self.get_job(name))

    async def complete_snapshot(self, arm: dict[str, Any]) -> JobSnapshot:
        """As ``RestClient.snapshot``: a run-history 404 leaves the details out, the job still exists."""
        details = None
        if self.details_wanted(arm):
            try:
                details = await self.get_run_details(arm["name"])
            except ResourceNotFound:
                log.warning(
                    "Run history has no details for job %s (yet); its run times and error are unknown.", arm["name"]
                )
            except Exception as exc:  # as RestClient.snapshot
                details_unread(arm, exc)
        return JobSnapshot.from_rest(arm, details)

    async def cancel_job(self, name: str) -> None:
        await self.request("POST", self.paths.job(name) + "/cancel", what=f"cancel job {name}")

    async def list_job_pages(self, params: dict[str, str]) -> AsyncIterator[list[dict[str, Any]]]:
        """The LIST one page at a time, so that a caller can stop after as many pages as it can afford."""
        url: str | None = self.paths.url("/jobs")
        query: dict[str, str] | None = params
        while url:
            page = await self.request("GET", url, params=query, what="LIST jobs")
            self.list_pages += 1
            values = page.get("value") if isinstance(page, dict) else None
            yield [item for item in values or [] if isinstance(item, dict)]
            url, query = page.get("nextLink") if isinstance(page, dict) else None, None

    async def list_jobs(self, params: dict[str, str]) -> AsyncIterator[dict[str, Any]]:
        async for page in self.list_job_pages(params):
            for item in page:
                yield item

    async def close(self) -> None:
        await self._client.close()
        await _aclose_quietly(self._credential)


def _again(error: Exception, fallback: type[AzureMLError]) -> Exception:
    """A copy of ``error`` for another read that waited on the attempt that raised it (same class and message);
    an error that cannot be rebuilt from its arguments becomes ``fallback`` with its text."""
    try:
        again = copy.copy(error)
    except Exception:
        return fallback(scrub(str(error), limit=300))
    return again.with_traceback(None)


def _close_quietly(credential: Any) -> None:
    close = getattr(credential, "close", None)
    if close is not None:
        try:
            close()
        except Exception:  # closing a credential that already failed must not hide the real error
            log.debug("closing a credential failed", exc_info=True)


async def _aclose_quietly(credential: Any) -> None:
    close = getattr(credential, "close", None)
    if close is not None:
        try:
            await close()
        except Exception:
            log.debug("closing a credential failed", exc_info=True)
