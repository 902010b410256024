"""Idempotent resources see every real change, and every long-running write has a bounded wait.

Real ``MLClient`` and azure-identity credentials over HTTPS against the emulator (issue 9, §6 and §1).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_azureml.emulator import Emulator, Timing
from airflow_azureml.exceptions import AzureMLConfigError, AzureMLError
from airflow_azureml.operators import (
    AzureMLCreateBatchDeploymentOperator,
    AzureMLCreateComputeClusterOperator,
    AzureMLDeleteComputeOperator,
)
from tests.conftest import FAST

SEED = Path(__file__).resolve().parents[2] / "dags" / "azureml"
ENDPOINT, DEPLOYMENT = "heart-classifier-batch", "classifier-mlflow"


def writes(emulator: Emulator, contains: str) -> int:
    return sum(1 for r in emulator.requests() if r["method"] in ("PUT", "PATCH") and contains in r["path"])


def deployment_body(emulator: Emulator) -> dict[str, Any]:
    return emulator.call(lambda: emulator.workspace.deployments[(ENDPOINT, DEPLOYMENT)].body["properties"])


def deploy(**kwargs: Any) -> dict[str, Any]:
    # the emulator's demo model, whose versions a test registers (the example's own is pinned to version 1)
    kwargs.setdefault("model", "azureml:heart-classifier@latest")
    op = AzureMLCreateBatchDeploymentOperator(
        task_id="deploy", deployment=str(SEED / "deployment.yml"), set_default=False, **kwargs
    )
    return op.execute({})


@pytest.fixture
def deployed(emulator: Emulator, azureml_conn: dict[str, Any]) -> Emulator:
    for path in ("low-pri-cluster.yml", "dedicated-pool.yml"):
        AzureMLCreateComputeClusterOperator(task_id="c", compute=str(SEED / path)).execute({})
    assert deploy()["changed"] is True
    assert deployment_body(emulator)["model"]["assetId"].endswith("/models/heart-classifier/versions/1")
    return emulator


def test_unchanged_deployment_is_not_written(deployed: Emulator) -> None:
    before = writes(deployed, "/deployments/")
    assert deploy()["changed"] is False
    assert writes(deployed, "/deployments/") == before


def test_pinned_model_version_bump_updates_the_deployment(deployed: Emulator) -> None:
    deployed.call(lambda: deployed.workspace.register_model("heart-classifier", "2"))
    before = writes(deployed, "/deployments/")
    assert deploy(model="azureml:heart-classifier:2")["changed"] is True
    assert writes(deployed, "/deployments/") == before + 1
    assert deployment_body(deployed)["model"]["assetId"].endswith("/models/heart-classifier/versions/2")
    assert deploy(model="azureml:heart-classifier:2")["changed"] is False  # and then it is settled


def test_new_latest_model_version_updates_an_at_latest_deployment(deployed: Emulator) -> None:
    deployed.call(lambda: deployed.workspace.register_model("heart-classifier", "2"))
    assert deploy()["changed"] is True  # the YAML says @latest, and latest is now 2
    assert deployment_body(deployed)["model"]["assetId"].endswith("/versions/2")
    assert deploy()["changed"] is False


@pytest.mark.parametrize(
    ("change", "field", "value"),
    [
        ({"error_threshold": 5}, "errorThreshold", 5),
        ({"max_retries": 1}, "retrySettings", {"maxRetries": 1, "timeout": "PT5M"}),
        ({"output_file_name": "scores.csv"}, "outputFileName", "scores.csv"),
        ({"compute": "azureml:dedicated-pool"}, "compute", "dedicated-pool"),
        ({"instance_count": 1}, "resources", {"instanceCount": 1}),
    ],
)
def test_each_real_change_updates_the_deployment(deployed: Emulator, change: dict, field: str, value: Any) -> None:
    before = writes(deployed, "/deployments/")
    assert deploy(**change)["changed"] is True
    assert writes(deployed, "/deployments/") == before + 1
    got = deployment_body(deployed)[field]
    if isinstance(value, dict):
        assert {k: got.get(k) for k in value} == value
    elif field == "compute":
        assert got.endswith(f"/computes/{value}")
    else:
        assert got == value
    assert deploy(**change)["changed"] is False


def logged(capfd: pytest.CaptureFixture[str]) -> str:
    """What the operator logged (Airflow's task logger writes to the process's stdout/stderr here)."""
    out, err = capfd.readouterr()
    return out + err


def test_unchanged_at_latest_model_is_not_a_change(deployed: Emulator, capfd: pytest.CaptureFixture[str]) -> None:
    """``@latest`` resolves to today's latest version; while that is the deployed one, nothing is written."""
    deployed.call(lambda: deployed.workspace.register_model("other-model", "7"))  # another model's versions: no change
    before = writes(deployed, "/deployments/")
    logged(capfd)
    assert deploy()["changed"] is False
    assert writes(deployed, "/deployments/") == before
    assert "already has the wanted settings" in logged(capfd)


