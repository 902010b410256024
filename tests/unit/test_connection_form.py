"""The ``azure_ml`` connection form as Airflow 3's UI renders it from ``conn-fields``.

The UI (``FlexibleForm``) marks a field required when its schema ``type`` does not include
``"null"``, and offers each ``enum`` value, ``None`` included (shown as "null"), as a choice.
"""

from __future__ import annotations

from typing import Any

import pytest

REQUIRED = ("subscription_id", "resource_group", "workspace_name")


def _ui_required(schema: dict[str, Any]) -> bool:
    """The UI's rule (airflow/ui FlexibleForm ``isRequired``): a type, and not a nullable one."""
    kind = schema.get("type")
    return bool(kind) and (not isinstance(kind, list) or "null" not in kind)


@pytest.fixture(scope="module")
def widgets() -> dict[str, Any]:
    from airflow.providers_manager import ProvidersManager

    return {
        name.removeprefix("extra__azure_ml__"): info.field
        for name, info in ProvidersManager().connection_form_widgets.items()
        if name.startswith("extra__azure_ml__")
    }


def test_cloud_offers_the_three_clouds_and_custom_and_no_null(widgets: dict[str, Any]) -> None:
    schema = widgets["cloud"]["schema"]
    assert schema["enum"] == ["AzureCloud", "AzureChinaCloud", "AzureUSGovernment", "custom"]
    assert None not in schema["enum"]
    assert "null" not in (schema["type"] if isinstance(schema["type"], list) else [schema["type"]])
    assert widgets["cloud"]["value"] == "AzureCloud"


@pytest.mark.parametrize("field", REQUIRED)
def test_workspace_coordinates_are_required(widgets: dict[str, Any], field: str) -> None:
    schema = widgets[field]["schema"]
    assert _ui_required(schema), schema
    assert schema["title"]


@pytest.mark.parametrize(
    "field",
    [
        "tenant_id",
        "managed_identity_client_id",
        "workload_identity_tenant_id",
        "resource_manager_url",
        "authority_url",
        "ca_bundle",
        "studio_url",
    ],
)
def test_optional_fields_stay_optional(widgets: dict[str, Any], field: str) -> None:
    assert not _ui_required(widgets[field]["schema"])
