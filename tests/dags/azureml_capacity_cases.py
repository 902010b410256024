"""A capacity pool's sync; a scoring DAG with the cluster's delete as its teardown, for overlapping runs.

Used by tests/integration/test_capacity.py.

``params.inputs`` lists the datastore folders a run scores, one job each; a run with none (an interval whose
work is finished) goes straight to its teardown, as a backfill's re-run of a scored interval does.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pendulum
from airflow.sdk import DAG, task

from airflow_azureml.operators import (
    AzureMLCreateComputeClusterOperator,
    AzureMLDeleteComputeOperator,
    AzureMLInvokeBatchEndpointOperator,
    AzureMLSyncCapacityPoolOperator,
)
from tests.dag_support import record_failure

CONFIG = Path(__file__).parent / "azureml"
CASE = json.loads(os.environ.get("AZUREML_TEST_CASE", "{}"))

with DAG(
    "azureml_capacity_teardown",
    schedule=None,
    start_date=pendulum.datetime(2026, 11, 1, tz="UTC"),
    max_active_runs=2,
    default_args={"retries": 0, "on_failure_callback": record_failure},
    params={"inputs": []},
) as teardown_dag:
    cluster = AzureMLCreateComputeClusterOperator(task_id="cluster", compute=str(CONFIG / "low-pri-cluster.yml"))

    @task
    def plan(params: dict[str, Any]) -> list[dict[str, Any]]:
        return [
            {"inputs": {"heart_dataset": f"azureml://datastores/workspaceblobstore/paths/{folder}/"}}
            for folder in params["inputs"]
        ]

    score = AzureMLInvokeBatchEndpointOperator.partial(
        task_id="score",
        endpoint_name="heart-classifier-batch",
        deployment_name="classifier-mlflow",
        polling={"interval": 0.05, "max_interval": 0.2},
    ).expand_kwargs(plan())
    # [START howto_operator_delete_compute_if_busy]
    delete = AzureMLDeleteComputeOperator(
        task_id="delete",
        name="low-pri-cluster",
        if_busy=CASE.get("if_busy", "skip"),  # another run's jobs on the cluster: skip, wait, or "delete" anyway
        polling={"interval": 0.05},
        wait_timeout=CASE.get("wait_timeout", 1800),
    )
    # [END howto_operator_delete_compute_if_busy]
    cluster >> score >> delete.as_teardown(setups=cluster)

with DAG(
    "azureml_capacity_pool",
    schedule=None,
    start_date=pendulum.datetime(2026, 11, 1, tz="UTC"),
    default_args={"retries": 0, "on_failure_callback": record_failure},
) as pool_dag:
    AzureMLSyncCapacityPoolOperator(
        task_id="sync",
        compute=CASE.get("compute", str(CONFIG / "low-pri-cluster.yml")),
        deployment=CASE.get("deployment", str(CONFIG / "deployment.yml")),
        instance_count=CASE.get("instance_count"),
        queue_ahead=CASE.get("queue_ahead", 0),
        pool_name=CASE.get("pool_name"),
        airflow_conn_id="airflow_api",
    )
