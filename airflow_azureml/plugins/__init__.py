"""Airflow plugins shipped with the provider (the package's ``airflow.plugins`` entry point)."""
