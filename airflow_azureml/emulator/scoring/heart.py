"""The emulator's demo model ``heart-classifier``: a small deterministic heart-disease scorer.

It mirrors the model name of the source documents' example deployment. Rows are the classic
heart-disease CSV columns; the output line is ``file,row_id,probability,prediction``.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

COLUMNS = ["row_id", "age", "sex", "cp", "trestbps", "chol", "fbs", "restecg", "thalach", "exang", "oldpeak"]

# Hand-set logistic weights: older age, high cholesterol and exercise angina raise the risk.
_WEIGHTS = {
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
_BIAS = -3.2
_READY = False


def init() -> None:
    """Azure calls ``init()`` once per worker before any mini-batch."""
    global _READY
    _READY = True


def score_row(row: dict[str, str]) -> float:
    z = _BIAS + sum(weight * float(row[name]) for name, weight in _WEIGHTS.items())
    return 1.0 / (1.0 + math.exp(-z))


def run(mini_batch: list[str]) -> list[str]:
    """Score every row of every CSV file in the mini-batch; one output line per input row."""
    if not _READY:
        raise RuntimeError("init() was not called")
    lines: list[str] = []
    for path in mini_batch:
        with open(path, newline="") as handle:
            for row in csv.DictReader(handle):
                probability = score_row(row)
                lines.append(f"{Path(path).name},{row['row_id']},{probability:.4f},{int(probability >= 0.5)}")
    return lines
