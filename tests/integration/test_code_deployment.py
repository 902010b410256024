"""A deployment that ships its own scoring script and environment (``code_configuration`` + ``environment``).

The real ``MLClient`` and azure-identity credentials over HTTPS against the emulator, through the
create operator (the SDK path it uses): the SDK registers the code folder as a code asset, uploads it
to the storage SAS the service hands out (azure-storage-blob), and the emulator runs the *uploaded*
script: ``init()`` once, ``run(mini_batch)`` per mini-batch (issue 12, section 2).
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from airflow_azureml.emulator import Emulator
from airflow_azureml.example_data import write_heart_csvs
from airflow_azureml.operators import AzureMLCreateBatchDeploymentOperator, AzureMLCreateComputeClusterOperator

SEED = Path(__file__).resolve().parents[2] / "dags" / "azureml"
ENDPOINT, DEPLOYMENT = "heart-classifier-batch", "classifier-sklearn-script"
CODE_TAG = "airflow_azureml.code_sha256"  # the documented tag (docs/operators.md)


@pytest.fixture
def project(emulator: Emulator, azureml_conn: dict[str, Any], tmp_path: Path) -> Path:
    """The example deployment folder (YAML, score/, environment/) copied, so a test can change the script."""
    for name in ("low-pri-cluster.yml", "dedicated-pool.yml"):
        AzureMLCreateComputeClusterOperator(task_id="c", compute=str(SEED / name)).execute({})
    root = tmp_path / "project"
    root.mkdir()
    shutil.copy(SEED / "deployment-custom-script.yml", root / "deployment.yml")
    shutil.copytree(SEED / "score", root / "score", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(SEED / "environment", root / "environment")
    write_heart_csvs(emulator.datastore_path("code-test/in"), files=5, rows_per_file=3, seed=7, id_prefix="c-")
    return root


def deploy(project: Path) -> dict[str, Any]:
    op = AzureMLCreateBatchDeploymentOperator(task_id="deploy", deployment=str(project / "deployment.yml"))
    return op.execute({})


def invoke(emulator: Emulator, folder: str = "code-test/in") -> Any:
    """Invoke the deployment through the SDK and wait for the job's end (its output, or its error)."""
    from azure.ai.ml import Input

    from airflow_azureml.hooks.azure_ml import AzureMLHook

    ml = AzureMLHook().get_conn()
    uri = f"azureml://datastores/workspaceblobstore/paths/{folder}/"
    job = ml.batch_endpoints.invoke(
        endpoint_name=ENDPOINT, deployment_name=DEPLOYMENT, inputs={"heart_dataset": Input(type="uri_folder", path=uri)}
    )
    deadline = time.monotonic() + 120
    while emulator.job(job.name).status not in ("Completed", "Failed", "Canceled"):
        assert time.monotonic() < deadline, f"job {job.name} did not end"
        time.sleep(0.05)
    return emulator.job(job.name)


def predictions(emulator: Emulator, job: Any) -> list[str]:
    path = emulator.workspace.resolve_uri(job.output_uri) / "predictions.csv"
    return path.read_text().splitlines()


