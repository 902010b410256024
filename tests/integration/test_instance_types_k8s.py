"""Kubernetes instance types end to end: the operator, the official ``kubernetes`` client, the emulator.

Everything goes over real HTTPS with TLS verified against the emulator's CA: the operator reads a
kubeconfig that ``Emulator.kubeconfig()`` wrote (or an Airflow connection pointing at one), and the
emulator serves the ``amlarc.azureml.com/v1alpha1`` custom-objects API under ``/k8s/<cluster>``.
The YAML is Microsoft's own example (see ``tests/unit/test_instance_types.py``).
"""

from __future__ import annotations

import copy
import json
import logging
import subprocess
import sys
from pathlib import Path
from typing import Any

import pendulum
import pytest
import requests
import yaml

from airflow_azureml.emulator import Emulator
from airflow_azureml.exceptions import AzureMLConfigError
from airflow_azureml.instance_types import DEFAULT_NAME, GROUP, PLURAL, VERSION, InstanceType
from tests.conftest import load_dag, task_states, xcom_value
from tests.unit.test_instance_types import DOC_LIST_YAML, DOC_SINGLE_YAML

CLUSTER = "k8s-compute"
DOC_NAMES = ["cpusmall", "defaultinstancetype", "myinstancetypename"]
WRITES = ("POST", "PATCH", "PUT", "DELETE")
API = {"api-version": "2024-10-01"}


# ----------------------------------------------------------------------------------------------- helpers
def doc_file(tmp_path: Path, text: str = DOC_LIST_YAML + "---\n" + DOC_SINGLE_YAML) -> Path:
    path = tmp_path / "instance-types.yaml"
    path.write_text(text)
    return path


def apply(instance_types: Any, **kwargs: Any) -> dict[str, list[str]]:
    """Run the operator's ``execute`` as Airflow would (it needs no context)."""
    from airflow.sdk import DAG

    from airflow_azureml.operators import AzureMLApplyInstanceTypesOperator

    with DAG("instance_types_direct", schedule=None, start_date=pendulum.datetime(2026, 11, 1, tz="UTC")):
        op = AzureMLApplyInstanceTypesOperator(task_id="apply", instance_types=instance_types, **kwargs)
    return op.execute(context={})


def with_cpusmall_cpu_limit(cpu: str) -> str:
    """The document's list with another cpu limit for ``cpusmall`` (its first ``cpu: "1"`` before a GPU line)."""
    old = 'cpu: "1"\n          nvidia.com/gpu: 0'
    changed = DOC_LIST_YAML.replace(old, f'cpu: "{cpu}"\n          nvidia.com/gpu: 0', 1)
    assert changed != DOC_LIST_YAML
    return changed


def k8s_writes(emulator: Emulator, since: int = 0) -> list[tuple[str, str]]:
    """(method, path) of every write that reached the emulator's Kubernetes API since request number ``since``."""
    return [
        (r["method"], r["path"])
        for r in emulator.requests()[since:]
        if r["path"].startswith("/k8s/") and r["method"] in WRITES
    ]


def versions(emulator: Emulator, cluster: str = CLUSTER) -> dict[str, str]:
    return {name: obj["metadata"]["resourceVersion"] for name, obj in emulator.instance_type_objects(cluster).items()}


def custom_objects_api(kubeconfig: Path) -> Any:
    from kubernetes import client, config

    return client.CustomObjectsApi(config.new_client_from_config(config_file=str(kubeconfig)))


def arm(emulator: Emulator, method: str, path: str, **kwargs: Any) -> requests.Response:
    """An ARM call over HTTPS with a token the emulator's identity endpoint issued for its ARM audience."""
    token = emulator.call(lambda: emulator.identity.issue(emulator.client_id, f"{emulator.base_url}/.default"))
    ws = (
        f"/subscriptions/{emulator.subscription_id}/resourceGroups/{emulator.resource_group}"
        f"/providers/Microsoft.MachineLearningServices/workspaces/{emulator.workspace_name}"
    )
    return requests.request(
        method,
        f"{emulator.base_url}{ws}{path}",
        params=API,
        headers={"Authorization": f"Bearer {token['access_token']}"},
        verify=emulator.ca_cert,
        timeout=30,
        **kwargs,
    )


def attach_kubernetes_compute(name: str = CLUSTER) -> Any:
    """Attach the cluster as an Azure ML Kubernetes compute through the real ``MLClient``."""
    from azure.ai.ml.entities import KubernetesCompute

    from airflow_azureml.hooks import AzureMLHook

    ml = AzureMLHook().get_conn()
    compute = KubernetesCompute(
        name=name,
        resource_id=f"/subscriptions/00000000-0000-0000-0000-000000000001/resourceGroups/rg-aks"
        f"/providers/Microsoft.ContainerService/managedClusters/{name}",
        namespace="azureml",
    )
    ml.compute.begin_create_or_update(compute).result()
    return ml


def command_job(
    emulator: Emulator, name: str, instance_type: str | None, resources: Any = None, compute: str = CLUSTER
) -> requests.Response:
    """PUT a command job on a Kubernetes compute (the body the SDK sends, trimmed to what matters here)."""
    props: dict[str, Any] = {"instanceCount": 1}
    if instance_type is not None:
        props["instanceType"] = instance_type
    if resources is not None:
        props["properties"] = {"resources": resources}
    body = {
        "properties": {
            "jobType": "Command",
            "command": "python train.py",
            "environmentId": "azureml:AzureML-sklearn-1.5@latest",
            "computeId": f"azureml:{compute}",
            "resources": props,
        }
    }
    return arm(emulator, "PUT", f"/jobs/{name}", json=body)


@pytest.fixture
def kubeconfig(emulator: Emulator) -> Path:
    return emulator.kubeconfig(CLUSTER)


