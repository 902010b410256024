"""ARM addressing of the workspace: the resource provider, resource ids, and the scope check.

Every ARM route is ``/subscriptions/{sub}/resourceGroups/{rg}/providers/Microsoft.MachineLearningServices/
workspaces/{ws}/...``; ``ArmScope`` is the part of ``Routes`` (emulator.routes) that builds the
workspace's id and answers 404 for another subscription, resource group or workspace, as ARM does.
``short_name`` reads a resource's name out of an ARM id or an ``azureml:`` reference. Shared by every
route module and the workspace's resource checks.
"""

from __future__ import annotations

import uuid
from typing import Any

from aiohttp import web

from airflow_azureml.emulator.errors import EmulatorError

PROVIDER = "Microsoft.MachineLearningServices"


def short_name(ref: Any) -> str | None:
    if not ref:
        return None
    text = str(ref)
    if text.startswith("azureml:"):
        text = text[len("azureml:") :]
    return text.rstrip("/").rsplit("/", 1)[-1]


class ArmScope:
    """The part of ``Routes`` that knows the workspace's ARM id; ``sub``, ``rg`` and ``workspace`` are set there."""

    @property
    def ws_id(self) -> str:
        return f"/subscriptions/{self.sub}/resourceGroups/{self.rg}/providers/{PROVIDER}/workspaces/{self.workspace}"

    def _check_scope(self, request: web.Request) -> None:
        info = request.match_info
        if info.get("sub") != self.sub or info.get("rg", "").lower() != self.rg.lower():
            raise EmulatorError(404, "ResourceGroupNotFound", f"Resource group '{info.get('rg')}' could not be found.")
        if info.get("ws") != self.workspace:
            raise EmulatorError(
                404, "ResourceNotFound", f"The Resource '{PROVIDER}/workspaces/{info.get('ws')}' was not found."
            )

    def _workspace_guid(self) -> str:
        return str(uuid.uuid5(uuid.NAMESPACE_URL, self.ws_id))  # the workspace JSON's properties.workspaceId
