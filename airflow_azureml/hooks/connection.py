"""Connection settings of an ``azure_ml`` connection, and the credentials they select.

The one layer beneath both the hook (``hooks.azure_ml``) and the REST clients (``hooks.rest``):
it imports neither, so the two never import each other.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from airflow_azureml.exceptions import AzureMLConfigError
from airflow_azureml.redaction import MIN_SECRET_LENGTH, mask

if TYPE_CHECKING:
    from azure.core.credentials import TokenCredential
    from azure.core.credentials_async import AsyncTokenCredential

KNOWN_CLOUDS: dict[str, dict[str, str]] = {
    "AzureCloud": {
        "resource_manager": "https://management.azure.com",
        "authority": "https://login.microsoftonline.com",
        "studio": "https://ml.azure.com",
        "storage_suffix": "core.windows.net",
    },
    "AzureChinaCloud": {
        "resource_manager": "https://management.chinacloudapi.cn",
        "authority": "https://login.chinacloudapi.cn",
        "studio": "https://studio.ml.azure.cn",
        "storage_suffix": "core.chinacloudapi.cn",
    },
    "AzureUSGovernment": {
        "resource_manager": "https://management.usgovcloudapi.net",
        "authority": "https://login.microsoftonline.us",
        "studio": "https://ml.azure.us",
        "storage_suffix": "core.usgovcloudapi.net",
    },
}
CUSTOM_CLOUD = "custom"
EXTRA_FIELDS = (
    "subscription_id",
    "resource_group",
    "workspace_name",
    "tenant_id",
    "managed_identity_client_id",
    "workload_identity_tenant_id",
    "cloud",
    "resource_manager_url",
    "authority_url",
    "ca_bundle",
    "studio_url",
    "spot_history_url",
)
#: ``spot_history_url`` that keeps the spot history in an Airflow Variable (concurrent updates can be lost).
SPOT_HISTORY_IN_VARIABLE = "variable"


@dataclass(frozen=True)
class AzureMLConnectionSettings:
    """Everything a connection says, validated. Holds the secret; never log or serialise it."""

    subscription_id: str
    resource_group: str
    workspace_name: str
    tenant_id: str | None
    client_id: str | None
    client_secret: str | None
    managed_identity_client_id: str | None
    workload_identity_tenant_id: str | None
    cloud: str
    resource_manager_url: str
    authority_url: str
    ca_bundle: str | None
    studio_url: str
    # prices for the cost report (docs/cost.md): the Retail Prices API's endpoint (None: Azure's public one),
    # prices set by hand (checked: hooks.prices.check_manual_prices), and where the day's prices are cached
    prices_endpoint: str | None = None
    manual_prices: dict[str, dict[str, float]] | None = None
    prices_cache_dir: str | None = None
    # where the spot policy's shared history lives (spot_history_store): a blob container URL, "variable",
    # or None (the workspace's storage account, in a known cloud)
    spot_history_url: str | None = None

    @property
    def workspace_path(self) -> str:
        return (
            f"/subscriptions/{self.subscription_id}/resourceGroups/{self.resource_group}"
            f"/providers/Microsoft.MachineLearningServices/workspaces/{self.workspace_name}"
        )

    @property
    def arm_scope(self) -> str:
        return f"{self.resource_manager_url}/.default"

    @property
    def connection_verify(self) -> str | bool:
        """TLS verification is always on; a custom CA bundle is used when one is given."""
        return self.ca_bundle or True

    @property
    def sdk_cloud_name(self) -> str:
        """A cloud name unique per endpoint set: the SDK registers each name once per process."""
        if self.cloud != CUSTOM_CLOUD:
            return self.cloud
        digest = hashlib.sha256(f"{self.resource_manager_url}|{self.authority_url}".encode()).hexdigest()[:12]
        return f"AirflowCustom-{digest}"


def is_missing_connection(exc: BaseException) -> bool:
    """Airflow's "conn_id isn't defined" (``AirflowNotFoundException``; its module moved between versions)."""
    return any(cls.__name__ == "AirflowNotFoundException" for cls in type(exc).__mro__)


