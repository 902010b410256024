"""A real MLflow model end to end (issue 20, section 1), and what the emulator refuses as Azure does.

The example DAG registers the committed scikit-learn MLflow model (dags/azureml/model/) as an
``mlflow_model`` and deploys it with no scoring script; the emulator runs it through MLflow's pyfunc
loader, as Azure's generated scoring script does (docs/emulator.md, "MLflow models"). Everything goes
through the real azure-ai-ml MLClient and real Airflow (``dag.test()``).
"""

from __future__ import annotations

import csv
import io
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pendulum
import pytest

from airflow_azureml.emulator import Emulator
from airflow_azureml.example_data import write_heart_csvs
from airflow_azureml.exceptions import AzureMLConfigError
from airflow_azureml.operators import (
    AzureMLCreateBatchDeploymentOperator,
    AzureMLCreateComputeClusterOperator,
    AzureMLRegisterModelOperator,
)
from tests.conftest import FAST, load_dag, task_states

REPO = Path(__file__).resolve().parents[2]
SEED = REPO / "dags" / "azureml"
MODEL = SEED / "model"
INTERVAL = pendulum.datetime(2026, 11, 28, tz="UTC")
ENDPOINT = "mlflow-refusals"


@pytest.fixture
def bare_emulator(tmp_path: Path, fork_server: Any) -> Iterator[Emulator]:
    """An emulator where nothing is registered yet: the example DAG registers its model itself."""
    with Emulator(tmp_path / "emulator", timing=FAST, fork_server=fork_server) as emu:
        yield emu


