"""A DAG with one AzureMLJobSensor, shaped by AZUREML_TEST_CASE (job name and mode)."""

from __future__ import annotations

import json
import os

import pendulum
from airflow.sdk import DAG

from airflow_azureml.sensors import AzureMLJobSensor
from tests.dag_support import record_failure

CASE = json.loads(os.environ.get("AZUREML_TEST_CASE", "{}"))
MODE = CASE.get("mode", "poke")

with DAG(
    "azureml_sensor_case",
    schedule=None,
    start_date=pendulum.datetime(2026, 11, 1, tz="UTC"),
    default_args={"retries": 0, "on_failure_callback": record_failure},
) as dag:
    # [START howto_sensor_job]
    AzureMLJobSensor(
        task_id="wait_for_job",
        job_name=CASE.get("job_name", "missing"),
        mode="reschedule" if MODE == "reschedule" else "poke",
        deferrable=MODE == "deferrable",
        poke_interval=0.1,
        timeout=120,
        polling={"interval": 0.05, "max_interval": 0.2},
    )
    # [END howto_sensor_job]
