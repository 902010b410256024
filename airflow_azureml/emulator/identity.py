"""An AAD-style identity endpoint: enough of the v2.0 protocol for ``azure.identity`` (sync and aio)."""

from __future__ import annotations

import base64
import json
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web


def _b64(data: dict[str, Any]) -> str:
    return base64.urlsafe_b64encode(json.dumps(data).encode()).rstrip(b"=").decode()


@dataclass
class Identity:
    """Known service principals and the bearer tokens issued to them."""

    tenant_id: str
    clients: dict[str, str]  # client_id -> secret
    token_lifetime: int = 3600
    issued: dict[str, float] = field(default_factory=dict)  # token -> expiry (epoch seconds)

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


def add_identity_routes(app: web.Application, identity: Identity, base_url: str) -> None:
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
        scope = str(form.get("scope", "https://management.azure.com/.default")).split()[0]
        return web.json_response(identity.issue(client_id, scope))

    app.router.add_get("/common/discovery/instance", instance_discovery)
    app.router.add_get("/{tenant}/v2.0/.well-known/openid-configuration", openid_configuration)
    app.router.add_post("/{tenant}/oauth2/v2.0/token", token)
