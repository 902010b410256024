"""Table-driven tests of the Kubernetes InstanceType model (Azure ML Kubernetes compute).

The two YAML literals below are copied verbatim from Microsoft's article "Create and manage instance types
for efficient utilization of compute resources" (Japanese edition, 01/09/2024), including the stray
trailing space after ``memory: "1Gi"`` in the list example.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from airflow_azureml.exceptions import AzureMLConfigError
from airflow_azureml.instance_types import (
    DEFAULT_NAME,
    GROUP,
    PLURAL,
    VERSION,
    InstanceType,
    builtin_default_instance_type,
    check_mlflow_minimum,
    check_resources_fit,
    dump_instance_types,
    load_instance_types,
    parse_cpu,
    parse_memory,
    resolve_instance_type,
    validate_instance_types,
)

# The two examples below are copied verbatim from source document 003 (Microsoft Learn, "Create and
# manage instance types", CC BY 4.0), so that no test reads anything outside the repository.
DOC_SINGLE_YAML = """\
apiVersion: amlarc.azureml.com/v1alpha1
kind: InstanceType
metadata:
  name: myinstancetypename
spec:
  nodeSelector:
    mylabel: mylabelvalue
  resources:
    limits:
      cpu: "1"
      nvidia.com/gpu: 1
      memory: "2Gi"
    requests:
      cpu: "700m"
      memory: "1500Mi"
"""

DOC_LIST_YAML = """\
apiVersion: amlarc.azureml.com/v1alpha1
kind: InstanceTypeList
items:
  - metadata:
      name: cpusmall
    spec:
      resources:
        requests:
          cpu: "100m"
          memory: "100Mi"
        limits:
          cpu: "1"
          nvidia.com/gpu: 0
          memory: "1Gi"

  - metadata:
      name: defaultinstancetype
    spec:
      resources:
        requests:
          cpu: "1"
          memory: "1Gi" 
        limits:
          cpu: "1"
          nvidia.com/gpu: 0
          memory: "1Gi"
