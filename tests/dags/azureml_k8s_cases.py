"""Command jobs and deployments on Kubernetes compute, shaped by AZUREML_TEST_CASE."""

from __future__ import annotations

import json
import os

import pendulum
from airflow.sdk import DAG

from airflow_azureml.operators import AzureMLCreateBatchDeploymentOperator, AzureMLSubmitCommandJobOperator
from tests.dag_support import record_failure

CASE = json.loads(os.environ.get("AZUREML_TEST_CASE", "{}"))
START = pendulum.datetime(2026, 11, 1, tz="UTC")
DEFAULTS = {"retries": 0, "on_failure_callback": record_failure}

with DAG("azureml_k8s_command_case", schedule=None, start_date=START, default_args=DEFAULTS) as command_dag:
    AzureMLSubmitCommandJobOperator(
        task_id="command",
        command="python -c 'print(1)'",
        environment="azureml:AzureML-acpt-pytorch-2.2-cuda12.1@latest",
        compute="k8s-compute",
        instance_type=CASE.get("instance_type", "gpusmall"),
        resource_requests=CASE.get("resources"),
        instance_types=CASE.get("instance_types"),
        polling={"interval": 0.05, "max_interval": 0.2},
    )

with DAG("azureml_k8s_deployment_case", schedule=None, start_date=START, default_args=DEFAULTS) as deployment_dag:
    AzureMLCreateBatchDeploymentOperator(
        task_id="deploy",
        endpoint_name="heart-classifier-k8s",
        name="classifier-k8s",
        model="azureml:heart-classifier@latest",
        compute="azureml:k8s-compute",
        instance_type=CASE.get("instance_type", "cpularge"),
        instance_count=1,
        mini_batch_size=2,
        deployment=CASE.get("deployment"),  # a deployment YAML, for its resources.properties
    )
