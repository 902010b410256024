"""The emulator process: an aiohttp HTTPS app on 127.0.0.1, run in its own thread and event loop."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import secrets
import socket
import ssl
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from concurrent.futures import Future
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote

from aiohttp import web

from airflow_azureml.emulator.api_versions import ApiVersionCheck, api_version_middleware
from airflow_azureml.emulator.blobs import ACCOUNT as BLOB_ACCOUNT
from airflow_azureml.emulator.blobs import STORAGE_AUDIENCE, blob_app
from airflow_azureml.emulator.certs import ensure_self_signed_cert, make_private, write_private
from airflow_azureml.emulator.codes import CodeRoutes
from airflow_azureml.emulator.faults import FaultPlan, FaultRule
from airflow_azureml.emulator.identity import (
    KUBERNETES_AUDIENCE,
    ML_AUDIENCE,
    AudienceCheck,
    Identity,
    add_identity_routes,
    audience_middleware,
)
from airflow_azureml.emulator.kubernetes.api import check_cluster_name, is_kubernetes_path, status_response
from airflow_azureml.emulator.kubernetes.attachment import (
    KUBECONFIG_TOKEN_LIFETIME,
    kubeconfig_document,
    write_kubeconfig,
)
from airflow_azureml.emulator.kubernetes.routes import KubernetesRoutes
from airflow_azureml.emulator.models import Job
from airflow_azureml.emulator.routes import Routes, arm_error, token_principal
from airflow_azureml.emulator.scoring.forks import ForkServer
from airflow_azureml.emulator.workspace import EmulatorError, Timing, Workspace

log = logging.getLogger(__name__)
T = TypeVar("T")

# The only routes served without a bearer token, matched whole (a path that merely contains "/oauth2/" is
# not one): Entra ID's identity endpoints, the workspace discovery document, and the Retail Prices API
# (public, as prices.azure.com is). Everything else needs a token: the control API (``/_emulator/``) the
# emulator's control token, every other route a token the emulator's identity issued.
IDENTITY_ROUTES = (
    re.compile(r"/common/discovery/instance"),
    re.compile(r"/[^/]+/v2\.0/\.well-known/openid-configuration"),
    re.compile(r"/[^/]+/oauth2/v2\.0/token"),
)
PUBLIC_ROUTES = (
    re.compile(r"/discovery"),  # the workspace discovery document
    re.compile(r"/api/retail/prices"),
    re.compile(r"/_emulator/studio/jobs/[^/]+"),  # the Studio link a person opens in a browser
)
MAX_LOGGED_REQUESTS = 200_000


SPOT_HISTORY_CONTAINER = "airflow-spot-history"  # where connection_info points the provider's spot history


class Emulator:
    """A local Azure ML workspace. Use as a context manager, or ``start()`` / ``stop()``.

    Everything it needs lives in ``data_dir``: the TLS certificate, datastore folders, and
    ``emulator.json`` describing how to connect.
    """

    def __init__(
        self,
        data_dir: str | Path,
        *,
        port: int = 0,
        seed: int = 0,
        timing: Timing | None = None,
        subscription_id: str = "00000000-0000-0000-0000-000000000001",
        resource_group: str = "rg-emulator",
        workspace: str = "ws-emulator",
        tenant_id: str = "00000000-0000-0000-0000-0000000000aa",
        location: str = "eastus",
        lro_retry_after: str = "1",
        ml_audience: str = ML_AUDIENCE,
        fork_server: ForkServer | None = None,
    ) -> None:
        """``fork_server``: a template for MLflow models' scoring processes that this emulator shares and does
        not close (a test session's emulators share one: it imports MLflow once, not once per emulator)."""
        self.data_dir = Path(data_dir).resolve()
        self.port = port
        self.subscription_id = subscription_id
        self.resource_group = resource_group
        self.workspace_name = workspace
        self.tenant_id = tenant_id
        self.location = location
        self.lro_retry_after = lro_retry_after
        self.client_id = str(uuid.uuid5(uuid.NAMESPACE_DNS, f"airflow-azureml-client-{self.data_dir}"))
        self.client_secret = self._load_or_create_secret()
        #: The control API's credential (``Authorization: Bearer <control_token>``): a random secret of this
        #: emulator, written to emulator.json only. No token the identity issues opens the control API.
        self.control_token = secrets.token_urlsafe(32)
        self.workspace = Workspace(self.data_dir, seed=seed, timing=timing, fork_server=fork_server)
        self.identity = Identity(tenant_id=tenant_id, clients={self.client_id: self.client_secret})
        self.faults = FaultPlan(self.workspace.rng)
        self.ml_audience = ml_audience.rstrip("/")
        behaviour = self.workspace.behaviour  # switches: check_api_versions, check_audiences
        self.api_version_check = ApiVersionCheck(location=location, enabled=lambda: behaviour.check_api_versions)
        self.audience_check = AudienceCheck(ml_audience=self.ml_audience, enabled=lambda: behaviour.check_audiences)
        self.request_log: list[dict[str, Any]] = []
        self.response_hooks: list[tuple[Callable[[dict[str, Any]], bool], Callable[[dict[str, Any]], None]]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._runner: web.AppRunner | None = None
        self._blob_runner: web.AppRunner | None = None
        self._ready = threading.Event()
        self._startup_error: BaseException | None = None
        self.base_url = ""
        self._kube_tokens: dict[str, str] = {}  # cluster -> long-lived token written into its kubeconfig

    # ------------------------------------------------------------- lifecycle
    def _load_or_create_secret(self) -> str:
        path = self.data_dir / "client_secret"
        if path.exists():
            return make_private(path).read_text().strip()
        self.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        secret = secrets.token_urlsafe(24)
        write_private(path, secret)
        return secret

    def __enter__(self) -> Emulator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> Emulator:
        cert, key = ensure_self_signed_cert(self.data_dir)
        self.ca_cert = str(cert)
        ssl_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ssl_ctx.load_cert_chain(cert, key)
        self._thread = threading.Thread(target=self._serve, args=(ssl_ctx,), name="azureml-emulator", daemon=True)
        self._thread.start()
        self._ready.wait(timeout=30)
        if self._startup_error is not None:
            raise RuntimeError(f"emulator failed to start: {self._startup_error}") from self._startup_error
        self.write_connection_file()
        return self

    def _serve(self, ssl_ctx: ssl.SSLContext) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        asyncio.set_event_loop(loop)
        try:
            loop.run_until_complete(self._start_site(ssl_ctx))
        except BaseException as exc:  # surfaced to start()
            self._startup_error = exc
            self._ready.set()
            return
        self._ready.set()
        loop.run_forever()
        loop.run_until_complete(self.workspace.shutdown())
        if self._runner is not None:
            loop.run_until_complete(self._runner.cleanup())
        if self._blob_runner is not None:
            loop.run_until_complete(self._blob_runner.cleanup())
        loop.close()

    async def _start_site(self, ssl_ctx: ssl.SSLContext) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", self.port))
        self.port = sock.getsockname()[1]
        self.base_url = f"https://127.0.0.1:{self.port}"
        self.audience_check.resource_manager = self.base_url
        protocol = [
            audience_middleware(self.identity, self.audience_check),
            api_version_middleware(self.api_version_check),
        ]
        app = web.Application(middlewares=[self._middleware, *protocol], client_max_size=64 * 1024**2)
        self.routes = Routes(
            self.workspace,
            base_url=self.base_url,
            subscription_id=self.subscription_id,
            resource_group=self.resource_group,
            workspace=self.workspace_name,
            location=self.location,
            lro_retry_after=self.lro_retry_after,
            plan=self.faults,
            identity=self.identity,
            request_log=self.request_log,
        )
        check = self.audience_check
        storage = frozenset({STORAGE_AUDIENCE})
        add_identity_routes(
            app, self.identity, self.base_url, lambda: check.arm | check.ml | check.kubernetes | storage
        )
        self.routes.add_to(app)
        CodeRoutes(self.workspace.codes, self.routes).add_to(app)
        KubernetesRoutes(self.workspace, kubeconfig_writer=self._write_kubeconfig).add_to(app)
        self._runner = web.AppRunner(app, access_log=None, handler_cancellation=True)
        await self._runner.setup()
        await web.SockSite(self._runner, sock, ssl_context=ssl_ctx, backlog=2048).start()
        # the storage account (emulator.blobs): its own plain-HTTP port, path-style, as Azurite serves it
        self._blob_runner = web.AppRunner(blob_app(self.workspace.blobs, self.request_log), access_log=None)
        await self._blob_runner.setup()
        blob_sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        blob_sock.bind(("127.0.0.1", 0))
        blobs = self.workspace.blobs
        blobs.base_url = f"http://127.0.0.1:{blob_sock.getsockname()[1]}"
        await web.SockSite(self._blob_runner, blob_sock, backlog=256).start()
        # the same account over TLS: Azure Storage takes Entra ID bearer tokens over HTTPS only (the spot history)
        tls_sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        tls_sock.bind(("127.0.0.1", 0))
        blobs.tls_url = f"https://127.0.0.1:{tls_sock.getsockname()[1]}"
        await web.SockSite(self._blob_runner, tls_sock, ssl_context=ssl_ctx, backlog=256).start()
        identity, behaviour = self.identity, self.workspace.behaviour

        def token_audience(token: str) -> str | None:
            live = identity.issued.get(token, 0) > time.time()
            return identity.audiences.get(token) if live else None

        blobs.token_audience = token_audience
        blobs.data_role = lambda: behaviour.storage_data_role
        blobs.challenge = (
            f"Bearer authorization_uri={self.base_url}/{self.tenant_id}/oauth2/authorize resource_id={STORAGE_AUDIENCE}"
        )

    def stop(self) -> None:
        if self._loop is not None and self._loop.is_running():
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._loop = None

    # ------------------------------------------------------------ middleware
    @web.middleware
    async def _middleware(
        self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        started = time.monotonic()
        entry: dict[str, Any] = {
            "t": time.time(),
            "method": request.method,
            "path": request.path,
            "query": dict(request.query),
            "ua": request.headers.get("User-Agent", ""),
        }
        peer = request.transport.get_extra_info("peername") if request.transport else None
        entry["peer_port"] = peer[1] if peer else None  # known while the request is in flight too
        if len(self.request_log) < MAX_LOGGED_REQUESTS:
            self.request_log.append(entry)
        try:
            response = await self._dispatch(request, handler, entry)
        except EmulatorError as exc:
            response = arm_error(exc.status, exc.code, exc.message)
        except web.HTTPException as exc:
            if is_kubernetes_path(request.path):
                response = status_response(exc.status, exc.reason.replace(" ", ""), exc.reason)
            else:
                codes = {404: "NotFound", 405: "MethodNotAllowed"}
                response = arm_error(exc.status, codes.get(exc.status, "BadRequest"), exc.reason)
        except (ValueError, TypeError, KeyError, AttributeError, IndexError) as exc:
            # Input the handler could not read (a body that is not JSON, a field of the wrong type, a query
            # value that does not parse): Azure refuses it at once with a 400; a 500 would be retried.
            # also where the emulator itself is wrong: the traceback says which, in the emulator's log
            log.warning("Malformed %s %s: %s: %s", request.method, request.path, type(exc).__name__, exc, exc_info=True)
            message = f"The request is malformed ({type(exc).__name__})."
            if is_kubernetes_path(request.path):
                response = status_response(400, "BadRequest", message)
            else:
                response = arm_error(400, "BadRequest", message)
        entry["status"] = response.status
        entry["ms"] = round((time.monotonic() - started) * 1000, 2)
        for predicate, callback in list(self.response_hooks):
            if predicate(entry):  # runs after this response has been written to the socket
                asyncio.get_running_loop().call_later(0.05, callback, dict(entry))
        if "Retry-After" in response.headers:
            entry["retry_after"] = response.headers["Retry-After"]
        return response

    async def _dispatch(
        self,
        request: web.Request,
        handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
        entry: dict[str, Any],
    ) -> web.StreamResponse:
        is_identity = any(route.fullmatch(request.path) for route in IDENTITY_ROUTES)
        is_public = is_identity or any(route.fullmatch(request.path) for route in PUBLIC_ROUTES)
        if not is_public and request.path.startswith("/_emulator/"):
            auth = request.headers.get("Authorization", "")
            token = auth[7:] if auth[:7].lower() == "bearer " else ""
            if not secrets.compare_digest(token.encode(), self.control_token.encode()):
                entry["auth"] = "rejected"
                return web.json_response(
                    {
                        "error": {
                            "code": "AuthenticationFailed",
                            "message": "Authentication failed: the emulator's control API takes its control "
                            "token (emulator.json control_token) as the bearer token, no other.",
                        }
                    },
                    status=401,
                    headers={"WWW-Authenticate": 'Bearer realm="emulator-control", error="invalid_token"'},
                )
            entry["auth"] = "control"
        elif not is_public:
            auth = request.headers.get("Authorization", "")
            token = auth[7:] if auth[:7].lower() == "bearer " else ""
            if not token or not self.identity.valid(token):
                entry["auth"] = "rejected"
                if is_kubernetes_path(request.path):
                    return status_response(401, "Unauthorized", "Unauthorized")
                return web.json_response(
                    {
                        "error": {
                            "code": "ExpiredAuthenticationToken"
                            if token in self.identity.issued
                            else "AuthenticationFailed",
                            "message": "Authentication failed: the bearer token is missing, invalid or expired.",
                        }
                    },
                    status=401,
                    headers={
                        "WWW-Authenticate": f'Bearer authorization_uri="{self.base_url}/{self.tenant_id}", '
                        'error="invalid_token"'
                    },
                )
            entry.update(token_principal(token))  # who: the request log names the caller of every request
        fault = None
        if not request.path.startswith("/_emulator/"):
            fault = self.faults.pick(request.method, request.path, identity=is_identity)
            if fault is not None:
                entry["fault"] = fault.label
                if fault.when == "before":
                    injected = await self._inject(request, fault)
                    if injected is not None:
                        return injected
        response = await handler(request)
        if fault is not None and fault.when == "after":  # the work is done; now lose or replace the answer
            return await self._inject(request, fault) or response
        return response

    async def _inject(self, request: web.Request, fault: FaultRule) -> web.StreamResponse | None:
        """Apply ``fault``: drop the connection, wait, or answer its status. None: go on normally."""
        if fault.kind == "drop":
            if request.transport is not None:
                request.transport.abort()
            raise asyncio.CancelledError
        if fault.kind == "latency":
            await asyncio.sleep(fault.seconds)
            return None
        headers = {"Retry-After": _fmt(fault.retry_after)} if fault.retry_after is not None else {}
        code = _FAULT_CODES.get(fault.status, "ServiceUnavailable")
        if is_kubernetes_path(request.path):
            response = status_response(fault.status, code, f"Injected fault: HTTP {fault.status}")
            response.headers.update(headers)
            return response
        return web.json_response(
            {"error": {"code": code, "message": f"Injected fault: HTTP {fault.status}"}},
            status=fault.status,
            headers=headers,
        )

    # --------------------------------------------------------- connection info
    def connection_info(self) -> dict[str, Any]:
        extra = {
            "subscription_id": self.subscription_id,
            "resource_group": self.resource_group,
            "workspace_name": self.workspace_name,
            "tenant_id": self.tenant_id,
            "cloud": "custom",
            "resource_manager_url": self.base_url,
            "authority_url": self.base_url,
            "ca_bundle": self.ca_cert,
            "aml_resource_id": self.ml_audience,
            "emulator": True,  # ours, not Azure's: tells the provider's Studio link to use the emulator's job page
            "prices_endpoint": self.base_url,  # the emulator's Retail Prices API (docs/cost.md), not prices.azure.com
            # the spot policy's shared history: a container in the emulated storage account, over TLS
            "spot_history_url": f"{self.workspace.blobs.tls_url}/{BLOB_ACCOUNT}/{SPOT_HISTORY_CONTAINER}",
        }
        uri = (
            f"azure-ml://{quote(self.client_id, safe='')}:{quote(self.client_secret, safe='')}@"
            f"?__extra__={quote(json.dumps(extra), safe='')}"
        )
        return {
            "base_url": self.base_url,
            "aml_resource_id": self.ml_audience,  # the data plane's token audience (invoke)
            "ca_cert": self.ca_cert,
            "subscription_id": self.subscription_id,
            "resource_group": self.resource_group,
            "workspace": self.workspace_name,
            "tenant_id": self.tenant_id,
            "client_id": self.client_id,
            "client_secret": self.client_secret,
            "control_token": self.control_token,  # the control API's bearer token (/_emulator/...)
            "airflow_conn_uri": uri,
            "airflow_conn_json": json.dumps(
                {"conn_type": "azure_ml", "login": self.client_id, "password": self.client_secret, "extra": extra}
            ),
        }

    def spot_histories(self) -> dict[str, Any]:
        """The spot history blobs the provider wrote (name -> parsed JSON): the emulator's own record.
        The unit journals in the same container (``units/``) are ``unit_journals()``."""
        return {k: v for k, v in self._history_container_blobs().items() if not k.startswith("units/")}

    def unit_journals(self) -> dict[str, Any]:
        """The unit journal blobs the provider wrote in the spot history's container (``units/...``)."""
        return {k: v for k, v in self._history_container_blobs().items() if k.startswith("units/")}

    def _history_container_blobs(self) -> dict[str, Any]:
        def read() -> dict[str, Any]:
            container = self.workspace.blobs.containers.get(SPOT_HISTORY_CONTAINER)
            if container is None:
                return {}
            return {name: json.loads(blob.path.read_bytes()) for name, blob in container.blobs.items()}

        return self.call(read)

    def forget_spot_histories(self) -> None:
        self.call(lambda: self.workspace.blobs.containers.pop(SPOT_HISTORY_CONTAINER, None))

    def write_connection_file(self) -> Path:
        return write_private(self.data_dir / "emulator.json", json.dumps(self.connection_info(), indent=2))

    # ------------------------------------------------------- python control
    def call(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the emulator's loop (all state lives there) and return its result."""
        if self._loop is None:
            raise RuntimeError("emulator is not running")

        async def runner() -> T:
            return fn()

        future: Future[T] = asyncio.run_coroutine_threadsafe(runner(), self._loop)
        return future.result(timeout=30)

    def preempt_cluster(self, name: str, form: str = "canceled") -> list[str]:
        return self.call(lambda: self.workspace.preempt_cluster(name, form))

    def evict_nodes(self, name: str, count: int = 1) -> int:
        return self.call(lambda: self.workspace.evict_nodes(name, count))

    def deallocate_preempted(self, name: str) -> int:
        """Test control: the cluster's evicted nodes still in the gauge are deallocated now."""
        return self.call(lambda: self.workspace.deallocate_preempted(name))

    def set_capacity(self, name: str, nodes: int | None) -> None:
        self.call(lambda: self.workspace.set_capacity(name, nodes))

    def set_eviction_rate(self, name: str, per_node_per_second: float) -> None:
        self.call(lambda: self.workspace.set_eviction_rate(name, per_node_per_second))

    def bill(self) -> dict[str, Any]:
        """The emulator's own bill (``emulator.billing``), as ``GET /_emulator/bill`` returns it."""
        return self.call(self.workspace.bill)

    def set_price_ratio(
        self, vm_size: str, *, spot: float | None = None, low_priority: float | None = None
    ) -> dict[str, Any]:
        """Spot / Low Priority rate of ``vm_size`` as a fraction of pay-as-you-go; also ``POST /_emulator/prices``."""
        return self.call(lambda: self.workspace.set_price_ratio(vm_size, spot=spot, low_priority=low_priority))

    def add_fault(self, **rule: Any) -> None:
        fault = FaultRule.from_dict(rule)
        self.call(lambda: self.faults.add(fault))

    def after_response(
        self, predicate: Callable[[dict[str, Any]], bool], callback: Callable[[dict[str, Any]], None]
    ) -> None:
        """Call ``callback(entry)`` just after a response whose log entry matches ``predicate`` was sent.

        The entry carries ``peer_port``, the client's port, so a test can find the client process.
        """
        self.call(lambda: self.response_hooks.append((predicate, callback)))

    def clear_faults(self) -> None:
        self.call(self.faults.clear)
        self.call(self.response_hooks.clear)

    def expire_tokens(self) -> int:
        return self.call(self.identity.expire_all)

    def set_behaviour(self, **switches: Any) -> dict[str, Any]:
        """Change behaviour switches (``behaviour.Behaviour``); returns them all. Also ``POST /_emulator/behaviour``."""
        return self.call(lambda: self.workspace.set_behaviour(switches))

    def behaviour(self) -> dict[str, Any]:
        return self.call(self.workspace.behaviour.to_dict)

    def set_deployment_behaviour(self, endpoint: str, deployment: str, **switches: bool) -> dict[str, bool]:
        """Per-deployment switches, e.g. ``ignore_job_name=True`` (Azure/azure-sdk-for-python#32763)."""
        return self.call(lambda: self.workspace.set_deployment_behaviour(endpoint, deployment, switches))

    def hold_cluster(self, name: str, held: bool = True) -> None:
        """Test control: Running jobs on the cluster do not end until released (``release_job``) or let go."""
        self.call(lambda: self.workspace.hold_cluster(name, held))

    def release_job(self, name: str) -> None:
        self.call(lambda: self.workspace.release_job(name))

    def hold_job(self, name: str) -> None:
        """Test control: a released job on a held cluster takes no new work again (``release_job`` undone)."""
        self.call(lambda: self.workspace.hold_job(name))

    def stall_job(self, name: str, seconds: float) -> None:
        """A Running job goes NotResponding for ``seconds``, then resumes and goes on to its end."""
        self.call(lambda: self.workspace.stall_job(name, seconds))

    def cancel_unlogged(self, name: str) -> None:
        """A person's cancel through a path the Activity Log does not see (Studio's); also
        ``POST /_emulator/jobs/{name}/cancel``. A cancel through ARM (the SDK) is logged."""
        self.call(lambda: self.workspace.cancel_job(name))

    def activity_events(self) -> list[dict[str, Any]]:
        """Every Activity Log event so far, shown or not yet (emulator.activity_log)."""
        return self.call(lambda: [dict(e) for _, e in self.routes.activity.events])

    def register_model(self, name: str, version: str, scoring_module: str) -> None:
        self.call(lambda: self.workspace.register_model(name, version, scoring_module=scoring_module))

    def job(self, name: str) -> Job | None:
        return self.call(lambda: self.workspace.jobs.get(name))

    def jobs(self) -> list[Job]:
        return self.call(lambda: list(self.workspace.jobs.values()))

    def route_table(self) -> list[dict[str, str]]:
        """Every route the HTTPS app serves: ``{"method", "path"}``, the path as registered (with placeholders)."""
        assert self._runner is not None, "the emulator is not running"
        table = []
        for route in self._runner.app.router.routes():
            info = route.resource.get_info() if route.resource is not None else {}
            path = info.get("path") or info.get("formatter") or ""
            if path:
                table.append({"method": route.method, "path": path})
        return table

    def requests(self) -> list[dict[str, Any]]:
        return self.call(lambda: list(self.request_log))

    def kubeconfig(self, cluster: str) -> Path:
        """Write ``DIR/kubeconfig-<cluster>.yaml`` for the Kubernetes cluster ``cluster`` and return its path.

        The server is ``<base_url>/k8s/<cluster>`` (cluster ``X`` is the workspace's Kubernetes compute ``X``),
        TLS is verified against the emulator's ``ca.pem``, and the user has a long-lived bearer token.
        """
        return self.call(lambda: self._write_kubeconfig(cluster))

    def _write_kubeconfig(self, cluster: str) -> Path:
        check_cluster_name(cluster)
        self.workspace.kube_cluster(cluster)
        token = self._kube_tokens.get(cluster)
        if token is None or not self.identity.valid(token):
            issued = self.identity.issue(self.client_id, f"{KUBERNETES_AUDIENCE}/.default", KUBECONFIG_TOKEN_LIFETIME)
            token = self._kube_tokens[cluster] = issued["access_token"]
        document = kubeconfig_document(cluster, f"{self.base_url}/k8s/{cluster}", self.ca_cert, token)
        return write_kubeconfig(self.data_dir / f"kubeconfig-{cluster}.yaml", document)

    def instance_type_objects(self, cluster: str) -> dict[str, dict[str, Any]]:
        """The ``InstanceType`` objects stored in ``cluster``, by name (copies, as the API returns them)."""

        def read() -> dict[str, dict[str, Any]]:
            state = self.workspace.kube_clusters.get(cluster)
            return {} if state is None else {name: state.get(name) for name in state.objects}

        return self.call(read)

    def set_extension_node_selector(self, cluster: str, node_selector: dict[str, str] | None) -> None:
        """The Azure ML extension's nodeSelector on ``cluster``: instance types must use a subset of it."""
        selector = dict(node_selector) if node_selector else None
        self.call(lambda: setattr(self.workspace.kube_cluster(cluster), "extension_node_selector", selector))

    def datastore_path(self, uri_or_relative: str) -> Path:
        if "://" in uri_or_relative:
            return self.workspace.resolve_uri(uri_or_relative)
        return self.workspace.datastore_root("workspaceblobstore") / uri_or_relative


_FAULT_CODES = {
    429: "TooManyRequests",
    500: "InternalServerError",
    502: "BadGateway",
    503: "ServiceUnavailable",
    504: "GatewayTimeout",
}


def _fmt(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)