"""  # noqa: W291 - the trailing space after "1Gi" is in the document and kept verbatim

GI = 2**30
MI = 2**20


def _raises(fragment: str) -> Any:
    """Every rule violation is an AzureMLConfigError whose message names the offending field."""
    return pytest.raises(AzureMLConfigError, match=re.escape(fragment))


def _gpu_small() -> dict[str, Any]:
    """A valid manifest that the invalid cases below break one field at a time."""
    return {
        "apiVersion": "amlarc.azureml.com/v1alpha1",
        "kind": "InstanceType",
        "metadata": {"name": "gpu-small"},
        "spec": {
            "nodeSelector": {"pool": "gpu"},
            "resources": {
                "requests": {"cpu": "500m", "memory": "1Gi"},
                "limits": {"cpu": "2", "nvidia.com/gpu": 1, "memory": "4Gi"},
            },
        },
    }


def _set(manifest: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """Set (or with ``...`` delete) a dotted path; ``nvidia.com/gpu`` is written ``nvidia_com/gpu``."""
    keys = [k.replace("_com/", ".com/") for k in path.split(".")]
    node = manifest
    for key in keys[:-1]:
        node = node[key]
    if value is ...:
        node.pop(keys[-1], None)
    else:
        node[keys[-1]] = value
    return manifest


def _instance(name: str, requests: dict[str, str], limits: dict[str, Any], node_selector: Any = None) -> InstanceType:
    return InstanceType(name=name, node_selector=node_selector, requests=requests, limits=limits)


# ------------------------------------------------------------------------------------ the document's examples
def test_document_single_example_loads() -> None:
    (it,) = load_instance_types(DOC_SINGLE_YAML)
    assert it == InstanceType(
        name="myinstancetypename",
        node_selector={"mylabel": "mylabelvalue"},
        requests={"cpu": "700m", "memory": "1500Mi"},
        limits={"cpu": "1", "nvidia.com/gpu": 1, "memory": "2Gi"},
    )
    assert (it.cpu_request_millicores, it.cpu_limit_millicores) == (700, 1000)
    assert (it.memory_request_bytes, it.memory_limit_bytes) == (1500 * MI, 2 * GI)
    assert it.gpu_limit == 1


def test_document_list_example_loads() -> None:
    types = load_instance_types(DOC_LIST_YAML)
    assert [t.name for t in types] == ["cpusmall", "defaultinstancetype"]
    cpusmall, default = types
    assert cpusmall.requests == {"cpu": "100m", "memory": "100Mi"}
    assert cpusmall.limits == {"cpu": "1", "nvidia.com/gpu": 0, "memory": "1Gi"}
    assert cpusmall.gpu_limit == 0
    assert default.requests == {"cpu": "1", "memory": "1Gi"}
    assert default.node_selector is None


# ------------------------------------------------------------------------------------------------ quantities
@pytest.mark.parametrize(
    ("text", "millicores"),
    [
        ("100m", 100),
        ("700m", 700),
        ("1", 1000),
        ("2", 2000),
        ("0.5", 500),
        ("1.5", 1500),
        ("0.1", 100),
        ("0.001", 1),
        ("1000m", 1000),
    ],
)
def test_parse_cpu_valid(text: str, millicores: int) -> None:
    assert parse_cpu(text) == millicores


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("", "cpu must not be empty"),
        ("  ", "cpu must not be empty"),
        ("0", "cpu must not be 0"),
        ("0m", "cpu must not be 0"),
        ("0.0", "cpu must not be 0"),
        ("-1", "is not a CPU quantity"),
        ("1Gi", "is not a CPU quantity"),
        ("one", "is not a CPU quantity"),
        (" 1", "is not a CPU quantity"),
        ("1.5m", "finer than 1m"),
        ("0.0005", "finer than 1m"),
        (True, "must be a CPU quantity string"),
        (None, "must be a CPU quantity string"),
    ],
)
def test_parse_cpu_invalid(value: Any, fragment: str) -> None:
    with _raises(fragment):
        parse_cpu(value)


@pytest.mark.parametrize(
    ("text", "size"),
    [
        ("1024Mi", GI),
        ("1500Mi", 1500 * MI),
        ("2Gi", 2 * GI),
        ("1Ki", 1024),
        ("1Ti", 2**40),
        ("1Pi", 2**50),
        ("1k", 1000),
        ("1M", 10**6),
        ("1G", 10**9),
        ("1T", 10**12),
        ("1P", 10**15),
        ("1048576", 2**20),
        ("0.5Gi", GI // 2),
        ("0.2Gi", 214748365),  # 214748364.8 rounds up, as Kubernetes does
    ],
)
def test_parse_memory_valid(text: str, size: int) -> None:
    assert parse_memory(text) == size


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("", "memory must not be empty"),
        ("0", "memory must not be 0"),
        ("0Mi", "memory must not be 0"),
        ("0.0Gi", "memory must not be 0"),
        ("400m", "thousandths of a byte"),
        ("1GB", "is not a memory quantity"),
        ("Mi", "is not a memory quantity"),
        ("-1Gi", "is not a memory quantity"),
        ("1 Gi", "is not a memory quantity"),
        (1.5, "must be a memory quantity string"),
        (None, "must be a memory quantity string"),
    ],
)
def test_parse_memory_invalid(value: Any, fragment: str) -> None:
    with _raises(fragment):
        parse_memory(value)


# ---------------------------------------------------------------------------------- one instance type's rules
@pytest.mark.parametrize(
    ("path", "value", "check"),
    [
        ("spec.resources.limits.nvidia_com/gpu", 0, lambda t: t.gpu_limit == 0),  # 0 is allowed in limits
        ("spec.resources.limits.nvidia_com/gpu", ..., lambda t: "nvidia.com/gpu" not in t.limits),
        ("spec.resources.limits.nvidia_com/gpu", None, lambda t: t.gpu_limit == 0),  # null = no GPU
        ("spec.nodeSelector", ..., lambda t: t.node_selector is None),
        ("spec.nodeSelector", {}, lambda t: t.node_selector is None),
        ("spec.resources.requests.cpu", "2", lambda t: t.cpu_request_millicores == 2000),  # equal to limit
        ("spec.resources.requests.cpu", "0.25", lambda t: t.cpu_request_millicores == 250),
        ("spec.resources.requests.memory", "4G", lambda t: t.memory_request_bytes == 4 * 10**9),
        ("metadata.name", "gpu.small-2", lambda t: t.name == "gpu.small-2"),
        ("metadata.labels", {"team": "ml"}, lambda t: t.name == "gpu-small"),  # other metadata is ignored
    ],
)
def test_instance_type_valid_variants(path: str, value: Any, check: Any) -> None:
    (it,) = load_instance_types(_set(_gpu_small(), path, value))
    assert check(it)


INVALID_INSTANCE_TYPES = [
    # name
    ("metadata.name", ..., "metadata.name is required"),
    ("metadata.name", "", "metadata.name is required"),
    ("metadata", ..., "metadata.name is required"),
    ("metadata.name", "GPU_Small", "metadata.name must be a Kubernetes object name"),
    ("metadata.name", "x" * 254, "metadata.name must be a Kubernetes object name"),
    # CPU request
    ("spec.resources.requests.cpu", ..., "instance type 'gpu-small': resources.requests.cpu is required"),
    ("spec.resources.requests.cpu", "", "instance type 'gpu-small': resources.requests.cpu must not be empty"),
    ("spec.resources.requests.cpu", "0", "instance type 'gpu-small': resources.requests.cpu must not be 0"),
    ("spec.resources.requests.cpu", "0m", "instance type 'gpu-small': resources.requests.cpu must not be 0"),
    ("spec.resources.requests.cpu", 1, "resources.requests.cpu must be a quoted string"),
    ("spec.resources.requests.cpu", "lots", "resources.requests.cpu 'lots' is not a CPU quantity"),
    # memory request
    ("spec.resources.requests.memory", ..., "instance type 'gpu-small': resources.requests.memory is required"),
    ("spec.resources.requests.memory", "", "resources.requests.memory must not be empty"),
    ("spec.resources.requests.memory", "0", "resources.requests.memory must not be 0"),
    ("spec.resources.requests.memory", "0Gi", "resources.requests.memory must not be 0"),
    ("spec.resources.requests.memory", 1024, "resources.requests.memory must be a quoted string"),
    ("spec.resources.requests.memory", "1GB", "resources.requests.memory '1GB' is not a memory quantity"),
    # CPU limit
    ("spec.resources.limits.cpu", ..., "instance type 'gpu-small': resources.limits.cpu is required"),
    ("spec.resources.limits.cpu", "", "resources.limits.cpu must not be empty"),
    ("spec.resources.limits.cpu", "0", "resources.limits.cpu must not be 0"),
    # memory limit
    ("spec.resources.limits.memory", ..., "instance type 'gpu-small': resources.limits.memory is required"),
    ("spec.resources.limits.memory", "", "resources.limits.memory must not be empty"),
    ("spec.resources.limits.memory", "0", "resources.limits.memory must not be 0"),
    # GPU: an integer, in limits only
    ("spec.resources.requests.nvidia_com/gpu", 1, "resources.requests.nvidia.com/gpu is not allowed here"),
    ("spec.resources.limits.nvidia_com/gpu", "1", "resources.limits.nvidia.com/gpu must be an integer"),
    ("spec.resources.limits.nvidia_com/gpu", 1.5, "resources.limits.nvidia.com/gpu must be an integer"),
    ("spec.resources.limits.nvidia_com/gpu", True, "resources.limits.nvidia.com/gpu must be an integer"),
    ("spec.resources.limits.nvidia_com/gpu", -1, "resources.limits.nvidia.com/gpu must not be negative"),
    # nodeSelector: a string map
    ("spec.nodeSelector", ["pool=gpu"], "instance type 'gpu-small': nodeSelector must be a map"),
    ("spec.nodeSelector", {"gpu": True}, "instance type 'gpu-small': nodeSelector.gpu must be a string"),
    ("spec.nodeSelector", {"zone": 1}, "nodeSelector.zone must be a string"),
    ("spec.nodeSelector", {"": "x"}, "nodeSelector has a key ''"),
    # requests <= limits
    ("spec.resources.requests.cpu", "3", "resources.requests.cpu ('3') must not be greater than resources.limits.cpu"),
    ("spec.resources.requests.memory", "5Gi", "resources.requests.memory ('5Gi') must not be greater than"),
    # structure and typos
    ("spec.resources.requests.memroy", "1Gi", "resources.requests.memroy is not a known field"),
    ("spec.resources.limits.amd_com/gpu", 1, "resources.limits.amd.com/gpu is not a known field"),
    ("spec.nodeselector", {"pool": "gpu"}, "instance type 'gpu-small': spec.nodeselector is not a known field"),
    ("spec.resources.limits", ..., "instance type 'gpu-small': resources.limits is required"),
    ("spec.resources.requests", ..., "instance type 'gpu-small': resources.requests is required"),
    ("spec.resources", ..., "instance type 'gpu-small': resources is required"),
    ("spec", ..., "instance type 'gpu-small': spec is required"),
    ("apiVersion", "amlarc.azureml.com/v1", "apiVersion must be 'amlarc.azureml.com/v1alpha1'"),
    ("apiVersion", ..., "apiVersion must be"),
    ("kind", "Pod", "kind must be 'InstanceType' or 'InstanceTypeList'"),
]


@pytest.mark.parametrize(("path", "value", "fragment"), INVALID_INSTANCE_TYPES)
def test_instance_type_invalid(path: str, value: Any, fragment: str) -> None:
    with _raises(fragment):
        load_instance_types(_set(_gpu_small(), path, value))


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"requests": {"cpu": "1"}, "limits": {"cpu": "1", "memory": "1Gi"}}, "resources.requests.memory is required"),
        ({"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {}}, "resources.limits.cpu is required"),
        ({"requests": None, "limits": {}}, "resources.requests must be a map"),
        (
            {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": "2"}},
            "resources.limits.nvidia.com/gpu must be an integer",
        ),
    ],
)
def test_instance_type_constructor_validates(kwargs: dict[str, Any], fragment: str) -> None:
    with _raises(f"instance type 'built': {fragment}"):
        InstanceType(name="built", **kwargs)


def test_config_error_is_a_value_error() -> None:
    with pytest.raises(ValueError):
        load_instance_types(_set(_gpu_small(), "spec.resources.requests.cpu", "0"))


# ---------------------------------------------------------------------------------------- list-level rules
DUPLICATE_LIST = """\
apiVersion: amlarc.azureml.com/v1alpha1
kind: InstanceTypeList
items:
  - metadata: {name: cpusmall}
    spec: {resources: {requests: {cpu: "100m", memory: "100Mi"}, limits: {cpu: "1", memory: "1Gi"}}}
  - metadata: {name: cpusmall}
    spec: {resources: {requests: {cpu: "1", memory: "1Gi"}, limits: {cpu: "1", memory: "1Gi"}}}
