"""Writes that Azure refuses are refused by the emulator too, each with its source.

Sent as raw REST (the SDK validates some of these client-side; the service is what is emulated).
"""

from __future__ import annotations

from typing import Any

import pytest

from airflow_azureml.emulator import Emulator
from tests.integration.test_instance_types_k8s import arm as arm_call


def arm(emulator: Emulator, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
    return arm_call(emulator, method, path, json=body)


def cluster(size: str = "STANDARD_DS3_V2", priority: str = "LowPriority") -> dict[str, Any]:
    return {
        "location": "eastus",
        "properties": {
            "computeType": "AmlCompute",
            "properties": {
                "vmSize": size,
                "vmPriority": priority,
                "scaleSettings": {"minNodeCount": 0, "maxNodeCount": 2},
            },
        },
    }


def test_an_existing_clusters_vm_size_cannot_change(emulator: Emulator) -> None:
    # Compute_Update (2024-10-01) takes only scaleSettings; the size is fixed at creation
    assert arm(emulator, "PUT", "/computes/spot-a", cluster()).status_code in (200, 201)
    refused = arm(emulator, "PUT", "/computes/spot-a", cluster(size="STANDARD_NC6"))
    assert refused.status_code == 409 and "vmSize" in refused.json()["error"]["message"]
    assert arm(emulator, "PUT", "/computes/spot-a", cluster(size="standard_ds3_v2")).status_code in (200, 201)


@pytest.mark.parametrize("name", ["-bad", "1abc", "ab", "a" * 25, "bad-", "bad_name"])
def test_a_compute_name_azure_refuses_is_refused(emulator: Emulator, name: str) -> None:
    # "between 3 to 24 characters long", letters, digits and '-', a letter first (compute cluster how-to)
    refused = arm(emulator, "PUT", f"/computes/{name}", cluster())
    assert refused.status_code == 400 and "Invalid compute name" in refused.json()["error"]["message"]
    assert emulator.call(lambda: name not in emulator.workspace.computes)
    assert arm(emulator, "PUT", "/computes/dedicated-cluster-24char", cluster()).status_code in (200, 201)


@pytest.mark.parametrize("mode", ["Key", "AMLToken"])
def test_a_batch_endpoint_takes_entra_tokens_only(emulator: Emulator, mode: str) -> None:
    body = {"location": "eastus", "properties": {"authMode": mode}}
    refused = arm(emulator, "PUT", "/batchEndpoints/heart-batch", body)
    assert refused.status_code == 400 and "authMode" in refused.json()["error"]["message"]
    for accepted in ("AADToken", "aadToken"):  # the swagger's enum value, and what azure-ai-ml sends
        assert arm(emulator, "PUT", "/batchEndpoints/heart-batch", {**body, "properties": {"authMode": accepted}}).ok
    assert arm(emulator, "PUT", "/batchEndpoints/-heart", {**body, "properties": {}}).status_code == 400


def test_a_command_job_needs_a_command(emulator: Emulator) -> None:
    assert arm(emulator, "PUT", "/computes/cpu-a", cluster(priority="Dedicated")).ok
    compute = f"/subscriptions/{emulator.subscription_id}/x/computes/cpu-a"
    body = {"properties": {"jobType": "Command", "computeId": compute, "environmentId": "azureml:env:1"}}
    refused = arm(emulator, "PUT", "/jobs/no-command-1", body)
    assert refused.status_code == 400 and "command" in refused.json()["error"]["message"]
    assert emulator.call(lambda: "no-command-1" not in emulator.workspace.jobs)


def test_a_kubernetes_create_carrying_a_resource_version_is_refused(emulator: Emulator) -> None:
    import kubernetes

    api = kubernetes.client.CustomObjectsApi(
        kubernetes.config.new_client_from_config(config_file=str(emulator.kubeconfig("k8s-compute")))
    )
    body = {
        "apiVersion": "amlarc.azureml.com/v1alpha1",
        "kind": "InstanceType",
        "metadata": {"name": "small", "resourceVersion": "7"},
        "spec": {"resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "1Gi"}}},
    }
    with pytest.raises(kubernetes.client.ApiException) as refused:
        api.create_cluster_custom_object("amlarc.azureml.com", "v1alpha1", "instancetypes", body)
    assert refused.value.status == 400 and "resourceVersion should not be set" in str(refused.value.body)
