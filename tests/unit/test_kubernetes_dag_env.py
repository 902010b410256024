"""The Kubernetes example DAG reads its cluster and kubeconfig on the worker, and guesses no cluster."""

from __future__ import annotations

import runpy
from pathlib import Path
from typing import Any

import pytest

DAG_FILE = Path(__file__).resolve().parents[2] / "dags" / "kubernetes_instance_type_scoring.py"


def _render(dag: Any, task_id: str, field: str) -> str:
    return (
        dag.get_template_env()
        .from_string(getattr(dag.get_task(task_id), field))
        .render(**(dag.user_defined_macros or {}))
    )


def test_defaults_are_not_the_emulator_s_ids() -> None:
    source = DAG_FILE.read_text()
    assert "rg-emulator" not in source and "00000000-0000-0000-0000-000000000001" not in source


def test_cluster_and_kubeconfig_come_from_the_worker_s_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AZUREML_K8S_RESOURCE_ID", "/subscriptions/parse-time")
    monkeypatch.setenv("AZUREML_KUBECONFIG", "/parse-time/kubeconfig")
    dag = runpy.run_path(str(DAG_FILE))["dag"]  # the DAG processor's parse

    worker_id = "/subscriptions/s/resourceGroups/rg/providers/Microsoft.ContainerService/managedClusters/aks"
    monkeypatch.setenv("AZUREML_K8S_RESOURCE_ID", worker_id)
    monkeypatch.setenv("AZUREML_KUBECONFIG", "/worker/kubeconfig")
    assert _render(dag, "attach_kubernetes_compute", "resource_id") == worker_id
    assert _render(dag, "apply_instance_types", "kubeconfig") == "/worker/kubeconfig"

    monkeypatch.delenv("AZUREML_KUBECONFIG")
    assert _render(dag, "apply_instance_types", "kubeconfig") == str(Path.home() / ".kube" / "config")


def test_no_cluster_id_is_a_clear_error_at_run_time(monkeypatch: pytest.MonkeyPatch) -> None:
    from airflow_azureml.exceptions import AzureMLConfigError

    monkeypatch.delenv("AZUREML_K8S_RESOURCE_ID", raising=False)
    dag = runpy.run_path(str(DAG_FILE))["dag"]  # parses without it
    with pytest.raises(AzureMLConfigError, match="AZUREML_K8S_RESOURCE_ID"):
        _render(dag, "attach_kubernetes_compute", "resource_id")