"""

DUPLICATE_ACROSS_DOCUMENTS = DOC_LIST_YAML + "---\n" + DOC_LIST_YAML.replace("cpusmall", "cpularge")


@pytest.mark.parametrize("source", [DUPLICATE_LIST, DUPLICATE_ACROSS_DOCUMENTS], ids=["one-list", "two-documents"])
def test_duplicate_names_are_refused(source: str) -> None:
    with _raises("metadata.name is defined more than once"):
        load_instance_types(source)


def test_validate_instance_types_refuses_duplicate_objects() -> None:
    (it,) = load_instance_types(DOC_SINGLE_YAML)
    with _raises("instance type 'myinstancetypename': metadata.name is defined more than once"):
        validate_instance_types([it, copy.deepcopy(it)])


def test_validate_instance_types_revalidates_mutated_objects() -> None:
    (it,) = load_instance_types(DOC_SINGLE_YAML)
    it.limits["cpu"] = "0"
    with _raises("instance type 'myinstancetypename': resources.limits.cpu must not be 0"):
        validate_instance_types([it])


@pytest.mark.parametrize(
    ("selector", "extension", "fragment"),
    [
        (None, {"pool": "aml"}, None),
        ({"pool": "aml"}, {"pool": "aml"}, None),
        ({"pool": "aml"}, {"pool": "aml", "zone": "1"}, None),
        ({"pool": "aml", "zone": "1"}, {"pool": "aml", "zone": "1"}, None),
        ({"pool": "aml"}, None, None),  # no extension nodeSelector: nothing to be a subset of
        ({"pool": "aml"}, {}, None),
        ({"pool": "gpu"}, {"pool": "aml"}, "instance type 'sel': nodeSelector.pool is 'gpu' but the extension's"),
        # a key the extension lacks: only warned (ambiguous "subset", tests/unit/test_ambiguous_rules.py)
        ({"other": "x"}, {"pool": "aml"}, None),
        ({"pool": "aml", "zone": "2"}, {"pool": "aml", "zone": "1"}, "nodeSelector.zone is '2'"),
        ({"pool": "aml"}, {"pool": 1}, "extension nodeSelector.pool must be a string"),
    ],
)
def test_node_selector_must_be_subset_of_extension(
    selector: dict[str, str] | None, extension: dict[str, Any] | None, fragment: str | None
) -> None:
    manifest = _set(_gpu_small(), "metadata.name", "sel")
    _set(manifest, "spec.nodeSelector", selector if selector is not None else ...)
    it = load_instance_types(manifest)[0]
    if fragment is None:
        validate_instance_types([it], extension)
        assert load_instance_types(manifest, extension_node_selector=extension) == [it]
    else:
        with _raises(fragment):
            validate_instance_types([it], extension)
        with _raises(fragment):
            load_instance_types(manifest, extension_node_selector=extension)


# ------------------------------------------------------------------------------------------------ loading
KUBECTL_GET_OUTPUT = """\
apiVersion: v1
kind: List
items:
  - apiVersion: amlarc.azureml.com/v1alpha1
    kind: InstanceType
    metadata: {name: cpusmall, resourceVersion: "42"}
    spec: {resources: {requests: {cpu: "100m", memory: "100Mi"}, limits: {cpu: "1", memory: "1Gi"}}}
