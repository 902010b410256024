"""Hooks. Importing this package does not import ``azure.ai.ml``."""

from airflow_azureml.hooks.azure_ml import AzureMLHook

__all__ = ["AzureMLHook"]
