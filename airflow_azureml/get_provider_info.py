"""Provider metadata read by Airflow's ProvidersManager (``apache_airflow_provider`` entry point)."""

from __future__ import annotations

from typing import Any


def _text(label: str, description: str, *, required: bool = False, **schema: Any) -> dict[str, Any]:
    # Airflow's UI marks a conn-field required when its schema type does not include "null".
    kind: str | list[str] = "string" if required else ["string", "null"]
    return {"label": label, "description": description, "schema": {"type": kind, **schema}}


def get_provider_info() -> dict[str, Any]:
    from airflow_azureml import compat

    if not compat.has_conn_fields():  # Airflow < 3.3 ignores "conn-fields" below: no fields for the extras
        compat.warn_missing("conn_fields")
    return {
        "package-name": "airflow-azureml",
        "name": "Azure Machine Learning (airflow-azureml)",
        "description": "Low-priority clusters, batch endpoints and preemption-aware waits for Azure ML.",
        "versions": ["0.1.0"],
        "integrations": [
            {
                "integration-name": "Azure Machine Learning",
                "external-doc-url": "https://learn.microsoft.com/azure/machine-learning/",
                "tags": ["azure"],
            }
        ],
        "hooks": [
            {
                "integration-name": "Azure Machine Learning",
                "python-modules": [
                    "airflow_azureml.hooks.azure_ml",
                    "airflow_azureml.hooks.airflow_rest",
                    "airflow_azureml.hooks.airflow_pools",
                ],
            }
        ],
        "operators": [
            {
                "integration-name": "Azure Machine Learning",
                "python-modules": [
                    "airflow_azureml.operators.compute",
                    "airflow_azureml.operators.capacity",
                    "airflow_azureml.operators.batch",
                    "airflow_azureml.operators.jobs",
                    "airflow_azureml.operators.kubernetes",
                    "airflow_azureml.operators.models",
                ],
            }
        ],
        "sensors": [{"integration-name": "Azure Machine Learning", "python-modules": ["airflow_azureml.sensors.job"]}],
        "triggers": [
            {"integration-name": "Azure Machine Learning", "python-modules": ["airflow_azureml.triggers.job"]}
        ],
        # Airflow 3.2+ adds these to its CLI (``airflow azureml bill``); 3.1 ignores the key
        "cli": ["airflow_azureml.cli.get_azureml_cli_commands"],
        "extra-links": [
            "airflow_azureml.links.studio.AzureMLStudioJobLink",
            "airflow_azureml.links.studio.AzureMLStudioPreviousJobLink",
        ],
        "asset-uris": [
            {
                "schemes": ["azureml"],
                "handler": "airflow_azureml.assets.sanitize_uri",
                "factory": "airflow_azureml.assets.create_asset",
                "to_openlineage_converter": "airflow_azureml.openlineage.convert_asset_to_openlineage",
            }
        ],
        "connection-types": [
            {
                "connection-type": "azure_ml",
                "hook-class-name": "airflow_azureml.hooks.azure_ml.AzureMLHook",
                "hook-name": "Azure Machine Learning",
                "ui-field-behaviour": {
                    "hidden-fields": ["schema", "port", "host"],
                    "relabeling": {"login": "Client ID", "password": "Client secret"},
                    "placeholders": {
                        "login": "service principal application (client) id; empty for DefaultAzureCredential",
                        "password": "client secret; empty for managed/workload identity or az login",
                        "subscription_id": "00000000-0000-0000-0000-000000000000",
                        "resource_group": "my-resource-group",
                        "workspace_name": "my-workspace",
                        "cloud": "AzureCloud",
                    },
                },
                "conn-fields": {
                    "subscription_id": _text("Subscription ID", "Azure subscription of the workspace.", required=True),
                    "resource_group": _text("Resource group", "Resource group of the workspace.", required=True),
                    "workspace_name": _text("Workspace", "Azure Machine Learning workspace name.", required=True),
                    "tenant_id": _text("Tenant ID", "Microsoft Entra tenant; required with a client secret."),
                    "managed_identity_client_id": _text(
                        "Managed identity client ID", "User-assigned managed identity, used without a secret."
                    ),
                    "workload_identity_tenant_id": _text(
                        "Workload identity tenant ID", "Tenant for workload identity federation (AKS)."
                    ),
                    "cloud": {
                        "label": "Cloud",
                        "description": "AzureCloud, AzureChinaCloud, AzureUSGovernment, or custom endpoints.",
                        "schema": {
                            "type": "string",
                            "enum": ["AzureCloud", "AzureChinaCloud", "AzureUSGovernment", "custom"],
                            "default": "AzureCloud",
                        },
                    },
                    "resource_manager_url": _text(
                        "Resource Manager URL", "Custom cloud only: ARM endpoint (https://...)."
                    ),
                    "authority_url": _text("Authority URL", "Custom cloud only: Entra ID authority (https://...)."),
                    "ca_bundle": _text("CA bundle path", "PEM file of a private CA; TLS verification stays on."),
                    "studio_url": _text("Studio URL", "Base URL for Azure ML Studio links (optional)."),
                    "spot_history_url": _text(
                        "Spot history container",
                        "Blob container URL for the shared spot history (optional; default: the workspace's "
                        "storage account, or 'variable' for an Airflow Variable).",
                    ),
                },
            }
        ],
    }
