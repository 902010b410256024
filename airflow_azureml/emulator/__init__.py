"""A local Azure ML workspace emulator that the real ``azure-ai-ml`` SDK talks to over HTTPS.

Importing this package is cheap; the server starts only when :class:`Emulator` is started.
"""

from airflow_azureml.emulator.runtime import Timing
from airflow_azureml.emulator.server import Emulator

__all__ = ["Emulator", "Timing"]
