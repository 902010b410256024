"""Train the example's heart-disease classifier and save it as an MLflow model (``dags/azureml/model/``).

    python scripts/train_heart_model.py [--out dags/azureml/model]

A scikit-learn pipeline (standard scaling, then logistic regression) trained on rows of the example's own
heart data (``airflow_azureml.example_data.heart_rows``), labelled by a seeded draw from a hand-set risk
score (older age, high cholesterol, exercise angina and ST depression raise it). Everything is seeded and
the solver is deterministic, so the same pinned packages rebuild the same files: the model is committed,
and ``tests/unit/test_heart_model.py`` checks that this script reproduces it.

It is saved with ``mlflow.sklearn.save_model`` (flavours ``sklearn`` and ``python_function``) and a
signature inferred from the training frame: the ten feature columns in, the predicted class (0 or 1) out.
The input files' ``row_id`` column is not a feature; MLflow's schema enforcement ignores the extra
column. The two values MLflow makes up at each save (``utc_time_created``, ``model_uuid``) are set from
the content, so that a rebuild is byte-identical. Needs the ``mlflow`` extra (``pip install -e ".[mlflow]"``).
"""

from __future__ import annotations

import argparse
import hashlib
import math
import os
import random
import shutil
import uuid
from pathlib import Path

from airflow_azureml.example_data import COLUMNS, heart_rows

FEATURES = [c for c in COLUMNS if c != "row_id"]
SEED = 20261201
ROWS = 2000
OUT = Path(__file__).resolve().parents[1] / "dags" / "azureml" / "model"
# The ground truth the labels are drawn from (the weights of the earlier hand-set demo scorer).
_RISK = {
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
_BIAS = -5.6  # centred on the generated rows, so that both classes are common
CREATED = "2026-12-01 00:00:00.000000"  # MLmodel's utc_time_created, fixed for a reproducible file


def training_frame():  # -> tuple[pandas.DataFrame, pandas.Series]
    import pandas as pd

    rows = heart_rows(ROWS, seed=SEED)
    frame = pd.DataFrame([r[1:] for r in rows], columns=FEATURES).astype({"oldpeak": "float64"})
    rng = random.Random(SEED + 1)
    labels = []
    for record in frame.to_dict("records"):
        z = _BIAS + sum(w * float(record[c]) for c, w in _RISK.items())
        labels.append(int(rng.random() < 1.0 / (1.0 + math.exp(-z))))
    return frame, pd.Series(labels, name="target")


def train():  # -> sklearn.pipeline.Pipeline
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    frame, labels = training_frame()
    return make_pipeline(StandardScaler(), LogisticRegression(max_iter=1000, random_state=0)).fit(frame, labels)


def build(out: Path) -> Path:
    """Train and save the MLflow model into ``out`` (replaced); returns ``out``."""
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")  # no usage report, no id file under $HOME
    import mlflow.sklearn
    import sklearn
    from mlflow.models import infer_signature

    frame, _ = training_frame()
    model = train()
    signature = infer_signature(frame, model.predict(frame))
    if out.exists():
        shutil.rmtree(out)
    mlflow.sklearn.save_model(
        model,
        str(out),
        signature=signature,
        serialization_format=mlflow.sklearn.SERIALIZATION_FORMAT_CLOUDPICKLE,
        # stated, not inferred: inference imports the model in a subprocess and reads the environment
        pip_requirements=[f"mlflow-skinny=={mlflow.__version__}", f"scikit-learn=={sklearn.__version__}"],
    )
    mlmodel = out / "MLmodel"
    digest = hashlib.sha256((out / "model.pkl").read_bytes()).hexdigest()
    lines = []
    for line in mlmodel.read_text().splitlines():
        if line.startswith("utc_time_created:"):
            line = f"utc_time_created: '{CREATED}'"
        elif line.startswith("model_uuid:"):
            line = f"model_uuid: {uuid.uuid5(uuid.NAMESPACE_URL, 'sha256:' + digest).hex}"
        lines.append(line)
    mlmodel.write_text("\n".join(lines) + "\n")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=OUT, help=f"the model folder to write (default: {OUT})")
    args = parser.parse_args()
    print(f"saved the MLflow model to {build(args.out)}")


if __name__ == "__main__":
    main()
