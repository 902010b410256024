"""The one base trigger: serialisation lives here, and only safe, declared fields are serialised."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from airflow.triggers.base import BaseTrigger

from airflow_azureml.polling import PollingPolicy

_FORBIDDEN = ("secret", "password", "token", "credential", "key")


class AzureMLBaseTrigger(BaseTrigger):
    """Subclasses list ``serialized_fields``; ``serialize`` emits exactly those, never a secret.

    Triggers run in the triggerer and are stored as rows in the metadata DB. They carry the
    connection id, never the connection, so the triggerer reads credentials itself.
    """

    serialized_fields: ClassVar[Sequence[str]] = ()

    def __init__(self, *, azure_ml_conn_id: str, polling: PollingPolicy | dict[str, Any] | None = None) -> None:
        super().__init__()
        self.azure_ml_conn_id = azure_ml_conn_id
        self.policy = polling if isinstance(polling, PollingPolicy) else PollingPolicy.from_dict(polling)

    def serialize(self) -> tuple[str, dict[str, Any]]:
        kwargs: dict[str, Any] = {"azure_ml_conn_id": self.azure_ml_conn_id, "polling": self.policy.to_dict()}
        for name in self.serialized_fields:
            if any(word in name.lower() for word in _FORBIDDEN):
                raise TypeError(f"{type(self).__name__} must not serialise {name!r}")
            kwargs[name] = getattr(self, name)
        return f"{type(self).__module__}.{type(self).__qualname__}", kwargs
