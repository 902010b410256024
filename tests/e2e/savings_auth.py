"""An auth manager for the savings view's e2e test: Airflow's simple one, except that the user ``outsider``
may read no DAG. The simple auth manager has no per-DAG rights of its own; this is the smallest real one that
does, through Airflow's public ``BaseAuthManager`` interface (``is_authorized_dag``)."""

from __future__ import annotations

from typing import Any

from airflow.api_fastapi.auth.managers.simple.simple_auth_manager import SimpleAuthManager

OUTSIDER = "outsider"


class OutsiderDeniedAuthManager(SimpleAuthManager):
    def is_authorized_dag(self, *, method: Any, user: Any, access_entity: Any = None, details: Any = None) -> bool:
        if getattr(user, "username", None) == OUTSIDER:
            return False
        return super().is_authorized_dag(method=method, user=user, access_entity=access_entity, details=details)
