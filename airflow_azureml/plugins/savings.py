"""The savings view in Airflow's UI: an Airflow 3 plugin, registered through the provider's entry point.

Two pages, each a tab in Airflow's UI (``external_views``): per DAG (its last runs, a chart and their total)
and per DAG run (its tasks). They are served by a FastAPI app that the api-server mounts at ``/azureml-savings``.

Auth is Airflow's own: the page reads the cost reports through Airflow's public REST API, in the api-server's
process, with the credential of the person asking (their ``Authorization`` header, else the UI's ``_token``
cookie). So it shows exactly what that person may read, and nothing to a person who cannot read the DAG; the
plugin holds no credential of its own and keeps no store (the reports are the job tasks' ``azureml_cost`` XComs).

Every Airflow process loads plugins, so this module imports only Airflow's plugin base: the FastAPI app is
built on its first request. (No ``from __future__ import annotations``: FastAPI reads the routes' parameter
types, ``Request`` among them, from the annotations, and that type is imported inside ``build_app``.)
"""

import asyncio
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import quote

from airflow.plugins_manager import AirflowPlugin

URL_PREFIX = "/azureml-savings"
ROOT_APP_KEY = "airflow_azureml.root_app"  # the api-server's own app, noted in the request's scope
DEFAULT_RUNS = 25
MAX_RUNS = 100
READS_AT_ONCE = 8
PAGE = 100
PAGE_TIMEOUT = 60.0  # seconds for all of a page's reads: the in-process transport has no timeout of its own
COOKIE = "_token"  # Airflow's UI session cookie (base_auth_manager.COOKIE_NAME_JWT_TOKEN)

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


class ApiDenied(Exception):
    """Airflow's API refused the person's credential, or does not show them the DAG or run (401, 403, 404)."""

    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


async def all_or_nothing(*awaitables: Awaitable[Any]) -> list[Any]:
    """``asyncio.gather``, but the first failure cancels the reads still going (a denied page reads no more)."""
    tasks = [asyncio.ensure_future(a) for a in awaitables]
    try:
        return list(await asyncio.gather(*tasks))
    finally:
        for task in tasks:
            task.cancel()


class CostReportsReader:
    """The cost reports of a DAG's runs, read over ``/api/v2`` with one person's token."""

    def __init__(self, client: Any) -> None:
        self.client = client  # an httpx.AsyncClient with the person's Authorization header
        self.gate = asyncio.Semaphore(READS_AT_ONCE)

    async def get(self, path: str, **params: Any) -> dict[str, Any]:
        async with self.gate:
            response = await self.client.get(f"/api/v2{path}", params=params)
        if response.status_code in (401, 403, 404):
            raise ApiDenied(response.status_code)
        response.raise_for_status()
        return dict(response.json())

    async def check_dag(self, dag_id: str) -> None:
        await self.get(f"/dags/{quote(dag_id, safe='')}")

    async def runs(self, dag_id: str, limit: int) -> list[dict[str, Any]]:
        path = f"/dags/{quote(dag_id, safe='')}/dagRuns"
        return list((await self.get(path, limit=limit, order_by="-run_after")).get("dag_runs") or [])

    async def run(self, dag_id: str, run_id: str) -> dict[str, Any]:
        return await self.get(f"/dags/{quote(dag_id, safe='')}/dagRuns/{quote(run_id, safe='')}")

    async def reports(self, dag_id: str, run: dict[str, Any]) -> Any:
        from airflow_azureml.cost import COST_XCOM_KEY
        from airflow_azureml.savings import RunReports, report_value

        run_path = f"/dags/{quote(dag_id, safe='')}/dagRuns/{quote(run['dag_run_id'], safe='')}"
        entries: list[dict[str, Any]] = []
        while True:
            page = await self.get(
                f"{run_path}/taskInstances/~/xcomEntries", xcom_key=COST_XCOM_KEY, limit=PAGE, offset=len(entries)
            )
            batch = list(page.get("xcom_entries") or [])
            entries.extend(batch)
            if not batch or len(entries) >= int(page.get("total_entries") or 0):
                break

        async def value(entry: dict[str, Any]) -> dict[str, Any] | None:
            path = f"{run_path}/taskInstances/{quote(str(entry['task_id']), safe='')}/xcomEntries/{COST_XCOM_KEY}"
            try:
                answer = await self.get(path, map_index=int(entry.get("map_index", -1)))
            except ApiDenied as denied:
                if denied.status == 404:  # cleared since it was listed: counted as unreadable
                    return None
                raise  # a read refused to this person: the page shows nothing, not a smaller bill
            return report_value(answer.get("value"))

        values = await all_or_nothing(*(value(e) for e in entries))
        found = RunReports(run["dag_run_id"], run.get("logical_date"), run.get("run_after"), run.get("state"))
        found.reports = sorted(
            (v for v in values if v is not None), key=lambda r: (r.get("task_id"), r.get("map_index"))
        )
        found.unreadable = sum(v is None for v in values)
        return found


def credential(headers: Any, cookies: Any) -> dict[str, str] | None:
    """What the person's own request to Airflow's API would carry: an explicit ``Authorization: Bearer`` header
    first, else the UI's session cookie, forwarded as a cookie so that Airflow's own middleware (its token
    refresh) treats it as it treats the UI's requests. None: no credential."""
    scheme, _, token = (headers.get("authorization") or "").partition(" ")
    if scheme.lower() == "bearer" and token.strip():
        return {"Authorization": f"Bearer {token.strip()}"}
    session = cookies.get(COOKIE)
    return {"Cookie": f"{COOKIE}={session}"} if session else None


