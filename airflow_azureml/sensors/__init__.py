"""Sensors."""

from airflow_azureml.sensors.job import AzureMLJobSensor

__all__ = ["AzureMLJobSensor"]
