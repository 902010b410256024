"""The committed example model (dags/azureml/model/) is what scripts/train_heart_model.py builds, and it works."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import yaml

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "dags" / "azureml" / "model"
# What the interpreter that runs the script decides, not the model: masked before comparing.
# And model_uuid: the script derives it from model.pkl's bytes, which vary with the CPU (assert_same_model).
_ENVIRONMENT_LINES = ("python_version:", "python:", "- python=", "- pip==", "- pip<=", "- setuptools==", "model_uuid:")


def trainer() -> ModuleType:
    spec = importlib.util.spec_from_file_location("train_heart_model", ROOT / "scripts" / "train_heart_model.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _text(path: Path) -> str:
    return "\n".join(line for line in path.read_text().splitlines() if not line.strip().startswith(_ENVIRONMENT_LINES))


def assert_same_model(rebuilt: Path, committed: Path) -> None:
    """The same pipeline, fitted to the same numbers up to the last bits, predicting the same classes.

    Not the same bytes: numpy and OpenBLAS pick their kernels by the CPU (AVX-512 or not), and the fitted
    floats differ in their last bits between machines (a .ci/run on an AMD EPYC without AVX-512 differed at
    one byte of the pickle).
    """
    import pickle

    import numpy as np

    new, old = (pickle.loads(path.read_bytes()) for path in (rebuilt, committed))
    assert repr(new.get_params(deep=True)) == repr(old.get_params(deep=True))
    for (name, step_new), (_, step_old) in zip(new.steps, old.steps, strict=True):
        # n_iter_ left out: the solver's iteration count may move with the same last bits
        fitted = sorted(k for k in vars(step_old) if k.endswith("_") and not k.startswith("_") and k != "n_iter_")
        assert (
            sorted(k for k in vars(step_new) if k.endswith("_") and not k.startswith("_") and k != "n_iter_") == fitted
        )
        for key in fitted:
            a, b = getattr(step_new, key), getattr(step_old, key)
            if isinstance(b, np.ndarray) and b.dtype.kind == "f":
                np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-12, err_msg=f"{name}.{key}")
            elif isinstance(b, np.ndarray):
                np.testing.assert_array_equal(a, b, err_msg=f"{name}.{key}")
            else:
                assert a == b, (name, key)
    frame, _ = trainer().training_frame()
    np.testing.assert_array_equal(new.predict(frame), old.predict(frame))


def test_the_script_rebuilds_the_committed_model(tmp_path: Path) -> None:
    rebuilt = trainer().build(tmp_path / "model")
    names = sorted(p.name for p in MODEL.iterdir())
    assert sorted(p.name for p in rebuilt.iterdir()) == names
    assert_same_model(rebuilt / "model.pkl", MODEL / "model.pkl")
    for name in names:
        if name != "model.pkl":
            assert _text(rebuilt / name) == _text(MODEL / name), name


def test_the_committed_model_is_a_pyfunc_model_with_a_signature() -> None:
    mlmodel = yaml.safe_load((MODEL / "MLmodel").read_text())
    assert "python_function" in mlmodel["flavors"]  # what Azure's batch deployments need (docs/azure.md)
    assert mlmodel["signature"]["inputs"]


def test_the_model_learned_the_risk_it_was_trained_on() -> None:
    import mlflow.pyfunc

    frame, labels = trainer().training_frame()
    predicted = mlflow.pyfunc.load_model(str(MODEL)).predict(frame)
    accuracy = float((predicted == labels.to_numpy()).mean())
    assert 0.7 < accuracy < 1.0, accuracy  # better than a coin, and not a lookup of its labels
    assert set(predicted.tolist()) == {0, 1}
