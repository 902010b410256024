"""Moved to ``airflow_azureml.example_data`` (the example DAGs must not depend on the emulator).

Kept so that existing imports of the test data generator keep working.
"""

from __future__ import annotations

from airflow_azureml.example_data import COLUMNS, heart_rows, write_heart_csvs

__all__ = ["COLUMNS", "heart_rows", "write_heart_csvs"]
