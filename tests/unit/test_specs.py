"""Bad input fails before any API call, with a message that names the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from airflow_azureml.exceptions import AzureMLConfigError
from airflow_azureml.specs import ClusterSpec, DeploymentSpec, check_data_uri

REPO = Path(__file__).resolve().parents[2]
SEED = REPO / "dags" / "azureml"


def test_seed_cluster_yaml_as_written() -> None:
    spec = ClusterSpec.from_yaml(SEED / "low-pri-cluster.yml")
    assert (spec.name, spec.tier, spec.min_instances, spec.max_instances, spec.idle_time_before_scale_down) == (
        "low-pri-cluster",
        "low_priority",
        0,
        2,
        120,
    )


def test_seed_deployment_yaml_as_written() -> None:
    spec = DeploymentSpec.from_yaml(SEED / "deployment-custom-script.yml")
    assert spec.endpoint_name == "heart-classifier-batch" and spec.name == "classifier-sklearn-script"
    assert spec.compute == "azureml:low-pri-cluster" and spec.model == "azureml:heart-classifier-mlflow:1"
    assert (spec.instance_count, spec.max_concurrency_per_instance, spec.mini_batch_size) == (2, 2, 2)
    assert (spec.output_action, spec.output_file_name, spec.max_retries, spec.retry_timeout) == (
        "append_row",
        "predictions.csv",
        3,
        300,
    )


def test_kwargs_override_yaml() -> None:
    assert ClusterSpec.from_any(str(SEED / "low-pri-cluster.yml"), max_instances=5).max_instances == 5


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": "1bad"}, "Invalid compute name"),
        ({"name": "a" * 17}, "Invalid compute name"),
        ({"name": "ends-"}, "Invalid compute name"),
        ({"name": "ok-name", "min_instances": 3, "max_instances": 2}, "min_instances .3. must be <= max_instances"),
        ({"name": "ok-name", "tier": "spot"}, "Unknown tier"),
        ({"name": "ok-name", "idle_time_before_scale_down": -1}, "idle_time_before_scale_down must be >= 0"),
        ({"name": "ok-name", "max_instances": 0}, "max_instances must be >= 1"),
        ({"name": "ok-name", "size": ""}, "size must be a VM size"),
        ({"name": "ok-name", "min_instances": "two"}, "min_instances must be an integer"),
    ],
)
def test_cluster_validation(kwargs: dict, message: str) -> None:
    with pytest.raises(AzureMLConfigError, match=message):
        ClusterSpec(**kwargs)


GOOD_DEPLOYMENT = {"endpoint_name": "heart-ep", "name": "dep-1", "model": "azureml:m@latest", "compute": "azureml:cl"}


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"endpoint_name": "x"}, "Invalid batch endpoint name"),
        ({"name": "-x-"}, "Invalid deployment name"),
        ({"model": ""}, "model must name"),
        ({"compute": ""}, "compute must name"),
        ({"mini_batch_size": 0}, "mini_batch_size must be >= 1"),
        ({"output_action": "write_all"}, "Unknown output_action"),
        ({"output_file_name": "dir/p.csv"}, "output_file_name must be a plain file name"),
        ({"max_retries": -1}, "max_retries must be >= 0"),
    ],
)
def test_deployment_validation(override: dict, message: str) -> None:
    with pytest.raises(AzureMLConfigError, match=message):
        DeploymentSpec(**{**GOOD_DEPLOYMENT, **override})


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("name: [unclosed", "is not valid YAML"),
        ("- a\n- b\n", "must contain a mapping"),
        ("name: x\ntype: kubernetes\n", "expected amlcompute"),
    ],
)
def test_malformed_yaml(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "c.yml"
    path.write_text(content)
    with pytest.raises(AzureMLConfigError, match=message):
        ClusterSpec.from_yaml(path)


def test_missing_yaml_file() -> None:
    with pytest.raises(AzureMLConfigError, match="does not exist"):
        ClusterSpec.from_any("/nonexistent/cluster.yml")


@pytest.mark.parametrize(
    ("uri", "message"),
    [("", "non-empty"), ("/local/path", "is not a data URI"), ("azureml://x/{{ ds }}/", "unrendered template")],
)
def test_bad_data_uris(uri: str, message: str) -> None:
    with pytest.raises(AzureMLConfigError, match=message):
        check_data_uri("input", uri)


def test_entity_forms_become_the_same_specs_as_yaml() -> None:
    from dataclasses import replace

    from azure.ai.ml import load_compute
    from azure.ai.ml.entities import (
        AmlCompute,
        BatchRetrySettings,
        ModelBatchDeployment,
        ModelBatchDeploymentSettings,
        ResourceConfiguration,
    )

    from_yaml = replace(ClusterSpec.from_yaml(SEED / "low-pri-cluster.yml"), yaml_path=None)
    entity = AmlCompute(
        name="low-pri-cluster",
        size="STANDARD_DS3_v2",
        tier="low_priority",
        min_instances=0,
        max_instances=2,
        idle_time_before_scale_down=120,
    )
    assert ClusterSpec.from_any(entity) == from_yaml
    assert ClusterSpec.from_any(load_compute(source=str(SEED / "low-pri-cluster.yml"))) == from_yaml
    assert from_yaml.differences(entity) == {}
    assert from_yaml.differences(
        AmlCompute(
            name="low-pri-cluster",
            size="STANDARD_DS3_v2",
            tier="low_priority",
            min_instances=0,
            max_instances=4,
            idle_time_before_scale_down=120,
        )
    ) == {"max_instances": (4, 2)}

    deployment = ModelBatchDeployment(
        name="classifier-sklearn-script",
        endpoint_name="heart-classifier-batch",
        model="azureml:heart-classifier-mlflow@latest",
        compute="azureml:low-pri-cluster",
        resources=ResourceConfiguration(instance_count=2),
        settings=ModelBatchDeploymentSettings(
            max_concurrency_per_instance=2,
            mini_batch_size=2,
            output_action="append_row",
            output_file_name="predictions.csv",
            retry_settings=BatchRetrySettings(max_retries=3, timeout=300),
        ),
    )
    spec = DeploymentSpec.from_any(deployment)
    yaml_spec = DeploymentSpec.from_yaml(SEED / "deployment-custom-script.yml")
    for field in (
        "endpoint_name",
        "name",
        "compute",
        "instance_count",
        "max_concurrency_per_instance",
        "mini_batch_size",
        "output_action",
        "output_file_name",
        "max_retries",
        "retry_timeout",
    ):
        assert getattr(spec, field) == getattr(yaml_spec, field), field


# ---------------------------------------------------------------- unknown keys are errors (issue 9, §6)
@pytest.mark.parametrize(
    ("typo", "nearest"),
    [("teir", "tier"), ("max_instance", "max_instances"), ("min_instance", "min_instances")],
)
def test_unknown_cluster_yaml_key_names_file_key_and_nearest(tmp_path: Path, typo: str, nearest: str) -> None:
    path = tmp_path / "cluster.yml"
    path.write_text(f"name: low-pri-cluster\ntype: amlcompute\n{typo}: 2\n")
    with pytest.raises(AzureMLConfigError) as err:
        ClusterSpec.from_yaml(path)
    text = str(err.value)
    assert str(path) in text and repr(typo) in text and f"did you mean {nearest!r}" in text


def test_cluster_yaml_with_teir_and_max_instance_is_not_a_one_node_dedicated_cluster(tmp_path: Path) -> None:
    path = tmp_path / "cluster.yml"
    path.write_text("name: low-pri-cluster\ntype: amlcompute\nteir: low_priority\nmax_instance: 4\n")
    with pytest.raises(AzureMLConfigError, match="teir"):
        ClusterSpec.from_any(str(path))


@pytest.mark.parametrize(
    ("yaml_text", "key", "nearest"),
    [
        ("resources:\n  instance_cout: 2\n", "resources.instance_cout", "instance_count"),
        ("settings:\n  mini_bach_size: 2\n", "settings.mini_bach_size", "mini_batch_size"),
        ("settings:\n  retry_settings:\n    max_retry: 2\n", "settings.retry_settings.max_retry", "max_retries"),
        ("modle: azureml:m@latest\n", "modle", "model"),
    ],
)
def test_unknown_deployment_yaml_key(tmp_path: Path, yaml_text: str, key: str, nearest: str) -> None:
    path = tmp_path / "deployment.yml"
    path.write_text((SEED / "deployment-custom-script.yml").read_text() + yaml_text)
    with pytest.raises(AzureMLConfigError) as err:
        DeploymentSpec.from_yaml(path)
    text = str(err.value)
    assert str(path) in text and repr(key) in text and f"did you mean {nearest!r}" in text


def test_unknown_keyword_argument_is_a_config_error() -> None:
    with pytest.raises(AzureMLConfigError, match=r"'teir'.*did you mean 'tier'"):
        ClusterSpec.from_any(name="low-pri-cluster", teir="low_priority")
    with pytest.raises(AzureMLConfigError, match=r"'mini_bach_size'.*did you mean 'mini_batch_size'"):
        DeploymentSpec.from_any(**GOOD_DEPLOYMENT, mini_bach_size=2)


# ---------------------------------------------------------------- validation holes (issue 9, §6; issue 10, §4)
@pytest.mark.parametrize("label", ["mini_batch_size", "instance_count", "max_retries", "error_threshold"])
def test_booleans_are_not_integers(label: str) -> None:
    with pytest.raises(AzureMLConfigError, match=f"{label} must be an integer"):
        DeploymentSpec(**{**GOOD_DEPLOYMENT, label: True})


@pytest.mark.parametrize("value", [True, False, 1.5, "2", 0])
def test_check_positive_int(value: object) -> None:
    from airflow_azureml.specs import check_positive_int

    with pytest.raises(AzureMLConfigError, match="mini_batch_size must be a positive integer"):
        check_positive_int("mini_batch_size", value)
    assert check_positive_int("mini_batch_size", 3) == 3


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", float("nan"), float("inf"), 0, -5, True, "soon"])
def test_max_queue_time_must_be_finite_and_positive(value: object) -> None:
    from airflow_azureml.specs import check_seconds

    with pytest.raises(AzureMLConfigError, match="max_queue_time must be"):
        check_seconds("max_queue_time", value)
    assert check_seconds("max_queue_time", "3600") == 3600.0


@pytest.mark.parametrize(
    "name", ["../../../../x", "..", ".", "dir/p.csv", "dir\\p.csv", "", "p\x00.csv", "a" * 256, "p?.csv", " "]
)
def test_output_file_name_must_be_a_plain_file_name(name: str) -> None:
    from airflow_azureml.specs import check_output_file_name

    with pytest.raises(AzureMLConfigError, match="output_file_name"):
        check_output_file_name(name)
    with pytest.raises(AzureMLConfigError, match="output_file_name"):
        DeploymentSpec(**{**GOOD_DEPLOYMENT, "output_file_name": name})
    assert check_output_file_name("predictions-2026.csv") == "predictions-2026.csv"


def test_instance_type_on_amlcompute_command_job_is_an_error() -> None:
    from airflow_azureml.specs import check_instance_type_target

    with pytest.raises(AzureMLConfigError, match="instance_type applies to Kubernetes compute only"):
        check_instance_type_target("azureml:cpu-cluster", "cpularge", kubernetes=False)
    check_instance_type_target("azureml:cpu-cluster", None, kubernetes=False)
    check_instance_type_target("azureml:k8s-compute", "cpularge", kubernetes=True)


# ---------------------------------------------------------------- every real change updates (issue 9, §6)
def _read_back(**override: object) -> object:
    """A ``BatchDeployment`` as ``ml.batch_deployments.get`` returns the seed deployment (ARM ids, flat settings).

    The seed ships its scoring script and environment: the service returns them as an uploaded code version and
    an anonymous environment, with the fingerprint tags the operator wrote.
    """
    from azure.ai.ml.entities import BatchDeployment, BatchRetrySettings, CodeConfiguration, ResourceConfiguration

    ws = "/subscriptions/s/resourceGroups/rg/providers/Microsoft.MachineLearningServices/workspaces/ws"
    values: dict = {
        "environment": f"{ws}/environments/CliV2AnonymousEnvironment/versions/1",
        "code_configuration": CodeConfiguration(code=f"{ws}/codes/c0de/versions/1", scoring_script="score.py"),
        "tags": dict(DeploymentSpec.from_yaml(SEED / "deployment-custom-script.yml").fingerprints),
        "name": "classifier-sklearn-script",
        "endpoint_name": "heart-classifier-batch",
        "model": f"{ws}/models/heart-classifier-mlflow/versions/1",
        "compute": f"{ws}/computes/low-pri-cluster",
        "resources": ResourceConfiguration(instance_count=2),
        "max_concurrency_per_instance": 2,
        "mini_batch_size": 2,
        "output_action": "append_row",
        "output_file_name": "predictions.csv",
        "retry_settings": BatchRetrySettings(max_retries=3, timeout=300),
        "error_threshold": None,
    }
    values.update(override)
    return BatchDeployment(**values)


def test_unchanged_deployment_has_no_differences() -> None:
    spec = DeploymentSpec.from_yaml(SEED / "deployment-custom-script.yml")
    assert spec.differences(_read_back(), latest_model_version="1") == {}
    pinned = DeploymentSpec(**{**GOOD_DEPLOYMENT, "model": "azureml:heart-classifier-mlflow:1"})
    assert "model" not in pinned.differences(_read_back())


def test_model_version_bump_is_a_difference() -> None:
    spec = DeploymentSpec.from_any(
        str(SEED / "deployment-custom-script.yml"), model="azureml:heart-classifier-mlflow:2"
    )
    assert spec.differences(_read_back()) == {"model": ("heart-classifier-mlflow:1", "heart-classifier-mlflow:2")}
    latest = DeploymentSpec.from_any(
        str(SEED / "deployment-custom-script.yml"), model="azureml:heart-classifier-mlflow@latest"
    )
    assert latest.differences(_read_back(), latest_model_version="2") == {
        "model": ("heart-classifier-mlflow:1", "heart-classifier-mlflow:2")
    }


@pytest.mark.parametrize(
    ("override", "read_back", "key"),
    [
        ({"error_threshold": 5}, {}, "error_threshold"),
        ({}, {"error_threshold": 10}, "error_threshold"),
        ({"max_retries": 1}, {}, "max_retries"),
        ({"retry_timeout": 60}, {}, "retry_timeout"),
        ({"output_file_name": "scores.csv"}, {}, "output_file_name"),
        ({"output_action": "summary_only"}, {}, "output_action"),
        ({"compute": "azureml:dedicated-pool"}, {}, "compute"),
        ({"instance_count": 3}, {}, "instance_count"),
        ({"instance_type": "cpularge"}, {}, "instance_type"),
        ({"environment": "azureml:sklearn-env:2"}, {}, "environment"),
    ],
)
def test_each_real_change_is_a_difference(override: dict, read_back: dict, key: str) -> None:
    spec = DeploymentSpec.from_any(
        str(SEED / "deployment-custom-script.yml"), model="azureml:heart-classifier-mlflow:1", **override
    )
    assert list(spec.differences(_read_back(**read_back))) == [key]


def test_environment_and_code_configuration_are_compared() -> None:
    from azure.ai.ml.entities import CodeConfiguration

    ws = "/subscriptions/s/resourceGroups/rg/providers/Microsoft.MachineLearningServices/workspaces/ws"
    have = _read_back(
        environment=f"{ws}/environments/sklearn-env/versions/1",
        code_configuration=CodeConfiguration(code=f"{ws}/codes/abc/versions/1", scoring_script="score.py"),
        tags=None,  # registered code and environment: written without fingerprints
    )
    base = {"model": "azureml:heart-classifier-mlflow:1", "environment": "azureml:sklearn-env:1"}
    same = DeploymentSpec.from_any(
        str(SEED / "deployment-custom-script.yml"),
        **base,
        code_configuration=CodeConfiguration(code="azureml:abc:1", scoring_script="score.py"),
    )
    assert same.differences(have) == {}
    other_script = replace_code(same, CodeConfiguration(code="azureml:abc:1", scoring_script="batch_driver.py"))
    assert list(other_script.differences(have)) == ["code_configuration"]
    assert list(DeploymentSpec.from_any(str(SEED / "deployment-custom-script.yml"), **base).differences(have)) == [
        "code_configuration"
    ]


def replace_code(spec: DeploymentSpec, code: object) -> DeploymentSpec:
    from dataclasses import replace

    return replace(spec, code_configuration=code)


def test_description_alone_is_not_a_difference() -> None:
    spec = DeploymentSpec.from_any(
        str(SEED / "deployment-custom-script.yml"), model="azureml:heart-classifier-mlflow:1"
    )
    assert spec.differences(_read_back(description="something else")) == {}


def test_from_entity_keeps_error_threshold_and_resources() -> None:
    from azure.ai.ml.entities import ModelBatchDeployment, ModelBatchDeploymentSettings, ResourceConfiguration

    entity = ModelBatchDeployment(
        name="classifier-sklearn-script",
        endpoint_name="heart-classifier-batch",
        model="azureml:heart-classifier-mlflow:2",
        compute="azureml:low-pri-cluster",
        resources=ResourceConfiguration(instance_count=2, instance_type="cpularge"),
        settings=ModelBatchDeploymentSettings(mini_batch_size=2, error_threshold=7),
    )
    spec = DeploymentSpec.from_any(entity)
    assert (spec.error_threshold, spec.instance_type, spec.model) == (
        7,
        "cpularge",
        "azureml:heart-classifier-mlflow:2",
    )


# ---------------------------------------------------------------- the operators use these rules (no API call)
def _invoke(**kwargs: object) -> object:
    from airflow_azureml.operators import AzureMLInvokeBatchEndpointOperator

    base = {"task_id": "score", "endpoint_name": "heart-ep", "inputs": {"d": "azureml://datastores/s/paths/in/"}}
    return AzureMLInvokeBatchEndpointOperator(**{**base, **kwargs})


@pytest.mark.parametrize("name", ["../../../../x", "..", "a\\b.csv", "p?.csv", ""])
def test_invoke_refuses_an_output_file_name_that_is_a_path(name: str) -> None:
    with pytest.raises(AzureMLConfigError, match="output_file_name must be a plain file name"):
        _invoke(output_file_name=name).validate()


@pytest.mark.parametrize("label", ["mini_batch_size", "instance_count"])
def test_invoke_refuses_booleans_for_integers(label: str) -> None:
    with pytest.raises(AzureMLConfigError, match=f"{label} must be a positive integer"):
        _invoke(**{label: True}).validate()


@pytest.mark.parametrize("value", ["nan", "inf", float("nan"), float("inf"), "-inf"])
def test_invoke_refuses_a_max_queue_time_that_never_ends(value: object) -> None:
    with pytest.raises(AzureMLConfigError, match="max_queue_time must be"):
        _invoke(max_queue_time=value).validate()


def test_command_job_refuses_boolean_instance_count() -> None:
    from airflow_azureml.operators import AzureMLSubmitCommandJobOperator

    op = AzureMLSubmitCommandJobOperator(
        task_id="train",
        command="python train.py",
        environment="azureml:env:1",
        compute="cpu-cluster",
        instance_count=True,
    )
    with pytest.raises(AzureMLConfigError, match="instance_count must be a positive integer"):
        op.validate()


# ------------------------------------------- local code and inline environments compare by content (issue 9, §6)
IMAGE = "mcr.microsoft.com/azureml/openmpi4.1.0-ubuntu20.04:latest"
CONDA = "name: scoring\ndependencies:\n  - python=3.10\n  - pip:\n    - xgboost==2.0.3\n"


def _project(root: Path, *, conda: str = CONDA, script: str = "batch_driver.py") -> Path:
    """A deployment folder as the az ml CLI expects it: YAML, code folder and conda file side by side."""
    (root / "code" / "lib").mkdir(parents=True, exist_ok=True)
    (root / "code" / "batch_driver.py").write_text("def init():\n    pass\n\n\ndef run(batch):\n    return batch\n")
    (root / "code" / "lib" / "features.py").write_text("COLUMNS = ['age', 'chol']\n")
    (root / "conda.yml").write_text(conda)
    path = root / "deployment.yml"
    path.write_text(
        (SEED / "deployment-custom-script.yml").read_text()
        + f"code_configuration:\n  code: code\n  scoring_script: {script}\n"
        + f"environment:\n  image: {IMAGE}\n  conda_file: conda.yml\n"
    )
    return path


def _fingerprints(path: Path) -> dict[str, str]:
    return dict(DeploymentSpec.from_yaml(path).fingerprints)


def test_fingerprints_are_stable_and_independent_of_where_the_folder_is(tmp_path: Path, monkeypatch) -> None:
    from airflow_azureml.asset_refs import CODE_TAG, ENVIRONMENT_TAG

    first = _fingerprints(_project(tmp_path / "a"))
    assert set(first) == {CODE_TAG, ENVIRONMENT_TAG}
    assert all(len(v) == 64 for v in first.values())
    assert _fingerprints(tmp_path / "a" / "deployment.yml") == first  # same content, same hash
    assert _fingerprints(_project(tmp_path / "elsewhere")) == first  # relative paths + bytes, not the location
    monkeypatch.chdir(tmp_path / "elsewhere" / "code")  # relative paths resolve against the YAML's folder
    assert _fingerprints(tmp_path / "a" / "deployment.yml") == first


@pytest.mark.parametrize(
    "edit",
    [
        lambda root: (root / "code" / "lib" / "features.py").write_text("COLUMNS = ['age', 'chol', 'thal']\n"),
        lambda root: (root / "code" / "batch_driver.py").write_bytes(
            (root / "code" / "batch_driver.py").read_bytes() + b" "
        ),
        lambda root: (root / "code" / "new.py").write_text(""),
        lambda root: (root / "code" / "lib" / "features.py").rename(root / "code" / "lib" / "columns.py"),
    ],
    ids=["file-bytes", "one-byte-of-the-script", "new-file", "renamed-file"],
)
def test_any_byte_of_the_code_folder_changes_the_code_fingerprint(tmp_path: Path, edit) -> None:
    from airflow_azureml.asset_refs import CODE_TAG, ENVIRONMENT_TAG

    before = _fingerprints(_project(tmp_path))
    edit(tmp_path)
    after = _fingerprints(tmp_path / "deployment.yml")
    assert after[CODE_TAG] != before[CODE_TAG]
    assert after[ENVIRONMENT_TAG] == before[ENVIRONMENT_TAG]


def test_scoring_script_is_part_of_the_code_fingerprint(tmp_path: Path) -> None:
    from airflow_azureml.asset_refs import CODE_TAG

    a = _fingerprints(_project(tmp_path / "a"))
    b_path = _project(tmp_path / "b", script="lib/features.py")
    assert _fingerprints(b_path)[CODE_TAG] != a[CODE_TAG]


def test_files_the_sdk_does_not_upload_do_not_count(tmp_path: Path) -> None:
    from airflow_azureml.asset_refs import CODE_TAG

    path = _project(tmp_path)
    (tmp_path / "code" / ".amlignore").write_text("*.log\n__pycache__/\n")
    before = _fingerprints(path)[CODE_TAG]
    (tmp_path / "code" / "run.log").write_text("noise")
    (tmp_path / "code" / "__pycache__").mkdir()
    (tmp_path / "code" / "__pycache__" / "x.pyc").write_bytes(b"\x00")
    assert _fingerprints(path)[CODE_TAG] == before
    (tmp_path / "code" / "kept.txt").write_text("counts")
    assert _fingerprints(path)[CODE_TAG] != before


@pytest.mark.parametrize(
    "edit",
    [
        lambda root: (root / "conda.yml").write_text(CONDA.replace("2.0.3", "2.1.0")),
        lambda root: (root / "deployment.yml").write_text(
            (root / "deployment.yml").read_text().replace("ubuntu20.04:latest", "ubuntu22.04:latest")
        ),
    ],
    ids=["conda-content", "image"],
)
def test_conda_content_and_image_change_the_environment_fingerprint(tmp_path: Path, edit) -> None:
    from airflow_azureml.asset_refs import CODE_TAG, ENVIRONMENT_TAG

    before = _fingerprints(_project(tmp_path))
    edit(tmp_path)
    after = _fingerprints(tmp_path / "deployment.yml")
    assert after[ENVIRONMENT_TAG] != before[ENVIRONMENT_TAG]
    assert after[CODE_TAG] == before[CODE_TAG]


def test_conda_file_is_hashed_by_content_not_by_path(tmp_path: Path) -> None:
    from airflow_azureml.asset_refs import ENVIRONMENT_TAG

    path = _project(tmp_path)
    before = _fingerprints(path)[ENVIRONMENT_TAG]
    (tmp_path / "envs").mkdir()
    (tmp_path / "conda.yml").rename(tmp_path / "envs" / "other-name.yml")
    path.write_text(path.read_text().replace("conda_file: conda.yml", "conda_file: envs/other-name.yml"))
    assert _fingerprints(path)[ENVIRONMENT_TAG] == before


def test_an_environment_entity_hashes_like_the_same_yaml(tmp_path: Path) -> None:
    from azure.ai.ml.entities import Environment

    from airflow_azureml.asset_refs import ENVIRONMENT_TAG, environment_fingerprint

    path = _project(tmp_path)
    entity = Environment(image=IMAGE, conda_file=str(tmp_path / "conda.yml"))
    assert environment_fingerprint(entity, tmp_path) == _fingerprints(path)[ENVIRONMENT_TAG]
    assert environment_fingerprint("azureml:sklearn-env:1", tmp_path) is None  # a registered one compares by id
    assert environment_fingerprint(Environment(name="sklearn-env", version="1", image=IMAGE), tmp_path) is None


def test_missing_code_folder_or_conda_file_fails_before_any_api_call(tmp_path: Path) -> None:
    path = _project(tmp_path)
    (tmp_path / "conda.yml").unlink()
    with pytest.raises(AzureMLConfigError, match=r"conda_file .*conda.yml.* does not exist"):
        _fingerprints(path)
    _project(tmp_path)
    for child in sorted((tmp_path / "code").rglob("*"), reverse=True):
        child.unlink() if child.is_file() else child.rmdir()
    (tmp_path / "code").rmdir()
    with pytest.raises(AzureMLConfigError, match=r"code_configuration.code .*code.* does not exist"):
        _fingerprints(path)


def _read_back_inline(spec: DeploymentSpec, tags: dict | None) -> object:
    """The deployment as the service returns it after the operator wrote ``spec`` (ARM ids, our tags)."""
    from azure.ai.ml.entities import CodeConfiguration

    ws = "/subscriptions/s/resourceGroups/rg/providers/Microsoft.MachineLearningServices/workspaces/ws"
    return _read_back(
        environment=f"{ws}/environments/CliV2AnonymousEnvironment/versions/84b1172b",
        code_configuration=CodeConfiguration(code=f"{ws}/codes/5e1f/versions/1", scoring_script="batch_driver.py"),
        tags=tags,
    )


def test_unchanged_local_code_and_inline_environment_are_not_a_difference(tmp_path: Path) -> None:
    spec = DeploymentSpec.from_yaml(_project(tmp_path))
    assert spec.differences(_read_back_inline(spec, dict(spec.fingerprints)), latest_model_version="1") == {}


def test_a_deployment_without_our_fingerprint_tags_counts_as_changed(tmp_path: Path) -> None:
    spec = DeploymentSpec.from_yaml(_project(tmp_path))
    diffs = spec.differences(_read_back_inline(spec, {"owner": "someone"}), latest_model_version="1")
    assert sorted(diffs) == ["code_configuration", "environment"]


def test_a_changed_conda_file_is_a_difference_against_the_tag(tmp_path: Path) -> None:
    path = _project(tmp_path)
    old = DeploymentSpec.from_yaml(path)
    have = _read_back_inline(old, dict(old.fingerprints))
    (tmp_path / "conda.yml").write_text(CONDA.replace("2.0.3", "2.1.0"))
    assert list(DeploymentSpec.from_yaml(path).differences(have, latest_model_version="1")) == ["environment"]


def test_the_entity_sent_carries_the_fingerprint_tags_and_the_yaml_tags(tmp_path: Path) -> None:
    path = _project(tmp_path)
    path.write_text(path.read_text() + "tags:\n  team: cardio\n")
    spec = DeploymentSpec.from_yaml(path)
    assert spec.to_entity().tags == {"team": "cardio", **spec.fingerprints}
    assert spec.differences(_read_back_inline(spec, dict(spec.fingerprints)), latest_model_version="1") == {}


def test_registered_code_and_environment_need_no_fingerprint() -> None:
    spec = DeploymentSpec(
        **GOOD_DEPLOYMENT,
        environment="azureml:sklearn-env:1",
        code_configuration={"code": "azureml:abc:1", "scoring_script": "score.py"},
    )
    assert dict(spec.fingerprints) == {}
    assert spec.to_entity().tags in (None, {})


def test_the_code_sent_is_the_folder_hashed_whatever_the_workers_cwd(tmp_path: Path, monkeypatch) -> None:
    """The SDK resolves a relative ``code`` against the entity's base path (the cwd); the YAML means its folder."""
    from azure.ai.ml.entities import CodeConfiguration

    from airflow_azureml.operators import AzureMLCreateBatchDeploymentOperator

    path = _project(tmp_path / "project")
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    spec = DeploymentSpec.from_yaml(path)
    sent = AzureMLCreateBatchDeploymentOperator._entity(spec)
    assert sent.code_configuration.code == str((tmp_path / "project" / "code").resolve())
    assert sent.code_configuration.scoring_script == "batch_driver.py"
    assert sent.tags == spec.fingerprints
    override = DeploymentSpec.from_any(
        str(path), code_configuration=CodeConfiguration(code="code", scoring_script="batch_driver.py")
    )
    sent_override = AzureMLCreateBatchDeploymentOperator._entity(override)
    assert sent_override.code_configuration.code == sent.code_configuration.code
    assert override.fingerprints == spec.fingerprints


