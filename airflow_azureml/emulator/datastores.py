"""Datastores: the workspace's named places for data, and the ``azureml://`` data paths into them.

A datastore here is a folder under ``DIR/datastores/<name>`` (``workspaceblobstore`` always exists);
``Datastores`` is the part of ``Workspace`` that maps a data path to a folder and refuses any that would
leave its datastore, and ``DatastoreRoutes`` the part of ``Routes`` that lists and reads datastores as ARM
shows them. Azure's naming rule for datastores is ``azure_rules.check_datastore_name``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from aiohttp import web

from airflow_azureml.emulator.arm import PROVIDER
from airflow_azureml.emulator.azure_rules import RuleViolation, check_datastore_name, is_datastore_name
from airflow_azureml.emulator.errors import EmulatorError, not_found
from airflow_azureml.emulator.models import system_data

#: ``azureml://datastores/<name>/paths/<path>`` and the long form with the workspace's ARM scope before it.
_DATA_URI = re.compile(
    r"^azureml:(?://|/)(?:subscriptions/[^/]+/resourcegroups/[^/]+/(?:providers/microsoft\.machinelearningservices/)?"
    r"workspaces/[^/]+/)?datastores/(?P<datastore>[^/]*)/paths/(?P<path>.*)$",
    re.IGNORECASE,
)


class Datastores:
    """The part of ``Workspace`` (emulator.workspace) that resolves data paths to folders."""

    def datastore_root(self, datastore: str, *, create: bool = True) -> Path:
        """``DIR/datastores/<name>``, for a name Azure accepts only: nothing resolves outside that folder."""
        try:
            check_datastore_name(datastore)
        except RuleViolation as exc:
            raise EmulatorError(400, "UserError", str(exc)) from None
        root = self.data_dir / "datastores" / datastore
        if create:
            root.mkdir(parents=True, exist_ok=True)
        return root

    def resolve_uri(self, uri: str, *, existing: bool = False) -> Path:
        """Map ``azureml://datastores/<ds>/paths/<p>`` (or the long ARM form) to a folder under its datastore.

        ``existing``: the datastore must exist already (``workspaceblobstore`` or a folder under
        ``DIR/datastores/``), else 404, and nothing is created: what a request's data paths need.
        """
        match = _DATA_URI.match(uri) if isinstance(uri, str) else None
        if match is None:
            raise EmulatorError(
                400, "UserError", f"Unsupported data path {uri!r}: use azureml://datastores/<name>/paths/<path>"
            )
        root = self.datastore_root(match["datastore"], create=not existing)
        if existing and match["datastore"] != "workspaceblobstore" and not root.is_dir():
            raise EmulatorError(
                404,
                "UserError",
                f"Datastore {match['datastore']!r} was not found in the workspace (data path {uri!r}).",
            )
        root = root.resolve()
        target = (root / match["path"].strip("/")).resolve()
        if root not in target.parents and target != root:
            raise EmulatorError(400, "UserError", f"Data path {uri!r} escapes its datastore")
        return target


class DatastoreRoutes:
    """The part of ``Routes`` (emulator.routes) that serves the datastores."""

    def _datastore_json(self, name: str) -> dict[str, Any]:
        return {
            "id": f"{self.ws_id}/datastores/{name}",
            "name": name,
            "type": f"{PROVIDER}/workspaces/datastores",
            "properties": {
                "datastoreType": "AzureBlob",
                "accountName": "emulatorstore",
                "containerName": name,
                "endpoint": "core.windows.net",
                "protocol": "https",
                "isDefault": name == "workspaceblobstore",
                "credentials": {"credentialsType": "None"},
                "serviceDataAccessAuthIdentity": "None",
                "description": f"local folder {self.ws.datastore_root(name, create=False)}",
                "tags": {},
                "properties": {},
            },
            "systemData": system_data(self.ws.created, self.ws.created),  # datastore.get: sent
        }

    async def list_datastores(self, request: web.Request) -> web.Response:
        self._check_scope(request)
        root = self.ws.data_dir / "datastores"
        folders = (
            {p.name for p in root.iterdir() if p.is_dir() and is_datastore_name(p.name)} if root.exists() else set()
        )
        names = sorted({"workspaceblobstore", *folders})
        if request.query.get("isDefault", "").lower() == "true":
            names = ["workspaceblobstore"]
        return web.json_response({"value": [self._datastore_json(n) for n in names]})

    async def get_datastore(self, request: web.Request) -> web.Response:
        """A datastore is a folder under ``DIR/datastores/``; reading one never creates it, and a name Azure
        refuses (``..``, ``a.b``, ``Store``) is a 400 before it is ever used as a path."""
        self._check_scope(request)
        name = request.match_info["name"]
        root = self.ws.datastore_root(name, create=False)  # EmulatorError 400 for a name Azure refuses
        if name != "workspaceblobstore" and not root.is_dir():
            return not_found("datastores", name)
        return web.json_response(self._datastore_json(name))
