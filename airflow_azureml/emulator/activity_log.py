"""The subscription's Azure Activity Log, as far as the provider reads it: the cancels of jobs.

Azure Resource Manager logs every write and action request sent through it (PUT, POST, DELETE) in the
Activity Log's Administrative category, with the caller; a job cancel through ARM (``POST
{ws}/jobs/{name}/cancel``, what azure-ai-ml and ``az ml job cancel`` send) is such an action. A cancel
that does not go through ARM (the emulator's ``POST /_emulator/jobs/{name}/cancel``: Studio's path, or
run history's) leaves no event. Read with ``GET /subscriptions/{sub}/providers/Microsoft.Insights/
eventtypes/management/values?api-version=2015-04-01&$filter=...`` (the Activity Logs - List REST API):
the filter must give ``eventTimestamp ge`` and ``eventTimestamp le`` and may add ``resourceGroupName eq``
or ``resourceUri eq``; other clauses are refused. Events show only ``activity_log_lag_seconds`` after
they happened (ingestion lag), and a principal without read access at the resource group gets 403.

Least convenient where Azure is silent: ``caller`` is the principal's object id (no friendly name),
``resourceId`` comes upper-cased in its provider segment, each cancel is two events (``Started``, then
``Accepted``), and pages hold at most 50 events.

``ActivityLogRoutes`` is the part of ``Routes`` (emulator.routes) that serves the list; ``token_principal``
reads a request's caller out of its bearer token (for the events' ``caller`` and the request log).
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

from aiohttp import web

from airflow_azureml.emulator.errors import EmulatorError, arm_error

PAGE_SIZE = 50
CANCEL_OPERATION = "Microsoft.MachineLearningServices/workspaces/jobs/cancel/action"
_CLAUSE = re.compile(r"\s*(eventTimestamp|resourceGroupName|resourceUri)\s+(ge|le|eq)\s+'([^']*)'\s*", re.IGNORECASE)


def _iso(t: dt.datetime) -> str:
    return t.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f0Z")


def _parse_time(text: str) -> dt.datetime:
    value = re.sub(r"(\.\d{6})\d+", r"\1", text.strip()).replace("Z", "+00:00")
    parsed = dt.datetime.fromisoformat(value)
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.timezone.utc)


@dataclass
class ActivityLog:
    """Events of one subscription, in the order they happened."""

    subscription_id: str
    tenant_id: str
    events: list[tuple[dt.datetime, dict[str, Any]]] = field(default_factory=list)  # (visible from, event)

    def job_cancel(self, *, resource_id: str, resource_group: str, caller: str, lag_seconds: float) -> None:
        """A job cancel sent through ARM: its ``Started`` and ``Accepted`` events."""
        now = dt.datetime.now(dt.timezone.utc)
        visible = now + dt.timedelta(seconds=lag_seconds)
        correlation = str(uuid.uuid4())
        shown_id = resource_id.replace("Microsoft.MachineLearningServices", "MICROSOFT.MACHINELEARNINGSERVICES")
        for status in ("Started", "Accepted"):
            event_id = str(uuid.uuid4())
            event = {
                "authorization": {"action": CANCEL_OPERATION, "scope": resource_id},
                "caller": caller,
                "channels": "Operation",
                "claims": {"http://schemas.microsoft.com/identity/claims/objectidentifier": caller},
                "correlationId": correlation,
                "description": "",
                "eventDataId": event_id,
                "eventName": {
                    "value": "BeginRequest" if status == "Started" else "EndRequest",
                    "localizedValue": "Begin request" if status == "Started" else "End request",
                },
                "category": {"value": "Administrative", "localizedValue": "Administrative"},
                "id": f"{shown_id}/events/{event_id}/ticks/{int(now.timestamp() * 1e7)}",
                "level": "Informational",
                "resourceGroupName": resource_group,
                "resourceProviderName": {
                    "value": "Microsoft.MachineLearningServices",
                    "localizedValue": "Microsoft.MachineLearningServices",
                },
                "resourceId": shown_id,
                "resourceType": {
                    "value": "Microsoft.MachineLearningServices/workspaces/jobs",
                    "localizedValue": "Microsoft.MachineLearningServices/workspaces/jobs",
                },
                "operationId": correlation,
                "operationName": {"value": CANCEL_OPERATION, "localizedValue": "Cancel Job"},
                "properties": {},
                "status": {"value": status, "localizedValue": status},
                "subStatus": {"value": "Accepted" if status == "Accepted" else "", "localizedValue": ""},
                "eventTimestamp": _iso(now),
                "submissionTimestamp": _iso(visible),
                "subscriptionId": self.subscription_id,
                "tenantId": self.tenant_id,
            }
            self.events.append((visible, event))

    def query(self, filter_text: str) -> list[dict[str, Any]]:
        """The visible events the filter selects (400 for a filter the API refuses)."""
        clauses = [c for c in re.split(r"\s+and\s+", filter_text.strip(), flags=re.IGNORECASE) if c]
        start = end = None
        group = uri = None
        for clause in clauses:
            match = _CLAUSE.fullmatch(clause)
            if match is None:
                raise EmulatorError(400, "BadRequest", f"The $filter clause {clause!r} is not supported.")
            name, op, value = match.group(1).lower(), match.group(2).lower(), match.group(3)
            try:
                if name == "eventtimestamp" and op == "ge":
                    start = _parse_time(value)
                elif name == "eventtimestamp" and op == "le":
                    end = _parse_time(value)
                elif name == "resourcegroupname" and op == "eq":
                    group = value.lower()
                elif name == "resourceuri" and op == "eq":
                    uri = value.lower()
                else:
                    raise EmulatorError(400, "BadRequest", f"The $filter clause {clause!r} is not supported.")
            except ValueError:
                raise EmulatorError(400, "BadRequest", f"The $filter time {value!r} is not a date.") from None
        if start is None or end is None:
            raise EmulatorError(400, "BadRequest", "The $filter must give eventTimestamp ge and eventTimestamp le.")
        if end - start > dt.timedelta(days=90):
            raise EmulatorError(400, "BadRequest", "The $filter's time span must be at most 90 days.")
        now = dt.datetime.now(dt.timezone.utc)
        found = []
        for visible, event in self.events:
            at = _parse_time(event["eventTimestamp"])
            if visible > now or not start <= at <= end:
                continue
            if group is not None and event["resourceGroupName"].lower() != group:
                continue
            if uri is not None and event["resourceId"].lower() != uri:
                continue
            found.append(event)
        return sorted(found, key=lambda e: e["eventTimestamp"], reverse=True)  # newest first


def token_principal(token: str) -> dict[str, str]:
    """Who sent a request: the token's application (client) id and object id, for the request log."""
    try:
        payload = token.split(".")[1]
        claims = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    except (IndexError, ValueError, binascii.Error):
        return {}
    if not isinstance(claims, dict):
        return {}
    return {k: str(claims[c]) for k, c in (("client_id", "appid"), ("oid", "oid")) if claims.get(c)}


