"""Thin ARM/run-history REST clients over azure-core, sync (workers) and native asyncio (triggerer).

Job and compute reads go through here rather than ``MLClient`` because the SDK has no async
client, and because both paths must parse the same documents the same way. Retries are not
done by azure-core here: the caller's ``PollingPolicy`` decides (one back-off policy).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse

from airflow_azureml.exceptions import AzureMLError
from airflow_azureml.outcomes import JobSnapshot
from airflow_azureml.redaction import scrub

if TYPE_CHECKING:
    from azure.core.credentials import TokenCredential
    from azure.core.credentials_async import AsyncTokenCredential

    from airflow_azureml.hooks.azure_ml import AzureMLConnectionSettings

API_VERSION = "2024-10-01"
USER_AGENT = "airflow-azureml/0.1"
ASYNC_USER_AGENT = "airflow-azureml/0.1 (asyncio)"
TRANSIENT_STATUS = frozenset({408, 429, 500, 502, 503, 504})
_TOKEN_SLACK = 300  # refresh tokens five minutes before they expire


class TransientRestError(AzureMLError):
    """A throttled, 5xx or dropped request: safe to retry after ``retry_after`` seconds (if given)."""

    def __init__(self, message: str, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class ResourceNotFound(AzureMLError):
    """The resource does not exist (HTTP 404)."""


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
    _check(response.status_code, response.headers, response.text(), what)
    return response.json() if response.text() else {}


def _history_base(settings: AzureMLConnectionSettings, discovery: dict[str, Any]) -> str:
    return str(discovery.get("history") or discovery.get("api") or settings.resource_manager_url)


def _needs_details(arm_job: dict[str, Any]) -> bool:
    """Only a failed or cancelled job's error/warnings matter, and only run history has them."""
    return (arm_job.get("properties") or {}).get("status") in ("Failed", "Canceled")


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


class _ClientBase:
    """What the sync and async clients share: URLs, the cached token, the run-history base URL."""

    def __init__(self, settings: AzureMLConnectionSettings, credential: Any) -> None:
        self.paths = _Paths(settings)
        self._credential = credential
        self._scope = settings.arm_scope
        self._token: Any = None
        self._history_base: str | None = None

    def _token_stale(self, force: bool) -> bool:
        return force or self._token is None or self._token.expires_on - _TOKEN_SLACK < time.time()


class RestClient(_ClientBase):
    """Synchronous reads and cancels for one workspace."""

    def __init__(self, settings: AzureMLConnectionSettings, credential: TokenCredential) -> None:
        from azure.core import PipelineClient
        from azure.core.pipeline.transport import RequestsTransport

        super().__init__(settings, credential)
        self._client = PipelineClient(
            base_url=settings.resource_manager_url,
            policies=[],
            transport=RequestsTransport(connection_verify=settings.connection_verify, connection_timeout=30),
        )

    def _auth(self, force: bool = False) -> str:
        if self._token_stale(force):
            self._token = self._credential.get_token(self._scope)
        return str(self._token.token)

    def request(self, method: str, url: str, *, params: dict[str, str] | None = None, what: str = "") -> Any:
        for attempt in (1, 2):
            request = _build(method, url, params, self._auth(force=attempt == 2), USER_AGENT)
            try:
                response = self._client.send_request(request)
            except _connection_errors() as exc:
                raise TransientRestError(f"{what or url}: connection error: {scrub(str(exc))}") from None
            if response.status_code == 401 and attempt == 1:
                continue  # expired or revoked token: fetch a fresh one once
            return _result(response, what or f"{method} {url}")
        return {}

    def get_job(self, name: str) -> dict[str, Any]:
        return self.request("GET", self.paths.job(name), what=f"GET job {name}")

    def get_compute(self, name: str) -> dict[str, Any] | None:
        try:
            return self.request("GET", self.paths.compute(name), what=f"GET compute {name}")
        except ResourceNotFound:
            return None

    def history_base(self) -> str:
        if self._history_base is None:
            workspace = self.request("GET", self.paths.url(""), what="GET workspace")
            discovery_url = (workspace.get("properties") or {}).get("discoveryUrl")
            discovery = self.request("GET", discovery_url, what="GET discovery") if discovery_url else {}
            self._history_base = _history_base(self.paths.settings, discovery)
        return self._history_base

    def get_run_details(self, name: str) -> dict[str, Any]:
        url = self.paths.run_details(self.history_base(), name)
        return self.request("GET", url, what=f"GET run details {name}")

    def snapshot(self, name: str) -> JobSnapshot:
        """The job's status; for a failed or cancelled job also its error and warnings."""
        arm = self.get_job(name)
        return JobSnapshot.from_rest(arm, self.get_run_details(name) if _needs_details(arm) else None)

    def cancel_job(self, name: str) -> None:
        self.request("POST", self.paths.job(name) + "/cancel", what=f"cancel job {name}")

    def list_jobs(self, params: dict[str, str]) -> Iterator[dict[str, Any]]:
        url: str | None = self.paths.url("/jobs")
        query: dict[str, str] | None = params
        while url:
            page = self.request("GET", url, params=query, what="LIST jobs")
            yield from page.get("value") or []
            url, query = page.get("nextLink"), None

    def close(self) -> None:
        self._client.close()