def build_app(transport: Callable[[Any], Any] | None = None) -> Any:
    """The savings view's FastAPI app. ``transport(request)`` gives the httpx transport to Airflow's API (by
    default: the api-server's own app, in process)."""
    import httpx
    from fastapi import FastAPI, Request
    from fastapi.responses import HTMLResponse

    from airflow_azureml import savings
    from airflow_azureml.plugins import savings_page

    app = FastAPI(title="Azure ML savings", docs_url=None, redoc_url=None, openapi_url=None)

    def airflow_transport(request: Request) -> Any:
        if transport is not None:
            return transport(request)
        # raise_app_exceptions off: an error inside Airflow's API is its 500 response (the page says so), not
        # an exception re-raised here
        return httpx.ASGITransport(app=request.scope[ROOT_APP_KEY], raise_app_exceptions=False)

    async def read(request: Request, work: Callable[[CostReportsReader], Awaitable[str]], what: str) -> HTMLResponse:
        headers = credential(request.headers, request.cookies)
        if headers is None:
            page = savings_page.message_page("Not signed in", "Sign in to Airflow to see the savings view.")
            return HTMLResponse(page, status_code=401)
        async with httpx.AsyncClient(
            transport=airflow_transport(request), base_url="http://airflow", headers=headers, timeout=30
        ) as client:
            try:
                return HTMLResponse(await asyncio.wait_for(work(CostReportsReader(client)), PAGE_TIMEOUT))
            except asyncio.TimeoutError:
                text = f"Airflow's API did not answer the page's reads within {PAGE_TIMEOUT:.0f} s."
                return HTMLResponse(savings_page.message_page("Airflow's API is slow", text), status_code=504)
            except ApiDenied as denied:
                text = f"{what} was not found, or you may not read it."
                status = 401 if denied.status == 401 else 404 if denied.status == 404 else 403
                return HTMLResponse(savings_page.message_page("Nothing to show", text), status_code=status)
            except httpx.HTTPError as exc:  # Airflow's API failed: say so, show no figure
                from airflow_azureml.redaction import scrub

                text = f"Airflow's API could not be read: {scrub(type(exc).__name__ + ': ' + str(exc), limit=300)}"
                return HTMLResponse(savings_page.message_page("Airflow's API failed", text), status_code=502)

    @app.get("/dags/{dag_id}", response_class=HTMLResponse)
    async def dag_view(request: Request, dag_id: str, runs: int = DEFAULT_RUNS) -> HTMLResponse:
        limit = max(1, min(MAX_RUNS, runs))

        async def work(reader: CostReportsReader) -> str:
            await reader.check_dag(dag_id)
            found = await all_or_nothing(*(reader.reports(dag_id, r) for r in await reader.runs(dag_id, limit)))
            # the arithmetic is CPU work (about a second for 100 runs of long waits): off the event loop
            figures = await asyncio.to_thread(savings.dag_figures, found)
            return await asyncio.to_thread(savings_page.dag_page, dag_id, figures, limit)

        return await read(request, work, f"DAG {dag_id!r}")

    @app.get("/dags/{dag_id}/runs/{run_id}", response_class=HTMLResponse)
    async def run_view(request: Request, dag_id: str, run_id: str) -> HTMLResponse:
        async def work(reader: CostReportsReader) -> str:
            await reader.check_dag(dag_id)
            found = await reader.reports(dag_id, await reader.run(dag_id, run_id))
            figures = await asyncio.to_thread(savings.run_figures, found)
            return await asyncio.to_thread(savings_page.run_page, dag_id, figures)

        return await read(request, work, f"Run {run_id!r} of DAG {dag_id!r}")

    return app


class LazySavingsApp:
    """An ASGI app that builds the FastAPI app on its first request (plugins load in every Airflow process), and
    notes the api-server's own app in the scope, for the in-process reads of Airflow's API."""

    def __init__(self) -> None:
        self._app: Any = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._app is None:
            self._app = build_app()
        if scope.get("type") in ("http", "websocket") and "app" in scope:
            scope[ROOT_APP_KEY] = scope["app"]  # still Airflow's: a mounted app sets its own on entry
        await self._app(scope, receive, send)


class AzureMLSavingsPlugin(AirflowPlugin):
    """What spot saved, per DAG and per DAG run, as tabs of Airflow's UI (docs/ui.md)."""

    name = "azureml_savings"
    fastapi_apps = [{"app": LazySavingsApp(), "url_prefix": URL_PREFIX, "name": "Azure ML savings"}]
    external_views = [
        {
            "name": "Azure ML savings",
            # relative: the UI resolves it against its <base href>, so a sub-path deployment works too
            "href": URL_PREFIX.lstrip("/") + "/dags/{DAG_ID}",
            "destination": "dag",
            "url_route": "azureml-savings",
        },
        {
            "name": "Azure ML savings",
            "href": URL_PREFIX.lstrip("/") + "/dags/{DAG_ID}/runs/{RUN_ID}",
            "destination": "dag_run",
            "url_route": "azureml-savings-run",
        },
    ]
