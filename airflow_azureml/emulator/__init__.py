"""A local Azure ML workspace emulator that the real ``azure-ai-ml`` SDK talks to over HTTPS.

Importing this package is cheap (DAG files use its data generator); the server, aiohttp and
the certificate code load only when ``Emulator`` or ``Timing`` is first used.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from airflow_azureml.emulator.behaviour import Timing
    from airflow_azureml.emulator.server import Emulator

__all__ = ["Emulator", "Timing"]


def __getattr__(name: str) -> Any:
    if name == "Emulator":
        from airflow_azureml.emulator.server import Emulator

        return Emulator
    if name == "Timing":
        from airflow_azureml.emulator.behaviour import Timing

        return Timing
    raise AttributeError(name)
