"""An AAD-style identity endpoint: enough of the v2.0 protocol for ``azure.identity`` (sync and aio)."""

from __future__ import annotations

import base64
import json
import secrets
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from airflow_azureml.emulator.kubernetes.api import is_kubernetes_path, status_response

#: The Azure ML data plane's audience: the batch scoring URI takes only these tokens. azure-ai-ml asks for
#: ``<aml_resource_id>/.default`` (its cloud metadata's ``aml_resource_id``, https://ml.azure.com/ in Azure).
ML_AUDIENCE = "https://ml.azure.com"
#: The Azure Kubernetes Service AAD server application: kubelogin's audience for an AKS API server.
KUBERNETES_AUDIENCE = "6dae42f8-4368-4678-94ff-3960e28e3630"


def _b64(data: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()


@dataclass
class Identity:
    """Known service principals and the bearer tokens issued to them."""

    tenant_id: str
    clients: dict[str, str]  # client_id -> secret
    token_lifetime: int = 3600
    issued: dict[str, float] = field(default_factory=dict)  # token -> expiry (epoch seconds)
    audiences: dict[str, str] = field(default_factory=dict)  # token -> its ``aud`` claim

    def issue(self, client_id: str, scope: str, lifetime: int | None = None) -> dict[str, Any]:
        """A bearer token for ``scope``; ``lifetime`` (seconds) overrides ``token_lifetime`` (kubeconfigs)."""
        now = int(time.time())
        lifetime = self.token_lifetime if lifetime is None else lifetime
        claims = {
            "aud": scope.rsplit("/.default", 1)[0],
            "iss": f"https://sts.emulator/{self.tenant_id}/",
            "iat": now,
            "nbf": now,
            "exp": now + lifetime,
            "appid": client_id,
            "oid": client_id,
            "tid": self.tenant_id,
            "sub": client_id,
            "jti": secrets.token_hex(8),
        }
        token = f"{_b64({'alg': 'none', 'typ': 'JWT'})}.{_b64(claims)}.{secrets.token_urlsafe(16)}"
        self.issued[token] = now + lifetime
        self.audiences[token] = claims["aud"]
        return {
            "token_type": "Bearer",
            "expires_in": lifetime,
            "ext_expires_in": lifetime,
            "access_token": token,
        }

    def valid(self, token: str) -> bool:
        expiry = self.issued.get(token)
        return expiry is not None and expiry > time.time()

    def expire_all(self) -> int:
        """Fault: every issued token is now expired (clients must fetch a new one)."""
        count = len(self.issued)
        for token in self.issued:
            self.issued[token] = 0
        return count


@dataclass
class AudienceCheck:
    """Which audience each plane accepts. On by default: every Azure service checks the ``aud`` claim.

    - ARM (``/subscriptions/...``) takes its resource manager URL's audience, as ARM does with
      ``https://management.azure.com``. azure-ai-ml asks for ``<resource_manager>/.default``.
    - The batch scoring URI (``/inference/...``) takes only the ML audience: azure-ai-ml's invoke asks
      for ``<aml_resource_id>/.default``.
    - Run history (``/history/...``) takes the ML audience (its generated client's default scope) and ARM's:
      azure-ai-ml's run-history client is built with the ARM ``credential_scopes``.
    - The Kubernetes API (``/k8s/...``) takes only the AKS server application's audience.
    - The emulator's own control API (``/_emulator/...``) takes no issued token: only its control token
      (``Emulator.control_token``), checked before this.
    """

    ml_audience: str = ML_AUDIENCE
    #: The emulator's resource manager URL, set when the server has bound its port.
    resource_manager: str = ""
    #: Reads the ``check_audiences`` behaviour switch (on by default).
    enabled: Callable[[], bool] = field(default=lambda: True)

    @staticmethod
    def _forms(url: str) -> frozenset[str]:
        return frozenset({url.rstrip("/"), url.rstrip("/") + "/"})

    @property
    def arm(self) -> frozenset[str]:
        return self._forms(self.resource_manager)

    @property
    def ml(self) -> frozenset[str]:
        return self._forms(self.ml_audience)

    @property
    def kubernetes(self) -> frozenset[str]:
        return frozenset({KUBERNETES_AUDIENCE})

    def allowed(self, path: str) -> frozenset[str] | None:
        """The audiences ``path`` accepts; None when any issued token will do (or the check is off, or the
        path is the control API's, which the server checks against its control token instead)."""
        if path.startswith("/_emulator/") or not self.enabled():
            return None
        if path.startswith("/subscriptions/"):
            return self.arm
        if path.startswith("/inference/"):
            return self.ml
        if path.startswith("/history/"):
            return self.ml | self.arm
        if path.startswith("/k8s/"):
            return self.kubernetes
        return None


def wrong_audience(audience: str, allowed: frozenset[str]) -> web.Response:
    """ARM's 401 for a token issued for another resource (its wording, as users report it)."""
    listed = ",".join(f"'{a}'" for a in sorted(allowed))
    message = (
        f"The access token has been obtained for wrong audience or resource '{audience}'. "
        f"It should exactly match with one of the allowed audiences {listed}."
    )
    return web.json_response(
        {"error": {"code": "InvalidAuthenticationTokenAudience", "message": message}},
        status=401,
        headers={"WWW-Authenticate": f'Bearer error="invalid_token", error_description="{message}"'},
    )


def audience_middleware(identity: Identity, check: AudienceCheck) -> Callable[..., Awaitable[web.StreamResponse]]:
    """aiohttp middleware (inside the token check): refuse a valid token issued for another plane."""

    @web.middleware
    async def middleware(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        allowed = check.allowed(request.path)
        auth = request.headers.get("Authorization", "")
        token = auth[7:] if auth[:7].lower() == "bearer " else ""
        audience = identity.audiences.get(token)
        if allowed is None or audience is None or audience in allowed:
            return await handler(request)
        if is_kubernetes_path(request.path):  # the API server's answer to a token it cannot authenticate
            return status_response(401, "Unauthorized", "Unauthorized")
        return wrong_audience(audience, allowed)

    return middleware


def aad_error(status: int, error: str, code: int, description: str) -> web.Response:
    body = {
        "error": error,
        "error_description": f"AADSTS{code}: {description}",
        "error_codes": [code],
        "timestamp": time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime()),
        "trace_id": secrets.token_hex(16),
        "correlation_id": secrets.token_hex(16),
    }
    return web.json_response(body, status=status)


def add_identity_routes(
    app: web.Application,
    identity: Identity,
    base_url: str,
    known_resources: Callable[[], frozenset[str]] | None = None,
) -> None:
    """Entra's token endpoint. ``known_resources``: the resources (audiences) tokens are issued for;
    Entra refuses any other (AADSTS500011). None: any resource (a bare ``Identity`` in unit use)."""

    async def instance_discovery(request: web.Request) -> web.Response:
        host = base_url.split("://", 1)[1]
        return web.json_response(
            {
                "tenant_discovery_endpoint": f"{base_url}/{identity.tenant_id}/v2.0/.well-known/openid-configuration",
                "api-version": "1.1",
                "metadata": [{"preferred_network": host, "preferred_cache": host, "aliases": [host]}],
            }
        )

    async def openid_configuration(request: web.Request) -> web.Response:
        tenant = request.match_info["tenant"]
        return web.json_response(
            {
                "token_endpoint": f"{base_url}/{tenant}/oauth2/v2.0/token",
                "authorization_endpoint": f"{base_url}/{tenant}/oauth2/v2.0/authorize",
                "device_authorization_endpoint": f"{base_url}/{tenant}/oauth2/v2.0/devicecode",
                "issuer": f"{base_url}/{tenant}/v2.0",
                "jwks_uri": f"{base_url}/{tenant}/discovery/v2.0/keys",
                "response_types_supported": ["code", "id_token", "code id_token", "id_token token"],
                "subject_types_supported": ["pairwise"],
                "id_token_signing_alg_values_supported": ["RS256"],
                "token_endpoint_auth_methods_supported": ["client_secret_post", "private_key_jwt"],
                "tenant_region_scope": "WW",
                "cloud_instance_name": "emulator",
            }
        )

    async def token(request: web.Request) -> web.Response:
        tenant = request.match_info["tenant"]
        form = await request.post()
        if tenant not in (identity.tenant_id, "organizations", "common"):
            return aad_error(400, "invalid_request", 90002, f"Tenant '{tenant}' not found.")
        if form.get("grant_type") != "client_credentials":
            return aad_error(400, "unsupported_grant_type", 70003, "Only client_credentials is supported.")
        client_id = str(form.get("client_id", ""))
        if client_id not in identity.clients:
            return aad_error(
                400,
                "unauthorized_client",
                700016,
                f"Application with identifier '{client_id}' was not found in the directory.",
            )
        if not secrets.compare_digest(str(form.get("client_secret", "")), identity.clients[client_id]):
            return aad_error(
                401,
                "invalid_client",
                7000215,
                "Invalid client secret provided. Ensure the secret being sent in the request is the "
                f"client secret value, not the client secret ID, for a secret added to app '{client_id}'.",
            )
        scopes = str(form.get("scope") or "").split()
        if not scopes:  # Entra has no default scope
            return aad_error(
                400, "invalid_request", 900144, "The request body must contain the following parameter: 'scope'."
            )
        scope = scopes[0]
        if not scope.endswith("/.default"):
            return aad_error(
                400,
                "invalid_scope",
                1002012,
                f"The provided value for scope {scope} is not valid. Client credential flows must have a scope "
                "value with /.default suffixed to the resource identifier (application ID URI).",
            )
        resource = scope[: -len("/.default")]
        if known_resources is not None and resource.rstrip("/") not in {r.rstrip("/") for r in known_resources()}:
            return aad_error(
                400,
                "invalid_resource",
                500011,
                f"The resource principal named {resource} was not found in the tenant named {identity.tenant_id}. "
                "This can happen if the application has not been installed by the administrator of the tenant or "
                "consented to by any user in the tenant. You might have sent your authentication request to the "
                "wrong tenant.",
            )
        return web.json_response(identity.issue(client_id, scope))

    app.router.add_get("/common/discovery/instance", instance_discovery)
    app.router.add_get("/{tenant}/v2.0/.well-known/openid-configuration", openid_configuration)
    app.router.add_post("/{tenant}/oauth2/v2.0/token", token)
