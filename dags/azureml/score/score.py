"""Scoring script of the example's custom-script deployment (``deployment-custom-script.yml``).

The contract of a batch scoring script (Microsoft Learn, *Author scoring scripts for batch deployments*):

- ``init()`` runs once per worker process before any mini-batch. Load the model here. Azure ML sets
  ``AZUREML_MODEL_DIR`` to the folder the deployment's registered model was downloaded to (the
  registered folder may sit one level down in it).
- ``run(mini_batch)`` gets a list of input file paths (``mini_batch_size`` files) and returns a list of
  strings or a ``pandas.DataFrame``; with ``output_action: append_row`` every element (every row) becomes
  one line of ``predictions.csv``, unchanged and without a header. An exception fails the mini-batch, which
  is retried (``retry_settings``) and counted against ``error_threshold``.

This one loads the registered MLflow model (``heart-classifier-mlflow``) with its own flavour,
``mlflow.sklearn``, so that it can also return the probability, and writes one line per input row,
``<file>,<row_id>,<probability>,<prediction>``: unlike the no-code deployment's output, the row id is in
the line. Its environment is ``../environment/conda.yaml``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

model: Any = None
features: list[str] = []


def _model_folder() -> Path:
    root = Path(os.environ.get("AZUREML_MODEL_DIR") or ".")
    found = sorted(root.rglob("MLmodel"), key=lambda p: len(p.parts))
    if not found:
        raise FileNotFoundError(f"no MLflow model (MLmodel file) under AZUREML_MODEL_DIR={str(root)!r}")
    return found[0].parent


def init() -> None:
    """Load the registered model once per worker."""
    global model, features
    import mlflow.sklearn
    from mlflow.models import Model

    folder = _model_folder()
    model = mlflow.sklearn.load_model(str(folder))
    features = Model.load(str(folder)).get_input_schema().input_names()


def run(mini_batch: list[str]) -> list[str]:
    """Score every row of every CSV file in the mini-batch: one output line per input row."""
    import pandas as pd

    lines: list[str] = []
    for file_path in mini_batch:
        frame = pd.read_csv(file_path)
        probabilities = model.predict_proba(frame[features])[:, 1]
        name = Path(file_path).name
        for row_id, p in zip(frame["row_id"].astype(str), probabilities, strict=True):
            lines.append(f"{name},{row_id},{p:.4f},{int(p >= 0.5)}")
    return lines
