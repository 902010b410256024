"""The Airflow 3.1/3.2 runs leave out the tests marked ``same_on_every_airflow`` (tests/conftest.py).

Each reason there is a claim about code; these tests hold it, so that a test which starts to exercise
Airflow is not silently left out of the other versions' runs.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import EMULATOR_ONLY, EXAMPLE_DAG_VARIANTS, SAME_ON_EVERY_AIRFLOW

REPO = Path(__file__).resolve().parents[2]
# What an emulator-only test may use from the provider: the hook only to build the real SDK's MLClient
# (the hook itself runs on every version in test_hook_settings, test_resources and every dag.test() test),
# and two constants; and the example's data helpers (standard library only: heart rows, reading predictions).
CLIENT_SIDE = {
    "airflow_azureml.hooks.azure_ml",
    "airflow_azureml.hooks.rest",
    "airflow_azureml.naming",
    "airflow_azureml.example_data",
}
# Helpers taken from test modules that do run on every version: plain HTTP calls to the emulator.
HELPERS = {("tests.integration.test_instance_types_k8s", "arm")}


def imports(path: Path) -> set[tuple[str, str]]:
    """Every ``(module, name)`` the file imports, at any depth (function bodies too)."""
    found: set[tuple[str, str]] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {(alias.name, "") for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found |= {(node.module, alias.name) for alias in node.names}
    return found


def test_every_entry_names_a_test_that_exists() -> None:
    for entry in SAME_ON_EVERY_AIRFLOW:
        file, _, test = entry.partition("::")
        path = REPO / file
        assert path.is_file(), entry
        if test:
            assert f"def {test.split('[')[0]}(" in path.read_text(), entry


@pytest.mark.parametrize("file", EMULATOR_ONLY)
def test_an_emulator_only_test_imports_nothing_of_airflow(file: str) -> None:
    for module, name in imports(REPO / file):
        top = module.split(".")[0]
        assert top != "airflow", (file, module)
        if top == "airflow_azureml":
            assert module.startswith("airflow_azureml.emulator") or module in CLIENT_SIDE, (file, module)
        if top == "tests" and module.startswith("tests.integration."):
            other = module.replace(".", "/") + ".py"
            assert other in EMULATOR_ONLY or (module, name) in HELPERS, (file, module, name)
    text = (REPO / file).read_text()
    for airflow_fixture in ("airflow_db", "load_dag", "dag.test", "xcom_value"):
        assert airflow_fixture not in text, (file, airflow_fixture)


def test_the_emulator_loads_no_airflow() -> None:
    """The claim under EMULATOR_ONLY: every module of the emulator imports without Airflow."""
    code = (
        "import importlib, pkgutil, sys, json\n"
        "import airflow_azureml.emulator as e\n"
        "for m in pkgutil.walk_packages(e.__path__, e.__name__ + '.'):\n"
        "    if not m.name.endswith('__main__'):\n"
        "        importlib.import_module(m.name)\n"
        "print(json.dumps(sorted(k for k in sys.modules if k == 'airflow' or k.startswith('airflow.'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert json.loads(out.stdout) == []


def test_the_example_dag_still_runs_on_every_version() -> None:
    """The variants are left out because one run of the example DAG stays in every version's run."""
    kept = "tests/integration/test_example_dag.py::test_example_dag_survives_whole_cluster_preemption[canceled]"
    assert kept not in SAME_ON_EVERY_AIRFLOW
    assert all(
        entry.startswith(
            (
                "tests/integration/test_example_dag.py::",
                "tests/integration/test_demo.py",
                "tests/integration/test_mlflow_model.py::",
            )
        )
        for entry in EXAMPLE_DAG_VARIANTS
    )
