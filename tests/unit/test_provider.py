"""Provider registration and parse-time cost."""

from __future__ import annotations

import subprocess
import sys
import warnings
from importlib.metadata import entry_points
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_entry_point_and_provider_info() -> None:
    eps = [ep for ep in entry_points(group="apache_airflow_provider") if ep.value.startswith("airflow_azureml")]
    assert len(eps) == 1
    info = eps[0].load()()
    conn = info["connection-types"][0]
    assert conn["connection-type"] == "azure_ml"
    assert conn["hook-class-name"] == "airflow_azureml.hooks.azure_ml.AzureMLHook"
    assert {"subscription_id", "resource_group", "workspace_name", "tenant_id", "cloud", "ca_bundle"} <= set(
        conn["conn-fields"]
    )
    assert conn["ui-field-behaviour"]["relabeling"]["password"] == "Client secret"


def test_providers_manager_sees_connection_type_and_widgets() -> None:
    from airflow.providers_manager import ProvidersManager

    from airflow_azureml import compat

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # our own use of Airflow's API must not warn (deprecations included)
        pm = ProvidersManager()
        assert "airflow-azureml" in pm.providers
        # hooks moved to the task SDK's runtime manager in Airflow 3.2 (ProvidersManager.hooks is deprecated)
        try:
            from airflow.sdk.providers_manager_runtime import ProvidersManagerTaskRuntime
        except ImportError:  # Airflow 3.1: the providers manager still holds the hooks
            hooks = pm.hooks
        else:
            hooks = ProvidersManagerTaskRuntime().hooks
        assert "azure_ml" in hooks
        # the form comes from conn-fields and ui-field-behaviour, which Airflow 3.1 ignores (docs/airflow_versions.md)
        assert ("extra__azure_ml__workspace_name" in pm.connection_form_widgets) is compat.has_conn_fields()
        if compat.has_conn_fields():
            assert pm.field_behaviours["azure_ml"]["hidden_fields"] == ["schema", "port", "host"]
        else:
            assert "azure_ml" not in pm.field_behaviours


def test_importing_operators_hooks_and_dags_does_not_import_the_sdk() -> None:
    code = (
        "import sys, importlib, pkgutil, runpy\n"
        f"sys.path.insert(0, {str(REPO / 'dags')!r})\n"
        "import airflow_azureml\n"
        "for pkg in ('hooks', 'operators', 'sensors', 'triggers', 'links', 'plugins'):\n"
        "    m = importlib.import_module(f'airflow_azureml.{pkg}')\n"
        "    for info in pkgutil.iter_modules(m.__path__):\n"
        "        importlib.import_module(f'airflow_azureml.{pkg}.{info.name}')\n"
        f"for dag_file in {[str(p) for p in sorted((REPO / 'dags').glob('*.py'))]!r}:\n"
        "    runpy.run_path(dag_file)\n"
        # the SDK, and what the emulator's MLflow models need (the [mlflow] extra)
        "heavy = ('azure.ai.ml', 'azure.identity', 'aiohttp', 'mlflow', 'sklearn', 'pandas')\n"
        "heavy = [m for m in heavy if m in sys.modules]\n"
        "print('HEAVY=' + ','.join(heavy))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "HEAVY=\n" in result.stdout, result.stdout[-2000:]


def test_parsing_the_example_dags_imports_no_execute_time_module() -> None:
    """The rules, the triggers and the clients load when a task runs, not when a DAG is parsed.

    ``benchmarks/dag_parse.py`` measures what that saves; this only checks which modules load.
    """
    execute_time = (
        "airflow_azureml.specs",
        "airflow_azureml.instance_types",
        "airflow_azureml.triggers",
        "airflow.triggers.base",
        "azure.ai.ml",
        "azure.identity",
        "azure.core",
        "aiohttp",
        "kubernetes",
    )
    names = ("low_priority_batch_scoring", "kubernetes_instance_type_scoring")
    dags = [str(REPO / "dags" / f"{name}.py") for name in names]
    code = (
        "import sys, runpy\n"
        f"sys.path.insert(0, {str(REPO / 'dags')!r})\n"
        "import airflow.sdk\n"  # what Airflow loads itself is not ours (3.1's task SDK loads airflow.triggers.base)
        f"ours = [m for m in {execute_time!r} if m not in sys.modules]\n"
        "import airflow_azureml.operators, airflow_azureml.sensors\n"
        f"for dag_file in {dags!r}:\n"
        "    runpy.run_path(dag_file)\n"
        "loaded = [m for m in ours if m in sys.modules]\n"
        "print('LOADED=' + ','.join(loaded))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "LOADED=\n" in result.stdout, result.stdout[-2000:]
