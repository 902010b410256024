"""Operators. Importing them does not import ``azure.ai.ml`` (DAG parsing stays fast)."""

from airflow_azureml.operators.batch import (
    AzureMLCreateBatchDeploymentOperator,
    AzureMLInvokeBatchEndpointOperator,
)
from airflow_azureml.operators.compute import (
    AzureMLCreateComputeClusterOperator,
    AzureMLDeleteComputeOperator,
)

__all__ = [
    "AzureMLCreateBatchDeploymentOperator",
    "AzureMLCreateComputeClusterOperator",
    "AzureMLDeleteComputeOperator",
    "AzureMLInvokeBatchEndpointOperator",
]
