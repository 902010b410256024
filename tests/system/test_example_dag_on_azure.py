"""System test: the example DAG against a real Azure ML workspace, as Airflow's providers' system tests do.

Configured by environment variables (docs/azure.md, "System tests"); credentials come from
``DefaultAzureCredential``. Without the variables the module is skipped, naming the missing ones:
a skip, never a pass. ``AZUREML_SYSTEM_TESTS=required`` (a CI job meant to reach Azure) turns
the missing variables into an error instead.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pendulum
import pytest

REQUIRED = (
    "AZUREML_SYSTEM_SUBSCRIPTION_ID",
    "AZUREML_SYSTEM_RESOURCE_GROUP",
    "AZUREML_SYSTEM_WORKSPACE",
    # the example DAG writes its inputs where the workspace's jobs read them; a local folder will not do
    "AZUREML_DATASTORE_ROOT",
)
MISSING = [name for name in REQUIRED if not os.environ.get(name)]
if MISSING:
    reason = (
        f"system tests need a real Azure ML workspace; missing environment variable(s): {', '.join(MISSING)} "
        "(see docs/azure.md, 'System tests')"
    )
    if os.environ.get("AZUREML_SYSTEM_TESTS") == "required":
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason, allow_module_level=True)

from tests.conftest import load_dag, task_states, xcom_value  # noqa: E402

# A fresh interval each day: a re-run the same day reuses that day's verified partitions (0 new jobs).
INTERVAL = pendulum.now("UTC").start_of("day").subtract(days=1)
SMALL = {"partitions": 2, "files_per_partition": 2, "rows_per_file": 10}


@pytest.fixture
def workspace(airflow_db: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The ``azure_ml_default`` connection for the workspace; no secret: ``DefaultAzureCredential``."""
    extra = {
        "subscription_id": os.environ["AZUREML_SYSTEM_SUBSCRIPTION_ID"],
        "resource_group": os.environ["AZUREML_SYSTEM_RESOURCE_GROUP"],
        "workspace_name": os.environ["AZUREML_SYSTEM_WORKSPACE"],
        "cloud": os.environ.get("AZUREML_SYSTEM_CLOUD", "AzureCloud"),
    }
    if os.environ.get("AZUREML_SYSTEM_TENANT_ID"):
        extra["tenant_id"] = os.environ["AZUREML_SYSTEM_TENANT_ID"]
    monkeypatch.setenv("AIRFLOW_CONN_AZURE_ML_DEFAULT", json.dumps({"conn_type": "azure_ml", "extra": extra}))
    return extra


@pytest.mark.timeout(3 * 3600)  # cluster provisioning, spot capacity and scoring take a while on Azure
def test_example_dag_scores_every_row_exactly_once_on_azure(workspace: dict[str, Any]) -> None:
    run = load_dag("low_priority_batch_scoring.py").test(logical_date=INTERVAL, run_conf=SMALL)
    assert str(run.state) == "success", task_states(run)
    report = xcom_value(run, "report")
    assert report["partitions"] == SMALL["partitions"]
    assert report["rows_in"] == report["rows_scored"] > 0
    url = xcom_value(run, "score_partition", map_index=0, key="azureml_studio_job_url")
    if report["partitions_scored_this_run"] and url is not None:
        assert "_emulator" not in url and f"workspaces/{workspace['workspace_name']}" in url
