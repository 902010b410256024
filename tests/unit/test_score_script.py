"""The example deployment's scoring script (dags/azureml/score/score.py), called as Azure calls it: init(), run()."""

from __future__ import annotations

import importlib.util
import json
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


def test_one_line_per_row_with_file_row_id_probability_and_prediction(
    mini_batch: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AZUREML_MODEL_DIR", raising=False)
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


def test_the_same_lines_as_the_emulators_built_in_model(mini_batch: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    """The shipped script scores exactly as the emulator's built-in heart-classifier did: the report is unchanged."""
    from airflow_azureml.emulator.scoring import heart

    monkeypatch.delenv("AZUREML_MODEL_DIR", raising=False)
    score = load()
    score.init()
    heart.init()
    assert score.run(mini_batch) == heart.run(mini_batch)


def test_weights_from_the_registered_model_folder(
    mini_batch: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = tmp_path / "model" / "heart-classifier"
    model.mkdir(parents=True)
    (model / "weights.json").write_text(json.dumps({"bias": -100.0, "weights": {"age": 0.0}}))
    monkeypatch.setenv("AZUREML_MODEL_DIR", str(tmp_path / "model"))
    score = load()
    score.init()
    assert {line.rsplit(",", 2)[1:] == ["0.0000", "0"] for line in score.run(mini_batch)} == {True}


def test_an_empty_model_folder_keeps_the_built_in_weights(
    mini_batch: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AZUREML_MODEL_DIR", raising=False)
    baseline = load()
    baseline.init()
    monkeypatch.setenv("AZUREML_MODEL_DIR", str(tmp_path))
    score = load()
    score.init()
    assert score.run(mini_batch) == baseline.run(mini_batch)


def test_an_empty_mini_batch_returns_no_lines() -> None:
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