def script_rows(script: Path, folder: Path) -> list[str]:
    """What the script itself returns for the folder's files, called directly (init, then one run)."""
    spec = importlib.util.spec_from_file_location(f"score_{hashlib.sha1(bytes(script)).hexdigest()[:8]}", script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model_dir = os.environ.get("AZUREML_MODEL_DIR")
    os.environ["AZUREML_MODEL_DIR"] = str(SEED / "model")  # the registered model's files, as Azure sets it
    try:
        module.init()
    finally:
        if model_dir is None:
            os.environ.pop("AZUREML_MODEL_DIR", None)
        else:
            os.environ["AZUREML_MODEL_DIR"] = model_dir
    return list(module.run(sorted(str(p) for p in folder.glob("*.csv"))))


def code_requests(emulator: Emulator) -> list[dict[str, Any]]:
    return [r for r in emulator.requests() if r.get("plane") == "blob" or "/codes/" in r["path"]]


def deployment(emulator: Emulator) -> dict[str, Any]:
    return emulator.call(lambda: emulator.workspace.deployments[(ENDPOINT, DEPLOYMENT)].body)


def code_version(emulator: Emulator, code_id: str) -> Any:
    return emulator.call(lambda: emulator.workspace.codes.by_id(code_id))


def test_code_is_uploaded_registered_and_its_script_scores(emulator: Emulator, project: Path) -> None:
    assert deploy(project)["changed"] is True
    props = deployment(emulator)["properties"]
    code_id = props["codeConfiguration"]["codeId"]
    assert props["codeConfiguration"]["scoringScript"] == "score.py"
    assert "/environments/CliV2AnonymousEnvironment/versions/" in props["environmentId"]  # the inline environment
    # (a) registered as a code version, uploaded through the SAS the service handed out, confirmed
    code = code_version(emulator, code_id)
    assert code is not None and code.properties["isAnonymous"] is True
    assert code.properties["properties"]["hash_sha256"]
    blob_requests = [r for r in emulator.requests() if r.get("plane") == "blob"]
    # exists?, Put Blob of each file (.amlignore, score.py; the SDK uploads them from a thread pool, in
    # any order), then Set Blob Metadata on the first
    seen = [(r["method"], r["path"].rsplit("/", 1)[-1]) for r in blob_requests]
    assert len(seen) == 4 and seen[0] == ("HEAD", ".amlignore") and seen[-1] == ("PUT", ".amlignore"), seen
    assert sorted(seen[1:-1]) == [("PUT", ".amlignore"), ("PUT", "score.py")], seen
    assert blob_requests[-1]["query"].get("comp") == "metadata"
    assert all(r["query"].get("comp") != "metadata" for r in blob_requests[1:-1])
    assert all("sig" not in r["query"] for r in blob_requests)  # the SAS signature is never logged
    uploaded = emulator.call(lambda: emulator.workspace.codes.folder(code_id))
    assert (
        uploaded is not None and (uploaded / "score.py").read_bytes() == (project / "score" / "score.py").read_bytes()
    )
    container = uploaded.parent.name
    blob = emulator.call(lambda: emulator.workspace.blobs.containers[container].blobs["score/.amlignore"])
    assert blob.metadata.get("upload_status") == "completed"
    # (b) the job runs the uploaded script: its rows are what run() returns, nothing added or lost
    job = invoke(emulator)
    assert job.status == "Completed", job.error
    expected = script_rows(project / "score" / "score.py", emulator.datastore_path("code-test/in"))
    assert len(expected) == 15
    assert predictions(emulator, job) == expected
    assert [line.split(",")[1] for line in predictions(emulator, job)] == [f"c-{i:07d}" for i in range(15)]


def test_unchanged_code_uploads_nothing_and_does_not_rewrite(emulator: Emulator, project: Path) -> None:
    assert deploy(project)["changed"] is True
    first = deployment(emulator)
    assert first["tags"][CODE_TAG]
    before = len(code_requests(emulator))
    puts = sum(1 for r in emulator.requests() if r["method"] == "PUT" and "/deployments/" in r["path"])
    # (c) the same folder: the fingerprint tag matches, no upload, no code request, no deployment PUT
    assert deploy(project)["changed"] is False
    assert len(code_requests(emulator)) == before
    assert sum(1 for r in emulator.requests() if r["method"] == "PUT" and "/deployments/" in r["path"]) == puts
    assert deployment(emulator)["properties"]["codeConfiguration"] == first["properties"]["codeConfiguration"]


def test_a_changed_script_is_a_new_code_version_and_runs(emulator: Emulator, project: Path) -> None:
    script = project / "score" / "score.py"
    original = script.read_text()
    script.write_text(original.replace('f"{name},{row_id},{p:.4f},{int(p >= 0.5)}"', 'f"{name},{row_id},v1"'))
    assert deploy(project)["changed"] is True
    first_id = deployment(emulator)["properties"]["codeConfiguration"]["codeId"]
    job = invoke(emulator)
    assert job.status == "Completed", job.error
    assert predictions(emulator, job)[0] == "part-0000.csv,c-0000000,v1"  # the uploaded script, not a built-in

    script.write_text(original.replace('f"{name},{row_id},{p:.4f},{int(p >= 0.5)}"', 'f"{name},{row_id},v2"'))
    uploads = emulator.call(lambda: len(emulator.workspace.codes.pending_uploads))
    # (d) a new hash: a new code version, uploaded again, and the deployment now names it
    assert deploy(project)["changed"] is True
    second_id = deployment(emulator)["properties"]["codeConfiguration"]["codeId"]
    assert second_id != first_id
    assert emulator.call(lambda: len(emulator.workspace.codes.pending_uploads)) == uploads + 1
    assert code_version(emulator, first_id) is not None  # the old version stays, unchanged (create-only)
    job = invoke(emulator)
    assert job.status == "Completed", job.error
    lines = predictions(emulator, job)
    assert len(lines) == 15 and all(line.endswith(",v2") for line in lines)


def test_a_raising_run_fails_its_mini_batch_and_retries(emulator: Emulator, project: Path) -> None:
    """A run() that raises is a failed mini-batch: retried, then its files count against error_threshold."""
    script = project / "score" / "score.py"
    script.write_text(
        script.read_text()
        + "\n\n_run = run\n\n\ndef run(mini_batch):\n"
        + "    if any('part-0002' in p for p in mini_batch):\n"
        + "        raise ValueError('cannot score part-0002')\n"
        + "    return _run(mini_batch)\n"
    )
    assert deploy(project)["changed"] is True
    job = invoke(emulator)
    # error_threshold -1 (Azure's default): the job completes without the failed mini-batch's rows
    assert job.status == "Completed", job.error
    ids = {line.split(",")[1] for line in predictions(emulator, job)}
    assert ids == {f"c-{i:07d}" for i in range(15)} - {f"c-{i:07d}" for i in range(6, 12)}  # part-0002 and -0003
    assert job.mini_batch_attempts == 2 + 4  # two good mini-batches, the bad one 1 + max_retries (3) times
    logs = (emulator.data_dir / "job-runs" / job.name / "user_logs" / "std_log.txt").read_text()
    assert "ValueError: cannot score part-0002" in logs


def test_a_raising_init_fails_the_job_with_its_error(emulator: Emulator, project: Path) -> None:
    script = project / "score" / "score.py"
    script.write_text(script.read_text() + "\n\ndef init():\n    raise RuntimeError('no model here')\n")
    assert deploy(project)["changed"] is True
    job = invoke(emulator)
    assert job.status == "Failed"
    assert "RuntimeError: no model here" in job.error["message"]
    assert "exited with status code 42" in job.error["message"]  # Azure's wording of a failed runner


def test_the_script_sees_the_model_dir_and_no_secrets_of_the_emulator(
    emulator: Emulator, project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``AZUREML_MODEL_DIR`` is the registered model's folder; the emulator's own environment is not passed on."""
    monkeypatch.setenv("AZUREML_TEST_SECRET", "s3cr3t")
    script = project / "score" / "score.py"
    script.write_text(
        script.read_text()
        + "\n\ndef run(mini_batch):\n"
        + "    return [os.environ.get('AZUREML_MODEL_DIR', '-'), os.environ.get('AZUREML_TEST_SECRET', '-'),"
        + " ','.join(features)]\n"
    )
    model_dir = emulator.datastore_path("models/heart-classifier-mlflow/1")  # where the model is registered from
    assert deploy(project)["changed"] is True
    job = invoke(emulator)
    assert job.status == "Completed", job.error
    first = predictions(emulator, job)[:3]
    assert first[:2] == [str(model_dir.resolve()), "-"]
    assert first[2].split(",")[:2] == ["age", "sex"]  # init() loaded the registered model's signature


def test_the_sas_is_checked(emulator: Emulator, project: Path) -> None:
    """Storage answers as Azure does: no signature, or another container's, is refused."""
    from azure.core.exceptions import HttpResponseError
    from azure.storage.blob import ContainerClient

    assert deploy(project)["changed"] is True
    upload = emulator.call(lambda: emulator.workspace.codes.pending_uploads[-1])
    store = emulator.workspace.blobs
    container = emulator.call(lambda: store.containers[upload["container"]])
    good = ContainerClient.from_container_url(store.sas_url(container))
    assert (
        good.get_blob_client("score/score.py").download_blob().readall()
        == (project / "score" / "score.py").read_bytes()
    )
    anonymous = ContainerClient.from_container_url(store.container_url(container))
    with pytest.raises(HttpResponseError) as refused:
        anonymous.upload_blob("score/evil.py", b"print('x')")
    assert refused.value.status_code == 409 and refused.value.error_code == "PublicAccessNotPermitted"
    other = emulator.call(lambda: store.create_container())  # its SAS, signed for its own path
    forged = f"{store.container_url(container)}?{store.sas_url(other).split('?', 1)[1]}"
    with pytest.raises(HttpResponseError) as forbidden:
        ContainerClient.from_container_url(forged).upload_blob("score/evil.py", b"print('x')")
    assert forbidden.value.status_code == 403 and forbidden.value.error_code == "AuthenticationFailed"
    assert "score/evil.py" not in emulator.call(lambda: store.blob_names(container.name))


def test_a_code_version_cannot_point_elsewhere(
    emulator: Emulator, azureml_conn: dict[str, Any], tmp_path: Path
) -> None:
    """Code versions are create-only: the same content again reuses the version; other content under it is refused."""
    from azure.ai.ml.entities._assets import Code  # not exported, but what code_ops.create_or_update takes
    from azure.core.exceptions import HttpResponseError

    from airflow_azureml.hooks.azure_ml import AzureMLHook

    code_ops = AzureMLHook().get_conn()._code  # the SDK's CodeOperations: what a deployment's upload goes through
    folder = tmp_path / "code"
    folder.mkdir()
    (folder / "score.py").write_text("def run(mini_batch):\n    return []\n")
    first = code_ops.create_or_update(Code(name="scorer", version="1", path=str(folder)))
    uploads = emulator.call(lambda: len(emulator.workspace.codes.pending_uploads))
    again = code_ops.create_or_update(Code(name="scorer", version="1", path=str(folder)))
    assert (again.name, again.version, again.path) == (first.name, first.version, first.path)
    assert emulator.call(lambda: len(emulator.workspace.codes.pending_uploads)) == uploads  # found by hash
    (folder / "score.py").write_text("def run(mini_batch):\n    return ['changed']\n")
    # the service's words; azure-ai-ml would turn them into AssetPathException, but compares them with the whole
    # str() of the error, which azure-core ends with "Code: ... Message: ...", so the HttpResponseError comes through
    with pytest.raises(HttpResponseError, match=r"\(UserError\) Asset paths cannot be updated\."):
        code_ops.create_or_update(Code(name="scorer", version="1", path=str(folder)))
    assert code_ops.get("scorer", "1").path == first.path


def test_what_run_returns_is_written_as_is_and_a_non_list_fails_the_mini_batch(
    emulator: Emulator, project: Path
) -> None:
    """Elements of the list are written one per line (``str()`` of a non-string); ``None`` is a failed mini-batch."""
    script = project / "score" / "score.py"
    script.write_text(
        script.read_text()
        + "\n\ndef run(mini_batch):\n"
        + "    if any('part-0004' in p for p in mini_batch):\n"
        + "        return None\n"
        + "    return [(Path(p).name, 1) for p in mini_batch]\n"
    )
    assert deploy(project)["changed"] is True
    job = invoke(emulator)
    assert job.status == "Completed", job.error
    assert predictions(emulator, job) == [f"('part-000{i}.csv', 1)" for i in range(4)]
    logs = (emulator.data_dir / "job-runs" / job.name / "user_logs" / "std_log.txt").read_text()
    assert "run() returned NoneType; it must return a list or a pandas DataFrame" in logs


def test_a_large_file_goes_up_in_blocks(emulator: Emulator, azureml_conn: dict[str, Any]) -> None:
    """Above the client's single-put size azure-storage-blob sends Put Block + Put Block List (as for big code)."""
    from azure.storage.blob import ContainerClient

    store = emulator.workspace.blobs
    container = emulator.call(lambda: store.create_container())
    client = ContainerClient.from_container_url(
        store.sas_url(container), max_single_put_size=64 * 1024, max_block_size=64 * 1024
    )
    data = bytes(range(256)) * 1024  # 256 KiB: four blocks
    client.upload_blob("code/model.bin", data, validate_content=True)
    sent = [r for r in emulator.requests() if r.get("plane") == "blob" and r["path"].endswith("/code/model.bin")]
    assert [r["query"].get("comp") for r in sent] == ["block"] * 4 + ["blocklist"]
    assert all(r["status"] == 201 for r in sent)
    assert client.download_blob("code/model.bin").readall() == data
    assert client.get_blob_client("code/model.bin").get_blob_properties().size == len(data)


@pytest.mark.parametrize("script", ["absolute", "../outside.py"])
def test_a_scoring_script_outside_the_code_is_refused(emulator: Emulator, project: Path, script: str) -> None:
    """Azure finds the script inside the uploaded snapshot only; the emulator refuses one outside it."""
    from azure.ai.ml.entities import CodeConfiguration
    from azure.core.exceptions import HttpResponseError

    from airflow_azureml.hooks.azure_ml import AzureMLHook
    from airflow_azureml.specs import DeploymentSpec

    deploy(project)  # the endpoint and a good deployment exist
    (project / "outside.py").write_text("def init():\n    pass\n\n\ndef run(batch):\n    return batch\n")
    script = str(project / "outside.py") if script == "absolute" else script  # the SDK reads it locally first
    spec = DeploymentSpec.from_yaml(project / "deployment.yml")
    entity = spec.to_entity()
    entity.code_configuration = CodeConfiguration(code=str(project / "score"), scoring_script=script)
    entity.environment = "azureml:" + deployment(emulator)["properties"]["environmentId"].split("/environments/")[1]
    entity.environment = entity.environment.replace("/versions/", ":")
    ml = AzureMLHook().get_conn()
    with pytest.raises(HttpResponseError, match="must be a path inside the code"):
        ml.batch_deployments.begin_create_or_update(entity).result()
    assert deployment(emulator)["properties"]["codeConfiguration"]["scoringScript"] == "score.py"  # unchanged