def missing_connection_message(conn_id: str) -> str:
    """Where this process looked for the connection, and why one defined elsewhere may not be seen here."""
    env = "AIRFLOW_CONN_" + conn_id.upper()
    return (
        f"The Airflow connection {conn_id!r} is not defined for this process. It was looked up in the "
        f"secrets backends configured here, then the environment variable {env}, then the metadata DB "
        "(through the API server, for a task or a trigger). A connection added with `airflow connections add` "
        "or in the UI lives in the metadata DB, which a process without access to it does not see (for example "
        "the triggerer inside `airflow dags test`, or a worker configured for another deployment). Check the "
        f"conn_id, or define the connection where every process reads it: {env}, or a secrets backend. "
        "Retrying cannot help, so the task fails now."
    )


def parse_connection(conn: Any) -> AzureMLConnectionSettings:
    """Read and validate an ``azure_ml`` connection; raises ``AzureMLConfigError`` naming the field."""
    extra = dict(conn.extra_dejson or {})

    def get(name: str) -> str | None:
        value = extra.get(name) or extra.get(f"extra__azure_ml__{name}")
        return str(value).strip() if value not in (None, "") else None

    missing = [f for f in ("subscription_id", "resource_group", "workspace_name") if not get(f)]
    if missing:
        raise AzureMLConfigError(
            f"Connection {conn.conn_id!r} is missing required field(s) {missing}; set them in the "
            "connection's extra (subscription_id, resource_group, workspace_name)."
        )
    cloud = get("cloud") or "AzureCloud"
    if cloud != CUSTOM_CLOUD and cloud not in KNOWN_CLOUDS:
        raise AzureMLConfigError(
            f"Connection {conn.conn_id!r}: unknown cloud {cloud!r}; use one of {[*KNOWN_CLOUDS, CUSTOM_CLOUD]}."
        )
    defaults = KNOWN_CLOUDS.get(cloud, {})
    arm = get("resource_manager_url") or defaults.get("resource_manager")
    authority = get("authority_url") or defaults.get("authority")
    if not arm or not authority:
        raise AzureMLConfigError(
            f"Connection {conn.conn_id!r}: cloud 'custom' needs resource_manager_url and authority_url."
        )
    for label, url in (("resource_manager_url", arm), ("authority_url", authority)):
        if not url.startswith("https://"):
            raise AzureMLConfigError(f"Connection {conn.conn_id!r}: {label} must be an https:// URL.")
    ca_bundle = get("ca_bundle")
    if ca_bundle and not os.path.isfile(ca_bundle):
        raise AzureMLConfigError(f"Connection {conn.conn_id!r}: ca_bundle {ca_bundle!r} is not a file.")
    secret = conn.password or None
    tenant = get("tenant_id")
    if secret and not (tenant and conn.login):
        raise AzureMLConfigError(
            f"Connection {conn.conn_id!r}: a client secret needs tenant_id and a client id (login)."
        )
    if secret and len(secret) < MIN_SECRET_LENGTH:  # not a secret Azure issues, and too short to be masked
        raise AzureMLConfigError(
            f"Connection {conn.conn_id!r}: the client secret (password) is shorter than {MIN_SECRET_LENGTH} "
            "characters. Azure's client secrets are tens of characters, and a value this short would not be "
            "masked in logs: copy the secret's value, not its id."
        )
    if secret:
        mask(secret)
    from airflow_azureml.hooks.prices import check_manual_prices

    prices_endpoint = get("prices_endpoint")
    if prices_endpoint and not prices_endpoint.startswith(("https://", "http://")):
        raise AzureMLConfigError(f"Connection {conn.conn_id!r}: prices_endpoint must be an http(s):// URL.")
    spot_history_url = get("spot_history_url")
    blob_history = spot_history_url and spot_history_url != SPOT_HISTORY_IN_VARIABLE
    if blob_history and (not spot_history_url.startswith("https://") or "?" in spot_history_url):
        raise AzureMLConfigError(
            f"Connection {conn.conn_id!r}: spot_history_url must be an https:// blob container URL without a "
            f"query (the connection's identity signs in), or {SPOT_HISTORY_IN_VARIABLE!r}."
        )
    manual = check_manual_prices(
        extra.get("prices") or extra.get("extra__azure_ml__prices"), f"Connection {conn.conn_id!r}"
    )
    return AzureMLConnectionSettings(
        subscription_id=get("subscription_id") or "",
        resource_group=get("resource_group") or "",
        workspace_name=get("workspace_name") or "",
        tenant_id=tenant,
        client_id=conn.login or None,
        client_secret=secret,
        managed_identity_client_id=get("managed_identity_client_id"),
        workload_identity_tenant_id=get("workload_identity_tenant_id"),
        cloud=cloud,
        resource_manager_url=arm.rstrip("/"),
        authority_url=authority.rstrip("/"),
        ca_bundle=ca_bundle,
        studio_url=(get("studio_url") or defaults.get("studio") or f"{arm.rstrip('/')}/_emulator").rstrip("/"),
        prices_endpoint=prices_endpoint.rstrip("/") if prices_endpoint else None,
        manual_prices=manual or None,
        prices_cache_dir=get("prices_cache_dir"),
        spot_history_url=spot_history_url.rstrip("/") if spot_history_url else None,
    )


