"""Operators. Importing them does not import ``azure.ai.ml`` (DAG parsing stays fast)."""

from airflow_azureml.operators.batch import (
    AzureMLCreateBatchDeploymentOperator,
    AzureMLInvokeBatchEndpointOperator,
)
from airflow_azureml.operators.capacity import AzureMLSyncCapacityPoolOperator
from airflow_azureml.operators.compute import (
    AzureMLAttachKubernetesComputeOperator,
    AzureMLCreateComputeClusterOperator,
    AzureMLDeleteComputeOperator,
)
from airflow_azureml.operators.jobs import AzureMLSubmitCommandJobOperator
from airflow_azureml.operators.kubernetes import AzureMLApplyInstanceTypesOperator
from airflow_azureml.operators.models import AzureMLRegisterModelOperator

__all__ = [
    "AzureMLApplyInstanceTypesOperator",
    "AzureMLAttachKubernetesComputeOperator",
    "AzureMLCreateBatchDeploymentOperator",
    "AzureMLCreateComputeClusterOperator",
    "AzureMLDeleteComputeOperator",
    "AzureMLInvokeBatchEndpointOperator",
    "AzureMLRegisterModelOperator",
    "AzureMLSubmitCommandJobOperator",
    "AzureMLSyncCapacityPoolOperator",
]
