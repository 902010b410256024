"""Airflow pools through Airflow's public REST API (``/api/v2/pools``), the way Airflow 3 offers to a task.

The task SDK's Execution API has no pool routes; the public REST API does (create, read, patch). The
connection is ``AirflowRestHook``'s, with a user allowed to edit pools.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from airflow_azureml.hooks.airflow_rest import AirflowRestHook


class AirflowPoolsHook(AirflowRestHook):
    """Read, create and update one Airflow pool over the public REST API."""

    hook_name = "Airflow REST API (pools)"
    needs = "edit pools"

    def get_pool(self, name: str) -> dict[str, Any] | None:
        response = self._call("GET", f"/pools/{quote(name, safe='')}")
        if response.status_code == 404:
            return None
        return self._ok(response, f"read pool {name}")

    def create_pool(self, name: str, slots: int, description: str, include_deferred: bool) -> dict[str, Any] | None:
        """The pool created, or None when it already exists (another run created it first)."""
        body = {"name": name, "slots": slots, "description": description, "include_deferred": include_deferred}
        response = self._call("POST", "/pools", json=body)
        if response.status_code == 409:
            return None
        return self._ok(response, f"create pool {name}")

    def update_pool(self, name: str, wanted: dict[str, Any], fields: list[str]) -> dict[str, Any]:
        """Write ``fields`` of ``wanted``. The body names the pool and its slots even when only other fields
        change: Airflow validates a patch of a pool as a whole pool (``BasePool``), ``update_mask`` picks."""
        body = {"pool": name, **wanted}
        response = self._call("PATCH", f"/pools/{quote(name, safe='')}", params={"update_mask": fields}, json=body)
        return self._ok(response, f"update pool {name}")
