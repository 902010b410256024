"""The example deployment's scoring script (dags/azureml/score/score.py), called as Azure calls it: init(), run()."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from airflow_azureml.example_data import write_heart_csvs

SCRIPT = Path(__file__).resolve().parents[2] / "dags" / "azureml" / "score" / "score.py"


def load() -> ModuleType:
    """A fresh import per test: the script keeps its model in module globals, as scoring scripts do."""
    spec = importlib.util.spec_from_file_location("example_score", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    writes, sys.dont_write_bytecode = sys.dont_write_bytecode, True  # no __pycache__ in the code folder
    try:
        spec.loader.exec_module(module)
    finally:
        sys.dont_write_bytecode = writes
    return module


@pytest.fixture
def mini_batch(tmp_path: Path) -> list[str]:
    write_heart_csvs(tmp_path / "in", files=2, rows_per_file=3, seed=3, id_prefix="u-")
    return sorted(str(p) for p in (tmp_path / "in").glob("*.csv"))


MODEL = SCRIPT.parents[1] / "model"


@pytest.fixture
def model_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """``AZUREML_MODEL_DIR`` as Azure sets it: the registered folder inside it (here one level down)."""
    import shutil

    shutil.copytree(MODEL, tmp_path / "azureml-models" / "model")
    monkeypatch.setenv("AZUREML_MODEL_DIR", str(tmp_path / "azureml-models"))
    return tmp_path / "azureml-models"


def test_one_line_per_row_with_file_row_id_probability_and_prediction(model_dir: Path, mini_batch: list[str]) -> None:
    score = load()
    score.init()
    lines = score.run(mini_batch)
    assert len(lines) == 6
    fields = [line.split(",") for line in lines]
    assert [f[0] for f in fields] == ["part-0000.csv"] * 3 + ["part-0001.csv"] * 3
    assert [f[1] for f in fields] == [f"u-{i:07d}" for i in range(6)]  # the column the example's report reads
    for _, _, probability, prediction in fields:
        assert 0.0 < float(probability) < 1.0 and len(probability.split(".")[1]) == 4
        assert prediction == str(int(float(probability) >= 0.5))
    assert score.run(mini_batch) == lines  # deterministic


def test_the_predictions_are_the_registered_models(model_dir: Path, mini_batch: list[str]) -> None:
    """The script scores with the registered model: the same classes as MLflow's pyfunc loader gives."""
    import mlflow.pyfunc
    import pandas as pd

    score = load()
    score.init()
    predicted = [int(line.rsplit(",", 1)[1]) for line in score.run(mini_batch)]
    pyfunc = mlflow.pyfunc.load_model(str(MODEL))
    assert predicted == [v for path in mini_batch for v in pyfunc.predict(pd.read_csv(path)).tolist()]


def test_no_model_in_the_model_folder_fails_init(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AZUREML_MODEL_DIR", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="MLmodel"):
        load().init()


def test_an_empty_mini_batch_returns_no_lines(model_dir: Path) -> None:
    score = load()
    score.init()
    assert score.run([]) == []


def test_the_environment_installs_what_azure_batch_deployments_need() -> None:
    """Azure's batch driver runs in the deployment's own environment: azureml-core and
    azureml-dataset-runtime[fuse] must be there (the emulator builds no environment, so only this checks)."""
    import yaml

    conda = yaml.safe_load((Path(__file__).resolve().parents[2] / "dags/azureml/environment/conda.yaml").read_text())
    pip = next(d["pip"] for d in conda["dependencies"] if isinstance(d, dict) and "pip" in d)
    assert {"azureml-core", "azureml-dataset-runtime[fuse]"} <= set(pip)
