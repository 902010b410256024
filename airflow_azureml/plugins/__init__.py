"""Airflow plugins shipped with the provider (registered through ``get_provider_info``'s ``plugins``)."""