class AsyncRestClient(_ClientBase):
    """The same reads on native asyncio (aiohttp), for triggers. No threads, no sync SDK."""

    def __init__(self, settings: AzureMLConnectionSettings, credential: AsyncTokenCredential) -> None:
        from azure.core import AsyncPipelineClient
        from azure.core.pipeline.transport import AioHttpTransport

        super().__init__(settings, credential)
        self._client = AsyncPipelineClient(
            base_url=settings.resource_manager_url,
            policies=[],
            transport=AioHttpTransport(connection_verify=settings.connection_verify, connection_timeout=30),
        )
        self.list_pages = 0

    async def _auth(self, force: bool = False) -> str:
        if self._token_stale(force):
            self._token = await self._credential.get_token(self._scope)
        return str(self._token.token)

    async def request(self, method: str, url: str, *, params: dict[str, str] | None = None, what: str = "") -> Any:
        for attempt in (1, 2):
            request = _build(method, url, params, await self._auth(force=attempt == 2), ASYNC_USER_AGENT)
            try:
                response = await self._client.send_request(request)  # body is loaded (stream=False)
            except _connection_errors() as exc:
                raise TransientRestError(f"{what or url}: connection error: {scrub(str(exc))}") from None
            if response.status_code == 401 and attempt == 1:
                continue
            return _result(response, what or f"{method} {url}")
        return {}

    async def get_job(self, name: str) -> dict[str, Any]:
        return await self.request("GET", self.paths.job(name), what=f"GET job {name}")

    async def history_base(self) -> str:
        if self._history_base is None:
            workspace = await self.request("GET", self.paths.url(""), what="GET workspace")
            discovery_url = (workspace.get("properties") or {}).get("discoveryUrl")
            discovery = await self.request("GET", discovery_url, what="GET discovery") if discovery_url else {}
            self._history_base = _history_base(self.paths.settings, discovery)
        return self._history_base

    async def get_run_details(self, name: str) -> dict[str, Any]:
        url = self.paths.run_details(await self.history_base(), name)
        return await self.request("GET", url, what=f"GET run details {name}")

    async def snapshot(self, name: str) -> JobSnapshot:
        return await self.complete_snapshot(await self.get_job(name))

    async def complete_snapshot(self, arm: dict[str, Any]) -> JobSnapshot:
        details = await self.get_run_details(arm["name"]) if _needs_details(arm) else None
        return JobSnapshot.from_rest(arm, details)

    async def cancel_job(self, name: str) -> None:
        await self.request("POST", self.paths.job(name) + "/cancel", what=f"cancel job {name}")

    async def list_jobs(self, params: dict[str, str]) -> AsyncIterator[dict[str, Any]]:
        url: str | None = self.paths.url("/jobs")
        query: dict[str, str] | None = params
        while url:
            page = await self.request("GET", url, params=query, what="LIST jobs")
            self.list_pages += 1
            for item in page.get("value") or []:
                yield item
            url, query = page.get("nextLink"), None

    async def close(self) -> None:
        await self._client.close()
        await self._credential.close()
