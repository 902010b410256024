"""Score heart-disease partitions on a Kubernetes compute (AKS/Arc) with instance types.

Steps:
1. attach the Kubernetes cluster (idempotent) and apply the instance types of
   ``dags/azureml/instance-types.yml`` as ``amlarc.azureml.com/v1alpha1`` custom resources
   (create, patch, or nothing when unchanged), validated against the documented rules first;
2. create a batch deployment on that compute with ``instance_type: cpularge`` (checked to exist
   and to meet the MLflow minimum of 2 CPU / 4 GB before anything is written);
3. score the interval's partitions, one checkpointed job each;
4. run a command job on the GPU instance type ``gpusmall`` (its resources checked to fit).

Environment, read on the worker when a task's templates render (never by the DAG processor):

- ``AZUREML_K8S_RESOURCE_ID`` (required): the ARM id of your AKS or Arc cluster,
  ``/subscriptions/<sub>/resourceGroups/<rg>/providers/Microsoft.ContainerService/managedClusters/<name>``
  (``az aks show -g <rg> -n <name> --query id -o tsv``). It has no default: no one else's cluster is guessed.
- ``AZUREML_KUBECONFIG``: a kubeconfig for that cluster (default ``~/.kube/config`` of the worker's user;
  ``az aks get-credentials`` writes it), or give the operator ``kubernetes_conn_id`` instead. Against the
  emulator it is the kubeconfig the emulator writes.

Read by the DAG processor as well (they shape the tasks): ``AZUREML_DATASTORE_ROOT`` and
``AZUREML_STORAGE_CONN_ID`` (see ``low_priority_batch_scoring``), ``AZUREML_POLL_SECONDS`` (first poll
interval, default 30) and ``AZUREML_DEFERRABLE`` (default ``true``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import example_partitions
import pendulum
from airflow.sdk import DAG, Param, task

from airflow_azureml.exceptions import AzureMLConfigError
from airflow_azureml.operators import (
    AzureMLAttachKubernetesComputeOperator,
    AzureMLCreateBatchDeploymentOperator,
    AzureMLInvokeBatchEndpointOperator,
    AzureMLRegisterModelOperator,
    AzureMLSubmitCommandJobOperator,
)
from airflow_azureml.operators.kubernetes import AzureMLApplyInstanceTypesOperator

CONFIG = Path(__file__).parent / "azureml"
COMPUTE = "k8s-compute"
ENDPOINT = "heart-classifier-k8s"
DEPLOYMENT = "classifier-k8s"
PREFIX = "k8s-scoring"
INFRA_POOL = os.environ.get("AZUREML_INFRA_POOL", "azureml_infrastructure")  # one infrastructure write at a time
RETRY_DELAY = float(os.environ.get("AZUREML_RETRY_DELAY_SECONDS", "120"))
POLL_SECONDS = float(os.environ.get("AZUREML_POLL_SECONDS", "30"))
MAX_POLL_SECONDS = max(POLL_SECONDS, float(os.environ.get("AZUREML_MAX_POLL_SECONDS", "300")))
DEFERRABLE = os.environ.get("AZUREML_DEFERRABLE", "true").lower() == "true"


def cluster_resource_id() -> str:
    """``AZUREML_K8S_RESOURCE_ID`` as the worker sees it (a template macro: rendered at run time)."""
    value = os.environ.get("AZUREML_K8S_RESOURCE_ID", "").strip()
    if not value:
        raise AzureMLConfigError(
            "Set AZUREML_K8S_RESOURCE_ID to the ARM id of your Kubernetes cluster "
            "(/subscriptions/.../providers/Microsoft.ContainerService/managedClusters/<name>)."
        )
    return value


def kubeconfig_path() -> str:
    """``AZUREML_KUBECONFIG``, else ``~/.kube/config``, of the worker (a template macro: rendered at run time)."""
    return os.environ.get("AZUREML_KUBECONFIG") or str(Path.home() / ".kube" / "config")


with DAG(
    dag_id="kubernetes_instance_type_scoring",
    schedule="@daily",
    start_date=pendulum.datetime(2026, 11, 1, tz="UTC"),
    catchup=False,
    dagrun_timeout=pendulum.duration(hours=20),
    default_args=example_partitions.retry_args(RETRY_DELAY),
    params={
        "partitions": Param(2, type="integer", minimum=1, maximum=64),
        "files_per_partition": Param(4, type="integer", minimum=1),
        "rows_per_file": Param(25, type="integer", minimum=1),
    },
    tags=["azureml", "kubernetes", "example"],
    doc_md=__doc__,
    user_defined_macros={
        "cluster_resource_id": cluster_resource_id,
        "kubeconfig_path": kubeconfig_path,
        "interval_start": example_partitions.interval_start,
    },
) as dag:
    # [START howto_operator_attach_kubernetes_compute]
    attach = AzureMLAttachKubernetesComputeOperator(
        task_id="attach_kubernetes_compute",
        name=COMPUTE,
        resource_id="{{ cluster_resource_id() }}",
        namespace="azureml",
        pool=INFRA_POOL,
    )
    # [END howto_operator_attach_kubernetes_compute]
    # [START howto_operator_apply_instance_types]
    apply_types = AzureMLApplyInstanceTypesOperator(
        task_id="apply_instance_types",
        instance_types=str(CONFIG / "instance-types.yml"),
        kubeconfig="{{ kubeconfig_path() }}",
        pool=INFRA_POOL,
    )

    # [END howto_operator_apply_instance_types]
    @task
    def publish_model() -> str:
        """The committed MLflow model (azureml/model/), copied to where azureml/model.yml registers it from."""
        return example_partitions.publish_model(
            str(CONFIG / "model"), example_partitions.config_datastore_path(CONFIG / "model.yml")
        )

    register_model = AzureMLRegisterModelOperator(
        task_id="register_model", model=str(CONFIG / "model.yml"), pool=INFRA_POOL
    )
    # [START howto_operator_create_batch_deployment_kubernetes]
    deploy = AzureMLCreateBatchDeploymentOperator(
        task_id="create_kubernetes_deployment",
        endpoint_name=ENDPOINT,
        name=DEPLOYMENT,
        model="azureml:heart-classifier-mlflow:1",  # the example's MLflow model (azureml/model.yml)
        # the example's own scoring script and environment, as in deployment-custom-script.yml (row ids in
        # its output)
        code_configuration={"code": str(CONFIG / "score"), "scoring_script": "score.py"},
        environment={
            "image": "mcr.microsoft.com/azureml/openmpi4.1.0-ubuntu22.04:latest",
            "conda_file": str(CONFIG / "environment" / "conda.yaml"),
        },
        compute=f"azureml:{COMPUTE}",
        instance_type="cpularge",
        instance_count=2,
        max_concurrency_per_instance=2,
        mini_batch_size=2,
        output_action="append_row",
        output_file_name="predictions.csv",
        max_retries=3,
        retry_timeout=300,
        pool=INFRA_POOL,
    )
    # [END howto_operator_create_batch_deployment_kubernetes]

    @task
    def extract(
        params: dict[str, Any], data_interval_start: pendulum.DateTime | None = None, dag_run: Any = None
    ) -> list[dict[str, Any]]:
        start = example_partitions.interval_start(data_interval_start, dag_run)  # a manual run: its minute
        return example_partitions.write_partitions(
            PREFIX,
            example_partitions.interval_key(start),
            int(start.timestamp()),
            params["partitions"],
            params["files_per_partition"],
            params["rows_per_file"],
        )

    @task
    def plan(partitions: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return example_partitions.pending(partitions)

    score = AzureMLInvokeBatchEndpointOperator.partial(
        task_id="score_partition",
        endpoint_name=ENDPOINT,
        deployment_name=DEPLOYMENT,
        deferrable=DEFERRABLE,
        polling={"interval": POLL_SECONDS, "max_interval": MAX_POLL_SECONDS},
        map_index_template="{{ task.job_identity }}",
    ).expand_kwargs(planned := plan(extracted := extract()))

    # a failed check fails at once (example_partitions.ExactlyOnceCheckError); a lost worker is retried
    @task(trigger_rule="none_failed")
    def report(
        partitions: list[dict[str, Any]],
        planned: list[dict[str, Any]],
        results: list[dict[str, Any]] | None,
        data_interval_start: pendulum.DateTime | None = None,
        dag_run: Any = None,
    ) -> dict[str, Any]:
        interval = example_partitions.interval_key(example_partitions.interval_start(data_interval_start, dag_run))
        return example_partitions.report(PREFIX, interval, partitions, results, planned)

    # [START howto_operator_submit_command_job]
    gpu_job = AzureMLSubmitCommandJobOperator(
        task_id="gpu_command_job",
        command="python -c 'import torch; print(torch.cuda.is_available())'",
        environment="azureml:AzureML-acpt-pytorch-2.2-cuda12.1@latest",
        compute=COMPUTE,
        instance_type="gpusmall",
        resource_requests={
            "requests": {"cpu": "2", "memory": "8Gi"},
            "limits": {"cpu": "3", "memory": "12Gi", "nvidia.com/gpu": 1},
        },
        # a run with no data interval (a manual trigger) has no data_interval_start: its minute instead
        job_identity="{{ dag.dag_id }}/{{ interval_start(data_interval_start | default(none), dag_run) }}/gpu",
        deferrable=DEFERRABLE,
        polling={"interval": POLL_SECONDS, "max_interval": MAX_POLL_SECONDS},
    )
    # [END howto_operator_submit_command_job]

    checked = report(extracted, planned, score.output)
    publish_model() >> register_model >> deploy
    attach >> apply_types >> deploy >> extracted
    checked >> gpu_job
