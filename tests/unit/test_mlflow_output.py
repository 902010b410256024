"""The no-code MLflow deployment's output lines: Microsoft's current documented form, and the example's reading of it.

Microsoft Learn, *Deploy MLflow models in batch deployments*, "Analyze outputs": one line per input row,
no header, the columns ``row`` (the row's index in its input file), ``prediction``, ``file_name``, in that
order (docs/emulator.md, "MLflow models").
"""

from __future__ import annotations

import csv
import io
import os
from pathlib import Path

import pandas as pd
import pytest

from airflow_azureml.emulator.scoring import _mlflow_driver as driver
from airflow_azureml.example_data import scored_row_ids, write_heart_csvs

MODEL = Path(__file__).resolve().parents[2] / "dags" / "azureml" / "model"


@pytest.fixture
def files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    monkeypatch.setenv("AZUREML_MODEL_DIR", str(MODEL))
    monkeypatch.setenv("MLFLOW_DISABLE_TELEMETRY", "true")
    write_heart_csvs(tmp_path, files=2, rows_per_file=7, seed=3)
    driver.init()
    return sorted(tmp_path.glob("*.csv"))


def test_one_csv_line_per_row_with_row_prediction_file_name(files: list[Path]) -> None:
    lines = driver.run([str(path) for path in files])
    assert len(lines) == 14
    # read back as Microsoft's notebook does: pd.read_csv(path, names=["row", "prediction", "file"])
    frame = pd.read_csv(io.StringIO("\n".join(lines) + "\n"), names=["row", "prediction", "file"])
    for path in files:
        mine = frame[frame["file"] == os.path.basename(path)]
        assert mine["row"].tolist() == list(range(7))
        assert mine["prediction"].tolist() == driver.model.predict(pd.read_csv(path)).tolist()
    assert lines[0] == f"0,{frame['prediction'][0]},{files[0].name}"


def test_the_row_number_matches_the_row_id_whatever_the_line_order(files: list[Path]) -> None:
    lines = driver.run([str(path) for path in files])
    inputs = {p.name: [r["row_id"] for r in csv.DictReader(p.read_text().splitlines())] for p in files}
    ids = scored_row_ids("\n".join(reversed(lines)), inputs)
    assert sorted(ids) == sorted(i for rows in inputs.values() for i in rows)
    assert ids[0] == inputs[files[-1].name][-1]


def test_the_scripts_lines_and_unknown_rows() -> None:
    inputs = {"a.csv": ["r0", "r1"]}
    text = "a.csv,r9,0.5,1\n2,1,a.csv\n0,0,b.csv\n"
    assert scored_row_ids(text, inputs) == ["r9", "a.csv#extra-2", "b.csv#extra-0"]
