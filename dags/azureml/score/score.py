"""Scoring script of the example batch deployment (``code_configuration.scoring_script``).

Azure ML calls ``init()`` once per worker process and ``run(mini_batch)`` for each mini-batch, a list
of input file paths. ``run`` returns one line per input row, ``<file>,<row_id>,<probability>,<prediction>``;
with ``output_action: append_row`` those lines, unchanged and without a header, make up
``predictions.csv``, so the example's report reads the row id from the second column wherever it runs.

The model is deliberately trivial and deterministic: a hand-set logistic scorer over the heart-disease
columns. If the registered model's folder (``AZUREML_MODEL_DIR``) holds a ``weights.json``
(``{"bias": b, "weights": {column: w}}``), those weights are used instead. Only the standard library
is needed, which is all that ``../environment/conda.yaml`` installs beyond Python.
"""

from __future__ import annotations

import csv
import json
import math
import os
from pathlib import Path

DEFAULT_BIAS = -3.2
DEFAULT_WEIGHTS = {
    "age": 0.045,
    "sex": 0.6,
    "cp": 0.35,
    "trestbps": 0.012,
    "chol": 0.006,
    "fbs": 0.2,
    "thalach": -0.025,
    "exang": 0.9,
    "oldpeak": 0.45,
}

bias = DEFAULT_BIAS
weights: dict[str, float] = dict(DEFAULT_WEIGHTS)


def _weights_file() -> Path | None:
    model_dir = os.environ.get("AZUREML_MODEL_DIR")
    if not model_dir:
        return None
    found = sorted(Path(model_dir).rglob("weights.json"))  # a folder model may nest its files one level down
    return found[0] if found else None


def init() -> None:
    """Load the model once: the registered weights if the model folder has them, else the built-in ones."""
    global bias, weights
    path = _weights_file()
    if path is None:
        bias, weights = DEFAULT_BIAS, dict(DEFAULT_WEIGHTS)
        return
    model = json.loads(path.read_text())
    bias = float(model["bias"])
    weights = {str(k): float(v) for k, v in model["weights"].items()}


def probability(row: dict[str, str]) -> float:
    z = bias + sum(weight * float(row[column]) for column, weight in weights.items())
    return 1.0 / (1.0 + math.exp(-z))


def run(mini_batch: list[str]) -> list[str]:
    """Score every row of every CSV file in the mini-batch: one output line per input row."""
    lines: list[str] = []
    for file_path in mini_batch:
        name = Path(file_path).name
        with open(file_path, newline="") as handle:
            for row in csv.DictReader(handle):
                p = probability(row)
                lines.append(f"{name},{row['row_id']},{p:.4f},{int(p >= 0.5)}")
    return lines