class ActivityLogRoutes:
    """The part of ``Routes`` (emulator.routes) that serves the Activity Log."""

    async def activity_log(self, request: web.Request) -> web.Response:
        """Activity Logs - List: the events the ``$filter`` selects, newest first, 50 a page (emulator.activity_log)."""
        if request.match_info["sub"] != self.sub:
            return arm_error(
                404, "SubscriptionNotFound", f"The subscription '{request.match_info['sub']}' could not be found."
            )
        if not self.ws.behaviour.activity_log_reader:
            return arm_error(
                403,
                "AuthorizationFailed",
                "The client does not have authorization to perform action 'Microsoft.Insights/eventtypes/values/read' "
                f"over scope '/subscriptions/{self.sub}'.",
            )
        events = self.activity.query(request.query.get("$filter", ""))
        skip = int(request.query.get("$skiptoken", "0"))
        page = events[skip : skip + PAGE_SIZE]
        body: dict[str, Any] = {"value": page}
        if skip + PAGE_SIZE < len(events):
            query = {k: v for k, v in request.query.items() if k != "$skiptoken"}
            query["$skiptoken"] = str(skip + PAGE_SIZE)
            body["nextLink"] = f"{self.base_url}{request.path}?{urlencode(query)}"
        return web.json_response(body)