# ------------------------------------------- inline environment and local code compare by content (issue 9, §6)
CONDA = "name: scoring\ndependencies:\n  - python=3.10\n  - pip:\n    - xgboost==2.0.3\n"


ENVIRONMENT_TAG = "airflow_azureml.environment_sha256"  # the documented tag name (docs/operators.md)


def inline_project(root: Path) -> Path:
    """The seed deployment with an inline environment: an image and a conda file beside the YAML.

    The seed's code folder is left out here (tests/integration/test_code_deployment.py covers local code).
    """
    import yaml

    root.mkdir(parents=True, exist_ok=True)
    (root / "conda.yml").write_text(CONDA)
    seed = yaml.safe_load((SEED / "deployment.yml").read_text())
    seed.pop("code_configuration", None)
    seed["environment"] = {
        "image": "mcr.microsoft.com/azureml/openmpi4.1.0-ubuntu20.04:latest",
        "conda_file": "conda.yml",
    }
    (root / "deployment.yml").write_text(yaml.safe_dump(seed, sort_keys=False))
    return root / "deployment.yml"


def deploy_yaml(path: Path) -> dict[str, Any]:
    return AzureMLCreateBatchDeploymentOperator(task_id="deploy", deployment=str(path), set_default=False).execute({})


def test_unchanged_inline_environment_is_not_rewritten(
    deployed: Emulator, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    path = inline_project(tmp_path / "project")
    monkeypatch.chdir(tmp_path)  # relative paths resolve against the YAML's folder, not the worker's cwd
    assert deploy_yaml(path)["changed"] is True
    first = emulator_deployment(deployed)
    assert first["tags"][ENVIRONMENT_TAG]
    assert "/environments/" in first["properties"]["environmentId"]
    before = writes(deployed, "/deployments/")
    logged(capfd)
    assert deploy_yaml(path)["changed"] is False
    assert "already has the wanted settings" in logged(capfd)
    assert writes(deployed, "/deployments/") == before  # no PUT at all

    (tmp_path / "project" / "conda.yml").write_text(CONDA.replace("2.0.3", "2.1.0"))
    assert deploy_yaml(path)["changed"] is True
    assert writes(deployed, "/deployments/") == before + 1
    second = emulator_deployment(deployed)
    assert second["tags"][ENVIRONMENT_TAG] != first["tags"][ENVIRONMENT_TAG]
    assert second["properties"]["environmentId"] != first["properties"]["environmentId"]  # a new environment
    assert deploy_yaml(path)["changed"] is False


def test_deployment_written_by_someone_else_without_our_tag_is_updated(deployed: Emulator, tmp_path: Path) -> None:
    """No fingerprint tag: we cannot tell what its environment holds, so we write (never miss a change)."""
    path = inline_project(tmp_path / "project")
    assert deploy_yaml(path)["changed"] is True

    def drop_tags() -> None:
        deployed.workspace.deployments[(ENDPOINT, DEPLOYMENT)].body["tags"] = {}

    deployed.call(drop_tags)
    before = writes(deployed, "/deployments/")
    assert deploy_yaml(path)["changed"] is True
    assert writes(deployed, "/deployments/") == before + 1


def test_an_environment_version_cannot_be_redefined(emulator: Emulator, azureml_conn: Any, tmp_path: Path) -> None:
    """Azure's environment versions are create-only (image, conda file...): the same one again is fine, another not."""
    from azure.ai.ml.entities import Environment
    from azure.core.exceptions import ResourceExistsError

    from airflow_azureml.hooks.azure_ml import AzureMLHook

    ml = AzureMLHook().get_conn()
    image = "mcr.microsoft.com/azureml/openmpi4.1.0-ubuntu20.04:latest"
    (tmp_path / "conda.yml").write_text(CONDA)
    env = ml.environments.create_or_update(
        Environment(name="scoring-env", version="1", image=image, conda_file=str(tmp_path / "conda.yml"))
    )
    assert (env.name, env.version, env.image) == ("scoring-env", "1", image)
    again = ml.environments.create_or_update(
        Environment(name="scoring-env", version="1", image=image, conda_file=str(tmp_path / "conda.yml"))
    )
    assert again.conda_file == env.conda_file
    (tmp_path / "conda.yml").write_text(CONDA.replace("2.0.3", "2.1.0"))
    with pytest.raises(ResourceExistsError, match="cannot be changed"):
        ml.environments.create_or_update(
            Environment(name="scoring-env", version="1", image=image, conda_file=str(tmp_path / "conda.yml"))
        )
    assert ml.environments.get("scoring-env", version="1").conda_file == env.conda_file


def emulator_deployment(emulator: Emulator) -> dict[str, Any]:
    return emulator.call(lambda: dict(emulator.workspace.deployments[(ENDPOINT, DEPLOYMENT)].body))


def test_unknown_key_in_deployment_yaml_fails_before_any_request(deployed: Emulator, tmp_path: Path) -> None:
    path = tmp_path / "deployment.yml"
    path.write_text((SEED / "deployment.yml").read_text().replace("mini_batch_size", "mini_bach_size"))
    seen = len(deployed.requests())
    with pytest.raises(AzureMLConfigError, match=r"'settings.mini_bach_size'.*did you mean 'mini_batch_size'"):
        AzureMLCreateBatchDeploymentOperator(task_id="d", deployment=str(path)).execute({})
    assert len(deployed.requests()) == seen


def test_unknown_key_in_cluster_yaml_fails_before_any_request(emulator: Emulator, azureml_conn: Any, tmp_path: Path):
    path = tmp_path / "cluster.yml"
    path.write_text((SEED / "low-pri-cluster.yml").read_text().replace("tier:", "teir:"))
    seen = len(emulator.requests())
    with pytest.raises(AzureMLConfigError, match=r"cluster.yml.*'teir'.*did you mean 'tier'"):
        AzureMLCreateComputeClusterOperator(task_id="c", compute=str(path)).execute({})
    assert len(emulator.requests()) == seen


# ----------------------------------------------------------------------------- bounded LRO waits
@pytest.fixture
def slow_lro(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Emulator]:
    """An emulator whose long-running operations answer ``Retry-After: 86400``."""
    from tests.helpers import register_example_model

    with Emulator(tmp_path / "slow", timing=FAST, lro_retry_after="86400") as emu:
        register_example_model(emu)
        monkeypatch.setenv("AIRFLOW_CONN_AZURE_ML_DEFAULT", emu.connection_info()["airflow_conn_json"])
        yield emu


@pytest.mark.timeout(90)
def test_retry_after_a_day_does_not_hold_creates_updates_or_deletes(slow_lro: Emulator) -> None:
    polling = {"interval": 0.2, "max_interval": 1.0}
    cluster = AzureMLCreateComputeClusterOperator(
        task_id="c", compute=str(SEED / "low-pri-cluster.yml"), polling=polling
    )
    assert cluster.execute({})["provisioning_state"] == "Succeeded"
    op = AzureMLCreateBatchDeploymentOperator(task_id="d", deployment=str(SEED / "deployment.yml"), polling=polling)
    assert op.execute({})["changed"] is True
    assert AzureMLDeleteComputeOperator(task_id="x", name="low-pri-cluster", polling=polling).execute({}) is True
    assert slow_lro.call(lambda: "low-pri-cluster" not in slow_lro.workspace.computes)


@pytest.mark.timeout(90)
def test_create_that_never_finishes_times_out_with_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    never = Timing(provisioning=3600, node_startup=0.05, mini_batch=0.03, command_job=0.2, tick=0.01)
    with Emulator(tmp_path / "never", timing=never) as emu:
        monkeypatch.setenv("AIRFLOW_CONN_AZURE_ML_DEFAULT", emu.connection_info()["airflow_conn_json"])
        op = AzureMLCreateComputeClusterOperator(
            task_id="c", compute=str(SEED / "low-pri-cluster.yml"), wait_timeout=1.0, polling={"interval": 0.2}
        )
        with pytest.raises(AzureMLError, match="did not finish within"):
            op.execute({})


def test_instance_type_on_an_amlcompute_command_job_fails_before_any_job(deployed: Emulator) -> None:
    from airflow_azureml.operators import AzureMLSubmitCommandJobOperator

    op = AzureMLSubmitCommandJobOperator(
        task_id="train",
        command="python train.py",
        environment="azureml:sklearn-env:1",
        compute="azureml:low-pri-cluster",
        instance_type="cpularge",
    )
    with pytest.raises(AzureMLConfigError, match="instance_type applies to Kubernetes compute only"):
        op.execute({})
    assert deployed.jobs() == []
