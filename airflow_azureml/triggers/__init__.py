"""Triggers: native-asyncio waits that run in the triggerer."""

from airflow_azureml.triggers.job import AzureMLJobTrigger

__all__ = ["AzureMLJobTrigger"]
