"""The scoring script Azure generates for an MLflow model deployed without one (no-code deployment).

Run by the emulator's script host (``_script_host.py``) as any deployment's own ``score.py`` is, in a
process of its own, so the model's imports and errors never reach the emulator. What it does is what
Microsoft documents for batch deployments of MLflow models (Microsoft Learn, *Deploy MLflow models in
batch deployments*, "Considerations when deploying to batch inference"; docs/emulator.md, "MLflow models"):

- ``init()`` loads the model with MLflow's pyfunc loader (``mlflow.pyfunc.load_model``) from
  ``AZUREML_MODEL_DIR``: "Batch deployments only support deploying MLflow models with a pyfunc flavor";
  a model without one fails here, and so the job.
- ``run(mini_batch)`` calls the model's ``predict`` once per file. ``.csv``, ``.parquet`` and ``.pqt``
  files are read as a ``pandas.DataFrame``; with a column signature (``ColSpec``) the columns are read as
  the signature's types ("Input's data types are enforced ... while reading the data"), without one no
  typing is enforced. A file that cannot be read or scored fails its mini-batch with
  ``Error processing input file: '<path>'. Exception: <error>``, the documented message.
- Output: one line per input row, in the file's order, with no header and three columns in this order
  (Microsoft Learn, *Deploy MLflow models in batch deployments*, "Analyze outputs", as of 2026-12: source
  MicrosoftDocs/azure-ai-docs, articles/machine-learning/how-to-mlflow-batch.md): ``row``, the row's index
  in its input file (0 for the first data row; documented as optional, present for tabular input, which
  is all the emulator scores), ``prediction``, "as-is" from ``predict()``, and ``file_name``, the input
  file's name. The documentation's own notebook reads it with
  ``pd.read_csv(path, names=["row", "prediction", "file"])``, so each line is a CSV record:
  ``0,1,part-0000.csv``. A prediction that is not a single value (a row of a DataFrame, an array) is
  written as JSON in one quoted field: Microsoft does not document that case's text.

Which file types a job may hold is checked by the runner before the first mini-batch (an unsupported
file fails the job, as documented); images are documented but not emulated.
"""

from __future__ import annotations

import csv
import io
import json
import os
from pathlib import Path
from typing import Any

TABULAR = (".csv", ".parquet", ".pqt")
_TYPES = {"long": "int64", "integer": "int32", "double": "float64", "float": "float32", "boolean": "bool"}
model: Any = None
column_types: dict[str, str] = {}


def _model_folder() -> Path:
    root = Path(os.environ.get("AZUREML_MODEL_DIR") or ".")
    found = sorted(root.rglob("MLmodel"), key=lambda p: len(p.parts))  # the registered folder may nest it
    if not found:
        raise FileNotFoundError(f"No MLmodel file in the model folder {root.name!r}")
    return found[0].parent


def init() -> None:
    global model, column_types
    try:
        import mlflow.pyfunc
    except ImportError as exc:
        raise ImportError(
            f"{exc}: the emulator runs MLflow models with MLflow's pyfunc loader; install airflow-azureml[mlflow] "
            "and the model's flavour (its requirements.txt)"
        ) from exc
    model = mlflow.pyfunc.load_model(str(_model_folder()))
    schema = model.metadata.get_input_schema()
    column_types = {}
    if schema is not None and not schema.is_tensor_spec():
        for spec in schema.inputs:
            dtype = _TYPES.get(str(getattr(spec.type, "name", spec.type)))
            if spec.name and dtype:
                column_types[spec.name] = dtype


def _read(path: str) -> Any:
    import pandas as pd

    frame = pd.read_csv(path) if path.lower().endswith(".csv") else pd.read_parquet(path)
    for column, dtype in column_types.items():
        if column in frame.columns:
            frame[column] = frame[column].astype(dtype)
    return frame


def _plain(value: Any) -> Any:
    """A numpy scalar or array as Python's own value, so that the line is a plain literal."""
    if hasattr(value, "tolist"):
        value = value.tolist()
    return json.loads(json.dumps(value, default=str))


def _field(value: Any) -> Any:
    """A prediction as one CSV field: a single value as itself, anything else as JSON."""
    value = _plain(value)
    return json.dumps(value) if isinstance(value, (list, dict)) else value


def run(mini_batch: list[str]) -> list[str]:
    lines: list[str] = []
    for path in mini_batch:
        try:
            predictions = model.predict(_read(path))
        except Exception as exc:
            raise RuntimeError(f"Error processing input file: {path!r}. Exception: {exc}") from exc
        if hasattr(predictions, "to_dict") and hasattr(predictions, "columns"):  # a DataFrame: a row each
            values = predictions.to_dict("records")
        elif hasattr(predictions, "tolist"):
            values = predictions.tolist()
        else:
            values = list(predictions)
        name = os.path.basename(path)
        for row, value in enumerate(values):
            buffer = io.StringIO()
            csv.writer(buffer, lineterminator="").writerow([row, _field(value), name])
            lines.append(buffer.getvalue())
    return lines
