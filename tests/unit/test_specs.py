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
    spec = DeploymentSpec.from_yaml(SEED / "deployment.yml")
    assert spec.endpoint_name == "heart-classifier-batch" and spec.name == "classifier-xgboost"
    assert spec.compute == "azureml:low-pri-cluster" and spec.model == "azureml:heart-classifier@latest"
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
        name="classifier-xgboost",
        endpoint_name="heart-classifier-batch",
        model="azureml:heart-classifier@latest",
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
    yaml_spec = DeploymentSpec.from_yaml(SEED / "deployment.yml")
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
