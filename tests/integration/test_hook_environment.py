"""The hook in a child process that inherited the parent's ``AZUREML_CURRENT_CLOUD``.

``MLClient`` writes the registered custom cloud's name into ``os.environ``; a task subprocess
inherits it and importing ``azure.ai.ml`` there fails ("Unknown cloud environment") unless the
hook drops the inherited name first. Seen in ``make demo`` run from a process that had used the SDK.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

CHILD = """
from airflow_azureml.hooks.azure_ml import AzureMLHook
hook = AzureMLHook()
computes = [c.name for c in hook.get_conn().compute.list()]
print("computes:", computes)
"""


def test_child_process_with_an_inherited_custom_cloud_name_works(azureml_conn: dict[str, Any]) -> None:
    env = {**os.environ, "AZUREML_CURRENT_CLOUD": "AirflowCustom-0123456789ab"}
    result = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "computes:" in result.stdout


OPERATOR_CHILD = """
import airflow_azureml.operators.batch  # what a DAG file imports: parsing happens before any execute
from azure.ai.ml.entities import BatchEndpoint  # batch deployment execute() imports the SDK before the hook
from airflow_azureml.hooks.azure_ml import AzureMLHook
print("computes:", [c.name for c in AzureMLHook().get_conn().compute.list()])
"""


def test_operator_that_imports_the_sdk_before_the_hook_works_in_such_a_child(azureml_conn: dict[str, Any]) -> None:
    # Seen in the e2e suite under xdist: the Airflow services were children of a pytest worker whose
    # integration tests had used MLClient, and every deployment task failed with "Unknown cloud environment".
    env = {**os.environ, "AZUREML_CURRENT_CLOUD": "AirflowCustom-0123456789ab"}
    command = [sys.executable, "-c", OPERATOR_CHILD]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "computes:" in result.stdout
