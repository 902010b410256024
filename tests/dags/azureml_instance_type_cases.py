"""A DAG that applies Kubernetes instance types, for the integration tests (``dag.test()``).

The operator's arguments come from ``AZUREML_TEST_CASE`` (JSON) at parse time, so each test shapes them.
"""

from __future__ import annotations

import json
import os

import pendulum
from airflow.sdk import DAG

from airflow_azureml.operators import AzureMLApplyInstanceTypesOperator
from tests.dag_support import record_failure

CASE = json.loads(os.environ.get("AZUREML_TEST_CASE", "{}"))

with DAG(
    "azureml_instance_types_case",
    schedule=None,
    start_date=pendulum.datetime(2026, 11, 1, tz="UTC"),
    default_args={"retries": 0, "on_failure_callback": record_failure},
) as instance_types_dag:
    AzureMLApplyInstanceTypesOperator(
        task_id="apply_instance_types",
        instance_types=CASE.get("instance_types", []),
        # a placeholder when the case names neither, so that parsing never fails (other tests share the env)
        kubeconfig=CASE.get("kubeconfig", None if "kubernetes_conn_id" in CASE else "kubeconfig.yaml"),
        context=CASE.get("context"),
        kubernetes_conn_id=CASE.get("kubernetes_conn_id"),
        extension_node_selector=CASE.get("extension_node_selector"),
    )