def credential_kwargs(settings: AzureMLConnectionSettings) -> dict[str, Any]:
    """Keyword arguments shared by the sync and async credential classes."""
    kwargs: dict[str, Any] = {"authority": settings.authority_url, "connection_verify": settings.connection_verify}
    if settings.cloud == CUSTOM_CLOUD:
        # Private clouds and sovereign endpoints cannot be validated against the public AAD instance list.
        kwargs["disable_instance_discovery"] = True
    return kwargs


def default_chain_kwargs(settings: AzureMLConnectionSettings, kwargs: dict[str, Any]) -> dict[str, Any]:
    """``DefaultAzureCredential`` options: honour a managed identity client id given alone."""
    kwargs = dict(kwargs)
    kwargs.pop("disable_instance_discovery", None)
    if settings.managed_identity_client_id:
        kwargs["managed_identity_client_id"] = settings.managed_identity_client_id
    if settings.workload_identity_tenant_id:
        kwargs["workload_identity_tenant_id"] = settings.workload_identity_tenant_id
    if settings.tenant_id:
        kwargs["additionally_allowed_tenants"] = [settings.tenant_id]
    return kwargs


# azure-core logs each request with all its headers at INFO (4 entries per token fetch, about 40 % of a
# task log); azure.identity logs each token at INFO too. A logger the user set a level on is left alone.
SDK_LOGGERS = ("azure.core.pipeline.policies.http_logging_policy", "azure.identity")


def quiet_sdk_logging() -> None:
    """The SDK's request logging below INFO, unless the user configured those loggers themselves."""
    import logging

    for name in SDK_LOGGERS:
        logger = logging.getLogger(name)
        if logger.level == logging.NOTSET:
            logger.setLevel(logging.WARNING)


def build_credential(settings: AzureMLConnectionSettings) -> TokenCredential:
    """A client secret selects ``ClientSecretCredential``; otherwise ``DefaultAzureCredential``."""
    quiet_sdk_logging()
    kwargs = credential_kwargs(settings)
    if settings.client_secret:
        from azure.identity import ClientSecretCredential

        return ClientSecretCredential(
            settings.tenant_id or "", settings.client_id or "", settings.client_secret, **kwargs
        )
    from azure.identity import DefaultAzureCredential

    return DefaultAzureCredential(**default_chain_kwargs(settings, kwargs))


def build_async_credential(settings: AzureMLConnectionSettings) -> AsyncTokenCredential:
    """The same identity as ``build_credential``, from ``azure.identity.aio`` for triggers."""
    quiet_sdk_logging()
    kwargs = credential_kwargs(settings)
    if settings.client_secret:
        from azure.identity.aio import ClientSecretCredential

        return ClientSecretCredential(
            settings.tenant_id or "", settings.client_id or "", settings.client_secret, **kwargs
        )
    from azure.identity.aio import DefaultAzureCredential

    return DefaultAzureCredential(**default_chain_kwargs(settings, kwargs))