"""


@pytest.mark.parametrize(
    ("source", "names"),
    [
        (DOC_SINGLE_YAML, ["myinstancetypename"]),
        (DOC_LIST_YAML, ["cpusmall", "defaultinstancetype"]),
        (DOC_SINGLE_YAML + "---\n" + DOC_LIST_YAML, ["myinstancetypename", "cpusmall", "defaultinstancetype"]),
        ("---\n" + DOC_SINGLE_YAML + "---\n", ["myinstancetypename"]),  # empty documents are skipped
        (yaml.safe_load(DOC_SINGLE_YAML), ["myinstancetypename"]),
        (
            [yaml.safe_load(DOC_SINGLE_YAML), yaml.safe_load(DOC_LIST_YAML)],
            ["myinstancetypename", "cpusmall", DEFAULT_NAME],
        ),
        (KUBECTL_GET_OUTPUT, ["cpusmall"]),
        ("apiVersion: amlarc.azureml.com/v1alpha1\nkind: InstanceTypeList\nitems: []\n", []),
        ("", []),
    ],
    ids=[
        "single",
        "list",
        "multi-document",
        "empty-documents",
        "dict",
        "list-of-dicts",
        "kubectl-list",
        "no-items",
        "empty",
    ],
)
def test_load_sources(source: Any, names: list[str]) -> None:
    assert [t.name for t in load_instance_types(source)] == names


@pytest.mark.parametrize("as_path", [True, False], ids=["Path", "str"])
def test_load_from_file(tmp_path: Path, as_path: bool) -> None:
    path = tmp_path / "my_instance_type_list.yaml"
    path.write_text(DOC_LIST_YAML, encoding="utf-8")
    types = load_instance_types(path if as_path else str(path))
    assert [t.name for t in types] == ["cpusmall", "defaultinstancetype"]


@pytest.mark.parametrize(
    ("source", "fragment"),
    [
        ("/nonexistent/instance_types.yaml", "instance type file '/nonexistent/instance_types.yaml' does not exist"),
        ("kind: [unclosed", "invalid YAML"),
        ("just a string", "document 0 must be a map"),
        (42, "instance types must be YAML text, a path, a mapping or a list of mappings"),
        (
            "apiVersion: amlarc.azureml.com/v1alpha1\nkind: InstanceTypeList\nitems: {a: 1}\n",
            "document 0: items must be a list",
        ),
        (
            DOC_LIST_YAML.replace(
                "  - metadata:\n      name: cpusmall",
                "  - apiVersion: amlarc.azureml.com/v1alpha1\n    kind: Pod\n    metadata:\n      name: x",
                1,
            ),
            "document 0 items[0]: kind must be 'InstanceType'",
        ),
        (DOC_LIST_YAML.replace("name: cpusmall", "name: ''"), "document 0 items[0]: metadata.name is required"),
        (
            KUBECTL_GET_OUTPUT.replace("  - apiVersion: amlarc.azureml.com/v1alpha1\n", "  - apiVersion: v1\n"),
            "document 0 items[0]: apiVersion must be 'amlarc.azureml.com/v1alpha1'",
        ),
    ],
)
def test_load_invalid_sources(source: Any, fragment: str) -> None:
    with _raises(fragment):
        load_instance_types(source)


# ------------------------------------------------------------------------------------------------ dumping
ROUND_TRIP_SETS = {
    "single-example": lambda: load_instance_types(DOC_SINGLE_YAML),
    "list-example": lambda: load_instance_types(DOC_LIST_YAML),
    "builtin-default": lambda: [builtin_default_instance_type()],
    "tricky-strings": lambda: [
        _instance(
            "yes",
            {"cpu": "0.5", "memory": "1048576"},
            {"cpu": "1", "memory": "1G"},
            node_selector={"kubernetes.io/os": "linux", "on": "true", "zone": "01"},
        )
    ],
    "empty": lambda: [],
}


@pytest.mark.parametrize("as_list", [True, False], ids=["InstanceTypeList", "documents"])
@pytest.mark.parametrize("make", ROUND_TRIP_SETS.values(), ids=ROUND_TRIP_SETS.keys())
def test_round_trip(make: Any, as_list: bool) -> None:
    types = make()
    assert load_instance_types(dump_instance_types(types, as_list=as_list)) == types


def test_dump_has_the_document_shape() -> None:
    list_text = dump_instance_types(load_instance_types(DOC_LIST_YAML))
    assert yaml.safe_load(list_text) == yaml.safe_load(DOC_LIST_YAML)
    assert "  - metadata:\n      name: cpusmall\n" in list_text  # items indented as in the document
    assert 'cpu: "100m"' in list_text
    assert "nvidia.com/gpu: 0" in list_text  # an integer, not a string
    single_text = dump_instance_types(load_instance_types(DOC_SINGLE_YAML), as_list=False)
    assert yaml.safe_load(single_text) == yaml.safe_load(DOC_SINGLE_YAML)
    assert single_text.startswith("apiVersion: amlarc.azureml.com/v1alpha1\nkind: InstanceType\nmetadata:\n")


def test_dump_refuses_invalid_lists() -> None:
    (it,) = load_instance_types(DOC_SINGLE_YAML)
    with _raises("metadata.name is defined more than once"):
        dump_instance_types([it, it])


# ------------------------------------------------------------------------------------- API payload shapes
def test_custom_object_matches_the_document_and_api_coordinates() -> None:
    assert (GROUP, VERSION, PLURAL, DEFAULT_NAME) == (
        "amlarc.azureml.com",
        "v1alpha1",
        "instancetypes",
        "defaultinstancetype",
    )
    (it,) = load_instance_types(DOC_SINGLE_YAML)
    body = it.to_custom_object()
    assert body == yaml.safe_load(DOC_SINGLE_YAML)
    assert body["apiVersion"] == f"{GROUP}/{VERSION}"
    assert load_instance_types(body) == [it]


@pytest.mark.parametrize(
    ("make", "expected"),
    [
        (
            lambda: load_instance_types(DOC_SINGLE_YAML)[0],
            {
                "nodeSelector": {"mylabel": "mylabelvalue"},
                "resources": {
                    "requests": {"cpu": "700m", "memory": "1500Mi"},
                    "limits": {"cpu": "1", "memory": "2Gi", "nvidia.com/gpu": "1"},
                },
            },
        ),
        (
            builtin_default_instance_type,
            {
                "nodeSelector": None,
                "resources": {"requests": {"cpu": "100m", "memory": "2Gi"}, "limits": {"cpu": "2", "memory": "2Gi"}},
            },
        ),
    ],
    ids=["gpu", "builtin-default"],
)
def test_compute_properties_shape(make: Any, expected: dict[str, Any]) -> None:
    assert make().to_compute_properties() == expected


# --------------------------------------------------------------------------------- defaultinstancetype
DOC_LIST = "list-example"


@pytest.mark.parametrize(
    ("types", "name", "expected_name", "expected_requests"),
    [
        ([], None, DEFAULT_NAME, {"cpu": "100m", "memory": "2Gi"}),  # built-in default
        ([], "", DEFAULT_NAME, {"cpu": "100m", "memory": "2Gi"}),
        ([], DEFAULT_NAME, DEFAULT_NAME, {"cpu": "100m", "memory": "2Gi"}),
        ("single", None, DEFAULT_NAME, {"cpu": "100m", "memory": "2Gi"}),
        ("single", DEFAULT_NAME, DEFAULT_NAME, {"cpu": "100m", "memory": "2Gi"}),
        ("single", "myinstancetypename", "myinstancetypename", {"cpu": "700m", "memory": "1500Mi"}),
        (DOC_LIST, None, DEFAULT_NAME, {"cpu": "1", "memory": "1Gi"}),  # the user's definition overrides
        (DOC_LIST, DEFAULT_NAME, DEFAULT_NAME, {"cpu": "1", "memory": "1Gi"}),
        (DOC_LIST, "cpusmall", "cpusmall", {"cpu": "100m", "memory": "100Mi"}),
        (DOC_LIST, "CpuSmall", "cpusmall", {"cpu": "100m", "memory": "100Mi"}),
        (DOC_LIST, "defaultInstanceType", DEFAULT_NAME, {"cpu": "1", "memory": "1Gi"}),
    ],
)
def test_resolve_instance_type(
    types: Any, name: str | None, expected_name: str, expected_requests: dict[str, str]
) -> None:
    available = {"single": DOC_SINGLE_YAML, DOC_LIST: DOC_LIST_YAML}
    loaded = load_instance_types(available[types]) if types else []
    chosen = resolve_instance_type(loaded, name)
    assert (chosen.name, chosen.requests) == (expected_name, expected_requests)


def test_builtin_default_matches_the_document() -> None:
    default = builtin_default_instance_type()
    assert default.requests == {"cpu": "100m", "memory": "2Gi"}
    assert default.limits == {"cpu": "2", "memory": "2Gi"}
    assert (default.cpu_request_millicores, default.cpu_limit_millicores, default.gpu_limit) == (100, 2000, 0)
    assert default.node_selector is None
    default.requests["cpu"] = "1"  # each call returns a fresh copy
    assert builtin_default_instance_type().requests["cpu"] == "100m"


@pytest.mark.parametrize(
    ("source", "name", "fragment"),
    [
        (DOC_LIST_YAML, "gpularge", "instance type 'gpularge' is not defined; known instance types: cpusmall, "),
        (DOC_SINGLE_YAML, "nope", "known instance types: defaultinstancetype, myinstancetypename"),
        ("", "cpusmall", "known instance types: defaultinstancetype"),
    ],
)
def test_resolve_unknown_name_lists_known_names(source: str, name: str, fragment: str) -> None:
    with _raises(fragment):
        resolve_instance_type(load_instance_types(source), name)


def test_resolve_refuses_duplicates() -> None:
    types = load_instance_types(DOC_LIST_YAML)
    with _raises("instance type 'cpusmall': metadata.name is defined more than once"):
        resolve_instance_type([*types, types[0]], "cpusmall")


# ----------------------------------------------------------------------------- resources against an instance type
GPU_TYPE = "myinstancetypename"  # limits: cpu 1, memory 2Gi, 1 GPU
CPU_TYPE = "cpusmall"  # limits: cpu 1, memory 1Gi, 0 GPU


def _type(name: str) -> InstanceType:
    types = load_instance_types(DOC_SINGLE_YAML) + load_instance_types(DOC_LIST_YAML)
    return resolve_instance_type(types, name)


@pytest.mark.parametrize(
    ("type_name", "resources"),
    [
        (GPU_TYPE, None),  # no resources section: the instance type's own resources are used
        (GPU_TYPE, {}),
        (GPU_TYPE, {"requests": {"cpu": "500m", "memory": "1Gi"}}),  # limits are optional without GPU
        (GPU_TYPE, {"requests": {"cpu": "1", "memory": "2Gi"}}),  # equal to the instance type's limits: warned
        (GPU_TYPE, {"requests": {"cpu": "0.1", "memory": "0.2Gi"}, "limits": {"cpu": "0.2", "memory": "0.5Gi"}}),
        (
            GPU_TYPE,
            {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "2Gi", "nvidia.com/gpu": 1}},
        ),
        (
            GPU_TYPE,
            {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "2Gi", "nvidia.com/gpu": "1"}},
        ),
        (GPU_TYPE, {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"nvidia.com/gpu": 0}}),  # no GPU wanted
        (GPU_TYPE, {"requests": {"cpu": "1", "memory": "1Mi"}}),  # 1 MiB >= 1 MB
        (GPU_TYPE, {"requests": {"cpu": "1", "memory": "1M"}}),  # under 1Mi: warned
        (GPU_TYPE, {"instance_type": GPU_TYPE, "requests": {"cpu": "1", "memory": "1Gi"}}),  # other keys ignored
        (CPU_TYPE, {"requests": {"cpu": "100m", "memory": "100Mi"}, "limits": {"cpu": "1", "memory": "1Gi"}}),
        (DEFAULT_NAME, {"requests": {"cpu": "1", "memory": "1Gi"}}),
    ],
)
def test_resources_fit(type_name: str, resources: dict[str, Any] | None) -> None:
    check_resources_fit(resources, _type(type_name))


REQ = {"cpu": "500m", "memory": "1Gi"}
GPU_LIMITS = {"cpu": "1", "memory": "2Gi", "nvidia.com/gpu": 1}


@pytest.mark.parametrize(
    ("type_name", "resources", "fragment"),
    [
        # requests: cpu and memory are required, non-empty, non-zero; memory >= 1 MB
        (GPU_TYPE, {"limits": GPU_LIMITS}, "resources.requests is required"),
        (GPU_TYPE, {"requests": {"memory": "1Gi"}}, "resources.requests.cpu is required"),
        (GPU_TYPE, {"requests": {"cpu": "1"}}, "resources.requests.memory is required"),
        (GPU_TYPE, {"requests": {"cpu": "", "memory": "1Gi"}}, "resources.requests.cpu must not be empty"),
        (GPU_TYPE, {"requests": {"cpu": "0", "memory": "1Gi"}}, "resources.requests.cpu must not be 0"),
        (GPU_TYPE, {"requests": {"cpu": "1", "memory": ""}}, "resources.requests.memory must not be empty"),
        (GPU_TYPE, {"requests": {"cpu": "1", "memory": "0"}}, "resources.requests.memory must not be 0"),
        (
            GPU_TYPE,
            {"requests": {"cpu": "1", "memory": "999k"}},
            "resources.requests.memory ('999k') must be at least 1 MB",
        ),
        (GPU_TYPE, {"requests": {"cpu": 1, "memory": "1Gi"}}, "resources.requests.cpu must be a quoted string"),
        (GPU_TYPE, {"requests": {**REQ, "nvidia.com/gpu": 1}}, "resources.requests.nvidia.com/gpu is not allowed here"),
        # limits: needed only for a GPU, then complete
        (GPU_TYPE, {"requests": REQ, "limits": {"nvidia.com/gpu": 1}}, "resources.limits.cpu is required"),
        (
            GPU_TYPE,
            {"requests": REQ, "limits": {"cpu": "1", "nvidia.com/gpu": 1}},
            "resources.limits.memory is required",
        ),
        (
            GPU_TYPE,
            {"requests": REQ, "limits": {**GPU_LIMITS, "nvidia.com/gpu": None}},
            "resources.limits.nvidia.com/gpu must not be empty",
        ),
        (
            GPU_TYPE,
            {"requests": REQ, "limits": {**GPU_LIMITS, "nvidia.com/gpu": "one"}},
            "resources.limits.nvidia.com/gpu must be an integer",
        ),
        (GPU_TYPE, {"requests": REQ, "limits": {"cpu": "0", "memory": "1Gi"}}, "resources.limits.cpu must not be 0"),
        (
            GPU_TYPE,
            {"requests": REQ, "limits": {"cpu": "1", "memory": ""}},
            "resources.limits.memory must not be empty",
        ),
        (GPU_TYPE, {"requests": REQ, "limits": ["cpu"]}, "resources.limits must be a map"),
        (GPU_TYPE, {"requests": REQ, "limits": {"cpus": "1"}}, "resources.limits.cpus is not a known field"),
        # a request above the section's own limit
        (
            GPU_TYPE,
            {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "500m", "memory": "1Gi"}},
            "resources.requests.cpu ('1') must not be greater than resources.limits.cpu",
        ),
        # nothing above the instance type's limits
        (
            GPU_TYPE,
            {"requests": {"cpu": "2", "memory": "1Gi"}},
            "resources.requests.cpu ('2') exceeds the limit of instance type 'myinstancetypename'",
        ),
        (GPU_TYPE, {"requests": {"cpu": "1", "memory": "3Gi"}}, "resources.requests.memory ('3Gi') exceeds the limit"),
        (
            GPU_TYPE,
            {"requests": REQ, "limits": {"cpu": "1500m", "memory": "2Gi"}},
            "resources.limits.cpu ('1500m') exceeds the limit",
        ),
        (
            GPU_TYPE,
            {"requests": REQ, "limits": {"cpu": "1", "memory": "4Gi"}},
            "resources.limits.memory ('4Gi') exceeds the limit",
        ),
        (
            GPU_TYPE,
            {"requests": REQ, "limits": {**GPU_LIMITS, "nvidia.com/gpu": 2}},
            "resources.limits.nvidia.com/gpu (2) exceeds the limit",
        ),
        (
            CPU_TYPE,
            {"requests": REQ, "limits": {"cpu": "1", "memory": "1Gi", "nvidia.com/gpu": 1}},
            "instance type 'cpusmall' (nvidia.com/gpu: 0)",
        ),
        (
            DEFAULT_NAME,
            {"requests": {"cpu": "3", "memory": "1Gi"}},
            "resources.requests.cpu ('3') exceeds the limit of instance type 'defaultinstancetype'",
        ),
        (GPU_TYPE, ["requests"], "resources must be a map"),
    ],
)
def test_resources_do_not_fit(type_name: str, resources: Any, fragment: str) -> None:
    with _raises(fragment):
        check_resources_fit(resources, _type(type_name))


# ------------------------------------------------------------------------------------------- MLflow minimum
def _typed(requests: dict[str, str]) -> InstanceType:
    return _instance("mlflow", requests, {"cpu": "8", "memory": "32Gi"})


@pytest.mark.parametrize(
    "target",
    [
        {"requests": {"cpu": "2", "memory": "4Gi"}},
        {"requests": {"cpu": "2000m", "memory": "4G"}},
        {"requests": {"cpu": "4", "memory": "16Gi"}, "limits": {"cpu": "4", "memory": "16Gi"}},
        _typed({"cpu": "2", "memory": "4Gi"}),
    ],
)
def test_mlflow_minimum_met(target: Any) -> None:
    check_mlflow_minimum(target)


@pytest.mark.parametrize(
    ("target", "fragment"),
    [
        ({"requests": {"cpu": "1.5", "memory": "4Gi"}}, "resources.requests.cpu ('1.5') is below the 2 CPU cores"),
        ({"requests": {"cpu": "1999m", "memory": "8Gi"}}, "resources.requests.cpu ('1999m') is below"),
        ({"requests": {"cpu": "2", "memory": "3.5Gi"}}, "resources.requests.memory ('3.5Gi') is below the 4 GB"),
        ({"requests": {"cpu": "2", "memory": "3814Mi"}}, "resources.requests.memory ('3814Mi') is below"),
        ({"requests": {"cpu": "2"}}, "resources.requests.memory is required"),
        ({"requests": {"cpu": "0", "memory": "4Gi"}}, "resources.requests.cpu must not be 0"),
        ({"limits": {"cpu": "2", "memory": "4Gi"}}, "MLflow deployment: resources.requests is required"),
        (builtin_default_instance_type(), "instance type 'defaultinstancetype': resources.requests.cpu ('100m')"),
        (_typed({"cpu": "2", "memory": "2Gi"}), "instance type 'mlflow': resources.requests.memory ('2Gi')"),
        (None, "check_mlflow_minimum needs a resources mapping or an InstanceType"),
    ],
)
def test_mlflow_minimum_not_met(target: Any, fragment: str) -> None:
    with _raises(fragment):
        check_mlflow_minimum(target)