def test_example_dag_scores_every_row_once_with_the_mlflow_model(
    bare_emulator: Emulator, airflow_db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import mlflow.pyfunc
    import pandas as pd

    emulator = bare_emulator
    monkeypatch.setenv("AIRFLOW_CONN_AZURE_ML_DEFAULT", emulator.connection_info()["airflow_conn_json"])
    monkeypatch.setenv("AZUREML_DATASTORE_ROOT", f"file://{emulator.datastore_path('')}")
    monkeypatch.setenv("AZUREML_POLL_SECONDS", "0.1")
    run = load_dag("low_priority_batch_scoring.py").test(logical_date=INTERVAL)
    assert str(run.state) == "success", task_states(run)

    version = emulator.call(lambda: dict(emulator.workspace.models["heart-classifier-mlflow"]["1"]))
    assert version["modelType"] == "mlflow_model" and "python_function" in version["flavors"]
    for name in ("classifier-mlflow", "classifier-mlflow-dedicated"):
        props = emulator.call(lambda n=name: emulator.workspace.deployments[("heart-classifier-batch", n)].body)
        assert "codeConfiguration" not in props["properties"] or not props["properties"]["codeConfiguration"]
        assert props["properties"]["model"]["assetId"].endswith("/models/heart-classifier-mlflow/versions/1")

    model = mlflow.pyfunc.load_model(str(MODEL))
    key = INTERVAL.strftime("%Y%m%dT%H%M")
    parts = sorted(emulator.datastore_path(f"scoring/input/{key}").glob("part-*"))
    assert len(parts) == 4
    total = 0
    for part in parts:
        lines = (emulator.datastore_path(f"scoring/output/{key}/{part.name}") / "predictions.csv").read_text()
        # as Microsoft's notebook reads it back: no header, the columns row, prediction, file name
        rows = pd.read_csv(io.StringIO(lines), names=["row", "prediction", "file"], header=None)
        scored: list[str] = []
        for path in sorted(part.glob("*.csv")):
            ids = [r["row_id"] for r in csv.DictReader(path.read_text().splitlines())]
            mine = rows[rows["file"] == path.name].sort_values("row", kind="stable")
            assert mine["row"].tolist() == list(range(len(ids))), path.name  # each input row once, no more
            # the model's own predictions, row by row (the row number matches the row id)
            assert mine["prediction"].tolist() == model.predict(pd.read_csv(path)).tolist(), path.name
            scored += [ids[k] for k in mine["row"]]
        assert len(rows) == len(scored) == len(set(scored)) == 6 * 25
        total += len(rows)
    assert total == 4 * 6 * 25
    report = __import__("json").loads(emulator.datastore_path(f"scoring/reports/{key}/report.json").read_text())
    assert report["rows_in"] == report["rows_scored"] == total


# ------------------------------------------------------------------------------------------ refusals
def _ml(emulator: Emulator) -> Any:
    from airflow_azureml.hooks.azure_ml import AzureMLHook

    return AzureMLHook().get_conn()


def _register(emulator: Emulator, name: str, folder: Path, model_type: str = "mlflow_model") -> Any:
    """The folder copied to the datastore, then registered from there through the SDK."""
    from azure.ai.ml.entities import Model

    shutil.copytree(folder, emulator.datastore_path(f"models/{name}/1"))
    uri = f"azureml://datastores/workspaceblobstore/paths/models/{name}/1"
    return _ml(emulator).models.create_or_update(Model(name=name, version="1", path=uri, type=model_type))


def _deploy(name: str, model: str, **kwargs: Any) -> dict[str, Any]:
    return AzureMLCreateBatchDeploymentOperator(
        task_id="deploy",
        endpoint_name=ENDPOINT,
        name=name,
        model=model,
        compute="azureml:low-pri-cluster",
        instance_count=1,
        mini_batch_size=2,
        **kwargs,
    ).execute({})


def _invoke(emulator: Emulator, deployment: str, folder: str) -> Any:
    from azure.ai.ml import Input

    uri = f"azureml://datastores/workspaceblobstore/paths/{folder}/"
    job = _ml(emulator).batch_endpoints.invoke(
        endpoint_name=ENDPOINT, deployment_name=deployment, inputs={"data": Input(type="uri_folder", path=uri)}
    )
    deadline = time.monotonic() + 120
    while emulator.job(job.name).status not in ("Completed", "Failed", "Canceled"):
        assert time.monotonic() < deadline, f"job {job.name} did not end"
        time.sleep(0.05)
    return emulator.job(job.name)


@pytest.fixture
def cluster(emulator: Emulator, azureml_conn: dict[str, Any]) -> Emulator:
    AzureMLCreateComputeClusterOperator(task_id="c", compute=str(SEED / "low-pri-cluster.yml")).execute({})
    return emulator


def _flavours_only(tmp_path: Path, keep: tuple[str, ...]) -> Path:
    """The example model with only the ``keep`` flavours in its MLmodel file."""
    import yaml

    folder = tmp_path / "model"
    shutil.copytree(MODEL, folder)
    mlmodel = yaml.safe_load((folder / "MLmodel").read_text())
    mlmodel["flavors"] = {k: v for k, v in mlmodel["flavors"].items() if k in keep}
    (folder / "MLmodel").write_text(yaml.safe_dump(mlmodel))
    return folder


def test_a_model_without_the_pyfunc_flavour_is_refused_without_a_scoring_script(
    cluster: Emulator, tmp_path: Path
) -> None:
    """Microsoft Learn: "Batch deployments only support deploying MLflow models with a pyfunc flavor"."""
    registered = _register(cluster, "sklearn-only", _flavours_only(tmp_path, ("sklearn",)))
    assert set(registered.flavors) == {"sklearn"}  # read from the MLmodel file, as the service shows them
    with pytest.raises(Exception, match="pyfunc") as refused:
        _deploy("no-pyfunc", "azureml:sklearn-only:1")
    assert "python_function" in str(refused.value)
    assert cluster.call(lambda: (ENDPOINT, "no-pyfunc") not in cluster.workspace.deployments)


def test_a_custom_model_needs_a_scoring_script(cluster: Emulator, tmp_path: Path) -> None:
    _register(cluster, "plain-pickle", MODEL, model_type="custom_model")
    with pytest.raises(Exception, match="needs an MLflow model"):
        _deploy("no-script", "azureml:plain-pickle:1")


def test_an_mlflow_model_folder_needs_its_mlmodel_file(cluster: Emulator, tmp_path: Path) -> None:
    folder = tmp_path / "model"
    shutil.copytree(MODEL, folder)
    (folder / "MLmodel").unlink()
    with pytest.raises(Exception, match="No MLmodel file"):
        _register(cluster, "no-mlmodel", folder)
    assert cluster.call(lambda: "no-mlmodel" not in cluster.workspace.models)


def test_a_model_version_cannot_point_at_other_files(cluster: Emulator) -> None:
    from azure.ai.ml.entities import Model

    _register(cluster, "fixed", MODEL)
    shutil.copytree(MODEL, cluster.datastore_path("models/fixed/elsewhere"))
    other = "azureml://datastores/workspaceblobstore/paths/models/fixed/elsewhere"
    with pytest.raises(Exception, match="cannot be updated"):
        _ml(cluster).models.create_or_update(Model(name="fixed", version="1", path=other, type="mlflow_model"))


def test_an_unsupported_input_file_fails_the_job(cluster: Emulator) -> None:
    """Microsoft Learn: "any unsupported file that may be present in the input data will make the job to fail"."""
    _deploy("files", "azureml:heart-classifier-mlflow:1")
    write_heart_csvs(cluster.datastore_path("mixed"), files=2, rows_per_file=3, seed=1)
    cluster.datastore_path("mixed/extra.avro").write_bytes(b"Obj\x01")
    job = _invoke(cluster, "files", "mixed")
    assert job.status == "Failed"
    assert "File type 'avro' is not supported." in job.error["message"]


def test_the_models_own_error_fails_its_mini_batch_as_azure_reports_it(cluster: Emulator) -> None:
    """A value the signature cannot read fails that file's mini-batch with the documented message; the
    other mini-batches are scored, and the job fails once ``error_threshold`` is exceeded."""
    _deploy("typed", "azureml:heart-classifier-mlflow:1", max_retries=0, error_threshold=0)
    folder = cluster.datastore_path("typed")
    write_heart_csvs(folder, files=4, rows_per_file=3, seed=2)
    bad = folder / "part-0003.csv"
    bad.write_text(bad.read_text().replace("\n", "\nx-bad,value,1,1,120,200,0,1,150,0,1.0\n", 1))
    job = _invoke(cluster, "typed", "typed")
    assert job.status == "Failed"
    message = job.error["message"]
    assert "Error processing input file" in message and "part-0003.csv" in message, message
    assert "value" in message, message  # the model's (the signature's) own error, as read
    log = cluster.data_dir / "job-runs" / job.name / "user_logs" / "std_log.txt"
    assert "Error processing input file" in log.read_text()  # and in the job's user log


def test_a_whole_cluster_preemption_while_the_model_loads_ends_the_job(cluster: Emulator) -> None:
    """Loading an MLflow model takes seconds on a Running job: nodes lost meanwhile take no work."""
    _deploy("preempted", "azureml:heart-classifier-mlflow:1")
    write_heart_csvs(cluster.datastore_path("preempt-in"), files=4, rows_per_file=3, seed=4)
    from azure.ai.ml import Input

    job = _ml(cluster).batch_endpoints.invoke(
        endpoint_name=ENDPOINT,
        deployment_name="preempted",
        inputs={"data": Input(type="uri_folder", path="azureml://datastores/workspaceblobstore/paths/preempt-in/")},
    )
    deadline = time.monotonic() + 60
    while cluster.job(job.name).status != "Running":  # init() starts once the job runs on its nodes
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert cluster.preempt_cluster("low-pri-cluster") == [job.name]
    while cluster.job(job.name).status not in ("Completed", "Failed", "Canceled"):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert cluster.job(job.name).status == "Canceled"
    assert not (cluster.workspace.resolve_uri(cluster.job(job.name).output_uri) / "predictions.csv").exists()


def test_a_model_that_cannot_load_fails_the_job(cluster: Emulator, tmp_path: Path) -> None:
    folder = tmp_path / "model"
    shutil.copytree(MODEL, folder)
    (folder / "model.pkl").write_bytes(b"not a pickle")
    _register(cluster, "broken", folder)
    _deploy("broken", "azureml:broken:1")
    write_heart_csvs(cluster.datastore_path("broken-in"), files=1, rows_per_file=2, seed=3)
    job = _invoke(cluster, "broken", "broken-in")
    assert job.status == "Failed"
    assert "init() failed" in job.error["message"], job.error


# ------------------------------------------------------------------------ the register operator
def test_register_operator_is_idempotent_and_refuses_a_changed_version(emulator: Emulator, azureml_conn: Any) -> None:
    model = {
        "name": "again",
        "version": "3",
        "type": "mlflow_model",
        "path": "azureml://datastores/workspaceblobstore/paths/models/again/3/",
    }
    shutil.copytree(MODEL, emulator.datastore_path("models/again/3"))
    assert AzureMLRegisterModelOperator(task_id="r", model=model).execute({})["changed"] is True
    writes = len([r for r in emulator.requests() if r["method"] == "PUT"])
    assert AzureMLRegisterModelOperator(task_id="r", model=model).execute({})["changed"] is False
    assert len([r for r in emulator.requests() if r["method"] == "PUT"]) == writes
    shutil.copytree(MODEL, emulator.datastore_path("models/again/other"))
    moved = {**model, "path": "azureml://datastores/workspaceblobstore/paths/models/again/other/"}
    with pytest.raises(AzureMLConfigError, match="cannot change"):
        AzureMLRegisterModelOperator(task_id="r", model=moved).execute({})


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"verison": "1"}, "did you mean 'version'"),
        ({"version": None}, "version is required"),
        ({"type": "onnx"}, "not one of"),
        ({"path": "does-not-exist"}, "does not exist"),
    ],
)
def test_register_operator_refuses_bad_input_before_any_call(
    emulator: Emulator, azureml_conn: Any, change: dict[str, Any], message: str
) -> None:
    model = {"name": "m", "version": "1", "type": "mlflow_model", "path": str(MODEL), **change}
    before = len(emulator.requests())
    with pytest.raises(AzureMLConfigError, match=message):
        AzureMLRegisterModelOperator(task_id="r", model=model).execute({})
    assert len(emulator.requests()) == before


def test_register_operator_needs_the_mlmodel_file_of_a_local_mlflow_folder(tmp_path: Path) -> None:
    (tmp_path / "model.pkl").write_bytes(b"")
    with pytest.raises(AzureMLConfigError, match="MLmodel"):
        AzureMLRegisterModelOperator(
            task_id="r", model={"name": "m", "version": "1", "type": "mlflow_model", "path": str(tmp_path)}
        ).execute({})
