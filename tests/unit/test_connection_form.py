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
    """The form's extra fields (Airflow 3.2 on). Airflow 3.1 ignores ``conn-fields``: this asserts
    that loss (no extra field at all, docs/airflow_versions.md) and the tests that use it end there."""
    from airflow.providers_manager import ProvidersManager

    from airflow_azureml import compat

    fields = {
        name.removeprefix("extra__azure_ml__"): info.field
        for name, info in ProvidersManager().connection_form_widgets.items()
        if name.startswith("extra__azure_ml__")
    }
    if not compat.has_conn_fields():
        assert fields == {}, "Airflow 3.1 was expected to ignore conn-fields"
        return {}
    return fields


def degraded(widgets: dict[str, Any]) -> bool:
    """Airflow 3.1: the form has no extra fields (asserted by the fixture); nothing more to check."""
    return not widgets


def test_without_conn_fields_the_loss_is_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    """3.2 and 3.3: conn-fields are read, nothing logged. 3.1: one info line says what the form lacks."""
    from airflow_azureml import compat
    from airflow_azureml.get_provider_info import get_provider_info

    compat._warned.discard("conn_fields")
    with caplog.at_level("INFO", logger="airflow_azureml.compat"):
        get_provider_info()
        get_provider_info()
    lines = [r.getMessage() for r in caplog.records if "conn-fields" in r.getMessage()]
    if compat.has_conn_fields():
        assert lines == []
    else:
        assert len(lines) == 1 and "Extra field as JSON" in lines[0] and compat.airflow_version() in lines[0]


def test_cloud_offers_the_three_clouds_and_custom_and_no_null(widgets: dict[str, Any]) -> None:
    if degraded(widgets):
        return
    schema = widgets["cloud"]["schema"]
    assert schema["enum"] == ["AzureCloud", "AzureChinaCloud", "AzureUSGovernment", "custom"]
    assert None not in schema["enum"]
    assert "null" not in (schema["type"] if isinstance(schema["type"], list) else [schema["type"]])
    assert widgets["cloud"]["value"] == "AzureCloud"


@pytest.mark.parametrize("field", REQUIRED)
def test_workspace_coordinates_are_required(widgets: dict[str, Any], field: str) -> None:
    if degraded(widgets):
        return
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
    if degraded(widgets):
        return
    assert not _ui_required(widgets[field]["schema"])
