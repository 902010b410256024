"""``api-version`` on ARM routes: required, and checked per resource type, with ARM's error envelopes.

ARM answers before the resource provider sees the request:

- no ``api-version``: ``400 MissingApiVersionParameter`` "The api-version query parameter
  (?api-version=) is required for all requests.";
- a well-formed version the provider did not register for that resource type: ``400
  NoRegisteredProviderFound`` "No registered resource provider found for location '<loc>' and API version
  '<v>' for type '<type>'. The supported api-versions are '<list>'. The supported locations are '<locs>'.";
- a malformed one: ``400 InvalidApiVersionParameter`` "The api-version '<v>' is invalid. The supported
  versions are '<list>'.".

The wording is ARM's, as users report it (for example Azure/azure-sdk-for-js#4097 for
``Microsoft.MachineLearningServices/workspaces``, Azure/azure-cli#28496). Only ARM routes
(``/subscriptions/...``) are checked: run history, the batch scoring URI and discovery are data-plane
services with their own versioning.

Which versions: every ARM version the pinned ``azure-ai-ml`` 1.35.2 sends (its ``_ml_client.py`` pins one
client per version; the generated ``arm_ml_service`` client defaults to 2025-12-01; compute's
``updateDataMounts`` sends 2021-01-01), the provider's own REST client's (2024-10-01, the stable version
whose examples the contract test was first written against), and the newer versions in Microsoft's REST
specification (2025-10-01-preview). Workspaces and computes are older resource types and also accept the
first stable versions (2018-11-19, 2019-05-01); batch endpoints, jobs, datastores and models do not exist
in those. Nothing else is accepted: where the list is unknown, the shorter one is the less convenient.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

PROVIDER = "Microsoft.MachineLearningServices"

#: The ARM api-versions azure-ai-ml 1.35.2 sends (``azure/ai/ml/_ml_client.py`` and ``_restclient/arm_ml_service``).
SDK_VERSIONS = frozenset(
    {
        "2022-02-01-preview",
        "2022-05-01",
        "2022-10-01",
        "2022-10-01-preview",
        "2023-02-01-preview",
        "2023-04-01",
        "2023-04-01-preview",
        "2023-06-01-preview",
        "2023-08-01-preview",
        "2023-10-01",
        "2024-01-01-preview",
        "2024-04-01-preview",
        "2024-10-01-preview",
        "2025-01-01-preview",
        "2025-12-01",
    }
)
#: Stable 2024-10-01 and what Microsoft's specification has after it.
NEWER_VERSIONS = frozenset({"2024-10-01", "2025-10-01-preview", "2025-12-01"})
_CURRENT = SDK_VERSIONS | NEWER_VERSIONS
_FIRST_STABLE = frozenset({"2018-11-19", "2019-05-01"})

#: Resource type (as ARM names it, below the provider) -> the api-versions registered for it.
SUPPORTED: dict[str, frozenset[str]] = {
    "workspaces": _CURRENT | _FIRST_STABLE,
    "workspaces/computes": _CURRENT | _FIRST_STABLE | {"2021-01-01"},
    "workspaces/batchEndpoints": _CURRENT,
    "workspaces/batchEndpoints/deployments": _CURRENT,
    "workspaces/jobs": _CURRENT,
    "workspaces/datastores": _CURRENT,
    "workspaces/models": _CURRENT,
    "workspaces/models/versions": _CURRENT,
    "locations/mfeOperationsStatus": _CURRENT,
    "locations/computeOperationsStatus": _CURRENT,
    "locations/mfeOperationResults": _CURRENT,
}
#: The Activity Log's REST API (Activity Logs - List) has one version.
INSIGHTS_EVENTS = re.compile(r"^/subscriptions/[^/]+/providers/Microsoft\.Insights/eventtypes/management/values$", re.I)
INSIGHTS_VERSIONS = frozenset({"2015-04-01"})
_ACTIONS = frozenset({"cancel", "listKeys", "listNodes", "start", "stop", "restart", "updateDataMounts"})
_WELL_FORMED = re.compile(r"\d{4}-\d{2}-\d{2}(-[A-Za-z]+)?")
_PROVIDER_PATH = re.compile(r"^/subscriptions/[^/]+(?:/resourceGroups/[^/]+)?/providers/" + PROVIDER + "/(.+)$", re.I)


def resource_type(path: str) -> str | None:
    """``.../providers/Microsoft.MachineLearningServices/workspaces/w/jobs/j/cancel`` -> ``workspaces/jobs``.

    Actions (a trailing verb such as ``cancel``) belong to their resource's type; a list URL
    (``.../workspaces/w/computes``) to its items' type.
    """
    match = _PROVIDER_PATH.match(path)
    if match is None:
        return None
    segments = [s for s in match.group(1).split("/") if s]
    types = segments[0::2]
    if len(segments) % 2 == 1 and len(types) > 1 and segments[-1] in _ACTIONS:
        types = types[:-1]
    return "/".join(types)


def _versions_text(versions: frozenset[str]) -> str:
    return ", ".join(sorted(versions, reverse=True))


def _error(code: str, message: str) -> web.Response:
    return web.json_response({"error": {"code": code, "message": message}}, status=400)


@dataclass
class ApiVersionCheck:
    """The check, for the workspace's location. ``enabled`` reads the ``check_api_versions`` behaviour switch
    (on by default: ARM always checks)."""

    location: str = "eastus"
    enabled: Callable[[], bool] = field(default=lambda: True)

    def problem(self, path: str, query: Any) -> web.Response | None:
        """ARM's 400 for this request, or None when its api-version is accepted (or it is not an ARM route)."""
        if not path.startswith("/subscriptions/") or not self.enabled():
            return None
        version = query.get("api-version")
        if not version:
            return _error(
                "MissingApiVersionParameter",
                "The api-version query parameter (?api-version=) is required for all requests.",
            )
        kind = resource_type(path)
        supported = SUPPORTED.get(kind or "", _CURRENT)
        if INSIGHTS_EVENTS.match(path):
            kind, supported = "eventtypes/management", INSIGHTS_VERSIONS
        if version in supported:
            return None
        if not _WELL_FORMED.fullmatch(version):
            return _error(
                "InvalidApiVersionParameter",
                f"The api-version '{version}' is invalid. The supported versions are '{_versions_text(supported)}'.",
            )
        return _error(
            "NoRegisteredProviderFound",
            f"No registered resource provider found for location '{self.location}' and API version '{version}' "
            f"for type '{kind}'. The supported api-versions are '{_versions_text(supported)}'. "
            f"The supported locations are '{self.location}'.",
        )


def api_version_middleware(check: ApiVersionCheck) -> Callable[..., Awaitable[web.StreamResponse]]:
    """aiohttp middleware: refuse an ARM request whose api-version ARM would refuse."""

    @web.middleware
    async def middleware(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        refused = check.problem(request.path, request.query)
        return refused if refused is not None else await handler(request)

    return middleware