@pytest.fixture
def run_case(airflow_db: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """``dag.test()`` of the instance-type DAG with the given operator arguments."""
    failures = tmp_path / "failures.jsonl"
    monkeypatch.setenv("AZUREML_TEST_FAILURES", str(failures))

    def run(case: dict[str, Any]) -> tuple[Any, list[dict[str, str]]]:
        monkeypatch.setenv("AZUREML_TEST_CASE", json.dumps(case))
        failures.unlink(missing_ok=True)
        dag_run = load_dag("azureml_instance_type_cases.py").test(logical_date=pendulum.now("UTC"))
        recorded = [json.loads(line) for line in failures.read_text().splitlines()] if failures.exists() else []
        return dag_run, recorded

    return run


# ------------------------------------------------------------------------------------------------ tests
def test_apply_creates_then_changes_nothing_then_patches_one(
    emulator: Emulator, kubeconfig: Path, tmp_path: Path, run_case
) -> None:
    path = doc_file(tmp_path)
    dag_run, failures = run_case({"instance_types": str(path), "kubeconfig": str(kubeconfig)})
    assert str(dag_run.state) == "success", (task_states(dag_run), failures)
    assert xcom_value(dag_run, "apply_instance_types") == {"created": DOC_NAMES, "patched": [], "unchanged": []}
    objects = emulator.instance_type_objects(CLUSTER)
    assert sorted(objects) == DOC_NAMES
    assert objects["myinstancetypename"]["spec"] == {
        "nodeSelector": {"mylabel": "mylabelvalue"},
        "resources": {
            "requests": {"cpu": "700m", "memory": "1500Mi"},
            "limits": {"cpu": "1", "nvidia.com/gpu": 1, "memory": "2Gi"},
        },
    }
    assert all(o["metadata"]["generation"] == 1 and o["metadata"]["uid"] for o in objects.values())
    assert [m for m, _ in k8s_writes(emulator)] == ["POST"] * 3
    before = versions(emulator)

    # the same definitions again: only reads, nothing written, resourceVersions unchanged
    mark = len(emulator.requests())
    dag_run, failures = run_case({"instance_types": str(path), "kubeconfig": str(kubeconfig)})
    assert str(dag_run.state) == "success", (task_states(dag_run), failures)
    assert xcom_value(dag_run, "apply_instance_types") == {"created": [], "patched": [], "unchanged": DOC_NAMES}
    assert k8s_writes(emulator, mark) == []
    assert [r["method"] for r in emulator.requests()[mark:] if r["path"].startswith("/k8s/")] == ["GET"] * 3
    assert versions(emulator) == before

    # one limit changed: exactly that instance type is patched
    mark = len(emulator.requests())
    changed = with_cpusmall_cpu_limit("2")
    dag_run, failures = run_case(
        {"instance_types": str(doc_file(tmp_path, changed + "---\n" + DOC_SINGLE_YAML)), "kubeconfig": str(kubeconfig)}
    )
    assert str(dag_run.state) == "success", (task_states(dag_run), failures)
    assert xcom_value(dag_run, "apply_instance_types") == {
        "created": [],
        "patched": ["cpusmall"],
        "unchanged": ["defaultinstancetype", "myinstancetypename"],
    }
    assert k8s_writes(emulator, mark) == [
        ("PATCH", f"/k8s/{CLUSTER}/apis/{GROUP}/{VERSION}/{PLURAL}/cpusmall"),
    ]
    after = versions(emulator)
    assert after["cpusmall"] != before["cpusmall"]
    assert {k: v for k, v in after.items() if k != "cpusmall"} == {k: v for k, v in before.items() if k != "cpusmall"}
    cpusmall = emulator.instance_type_objects(CLUSTER)["cpusmall"]
    assert cpusmall["spec"]["resources"]["limits"] == {"cpu": "2", "nvidia.com/gpu": 0, "memory": "1Gi"}
    assert cpusmall["metadata"]["generation"] == 2


def test_every_input_form_applies_the_same_objects(emulator: Emulator, kubeconfig: Path) -> None:
    text = DOC_LIST_YAML + "---\n" + DOC_SINGLE_YAML
    assert apply(text, kubeconfig=str(kubeconfig))["created"] == DOC_NAMES
    as_dicts = list(yaml.safe_load_all(text))
    assert apply(as_dicts, kubeconfig=kubeconfig)["unchanged"] == DOC_NAMES
    from airflow_azureml.instance_types import load_instance_types

    models = load_instance_types(text)
    assert apply(models, kubeconfig=str(kubeconfig), context=CLUSTER)["unchanged"] == DOC_NAMES
    assert [m for m, _ in k8s_writes(emulator)] == ["POST"] * 3


def test_removed_fields_are_removed_by_the_patch(emulator: Emulator, kubeconfig: Path) -> None:
    gpu = InstanceType(
        name="gpu-small",
        node_selector={"pool": "gpu"},
        requests={"cpu": "500m", "memory": "1Gi"},
        limits={"cpu": "2", "nvidia.com/gpu": 1, "memory": "4Gi"},
    )
    apply([gpu], kubeconfig=str(kubeconfig))
    cpu_only = InstanceType(
        name="gpu-small", requests={"cpu": "500m", "memory": "1Gi"}, limits={"cpu": "2", "memory": "4Gi"}
    )
    assert apply([cpu_only], kubeconfig=str(kubeconfig))["patched"] == ["gpu-small"]
    assert emulator.instance_type_objects(CLUSTER)["gpu-small"]["spec"] == cpu_only.to_custom_object()["spec"]
    assert apply([cpu_only], kubeconfig=str(kubeconfig))["unchanged"] == ["gpu-small"]


def _manifest(name: str = "cpu-small", **resources: Any) -> dict[str, Any]:
    spec = {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "2Gi"}}
    for section, values in resources.items():
        spec[section] = values
    header = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "InstanceType", "metadata": {"name": name}}
    return {**header, "spec": {"resources": spec}}


@pytest.mark.parametrize(
    ("instance_types", "fragment"),
    [
        ([_manifest(limits={"cpu": "0", "memory": "2Gi"})], "resources.limits.cpu must not be 0"),
        (
            [_manifest(requests={"cpu": "500m", "memory": "1Gi", "nvidia.com/gpu": 1})],
            "a GPU count may only be set in limits",
        ),
        ([_manifest("twice"), _manifest("twice")], "is defined more than once"),
        ([_manifest(requests={"cpu": "500m", "memory": ""})], "resources.requests.memory must not be empty"),
        (DOC_LIST_YAML.replace('memory: "100Mi"', 'memory: "0"'), "resources.requests.memory must not be 0"),
        (DOC_LIST_YAML.replace('cpu: "100m"', "cpu: 1"), "must be a quoted string"),
        ("instance-types-that-do-not-exist.yaml", "does not exist"),
        ([], "No instance types found"),
    ],
    ids=[
        "cpu-zero",
        "gpu-in-requests",
        "duplicate-names",
        "empty-memory",
        "yaml-zero-memory",
        "yaml-unquoted-cpu",
        "missing-file",
        "none",
    ],
)
def test_invalid_definitions_fail_before_any_request(
    emulator: Emulator, kubeconfig: Path, instance_types: Any, fragment: str
) -> None:
    before = len(emulator.requests())
    with pytest.raises(AzureMLConfigError, match=fragment):
        apply(instance_types, kubeconfig=str(kubeconfig))
    assert len(emulator.requests()) == before, "nothing may reach the cluster"


