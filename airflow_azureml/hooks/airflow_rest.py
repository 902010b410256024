"""Airflow's own public REST API (``/api/v2``), for what a task or a command needs from Airflow itself.

In Airflow 3 a task has no metadata-DB session, and the task SDK's Execution API serves only what a running
task needs. Pools and a range of DAG runs' XComs are in the public REST API, with a JWT from the auth
manager's ``/auth/token``. The connection (any type, e.g. ``http``) names the api-server: ``host`` as a URL
(``http://airflow-api:8080``), or host, port and ``schema`` (``http``/``https``); ``login``/``password`` are a
user with the permissions the caller needs (``POST /auth/token``, as the simple, FAB and Keycloak auth
managers document). Without a login the token comes from ``GET /auth/token``, which only the simple auth
manager's ``simple_auth_manager_all_admins`` mode answers. Extra ``ca_bundle``: a CA file to trust; TLS
verification is never turned off.
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import BaseHook

from airflow_azureml.exceptions import AirflowException, AzureMLConfigError


class AirflowRestHook(BaseHook):
    """A token-authenticated client of Airflow's public REST API; subclasses add the routes they use."""

    conn_name_attr = "airflow_conn_id"
    default_conn_name = "airflow_api"
    hook_name = "Airflow REST API"
    #: what the connection's user must be allowed to do, for the error messages
    needs = "read DAG runs and XComs"

    def __init__(self, airflow_conn_id: str = default_conn_name, timeout: float = 30.0) -> None:
        super().__init__()
        self.airflow_conn_id = airflow_conn_id
        self.timeout = timeout
        self._client: Any = None

    def base_url(self) -> tuple[str, str | None, str | None, Any]:
        """``(base URL, login, password, verify)`` from the connection; a clear error when it cannot be used."""
        try:
            conn = self.get_connection(self.airflow_conn_id)
        except Exception as exc:  # AirflowNotFoundException and the task SDK's own errors
            raise AzureMLConfigError(
                f"Airflow connection {self.airflow_conn_id!r} (Airflow's api-server) is not defined: {exc}. "
                f"Give its URL as host and a user allowed to {self.needs}."
            ) from None
        host = (conn.host or "").strip().rstrip("/")
        if not host:
            raise AzureMLConfigError(
                f"Airflow connection {self.airflow_conn_id!r} has no host: give the api-server's URL, e.g. "
                "http://airflow-api:8080."
            )
        if "://" not in host:
            scheme = conn.schema if conn.schema in ("http", "https") else "http"
            host = f"{scheme}://{host}" + (f":{conn.port}" if conn.port else "")
        extra = conn.extra_dejson or {}
        verify: Any = extra.get("ca_bundle") or True
        return host, conn.login or None, conn.password or None, verify

    def _connect(self) -> Any:
        if self._client is None:
            import httpx

            base, login, password, verify = self.base_url()
            client = httpx.Client(base_url=base, timeout=self.timeout, verify=verify)
            if login:
                answer = client.post("/auth/token", json={"username": login, "password": password or ""})
            else:
                answer = client.get("/auth/token")
            if answer.status_code not in (200, 201):
                client.close()
                raise AirflowException(
                    f"Airflow's api-server at {base} gave no token ({answer.status_code}): "
                    + ("check the connection's login and password." if login else "give the connection a login.")
                )
            client.headers["Authorization"] = f"Bearer {answer.json()['access_token']}"
            self._client = client
        return self._client

    def _call(self, method: str, path: str, **kwargs: Any) -> Any:
        response = self._connect().request(method, f"/api/v2{path}", **kwargs)
        if response.status_code in (401, 403):
            raise AirflowException(
                f"{method} {path}: {response.status_code}; the connection's user needs permission to {self.needs}."
            )
        return response

    @staticmethod
    def _ok(response: Any, what: str) -> dict[str, Any]:
        if response.status_code >= 400:
            raise AirflowException(f"Airflow's REST API could not {what}: {response.status_code} {response.text[:300]}")
        return dict(response.json())

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
