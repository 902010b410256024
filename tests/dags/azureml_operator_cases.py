"""DAGs that exercise each operator through real Airflow (``dag.test()``) in the integration tests.

Parameters come from environment variables read at parse time, so each test can shape them.
A failure callback records the exception type so tests can assert on the typed errors.
"""

from __future__ import annotations

import json
import os
from datetime import timedelta
from pathlib import Path

import pendulum
from airflow.sdk import DAG

from airflow_azureml.operators import (
    AzureMLCreateBatchDeploymentOperator,
    AzureMLCreateComputeClusterOperator,
    AzureMLDeleteComputeOperator,
    AzureMLInvokeBatchEndpointOperator,
)
from tests.dag_support import lose_task_state, record_failure

CONFIG = Path(__file__).parent / "azureml"
START = pendulum.datetime(2026, 11, 1, tz="UTC")
CASE = json.loads(os.environ.get("AZUREML_TEST_CASE", "{}"))


DEFAULTS: dict = {"retries": 0, "on_failure_callback": record_failure}
if CASE.get("lose_task_state"):
    DEFAULTS["on_retry_callback"] = lose_task_state

with DAG("azureml_compute_cases", schedule=None, start_date=START, default_args=DEFAULTS) as compute_dag:
    creates = [
        AzureMLCreateComputeClusterOperator(
            task_id="create_from_yaml",
            compute=CASE.get("compute_yaml", str(CONFIG / "low-pri-cluster.yml")),
            **CASE.get("create_overrides", {}),
        )
    ]
    if CASE.get("with_dedicated", True):
        # [START howto_operator_create_compute_cluster_kwargs]
        creates.append(
            AzureMLCreateComputeClusterOperator(
                task_id="create_from_kwargs",
                name="dedicated-pool",
                size="STANDARD_DS3_v2",
                tier="dedicated",
                min_instances=0,
                max_instances=2,
                idle_time_before_scale_down=120,
            )
        )
        # [END howto_operator_create_compute_cluster_kwargs]
    if CASE.get("delete"):
        # [START howto_operator_delete_compute]
        creates >> AzureMLDeleteComputeOperator(task_id="delete", name=CASE["delete"])
        # [END howto_operator_delete_compute]

with DAG("azureml_deployment_case", schedule=None, start_date=START, default_args=DEFAULTS) as deployment_dag:
    AzureMLCreateBatchDeploymentOperator(
        task_id="create_deployment", deployment=str(CONFIG / "deployment.yml"), **CASE.get("deployment_overrides", {})
    )

INVOKE_KEYS = (
    "retries",
    "deferrable",
    "job_identity",
    "max_queue_time",
    "on_ambiguous_cancel",
    "evidence_wait",
    "deadline",
    "on_infeasible_deadline",
)
INVOKE_ARGS = {key: CASE[key] for key in INVOKE_KEYS if key in CASE}
if "fallback_compute" in CASE:  # refused by the invoke operator: a deployment's compute is fixed
    INVOKE_ARGS["fallback_compute"] = CASE["fallback_compute"]
if "execution_timeout" in CASE:
    INVOKE_ARGS["execution_timeout"] = timedelta(seconds=CASE["execution_timeout"])


class LosesItsFirstEvent(AzureMLInvokeBatchEndpointOperator):
    """The first try's resumption never happens: Airflow failed that try on the executor's late report of its
    deferral, after the trigger had fired (apache/airflow#67287, #72716), so the retry starts in ``execute``."""

    def execute_complete(self, context, event):  # type: ignore[no-untyped-def]
        if context["ti"].try_number == 1:
            with open(os.environ["AZUREML_TEST_LOST_EVENTS"], "a") as lost:  # the test checks whose event it was
                lost.write(f"{event.get('job_name')}\n")
            raise RuntimeError("the trigger's event was lost (case lose_first_event)")
        return super().execute_complete(context, event)


INVOKE_OPERATOR = LosesItsFirstEvent if CASE.get("lose_first_event") else AzureMLInvokeBatchEndpointOperator

with DAG("azureml_invoke_case", schedule=None, start_date=START, default_args=DEFAULTS) as invoke_dag:
    INVOKE_OPERATOR(
        task_id="invoke",
        retry_delay=timedelta(0),
        **INVOKE_ARGS,
        endpoint_name=CASE.get("endpoint_name", "heart-classifier-batch"),
        deployment_name=CASE.get("deployment_name", "classifier-mlflow"),
        inputs=CASE.get(
            "inputs", {"heart_dataset": "azureml://datastores/workspaceblobstore/paths/in/{{ ds_nodash }}/"}
        ),
        outputs=CASE.get("outputs"),
        output_file_name=CASE.get("output_file_name"),
        mini_batch_size=CASE.get("mini_batch_size"),
        max_resubmits=CASE.get("max_resubmits", 3),
        resubmit_backoff=CASE.get("resubmit_backoff", 0.05),
        fallback_deployment=CASE.get("fallback_deployment"),
        fallback_after=CASE.get("fallback_after"),
        loop_after=CASE.get("loop_after", 2),
        prices=CASE.get("prices"),
        polling={"interval": 0.05, "max_interval": 0.2, **CASE.get("polling", {})},
    )