def test_node_selector_must_fit_the_extension_both_offline_and_on_the_server(
    emulator: Emulator, kubeconfig: Path
) -> None:
    # another value for one of the extension's keys: both readings of "a subset" refuse it, offline
    before = len(emulator.requests())
    with pytest.raises(AzureMLConfigError, match="must be a subset"):
        apply(DOC_SINGLE_YAML, kubeconfig=str(kubeconfig), extension_node_selector={"mylabel": "other"})
    assert len(emulator.requests()) == before

    # the cluster enforces the same rule when the operator was not told the extension's selector
    emulator.set_extension_node_selector(CLUSTER, {"pool": "cpu"})
    with pytest.raises(AzureMLConfigError, match=r"HTTP 422: .*must be a subset"):
        apply(DOC_SINGLE_YAML, kubeconfig=str(kubeconfig))
    assert emulator.instance_type_objects(CLUSTER) == {}
    emulator.set_extension_node_selector(CLUSTER, {"mylabel": "mylabelvalue", "pool": "cpu"})
    assert apply(DOC_SINGLE_YAML, kubeconfig=str(kubeconfig))["created"] == ["myinstancetypename"]


def test_node_selector_key_the_extension_lacks_is_warned_offline_and_refused_by_the_cluster(
    emulator: Emulator, kubeconfig: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The gap of an ambiguous rule (docs/instance_types.md): the provider only warns, the emulator refuses.

    ``mylabel`` is not in the extension's nodeSelector. Read as "compatible with it" (the document's
    workloads run on nodes matching both selectors) that is fine; read as "each key=value pair is the
    extension's" it is not. The emulator takes the strict reading and answers 422.
    """
    emulator.set_extension_node_selector(CLUSTER, {"pool": "cpu"})
    caplog.set_level(logging.WARNING, logger=PROVIDER_LOGGER)
    before = len(emulator.requests())
    with pytest.raises(AzureMLConfigError, match=r"HTTP 422: .*must be a subset"):
        apply(DOC_SINGLE_YAML, kubeconfig=str(kubeconfig), extension_node_selector={"pool": "cpu"})
    warnings = [r.getMessage() for r in caplog.records if r.name == PROVIDER_LOGGER and r.levelno == logging.WARNING]
    assert any("node-selector-subset" in w and "Azure ML may refuse" in w for w in warnings), warnings
    writes = [r for r in emulator.requests()[before:] if r["method"] in WRITES and PLURAL in r["path"]]
    assert writes, "the provider did not refuse it: the body reached the cluster"
    assert emulator.instance_type_objects(CLUSTER) == {}


def test_bad_kubeconfig_or_context_fails_before_any_request(
    emulator: Emulator, kubeconfig: Path, tmp_path: Path
) -> None:
    before = len(emulator.requests())
    with pytest.raises(AzureMLConfigError, match="does not exist"):
        apply(DOC_SINGLE_YAML, kubeconfig=str(tmp_path / "nope.yaml"))
    with pytest.raises(AzureMLConfigError, match="Invalid kubeconfig"):
        apply(DOC_SINGLE_YAML, kubeconfig=str(kubeconfig), context="no-such-context")
    insecure = yaml.safe_load(kubeconfig.read_text())
    insecure["clusters"][0]["cluster"]["insecure-skip-tls-verify"] = True
    del insecure["clusters"][0]["cluster"]["certificate-authority"]
    (tmp_path / "insecure.yaml").write_text(yaml.safe_dump(insecure))
    with pytest.raises(AzureMLConfigError, match="TLS verification is never turned off"):
        apply(DOC_SINGLE_YAML, kubeconfig=str(tmp_path / "insecure.yaml"))
    with pytest.raises(AzureMLConfigError, match="exactly one of"):
        apply(DOC_SINGLE_YAML)
    assert len(emulator.requests()) == before


def test_applied_types_show_on_the_attached_compute_and_gate_jobs(
    emulator: Emulator, azureml_conn: dict[str, Any], kubeconfig: Path
) -> None:
    # applied before the cluster is attached: the objects are kept and show up on attach
    apply(DOC_LIST_YAML + "---\n" + DOC_SINGLE_YAML, kubeconfig=str(kubeconfig))
    ml = attach_kubernetes_compute()

    body = arm(emulator, "GET", f"/computes/{CLUSTER}").json()
    types = body["properties"]["properties"]["instanceTypes"]
    assert sorted(types) == DOC_NAMES
    # the document's own defaultinstancetype overrides the built-in one (requests cpu "100m", memory "2Gi")
    assert types[DEFAULT_NAME]["resources"]["requests"] == {"cpu": "1", "memory": "1Gi"}
    assert types["myinstancetypename"] == {
        "nodeSelector": {"mylabel": "mylabelvalue"},
        "resources": {
            "requests": {"cpu": "700m", "memory": "1500Mi"},
            "limits": {"cpu": "1", "memory": "2Gi", "nvidia.com/gpu": "1"},
        },
    }
    assert body["properties"]["properties"]["defaultInstanceType"] == DEFAULT_NAME
    sdk_view = ml.compute.get(CLUSTER)
    assert sdk_view.type == "kubernetes" and sdk_view.namespace == "azureml"
    assert sorted(sdk_view.properties["instanceTypes"]) == DOC_NAMES

    # the workspace schedules with them: known type ok, unknown refused, over-limit refused
    assert command_job(emulator, "job-ok", "cpusmall").status_code == 201
    assert command_job(emulator, "job-default", None).status_code == 201
    unknown = command_job(emulator, "job-unknown", "gpularge")
    assert unknown.status_code == 400 and "'gpularge' is not defined" in unknown.json()["error"]["message"]
    too_big = command_job(
        emulator, "job-too-big", "cpusmall", {"requests": {"cpu": "2", "memory": "512Mi"}}
    )  # cpusmall's cpu limit is "1"
    assert too_big.status_code == 400 and "is above the cpu limit '1' of instance type 'cpusmall'" in too_big.text
    fits = command_job(emulator, "job-fits", "cpusmall", {"requests": {"cpu": "500m", "memory": "512Mi"}})
    assert fits.status_code == 201, fits.text

    # applied after attach: visible at once, and the new limit is what jobs are checked against
    bigger = with_cpusmall_cpu_limit("4")
    assert apply(bigger, kubeconfig=str(kubeconfig))["patched"] == ["cpusmall"]
    types = arm(emulator, "GET", f"/computes/{CLUSTER}").json()["properties"]["properties"]["instanceTypes"]
    assert types["cpusmall"]["resources"]["limits"]["cpu"] == "4"
    assert command_job(emulator, "job-now-fits", "cpusmall", {"requests": {"cpu": "2", "memory": "512Mi"}}).ok


def test_attached_compute_without_objects_has_the_builtin_default(
    emulator: Emulator, azureml_conn: dict[str, Any]
) -> None:
    attach_kubernetes_compute("bare-k8s")
    types = arm(emulator, "GET", "/computes/bare-k8s").json()["properties"]["properties"]["instanceTypes"]
    assert list(types) == [DEFAULT_NAME]
    assert types[DEFAULT_NAME]["resources"]["requests"] == {"cpu": "100m", "memory": "2Gi"}
    too_big = command_job(emulator, "too-big", None, {"requests": {"cpu": "4", "memory": "1Gi"}}, compute="bare-k8s")
    assert (
        too_big.status_code == 400
        and "is above the cpu limit '2' of instance type 'defaultinstancetype'" in too_big.text
    )
    assert emulator.instance_type_objects("bare-k8s") == {}


def test_kubernetes_connection_with_kube_config_path(
    emulator: Emulator, kubeconfig: Path, tmp_path: Path, run_case, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(
        "AIRFLOW_CONN_K8S_EMULATOR",
        json.dumps(
            {"conn_type": "kubernetes", "extra": {"kube_config_path": str(kubeconfig), "cluster_context": CLUSTER}}
        ),
    )
    dag_run, failures = run_case({"instance_types": str(doc_file(tmp_path)), "kubernetes_conn_id": "k8s_emulator"})
    assert str(dag_run.state) == "success", (task_states(dag_run), failures)
    assert xcom_value(dag_run, "apply_instance_types")["created"] == DOC_NAMES
    assert sorted(emulator.instance_type_objects(CLUSTER)) == DOC_NAMES

    # the kubeconfig content itself in the connection (JSON string), as the cncf.kubernetes provider allows
    content = json.dumps(yaml.safe_load(kubeconfig.read_text()))
    monkeypatch.setenv(
        "AIRFLOW_CONN_K8S_INLINE", json.dumps({"conn_type": "kubernetes", "extra": {"kube_config": content}})
    )
    assert apply(DOC_SINGLE_YAML, kubernetes_conn_id="k8s_inline") == {
        "created": [],
        "patched": [],
        "unchanged": ["myinstancetypename"],
    }
    monkeypatch.setenv(
        "AIRFLOW_CONN_K8S_NO_VERIFY",
        json.dumps({"conn_type": "kubernetes", "extra": {"kube_config": content, "disable_verify_ssl": True}}),
    )
    with pytest.raises(AzureMLConfigError, match="disable_verify_ssl"):
        apply(DOC_SINGLE_YAML, kubernetes_conn_id="k8s_no_verify")


def test_invalid_definition_fails_the_task_in_airflow(emulator: Emulator, kubeconfig: Path, run_case) -> None:
    before = len(emulator.requests())
    bad = DOC_SINGLE_YAML.replace("    requests:\n", "    requests:\n      nvidia.com/gpu: 1\n")
    dag_run, failures = run_case({"instance_types": bad, "kubeconfig": str(kubeconfig)})
    assert str(dag_run.state) == "failed"
    assert [f["type"] for f in failures] == ["AzureMLConfigError"]
    assert "may only be set in limits" in failures[0]["message"]
    assert len(emulator.requests()) == before


# ---------------------------------------------------------------------- the emulator's Kubernetes API itself
def test_custom_objects_api_semantics(emulator: Emulator, kubeconfig: Path) -> None:
    from kubernetes.client.exceptions import ApiException

    api = custom_objects_api(kubeconfig)
    body = _manifest("api-check")
    created = api.create_cluster_custom_object(GROUP, VERSION, PLURAL, body)
    meta = created["metadata"]
    assert created["apiVersion"] == f"{GROUP}/{VERSION}" and created["kind"] == "InstanceType"
    assert {"name", "uid", "resourceVersion", "creationTimestamp", "generation"} <= set(meta)

    with pytest.raises(ApiException) as err:
        api.create_cluster_custom_object(GROUP, VERSION, PLURAL, body)
    assert err.value.status == 409 and json.loads(err.value.body)["reason"] == "AlreadyExists"
    with pytest.raises(ApiException) as err:
        api.get_cluster_custom_object(GROUP, VERSION, PLURAL, "absent")
    status = json.loads(err.value.body)
    assert (err.value.status, status["kind"], status["reason"]) == (404, "Status", "NotFound")
    with pytest.raises(ApiException) as err:
        api.create_cluster_custom_object(GROUP, VERSION, PLURAL, _manifest("bad", limits={"cpu": "0", "memory": "1Gi"}))
    assert (
        err.value.status == 422 and "spec.resources.limits.cpu: must not be 0" in json.loads(err.value.body)["message"]
    )

    # a merge patch that changes nothing keeps the resourceVersion; a real change bumps it and the generation
    same = api.patch_cluster_custom_object(GROUP, VERSION, PLURAL, "api-check", {"spec": body["spec"]})
    assert same["metadata"]["resourceVersion"] == meta["resourceVersion"]
    patched = api.patch_cluster_custom_object(
        GROUP, VERSION, PLURAL, "api-check", {"spec": {"resources": {"limits": {"cpu": "2"}}}}
    )
    assert patched["metadata"]["resourceVersion"] != meta["resourceVersion"]
    assert patched["metadata"]["generation"] == 2
    json_patched = api.patch_cluster_custom_object(
        GROUP,
        VERSION,
        PLURAL,
        "api-check",
        [{"op": "replace", "path": "/spec/resources/limits/memory", "value": "4Gi"}],
        _content_type="application/json-patch+json",
    )
    assert json_patched["spec"]["resources"]["limits"] == {"cpu": "2", "memory": "4Gi"}

    # replace needs the current resourceVersion (optimistic concurrency)
    stale = copy.deepcopy(created)
    stale["spec"]["resources"]["limits"]["cpu"] = "3"
    with pytest.raises(ApiException) as err:
        api.replace_cluster_custom_object(GROUP, VERSION, PLURAL, "api-check", stale)
    assert err.value.status == 409
    fresh = api.get_cluster_custom_object(GROUP, VERSION, PLURAL, "api-check")
    fresh["spec"]["resources"]["limits"]["cpu"] = "3"
    replaced = api.replace_cluster_custom_object(GROUP, VERSION, PLURAL, "api-check", fresh)
    assert replaced["spec"]["resources"]["limits"]["cpu"] == "3"

    listed = api.list_cluster_custom_object(GROUP, VERSION, PLURAL)
    assert listed["kind"] == "InstanceTypeList" and [i["metadata"]["name"] for i in listed["items"]] == ["api-check"]
    api.delete_cluster_custom_object(GROUP, VERSION, PLURAL, "api-check")
    assert api.list_cluster_custom_object(GROUP, VERSION, PLURAL)["items"] == []


def test_kubernetes_api_requires_the_token_and_serves_discovery(emulator: Emulator, kubeconfig: Path) -> None:
    from kubernetes import client, config

    api_client = config.new_client_from_config(config_file=str(kubeconfig))
    assert client.VersionApi(api_client).get_code().git_version.startswith("v1.")
    groups = client.ApisApi(api_client).get_api_versions()
    assert [g.name for g in groups.groups] == [GROUP]
    resources = client.CustomObjectsApi(api_client).get_api_resources(GROUP, VERSION)
    assert [(r.name, r.namespaced, r.kind) for r in resources.resources] == [(PLURAL, False, "InstanceType")]

    url = f"{emulator.base_url}/k8s/{CLUSTER}/apis/{GROUP}/{VERSION}/{PLURAL}"
    anonymous = requests.get(url, verify=emulator.ca_cert, timeout=10)
    assert anonymous.status_code == 401 and anonymous.json()["kind"] == "Status"
    config_doc = yaml.safe_load(kubeconfig.read_text())
    assert config_doc["current-context"] == CLUSTER
    assert config_doc["clusters"][0]["cluster"] == {
        "server": f"{emulator.base_url}/k8s/{CLUSTER}",
        "certificate-authority": emulator.ca_cert,
    }


def test_importing_the_operator_imports_neither_kubernetes_nor_the_sdk() -> None:
    code = (
        "import sys\n"
        "import airflow_azureml.operators.kubernetes\n"
        "print('HEAVY=' + ','.join(m for m in ('kubernetes', 'azure.ai.ml') if m in sys.modules))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "HEAVY=\n" in result.stdout, result.stdout[-2000:]


# ----------------------------------------------------------------- the two implementations of Azure's rules
# The provider checks offline (airflow_azureml.instance_types); the emulator applies its own copy of the
# rules as the service (airflow_azureml.emulator.azure_rules). Each row says what Azure does, from source
# document 003 (and Kubernetes' rules it relies on). Where the document reads two ways
# (docs/instance_types.md) the emulator takes the strict reading and the provider only warns:
#   "accept": both accept, and the provider logs no warning;
#   "refuse": both refuse (the provider before any API call);
#   "gap":    the provider accepts with a warning naming the rule, the emulator refuses.
# Whatever the row says, the provider never refuses what the emulator accepts, and what the provider
# accepts without a warning the emulator accepts too (``_outcomes_agree``).
PROVIDER_LOGGER = "airflow_azureml.instance_types"


def _spec(requests: dict[str, Any], limits: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {"resources": {"requests": requests, "limits": limits}, **extra}


def _provider_outcome(call: Any, caplog: pytest.LogCaptureFixture) -> str:
    """``refuse``, ``warn`` or ``accept``: what the provider does with one input."""
    caplog.clear()
    caplog.set_level(logging.WARNING, logger=PROVIDER_LOGGER)
    try:
        call()
    except AzureMLConfigError:
        return "refuse"
    warned = any(r.name == PROVIDER_LOGGER and r.levelno >= logging.WARNING for r in caplog.records)
    return "warn" if warned else "accept"


def _outcomes_agree(case: str, expected: str, provider: str, emulator_accepts: bool) -> None:
    assert not (provider == "refuse" and emulator_accepts), f"{case}: the provider refuses what the emulator accepts"
    assert not (provider == "accept" and not emulator_accepts), (
        f"{case}: the provider accepts without a warning what the emulator refuses"
    )
    wanted = {"accept": ("accept", True), "refuse": ("refuse", False), "gap": ("warn", False)}[expected]
    assert (provider, emulator_accepts) == wanted, case


DOC_SPEC = _spec(
    {"cpu": "700m", "memory": "1500Mi"},
    {"cpu": "1", "nvidia.com/gpu": 1, "memory": "2Gi"},
    nodeSelector={"mylabel": "mylabelvalue"},
)
INSTANCE_TYPE_CASES: list[tuple[str, str, Any, dict[str, str] | None, str]] = [
    # (case, name, spec, extension nodeSelector, expected)
    ("document example", "myinstancetypename", DOC_SPEC, None, "accept"),
    (
        "explicit zero GPUs",
        "cpusmall",
        _spec({"cpu": "100m", "memory": "100Mi"}, {"cpu": "1", "nvidia.com/gpu": 0, "memory": "1Gi"}),
        None,
        "accept",
    ),
    (
        "built-in default, GPU null",
        "defaultinstancetype",
        _spec({"cpu": "100m", "memory": "2Gi"}, {"cpu": "2", "memory": "2Gi", "nvidia.com/gpu": None}),
        None,
        "accept",
    ),
    ("fractional cores", "half", _spec({"cpu": "0.5", "memory": "1G"}, {"cpu": "1", "memory": "1Gi"}), None, "accept"),
    ("cpu request 0", "zero", _spec({"cpu": "0", "memory": "1Gi"}, {"cpu": "1", "memory": "1Gi"}), None, "refuse"),
    ("cpu request 0m", "zerom", _spec({"cpu": "0m", "memory": "1Gi"}, {"cpu": "1", "memory": "1Gi"}), None, "refuse"),
    (
        "memory limit 0.0Gi",
        "zerogi",
        _spec({"cpu": "1", "memory": "1Gi"}, {"cpu": "1", "memory": "0.0Gi"}),
        None,
        "refuse",
    ),
    ("empty memory", "empty", _spec({"cpu": "1", "memory": ""}, {"cpu": "1", "memory": "1Gi"}), None, "refuse"),
    ("cpu not a string", "number", _spec({"cpu": 1, "memory": "1Gi"}, {"cpu": "1", "memory": "1Gi"}), None, "refuse"),
    (
        "GPU in requests",
        "gpureq",
        _spec({"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": 1}, {"cpu": "1", "memory": "1Gi"}),
        None,
        "refuse",
    ),
    (
        "GPU as a string",
        "gpustr",
        _spec({"cpu": "1", "memory": "1Gi"}, {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "1"}),
        None,
        "refuse",
    ),
    (
        "negative GPU",
        "gpuneg",
        _spec({"cpu": "1", "memory": "1Gi"}, {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": -1}),
        None,
        "refuse",
    ),
    ("no limits", "nolimits", {"resources": {"requests": {"cpu": "1", "memory": "1Gi"}}}, None, "refuse"),
    ("no memory limit", "nomem", _spec({"cpu": "1", "memory": "1Gi"}, {"cpu": "1"}), None, "refuse"),
    ("typo in a field", "typo", _spec({"cpu": "1", "memroy": "1Gi"}, {"cpu": "1", "memory": "1Gi"}), None, "refuse"),
    (
        "request above limit",
        "over",
        _spec({"cpu": "2", "memory": "1Gi"}, {"cpu": "1", "memory": "1Gi"}),
        None,
        "refuse",
    ),
    (
        "request equal to limit",
        "equal",
        _spec({"cpu": "1", "memory": "1Gi"}, {"cpu": "1", "memory": "1Gi"}),
        None,
        "accept",
    ),
    (
        "upper-case name",
        "CpuSmall",
        _spec({"cpu": "1", "memory": "1Gi"}, {"cpu": "1", "memory": "1Gi"}),
        None,
        "refuse",
    ),
    (
        "nodeSelector value not a string",
        "sel",
        _spec({"cpu": "1", "memory": "1Gi"}, {"cpu": "1", "memory": "1Gi"}, nodeSelector={"gpu": 1}),
        None,
        "refuse",
    ),
    (
        "milli-bytes of memory",
        "millibytes",
        _spec({"cpu": "1", "memory": "1500m"}, {"cpu": "1", "memory": "1Gi"}),
        None,
        "refuse",
    ),
    ("finer than 1m", "tiny", _spec({"cpu": "0.0005", "memory": "1Gi"}, {"cpu": "1", "memory": "1Gi"}), None, "refuse"),
    ("nodeSelector inside the extension's", "subset", DOC_SPEC, {"mylabel": "mylabelvalue", "pool": "gpu"}, "accept"),
    ("nodeSelector with a key the extension lacks", "outside", DOC_SPEC, {"pool": "gpu"}, "gap"),
    ("nodeSelector with another value than the extension's", "clash", DOC_SPEC, {"mylabel": "other"}, "refuse"),
    ("no spec", "nospec", None, None, "refuse"),
]
GPU_TYPE_SPEC = _spec({"cpu": "2", "memory": "8Gi"}, {"cpu": "4", "nvidia.com/gpu": 1, "memory": "16Gi"})
RESOURCES_CASES: list[tuple[str, Any, str]] = [
    # (case, resources of a job or deployment on GPU_TYPE_SPEC, expected)
    ("no resources section: the instance type's own", None, "accept"),
    ("requests only", {"requests": {"cpu": "2", "memory": "8Gi"}}, "accept"),
    (
        "limits below the instance type's, all its GPUs",
        {"requests": {"cpu": "2", "memory": "8Gi"}, "limits": {"cpu": "3", "memory": "12Gi", "nvidia.com/gpu": 1}},
        "accept",
    ),
    (
        "limits equal to the instance type's",
        {"requests": {"cpu": "2", "memory": "8Gi"}, "limits": {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": 1}},
        "gap",
    ),
    ("cpu request equal to the instance type's limit", {"requests": {"cpu": "4000m", "memory": "1Gi"}}, "gap"),
    (
        "memory limit equal to the instance type's",
        {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "2", "memory": "16Gi"}},
        "gap",
    ),
    (
        "GPU count as a string (the REST body's form)",
        {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "2", "memory": "2Gi", "nvidia.com/gpu": "1"}},
        "accept",
    ),
    ("CPU-only limits", {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "2"}}, "accept"),
    (
        "cpu limit above the instance type's",
        {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "5", "memory": "1Gi"}},
        "refuse",
    ),
    ("cpu request above the instance type's limit", {"requests": {"cpu": "5", "memory": "1Gi"}}, "refuse"),
    (
        "more GPUs than the instance type",
        {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "2", "memory": "2Gi", "nvidia.com/gpu": 2}},
        "refuse",
    ),
    (
        "GPU without cpu and memory limits",
        {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"nvidia.com/gpu": 1}},
        "refuse",
    ),
    ("memory request 1Mi", {"requests": {"cpu": "1", "memory": "1Mi"}}, "accept"),
    ("memory request 1M (1 MB, under 1 MiB)", {"requests": {"cpu": "1", "memory": "1M"}}, "gap"),
    ("memory request 1000Ki", {"requests": {"cpu": "1", "memory": "1000Ki"}}, "gap"),
    ("memory request under 1 MB", {"requests": {"cpu": "1", "memory": "500k"}}, "refuse"),
    ("memory request missing", {"requests": {"cpu": "1"}}, "refuse"),
    ("GPU in requests", {"requests": {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": 1}}, "refuse"),
    (
        "request above its own limit",
        {"requests": {"cpu": "2", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "1Gi"}},
        "refuse",
    ),
    (
        "empty GPU limit",
        {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": ""}},
        "refuse",
    ),
]


def _emulator_accepts_type(name: str, spec: Any, extension: dict[str, str] | None) -> bool:
    from airflow_azureml.emulator.azure_rules import RuleViolation, check_instance_type

    try:
        check_instance_type(name, spec, extension)
    except RuleViolation:
        return False
    return True


@pytest.mark.parametrize(
    ("case", "name", "spec", "extension", "expected"), INSTANCE_TYPE_CASES, ids=[c[0] for c in INSTANCE_TYPE_CASES]
)
def test_provider_and_emulator_agree_on_instance_types(
    case: str, name: str, spec: Any, extension: dict[str, str] | None, expected: str, caplog: pytest.LogCaptureFixture
) -> None:
    from airflow_azureml.instance_types import load_instance_types

    document = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "InstanceType", "metadata": {"name": name}, "spec": spec}
    provider = _provider_outcome(lambda: load_instance_types(document, extension_node_selector=extension), caplog)
    _outcomes_agree(case, expected, provider, _emulator_accepts_type(name, spec, extension))


@pytest.mark.parametrize(("case", "resources", "expected"), RESOURCES_CASES, ids=[c[0] for c in RESOURCES_CASES])
def test_provider_and_emulator_agree_on_resources(
    case: str, resources: Any, expected: str, caplog: pytest.LogCaptureFixture
) -> None:
    from airflow_azureml.emulator.azure_rules import RuleViolation, check_instance_type, check_resources
    from airflow_azureml.instance_types import check_resources_fit, load_instance_types

    document = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "InstanceType", "metadata": {"name": "gpusmall"}}
    (provider_type,) = load_instance_types({**document, "spec": GPU_TYPE_SPEC})
    provider = _provider_outcome(lambda: check_resources_fit(resources, provider_type), caplog)
    try:
        check_resources(resources, check_instance_type("gpusmall", GPU_TYPE_SPEC))
        emulator = True
    except RuleViolation:
        emulator = False
    _outcomes_agree(case, expected, provider, emulator)


# MLflow deployments (no scoring script) need at least 2 CPU cores and 4 GB requested (source document 003).
# A row with an instance-type spec checks a deployment with no resources section on that instance type.
BIG_TYPE_SPEC = _spec({"cpu": "2", "memory": "4Gi"}, {"cpu": "4", "memory": "8Gi"})
MLFLOW_CASES: list[tuple[str, Any, Any, str]] = [
    # (case, deployment resources, instance type spec when resources is None, expected)
    ("2 cores and 4 GB (4G)", {"requests": {"cpu": "2", "memory": "4G"}}, None, "gap"),
    ("4095Mi: above 4G, below 4Gi", {"requests": {"cpu": "2", "memory": "4095Mi"}}, None, "gap"),
    ("2000m and 4Gi", {"requests": {"cpu": "2000m", "memory": "4Gi"}}, None, "accept"),
    ("more than the minimum", {"requests": {"cpu": "3.5", "memory": "16Gi"}}, None, "accept"),
    ("1900m", {"requests": {"cpu": "1900m", "memory": "8Gi"}}, None, "refuse"),
    ("one core", {"requests": {"cpu": "1", "memory": "4Gi"}}, None, "refuse"),
    ("3999M", {"requests": {"cpu": "2", "memory": "3999M"}}, None, "refuse"),
    ("3Gi", {"requests": {"cpu": "4", "memory": "3Gi"}}, None, "refuse"),
    ("no requests", {"limits": {"cpu": "4", "memory": "8Gi"}}, None, "refuse"),
    ("instance type with 2 cores and 4Gi", None, BIG_TYPE_SPEC, "accept"),
    (
        "instance type with 2 cores and 4G",
        None,
        _spec({"cpu": "2", "memory": "4G"}, {"cpu": "4", "memory": "8Gi"}),
        "gap",
    ),
    ("the document's myinstancetypename (700m, 1500Mi)", None, DOC_SPEC, "refuse"),
    (
        "the built-in default (100m, 2Gi)",
        None,
        _spec({"cpu": "100m", "memory": "2Gi"}, {"cpu": "2", "memory": "2Gi"}),
        "refuse",
    ),
]


@pytest.mark.parametrize(("case", "resources", "type_spec", "expected"), MLFLOW_CASES, ids=[c[0] for c in MLFLOW_CASES])
def test_provider_and_emulator_agree_on_the_mlflow_minimum(
    case: str, resources: Any, type_spec: Any, expected: str, caplog: pytest.LogCaptureFixture
) -> None:
    from airflow_azureml.emulator.azure_rules import RuleViolation, check_instance_type, check_mlflow_minimum
    from airflow_azureml.instance_types import check_mlflow_minimum as provider_check
    from airflow_azureml.instance_types import load_instance_types

    spec = type_spec if type_spec is not None else BIG_TYPE_SPEC
    document = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "InstanceType", "metadata": {"name": "chosen"}}
    (provider_type,) = load_instance_types({**document, "spec": spec})
    provider = _provider_outcome(lambda: provider_check(resources if resources is not None else provider_type), caplog)
    try:
        check_mlflow_minimum(resources, check_instance_type("chosen", spec))
        emulator = True
    except RuleViolation:
        emulator = False
    _outcomes_agree(case, expected, provider, emulator)


def test_mlflow_deployment_on_a_small_instance_type_is_refused(
    emulator: Emulator, azureml_conn: dict[str, Any], kubeconfig: Path, tmp_path: Path
) -> None:
    apply(DOC_LIST_YAML + "---\n" + DOC_SINGLE_YAML, kubeconfig=str(kubeconfig))
    attach_kubernetes_compute()
    endpoint = arm(
        emulator, "PUT", "/batchEndpoints/k8s-ep", json={"location": "eastus", "properties": {"authMode": "AADToken"}}
    )
    assert endpoint.ok, endpoint.text

    def deployment(name: str, instance_type: str, **extra: Any) -> requests.Response:
        props = {
            "compute": f"azureml:{CLUSTER}",
            "model": {"referenceType": "Id", "assetId": "azureml:heart-classifier:1"},  # an MLflow model
            "resources": {"instanceCount": 1, "instanceType": instance_type},
            **extra,
        }
        return arm(
            emulator,
            "PUT",
            f"/batchEndpoints/k8s-ep/deployments/{name}",
            json={"location": "eastus", "properties": props},
        )

    refused = deployment("mlflow-small", "cpusmall")
    assert refused.status_code == 400, refused.text
    assert refused.json()["error"]["code"] == "UserError" and "MLflow" in refused.json()["error"]["message"]
    # a scoring script makes it a custom deployment: the minimum does not apply (its code must exist:
    # registered through the real SDK, which uploads the folder to the workspace's storage)
    from azure.ai.ml.entities._assets import Code

    from airflow_azureml.hooks.azure_ml import AzureMLHook

    folder = tmp_path / "custom-code"
    folder.mkdir()
    (folder / "score.py").write_text("def init():\n    pass\n\n\ndef run(batch):\n    return batch\n")
    code_operations = AzureMLHook().get_conn()._code  # what deployments use for their code (no public accessor)
    code = code_operations.create_or_update(Code(name="small-custom", version="1", path=str(folder)))
    script = {"codeConfiguration": {"codeId": code.id, "scoringScript": "score.py"}}
    assert deployment("custom-small", "cpusmall", **script).ok


# A batch deployment's own ``resources.properties.resources`` (ResourceConfiguration.properties; the SDK sends
# REST ``resources.properties``) is checked against its instance type as a command job's resources are, and
# an MLflow model's minimum is checked against the deployment's own requests when it has them (else its
# instance type's). Both sides through the code the operator and the service run: the provider through
# ``AzureMLCreateBatchDeploymentOperator.check_kubernetes`` on the spec the operator builds from a deployment
# YAML, the emulator through a deployment PUT on a Kubernetes compute. Every row deploys the MLflow model
# ``heart-classifier``; rows about the limits ask for at least the MLflow minimum.
DEPLOYMENT_TYPES: dict[str, dict[str, Any]] = {
    "gpusmall": GPU_TYPE_SPEC,  # requests 2 / 8Gi, limits 4 / 16Gi / 1 GPU
    "cpularge": _spec({"cpu": "2", "memory": "8Gi"}, {"cpu": "4", "memory": "8Gi"}),
    "roomy": _spec({"cpu": "1", "memory": "1Gi"}, {"cpu": "8", "memory": "32Gi"}),
}
DEPLOYMENT_CASES: list[tuple[str, str, Any, str]] = [
    # (case, instance type, the deployment's resources.properties.resources, expected)
    ("no resources: cpularge's own requests meet the MLflow minimum", "cpularge", None, "accept"),
    ("no resources: roomy's own requests (1, 1Gi) are below the MLflow minimum", "roomy", None, "refuse"),
    (
        "own requests (1, 2Gi) below the MLflow minimum on cpularge",
        "cpularge",
        {"requests": {"cpu": "1", "memory": "2Gi"}},
        "refuse",
    ),
    (
        "own requests (2, 8Gi) meet the MLflow minimum on roomy",
        "roomy",
        {"requests": {"cpu": "2", "memory": "8Gi"}},
        "accept",
    ),
    ("own requests of 4G on roomy", "roomy", {"requests": {"cpu": "2", "memory": "4G"}}, "gap"),
    (
        "limits below gpusmall's",
        "gpusmall",
        {"requests": {"cpu": "2", "memory": "8Gi"}, "limits": {"cpu": "3", "memory": "12Gi", "nvidia.com/gpu": 1}},
        "accept",
    ),
    (
        "cpu limit 8 above gpusmall's 4",
        "gpusmall",
        {"requests": {"cpu": "2", "memory": "8Gi"}, "limits": {"cpu": "8", "memory": "12Gi"}},
        "refuse",
    ),
    ("cpu request above gpusmall's limit", "gpusmall", {"requests": {"cpu": "5", "memory": "8Gi"}}, "refuse"),
    (
        "limits equal to gpusmall's",
        "gpusmall",
        {"requests": {"cpu": "2", "memory": "8Gi"}, "limits": {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": 1}},
        "gap",
    ),
    (
        "more GPUs than gpusmall",
        "gpusmall",
        {"requests": {"cpu": "2", "memory": "8Gi"}, "limits": {"cpu": "3", "memory": "12Gi", "nvidia.com/gpu": 2}},
        "refuse",
    ),
    ("memory request equal to cpularge's limit", "cpularge", {"requests": {"cpu": "2", "memory": "8Gi"}}, "gap"),
]


def _instance_type_manifests() -> list[dict[str, Any]]:
    header = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "InstanceType"}
    return [{**header, "metadata": {"name": name}, "spec": spec} for name, spec in DEPLOYMENT_TYPES.items()]


@pytest.fixture(scope="module")
def deployment_workspace(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """One emulator for the table: a Kubernetes compute whose ARM ``instanceTypes`` are ``DEPLOYMENT_TYPES``."""
    from airflow_azureml.emulator.azure_rules import check_instance_type
    from tests.conftest import FAST

    with Emulator(tmp_path_factory.mktemp("deployments") / "emulator", timing=FAST) as emu:
        entries = {name: check_instance_type(name, spec).compute_entry() for name, spec in DEPLOYMENT_TYPES.items()}
        compute = arm(
            emu,
            "PUT",
            f"/computes/{CLUSTER}",
            json={
                "location": "eastus",
                "properties": {
                    "computeType": "Kubernetes",
                    "resourceId": f"/subscriptions/{emu.subscription_id}/resourceGroups/rg-aks"
                    f"/providers/Microsoft.ContainerService/managedClusters/{CLUSTER}",
                    "properties": {"namespace": "azureml", "instanceTypes": entries},
                },
            },
        )
        assert compute.ok, compute.text
        endpoint = arm(
            emu, "PUT", "/batchEndpoints/k8s-ep", json={"location": "eastus", "properties": {"authMode": "AADToken"}}
        )
        assert endpoint.ok, endpoint.text
        yield emu


def put_deployment(
    emulator: Emulator, name: str, instance_type: str, resources: Any, endpoint: str = "k8s-ep"
) -> requests.Response:
    """PUT an MLflow model deployment on the Kubernetes compute, with ``resources`` as REST ``resources.properties``."""
    rest_resources: dict[str, Any] = {"instanceCount": 1, "instanceType": instance_type}
    if resources is not None:
        rest_resources["properties"] = {"resources": resources}
    props = {
        "compute": f"azureml:{CLUSTER}",
        "model": {"referenceType": "Id", "assetId": "azureml:heart-classifier:1"},  # an MLflow model
        "resources": rest_resources,
    }
    return arm(
        emulator,
        "PUT",
        f"/batchEndpoints/{endpoint}/deployments/{name}",
        json={"location": "eastus", "properties": props},
    )


def deployment_operator(tmp_path: Path, instance_type: str, resources: Any, **kwargs: Any) -> Any:
    """The operator as a user writes it: a deployment YAML whose ``resources.properties.resources`` is ``resources``."""
    from airflow.sdk import DAG

    from airflow_azureml.operators import AzureMLCreateBatchDeploymentOperator

    section: dict[str, Any] = {"instance_count": 1, "instance_type": instance_type}
    if resources is not None:
        section["properties"] = {"resources": resources}
    path = tmp_path / "deployment.yml"
    path.write_text(
        yaml.safe_dump(
            {
                "name": "mlflow-dep",
                "endpoint_name": "k8s-ep",
                "type": "model",
                "model": "azureml:heart-classifier:1",
                "compute": f"azureml:{CLUSTER}",
                "resources": section,
            }
        )
    )
    with DAG("deployment_resources", schedule=None, start_date=pendulum.datetime(2026, 11, 1, tz="UTC")):
        return AzureMLCreateBatchDeploymentOperator(task_id="deploy", deployment=str(path), **kwargs)


@pytest.mark.parametrize(
    ("case", "instance_type", "resources", "expected"), DEPLOYMENT_CASES, ids=[c[0] for c in DEPLOYMENT_CASES]
)
def test_provider_and_emulator_agree_on_deployment_resources(
    case: str,
    instance_type: str,
    resources: Any,
    expected: str,
    deployment_workspace: Emulator,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    op = deployment_operator(tmp_path, instance_type, resources, instance_types=_instance_type_manifests())
    provider = _provider_outcome(lambda: op.check_kubernetes(op.build_spec()), caplog)
    name = f"dep-{DEPLOYMENT_CASES.index((case, instance_type, resources, expected))}"
    answer = put_deployment(deployment_workspace, name, instance_type, resources)
    assert answer.ok or (answer.status_code == 400 and answer.json()["error"]["code"] == "UserError"), answer.text
    _outcomes_agree(case, expected, provider, answer.ok)


def test_deployment_over_the_instance_type_limits_is_refused_by_the_emulator(
    emulator: Emulator, azureml_conn: dict[str, Any], kubeconfig: Path
) -> None:
    """The service refuses a deployment whose own resources exceed its instance type, whatever the client checked."""
    apply(DOC_LIST_YAML + "---\n" + DOC_SINGLE_YAML, kubeconfig=str(kubeconfig))
    attach_kubernetes_compute()
    endpoint = arm(
        emulator, "PUT", "/batchEndpoints/k8s-ep", json={"location": "eastus", "properties": {"authMode": "AADToken"}}
    )
    assert endpoint.ok, endpoint.text
    # myinstancetypename: limits cpu "1", memory "2Gi", one GPU; the MLflow minimum is met by the requests
    over = {"requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"cpu": "8", "memory": "8Gi"}}
    refused = put_deployment(emulator, "over-limit", "myinstancetypename", over)
    assert refused.status_code == 400, refused.text
    error = refused.json()["error"]
    assert error["code"] == "UserError" and "of instance type 'myinstancetypename'" in error["message"], error
    assert ("k8s-ep", "over-limit") not in emulator.call(lambda: dict(emulator.workspace.deployments))