# ---------------------------------------------------------------- code and environment given as mappings
@pytest.mark.parametrize(
    ("override", "message"),
    [
        ({"environment": {"imag": "mcr.microsoft.com/x:1"}}, r"'environment.imag'.*did you mean 'image'"),
        ({"environment": {"build": {"pth": "ctx"}}}, r"'environment.build.pth'.*did you mean 'path'"),
        ({"code_configuration": {"code": "score/", "scoringscript": "s.py"}}, r"did you mean 'scoring_script'"),
        ({"code_configuration": {"code": "score/"}}, "needs both code"),
    ],
    ids=["environment-typo", "build-typo", "code-typo", "no-scoring-script"],
)
def test_code_and_environment_mappings_are_checked_before_any_call(override: dict, message: str) -> None:
    with pytest.raises(AzureMLConfigError, match=message):
        DeploymentSpec(**{**GOOD_DEPLOYMENT, **override})


def test_environment_mapping_becomes_the_sdks_entity_with_paths_resolved(tmp_path: Path) -> None:
    from azure.ai.ml.entities import BuildContext, CodeConfiguration, Environment

    (tmp_path / "ctx").mkdir()
    (tmp_path / "ctx" / "Dockerfile").write_text("FROM scratch\n")
    (tmp_path / "conda.yaml").write_text("dependencies: [python=3.10]\n")
    (tmp_path / "score").mkdir()
    (tmp_path / "score" / "score.py").write_text("def init(): pass\ndef run(b): return b\n")
    spec = DeploymentSpec(
        **GOOD_DEPLOYMENT,
        base_path=str(tmp_path),
        environment={"image": "mcr.microsoft.com/x:1", "conda_file": "conda.yaml", "build": {"path": "ctx"}},
        code_configuration={"code": "score", "scoring_script": "score.py"},
    )
    entity = spec.to_entity()
    assert isinstance(entity.environment, Environment) and isinstance(entity.environment.build, BuildContext)
    assert entity.environment.build.path == str(tmp_path / "ctx")
    assert isinstance(entity.code_configuration, CodeConfiguration)
    assert entity.code_configuration.code == str(tmp_path / "score")
