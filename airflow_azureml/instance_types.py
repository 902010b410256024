"""Kubernetes instance types for Azure ML Kubernetes compute (AKS or Arc clusters attached to a workspace).

On a Kubernetes compute, Azure ML places a job or deployment with an ``InstanceType`` custom resource
(``amlarc.azureml.com/v1alpha1``). The resource holds a ``nodeSelector`` and cpu/memory/GPU requests and
limits. Azure rejects a bad definition only when it is applied, or later when a job is scheduled.
This module checks the same rules offline, before anything is sent, and raises ``AzureMLConfigError``
(never retried) with the instance type and the field in the message.

Some rules of the source article read two ways (``AMBIGUOUS_RULES``; docs/instance_types.md). This
module refuses only what both readings refuse; input that only the strict reading refuses is accepted
with a warning on this module's logger that names the rule and both readings, because Azure ML may
refuse it (the emulator takes the strict reading).

Pure Python: no network access, and neither ``kubernetes`` nor ``azure.ai.ml`` is imported.
"""

from __future__ import annotations

import logging
import math
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

if TYPE_CHECKING:
    from airflow_azureml.exceptions import AzureMLConfigError

log = logging.getLogger(__name__)


def _config_error(message: str) -> AzureMLConfigError:
    """The provider's config error, imported on use: these rules also run in the emulator,
    which must not pay Airflow's import time (~1.7 s) just to start."""
    from airflow_azureml.exceptions import AzureMLConfigError

    return AzureMLConfigError(message)


GROUP = "amlarc.azureml.com"
VERSION = "v1alpha1"
PLURAL = "instancetypes"  # cluster-scoped: use the cluster (not namespaced) custom-objects calls
API_VERSION = f"{GROUP}/{VERSION}"
KIND = "InstanceType"
LIST_KIND = "InstanceTypeList"
DEFAULT_NAME = "defaultinstancetype"

CPU = "cpu"
MEMORY = "memory"
GPU = "nvidia.com/gpu"

#: A deployment's ``resources.requests.memory`` may not be below 1 MB: refused below 1M (both readings),
#: warned below 1Mi (the strict reading; ``AMBIGUOUS_RULES["request-memory-minimum"]``).
MIN_REQUEST_MEMORY_BYTES = 10**6
STRICT_MIN_REQUEST_MEMORY_BYTES = 2**20
#: MLflow deployments need at least 2 CPU cores and 4 GB of requested memory: refused below 4G (both
#: readings), warned below 4Gi (the strict reading; ``AMBIGUOUS_RULES["mlflow-memory"]``).
MLFLOW_MIN_CPU_MILLICORES = 2000
MLFLOW_MIN_MEMORY_BYTES = 4 * 10**9
STRICT_MLFLOW_MIN_MEMORY_BYTES = 4 * 2**30


@dataclass(frozen=True)
class AmbiguousRule:
    """A rule of source document 003 with two plausible readings (docs/instance_types.md)."""

    name: str
    #: What the document says, and where.
    source: str
    #: The reading that accepts more: what it refuses, this module refuses.
    lenient: str
    #: The reading that refuses more (the emulator's): input in between is accepted with a warning.
    strict: str


AMBIGUOUS_RULES: dict[str, AmbiguousRule] = {
    rule.name: rule
    for rule in (
        AmbiguousRule(
            "mlflow-memory",
            'MLflow deployments need "at least 2 CPU cores and 4 GB of memory" requested',
            "4 GB is 4G, 4,000,000,000 bytes",
            "4 GB is 4Gi, 4,294,967,296 bytes (the article calls the default type's 2Gi '2 GB')",
        ),
        AmbiguousRule(
            "request-memory-minimum",
            'resources.requests.memory "may not be less than 1 MB"',
            "1 MB is 1M, 1,000,000 bytes",
            "1 MB is 1Mi, 1,048,576 bytes",
        ),
        AmbiguousRule(
            "under-instance-type-limits",
            "a deployment's resources must be under (\u4e0b\u56de\u308b) the instance type's limits",
            "not above: cpu or memory equal to the instance type's limit is allowed",
            "strictly below: cpu or memory equal to the instance type's limit is refused",
        ),
        AmbiguousRule(
            "node-selector-subset",
            "an instance type's nodeSelector must be a subset of the Azure ML extension's nodeSelector",
            "compatible: no key with another value than the extension's; other keys narrow the nodes further "
            "(workloads run on nodes that match both selectors)",
            "every key=value pair must also be in the extension's nodeSelector",
        ),
    )
}


def _warn_ambiguous(rule_name: str, where: str, problem: str) -> None:
    """Accept input that only the strict reading of an ambiguous rule refuses, and say so."""
    rule = AMBIGUOUS_RULES[rule_name]
    log.warning(
        "%s %s. Source document 003 rule %r is ambiguous (%s): the lenient reading (%s) accepts this, the "
        "strict reading (%s) refuses it. Accepted here, but Azure ML may refuse it; the emulator takes the "
        "strict reading (docs/instance_types.md).",
        where,
        problem,
        rule.name,
        rule.source,
        rule.lenient,
        rule.strict,
    )


# Kubernetes object names (cluster-scoped custom resources): a DNS-1123 subdomain.
_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_NAME_MAX = 253
_CPU_RE = re.compile(r"^(?P<num>\d+(?:\.\d+)?)(?P<milli>m)?$")
_MEMORY_RE = re.compile(r"^(?P<num>\d+(?:\.\d+)?)(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E|m)?$")
_MEMORY_MULTIPLIERS: dict[str, int] = {
    "": 1,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
}
_SPEC_KEYS = frozenset({"nodeSelector", "resources"})
_RESOURCES_KEYS = frozenset({"requests", "limits"})


def _fail(where: str, problem: str) -> AzureMLConfigError:
    return _config_error(f"{where} {problem}")


def _check_present(value: Any, where: str) -> None:
    """Quantities are strings in the CRD; a YAML ``cpu: 1`` is an int and would be refused by Azure."""
    if value is None:
        raise _fail(where, "is required")
    if not isinstance(value, str):
        raise _fail(where, f'must be a quoted string such as "{value}", not {type(value).__name__} {value!r}')


def parse_cpu(value: str | int | float, field: str = "cpu") -> int:
    """Parse a Kubernetes CPU quantity (``"100m"``, ``"1"``, ``"0.5"``) into millicores.

    Zero, empty, negative values and a precision finer than 1m are refused: Azure refuses them too.
    ``field`` is how the value is named in the error message.
    """
    if isinstance(value, bool) or not isinstance(value, (str, int, float)):
        raise _fail(field, f'must be a CPU quantity string such as "100m" or "1", not {value!r}')
    text = str(value)
    if not text.strip():
        raise _fail(field, "must not be empty")
    match = _CPU_RE.match(text)
    if match is None:
        raise _fail(field, f'{text!r} is not a CPU quantity: use millicores ("100m") or cores ("1", "0.5")')
    millis = Decimal(match["num"]) * (1 if match["milli"] else 1000)
    if millis == 0:
        raise _fail(field, "must not be 0")
    if millis != millis.to_integral_value():
        raise _fail(field, f"{text!r} is finer than 1m (one millicore), which Kubernetes does not allow")
    return int(millis)


def parse_memory(value: str | int, field: str = "memory") -> int:
    """Parse a Kubernetes memory quantity (``"1024Mi"``, ``"2Gi"``, ``"1G"``, ``"1048576"``) into bytes.

    Binary (Ki Mi Gi Ti Pi Ei) and decimal (k M G T P E) suffixes are accepted; fractions round up to a
    whole byte as Kubernetes does. The ``m`` suffix (thousandths of a byte) is refused: it is always a typo.
    """
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise _fail(field, f'must be a memory quantity string such as "2Gi", not {value!r}')
    text = str(value)
    if not text.strip():
        raise _fail(field, "must not be empty")
    match = _MEMORY_RE.match(text)
    if match is None:
        raise _fail(field, f'{text!r} is not a memory quantity: use a number and a suffix such as "1024Mi" or "2Gi"')
    suffix = match["suffix"] or ""
    if suffix == "m":
        raise _fail(field, f"{text!r} uses 'm' (thousandths of a byte); write 'Mi' or 'M' for mebibytes or megabytes")
    amount = Decimal(match["num"])
    if amount == 0:
        raise _fail(field, "must not be 0")
    return math.ceil(amount * _MEMORY_MULTIPLIERS[suffix])


def _parse_gpu(value: Any, where: str, *, allow_digit_string: bool = False) -> int:
    """GPUs are whole devices. The CRD wants a YAML integer; the SDK's ``ResourceSettings`` sends a string."""
    if value is None or (isinstance(value, str) and not value.strip()):
        raise _fail(where, "must not be empty")
    if allow_digit_string and isinstance(value, str) and value.isdigit():
        return int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise _fail(where, f"must be an integer, not {value!r}")
    if value < 0:
        raise _fail(where, f"must not be negative (got {value})")
    return value


def _check_string_map(value: Any, where: str) -> dict[str, str]:
    if not isinstance(value, Mapping):
        raise _fail(where, f"must be a map of strings to strings, not {type(value).__name__}")
    for key, item in value.items():
        if not isinstance(key, str) or not key:
            raise _fail(where, f"has a key {key!r}; keys must be non-empty strings")
        if not isinstance(item, str):
            raise _fail(f"{where}.{key}", f'must be a string (quote it: "{item}"), not {type(item).__name__}')
    return dict(value)


def _check_keys(section: Mapping[str, Any], allowed: Iterable[str], where: str) -> None:
    """Unknown resource names are refused, so that a typo such as ``memroy`` is not silently dropped."""
    allowed = list(allowed)
    for key in section:
        if key == GPU and GPU not in allowed:
            raise _fail(f"{where}.{GPU}", "is not allowed here: a GPU count may only be set in limits")
        if key not in allowed:
            raise _fail(f"{where}.{key}", f"is not a known field (expected one of: {', '.join(allowed)})")


@dataclass
class InstanceType:
    """One ``InstanceType`` custom resource. The quantities keep the strings as written.

    The definition is checked when the object is built, so the numeric helpers are always safe to call.
    ``nvidia.com/gpu: null`` (as in the built-in default) means "no GPU" and is dropped.
    """

    name: str
    node_selector: dict[str, str] | None = None
    requests: dict[str, str] = field(default_factory=dict)
    limits: dict[str, str | int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.node_selector, Mapping):
            self.node_selector = dict(self.node_selector) or None
        if isinstance(self.requests, Mapping):
            self.requests = dict(self.requests)
        if isinstance(self.limits, Mapping):
            self.limits = {k: v for k, v in self.limits.items() if not (k == GPU and v is None)}
        self.validate()

    @property
    def _where(self) -> str:
        return f"instance type {self.name!r}:"

    def validate(self) -> None:
        """Check this definition alone; cross-definition rules are in ``validate_instance_types``."""
        where = self._where
        if not isinstance(self.name, str) or not self.name:
            raise _fail(f"instance type {self.name!r}: metadata.name", "is required")
        if len(self.name) > _NAME_MAX or not _NAME_RE.match(self.name):
            raise _fail(
                f"{where} metadata.name",
                "must be a Kubernetes object name: lowercase letters, digits, '-' and '.', "
                "starting and ending with a letter or digit, at most 253 characters",
            )
        if self.node_selector is not None:
            _check_string_map(self.node_selector, f"{where} nodeSelector")
        for section_name, section, allowed in (
            ("requests", self.requests, (CPU, MEMORY)),
            ("limits", self.limits, (CPU, GPU, MEMORY)),
        ):
            at = f"{where} resources.{section_name}"
            if not isinstance(section, Mapping):
                raise _fail(at, f"must be a map, not {type(section).__name__}")
            _check_keys(section, allowed, at)
            _check_present(section.get(CPU), f"{at}.{CPU}")
            parse_cpu(section[CPU], f"{at}.{CPU}")
            _check_present(section.get(MEMORY), f"{at}.{MEMORY}")
            parse_memory(section[MEMORY], f"{at}.{MEMORY}")
        if GPU in self.limits:
            _parse_gpu(self.limits[GPU], f"{where} resources.limits.{GPU}")
        _check_requests_within_limits(self.requests, self.limits, f"{where} resources.requests", "resources.limits")

    @property
    def cpu_request_millicores(self) -> int:
        return parse_cpu(self.requests[CPU])

    @property
    def cpu_limit_millicores(self) -> int:
        return parse_cpu(self.limits[CPU])

    @property
    def memory_request_bytes(self) -> int:
        return parse_memory(self.requests[MEMORY])

    @property
    def memory_limit_bytes(self) -> int:
        return parse_memory(self.limits[MEMORY])

    @property
    def gpu_limit(self) -> int:
        """Number of NVIDIA GPUs; 0 when the instance type has none."""
        value = self.limits.get(GPU)
        return 0 if value is None else _parse_gpu(value, f"{self._where} resources.limits.{GPU}")

    def _spec(self, quantity: type[str] = str) -> dict[str, Any]:
        """The ``spec`` in the document's key order; ``quantity`` lets the YAML dumper quote the strings."""
        spec: dict[str, Any] = {}
        if self.node_selector:
            spec["nodeSelector"] = dict(self.node_selector)
        limits: dict[str, Any] = {CPU: quantity(self.limits[CPU])}
        if GPU in self.limits:
            limits[GPU] = self.gpu_limit
        limits[MEMORY] = quantity(self.limits[MEMORY])
        spec["resources"] = {
            "requests": {CPU: quantity(self.requests[CPU]), MEMORY: quantity(self.requests[MEMORY])},
            "limits": limits,
        }
        return spec

    def to_custom_object(self) -> dict[str, Any]:
        """The body for the Kubernetes custom-objects API (``GROUP``/``VERSION``/``PLURAL``, cluster-scoped)."""
        return {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": self.name}, "spec": self._spec()}

    def to_compute_properties(self) -> dict[str, Any]:
        """The entry under ``properties.instanceTypes[name]`` of an ARM Kubernetes compute.

        The REST schema (``InstanceResourceSchema``) types every resource value as a string, so the GPU
        count is sent as ``"1"``.
        """
        limits: dict[str, str] = {CPU: str(self.limits[CPU]), MEMORY: str(self.limits[MEMORY])}
        if GPU in self.limits:
            limits[GPU] = str(self.gpu_limit)
        return {
            "nodeSelector": dict(self.node_selector) if self.node_selector else None,
            "resources": {
                "requests": {CPU: str(self.requests[CPU]), MEMORY: str(self.requests[MEMORY])},
                "limits": limits,
            },
        }


def builtin_default_instance_type() -> InstanceType:
    """What the Azure ML extension creates as ``defaultinstancetype`` when a cluster is attached.

    It is not a visible custom resource (``kubectl get instancetype`` does not list it), but every client
    shows it. A custom resource with the same name replaces it. The article's prose says the limit is
    8 GB of memory, but its YAML (followed here) says ``2Gi``.
    """
    return InstanceType(
        name=DEFAULT_NAME,
        node_selector=None,
        requests={CPU: "100m", MEMORY: "2Gi"},
        limits={CPU: "2", MEMORY: "2Gi"},
    )


def _check_requests_within_limits(
    requests: Mapping[str, Any], limits: Mapping[str, Any], where: str, limits_name: str
) -> None:
    """Kubernetes refuses a pod whose request is above its limit; so does Azure ML."""
    for key, parse in ((CPU, parse_cpu), (MEMORY, parse_memory)):
        if requests.get(key) is None or limits.get(key) is None:
            continue
        if parse(requests[key]) > parse(limits[key]):
            raise _fail(
                f"{where}.{key}",
                f"({requests[key]!r}) must not be greater than {limits_name}.{key} ({limits[key]!r})",
            )


# ----------------------------------------------------------------------------------------------- loading
def _documents(source: Any) -> list[Any]:
    if isinstance(source, Mapping):
        return [source]
    if isinstance(source, (list, tuple)):
        return list(source)
    if isinstance(source, os.PathLike):
        return _parse_yaml(Path(source).read_text(encoding="utf-8"), str(source))
    if isinstance(source, str):
        if "\n" not in source and source.strip():
            try:
                is_file = Path(source).is_file()
            except OSError:
                is_file = False
            if is_file:
                return _parse_yaml(Path(source).read_text(encoding="utf-8"), source)
            if source.strip().endswith((".yaml", ".yml", ".json")):
                raise _config_error(f"instance type file {source!r} does not exist")
        return _parse_yaml(source, "YAML text")
    raise _config_error(
        f"instance types must be YAML text, a path, a mapping or a list of mappings, not {type(source).__name__}"
    )


def _parse_yaml(text: str, origin: str) -> list[Any]:
    try:
        return [doc for doc in yaml.safe_load_all(text) if doc is not None]
    except yaml.YAMLError as exc:
        raise _config_error(f"{origin}: invalid YAML: {exc}") from exc


def _from_item(item: Any, where: str, *, header_required: bool) -> InstanceType:
    if not isinstance(item, Mapping):
        raise _fail(where, f"must be a map, not {type(item).__name__}")
    if header_required or "apiVersion" in item or "kind" in item:
        if item.get("apiVersion") != API_VERSION:
            raise _fail(f"{where}: apiVersion", f"must be {API_VERSION!r}, not {item.get('apiVersion')!r}")
        if item.get("kind") != KIND:
            raise _fail(f"{where}: kind", f"must be {KIND!r}, not {item.get('kind')!r}")
    metadata = item.get("metadata")
    name = metadata.get("name") if isinstance(metadata, Mapping) else None
    if not isinstance(name, str) or not name:
        raise _fail(f"{where}: metadata.name", "is required and must be a non-empty string")
    at = f"instance type {name!r}:"
    spec = item.get("spec")
    if not isinstance(spec, Mapping):
        raise _fail(f"{at} spec", "is required and must be a map")
    _check_keys(spec, sorted(_SPEC_KEYS), f"{at} spec")
    resources = spec.get("resources")
    if not isinstance(resources, Mapping):
        raise _fail(f"{at} resources", "is required and must be a map with requests and limits")
    _check_keys(resources, sorted(_RESOURCES_KEYS), f"{at} resources")
    for section in ("requests", "limits"):
        if not isinstance(resources.get(section), Mapping):
            raise _fail(f"{at} resources.{section}", "is required and must be a map")
    node_selector = spec.get("nodeSelector")
    if node_selector is not None:
        node_selector = _check_string_map(node_selector, f"{at} nodeSelector")
    return InstanceType(
        name=name,
        node_selector=node_selector,
        requests=dict(resources["requests"]),
        limits=dict(resources["limits"]),
    )


def _from_document(doc: Any, where: str) -> list[InstanceType]:
    if not isinstance(doc, Mapping):
        raise _fail(where, f"must be a map, not {type(doc).__name__}")
    kind = doc.get("kind")
    if kind == "List" and doc.get("apiVersion") == "v1":  # what `kubectl get instancetype -o yaml` prints
        items = doc.get("items") or []
        return [_from_item(it, f"{where} items[{i}]", header_required=True) for i, it in enumerate(items)]
    if doc.get("apiVersion") != API_VERSION:
        raise _fail(f"{where}: apiVersion", f"must be {API_VERSION!r}, not {doc.get('apiVersion')!r}")
    if kind == KIND:
        return [_from_item(doc, where, header_required=True)]
    if kind == LIST_KIND:
        items = doc.get("items")
        if items is None:
            return []
        if not isinstance(items, list):
            raise _fail(f"{where}: items", f"must be a list, not {type(items).__name__}")
        return [_from_item(it, f"{where} items[{i}]", header_required=False) for i, it in enumerate(items)]
    raise _fail(f"{where}: kind", f"must be {KIND!r} or {LIST_KIND!r}, not {kind!r}")


def load_instance_types(
    source: str | os.PathLike[str] | Mapping[str, Any] | Sequence[Mapping[str, Any]],
    *,
    extension_node_selector: Mapping[str, str] | None = None,
) -> list[InstanceType]:
    """Read ``InstanceType``/``InstanceTypeList`` manifests (YAML text, a file, a dict, or several documents).

    Everything is validated, including unique names, so a bad file fails here rather than at apply time.
    """
    types: list[InstanceType] = []
    for index, doc in enumerate(_documents(source)):
        types.extend(_from_document(doc, f"document {index}"))
    validate_instance_types(types, extension_node_selector)
    return types


def validate_instance_types(
    types: Sequence[InstanceType], extension_node_selector: Mapping[str, str] | None = None
) -> None:
    """Check each definition, name uniqueness, and that each nodeSelector fits the extension's.

    When the Azure ML extension was installed with a nodeSelector, it applies to every instance type, and an
    instance type's own nodeSelector must be a subset of it. An empty or missing extension selector imposes
    nothing. Another value for one of the extension's keys is refused; a key the extension's selector does
    not have is only warned about (``AMBIGUOUS_RULES["node-selector-subset"]``).
    """
    ext = _check_string_map(extension_node_selector, "extension nodeSelector") if extension_node_selector else {}
    seen: set[str] = set()
    for item in types:
        if not isinstance(item, InstanceType):
            raise _config_error(f"expected InstanceType objects, got {type(item).__name__}")
        item.validate()
        if item.name in seen:
            raise _fail(f"instance type {item.name!r}: metadata.name", "is defined more than once; names are unique")
        seen.add(item.name)
        if not ext or not item.node_selector:
            continue
        for key, value in item.node_selector.items():
            if key not in ext:
                _warn_ambiguous(
                    "node-selector-subset",
                    f"instance type {item.name!r}: nodeSelector.{key}",
                    f"is not in the extension's nodeSelector {ext}",
                )
            elif ext[key] != value:
                raise _fail(
                    f"instance type {item.name!r}: nodeSelector.{key}",
                    f"is {value!r} but the extension's nodeSelector has {ext[key]!r}; it must be a subset of it",
                )


# ----------------------------------------------------------------------------------------------- dumping
class _Quoted(str):
    """A quantity string that the dumper writes in double quotes, as in Microsoft's examples."""


class _Dumper(yaml.SafeDumper):
    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        # Indent list items under ``items:`` as the document does.
        return super().increase_indent(flow, False)


_Dumper.add_representer(_Quoted, lambda d, v: d.represent_scalar("tag:yaml.org,2002:str", str(v), style='"'))


def dump_instance_types(types: Sequence[InstanceType], as_list: bool = True) -> str:
    """YAML for ``kubectl apply``: one ``InstanceTypeList``, or one ``InstanceType`` document per type."""
    validate_instance_types(types)
    if as_list:
        items = [{"metadata": {"name": t.name}, "spec": t._spec(_Quoted)} for t in types]
        docs: list[dict[str, Any]] = [{"apiVersion": API_VERSION, "kind": LIST_KIND, "items": items}]
    else:
        docs = [{**t.to_custom_object(), "spec": t._spec(_Quoted)} for t in types]
    return yaml.dump_all(docs, Dumper=_Dumper, sort_keys=False, default_flow_style=False, allow_unicode=True)


# ----------------------------------------------------------------------------------------------- selection
def resolve_instance_type(types: Sequence[InstanceType], name: str | None = None) -> InstanceType:
    """The instance type a job or deployment gets: the named one, else ``defaultinstancetype``.

    A user-defined ``defaultinstancetype`` overrides the one the extension created. Names are matched
    case-insensitively, as the workspace emulator does; custom-resource names are lowercase, so no two
    definitions can collide.
    """
    validate_instance_types(types)
    by_name = {t.name.lower(): t for t in types}
    if name is None or name == "":
        return by_name.get(DEFAULT_NAME) or builtin_default_instance_type()
    if not isinstance(name, str):
        raise _config_error(f"instance_type must be a string, not {type(name).__name__}")
    found = by_name.get(name.lower())
    if found is not None:
        return found
    if name.lower() == DEFAULT_NAME:
        return builtin_default_instance_type()
    known = sorted({t.name for t in types} | {DEFAULT_NAME})
    raise _config_error(f"instance type {name!r} is not defined; known instance types: {', '.join(known)}")


def check_resources_fit(resources: Mapping[str, Any] | None, instance_type: InstanceType) -> None:
    """Check a deployment's/job's ``resources`` section (``requests``/``limits``) against an instance type.

    Requests need cpu and memory (memory at least 1 MB). Limits are needed only for a GPU, and then
    cpu, memory and ``nvidia.com/gpu`` are all required. No value may exceed the instance type's limits.
    A memory request under 1Mi, or a cpu or memory value equal to the instance type's limit, is accepted
    with a warning: the article's "1 MB" and "under the limits" read two ways (``AMBIGUOUS_RULES``). The GPU
    count may equal the instance type's: GPUs are whole devices.
    Without a resources section, the instance type's own resources are used, so there is nothing to check.
    Keys other than requests/limits (such as ``instance_type``) are ignored.
    """
    if not resources:
        return
    if not isinstance(resources, Mapping):
        raise _config_error(f"resources must be a map, not {type(resources).__name__}")
    where = f"resources for instance type {instance_type.name!r}: resources"
    requests = resources.get("requests")
    if not isinstance(requests, Mapping):
        raise _fail(f"{where}.requests", "is required (with cpu and memory) when a resources section is given")
    _check_keys(requests, (CPU, MEMORY), f"{where}.requests")
    _check_present(requests.get(CPU), f"{where}.requests.{CPU}")
    _check_present(requests.get(MEMORY), f"{where}.requests.{MEMORY}")
    asked: dict[str, tuple[int, Any]] = {
        f"requests.{CPU}": (parse_cpu(requests[CPU], f"{where}.requests.{CPU}"), requests[CPU]),
        f"requests.{MEMORY}": (parse_memory(requests[MEMORY], f"{where}.requests.{MEMORY}"), requests[MEMORY]),
    }
    if asked[f"requests.{MEMORY}"][0] < MIN_REQUEST_MEMORY_BYTES:
        raise _fail(f"{where}.requests.{MEMORY}", f"({requests[MEMORY]!r}) must be at least 1 MB")
    if asked[f"requests.{MEMORY}"][0] < STRICT_MIN_REQUEST_MEMORY_BYTES:
        _warn_ambiguous("request-memory-minimum", f"{where}.requests.{MEMORY}", f"({requests[MEMORY]!r}) is below 1Mi")
    limits = resources.get("limits")
    gpus = 0
    if limits is not None:
        if not isinstance(limits, Mapping):
            raise _fail(f"{where}.limits", f"must be a map, not {type(limits).__name__}")
        _check_keys(limits, (CPU, GPU, MEMORY), f"{where}.limits")
        if GPU in limits:
            gpus = _parse_gpu(limits[GPU], f"{where}.limits.{GPU}", allow_digit_string=True)
        for key, parse in ((CPU, parse_cpu), (MEMORY, parse_memory)):
            if key not in limits and gpus == 0:
                continue  # limits are optional unless a GPU is wanted
            _check_present(limits.get(key), f"{where}.limits.{key}")
            asked[f"limits.{key}"] = (parse(limits[key], f"{where}.limits.{key}"), limits[key])
        _check_requests_within_limits(requests, limits, f"{where}.requests", "resources.limits")
    capacity = {CPU: instance_type.cpu_limit_millicores, MEMORY: instance_type.memory_limit_bytes}
    for path, (amount, text) in asked.items():
        key = path.split(".", 1)[1]
        if amount > capacity[key]:
            raise _fail(
                f"{where}.{path}",
                f"({text!r}) exceeds the limit of instance type {instance_type.name!r} "
                f"({key}: {instance_type.limits[key]!r})",
            )
        if amount == capacity[key]:
            _warn_ambiguous(
                "under-instance-type-limits",
                f"{where}.{path}",
                f"({text!r}) equals the limit of instance type {instance_type.name!r} "
                f"({key}: {instance_type.limits[key]!r})",
            )
    if gpus > instance_type.gpu_limit:
        raise _fail(
            f"{where}.limits.{GPU}",
            f"({gpus}) exceeds the limit of instance type {instance_type.name!r} ({GPU}: {instance_type.gpu_limit})",
        )


def check_mlflow_minimum(resources_or_instance_type: InstanceType | Mapping[str, Any]) -> None:
    """MLflow model deployments fail with less than 2 CPU cores and 4 GB of requested memory.

    Pass the deployment's ``resources`` section, or, when it has none, the instance type it runs on.
    Refused below 4G; between 4G and 4Gi accepted with a warning (``AMBIGUOUS_RULES["mlflow-memory"]``).
    """
    target = resources_or_instance_type
    if isinstance(target, InstanceType):
        where = f"instance type {target.name!r}: resources.requests"
        cpu_text, memory_text = target.requests[CPU], target.requests[MEMORY]
        cpu, memory = target.cpu_request_millicores, target.memory_request_bytes
    elif isinstance(target, Mapping):
        where = "MLflow deployment: resources.requests"
        requests = target.get("requests")
        if not isinstance(requests, Mapping):
            raise _fail(where, "is required (with cpu and memory); or pass the instance type instead")
        cpu_text, memory_text = requests.get(CPU), requests.get(MEMORY)
        _check_present(cpu_text, f"{where}.{CPU}")
        _check_present(memory_text, f"{where}.{MEMORY}")
        cpu, memory = parse_cpu(cpu_text, f"{where}.{CPU}"), parse_memory(memory_text, f"{where}.{MEMORY}")
    else:
        raise _config_error(
            f"check_mlflow_minimum needs a resources mapping or an InstanceType, not {type(target).__name__}"
        )
    if cpu < MLFLOW_MIN_CPU_MILLICORES:
        raise _fail(f"{where}.{CPU}", f"({cpu_text!r}) is below the 2 CPU cores MLflow deployments need")
    if memory < MLFLOW_MIN_MEMORY_BYTES:
        raise _fail(f"{where}.{MEMORY}", f"({memory_text!r}) is below the 4 GB of memory MLflow deployments need")
    if memory < STRICT_MLFLOW_MIN_MEMORY_BYTES:
        _warn_ambiguous("mlflow-memory", f"{where}.{MEMORY}", f"({memory_text!r}) is 4 GB but below 4Gi")


__all__ = [
    "AMBIGUOUS_RULES",
    "API_VERSION",
    "DEFAULT_NAME",
    "GROUP",
    "PLURAL",
    "VERSION",
    "AmbiguousRule",
    "InstanceType",
    "builtin_default_instance_type",
    "check_mlflow_minimum",
    "check_resources_fit",
    "dump_instance_types",
    "load_instance_types",
    "parse_cpu",
    "parse_memory",
    "resolve_instance_type",
    "validate_instance_types",
]


def instance_type_from_arm(name: str, entry: Mapping[str, Any] | None) -> InstanceType:
    """An ``InstanceType`` from one ARM ``instanceTypes`` entry of a Kubernetes compute.

    The service writes quantities as strings (GPU too) and absent values as null; both are
    normalised before the usual validation.
    """
    entry = entry or {}
    resources: dict[str, dict[str, Any]] = {}
    for section in ("requests", "limits"):
        values: dict[str, Any] = {}
        for key, value in ((entry.get("resources") or {}).get(section) or {}).items():
            if value in (None, ""):
                continue
            values[key] = int(value) if key == GPU and str(value).isdigit() else value
        resources[section] = values
    spec: dict[str, Any] = {"resources": resources}
    if entry.get("nodeSelector"):
        spec["nodeSelector"] = entry["nodeSelector"]
    (model,) = load_instance_types(
        {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": name.lower()}, "spec": spec}
    )
    return model


def from_compute_properties(instance_types: Mapping[str, Any] | None) -> list[InstanceType]:
    """All instance types of a Kubernetes compute's ARM JSON (``properties.properties.instanceTypes``),
    with the built-in ``defaultinstancetype`` when the compute lists none."""
    types = [instance_type_from_arm(name, entry) for name, entry in (instance_types or {}).items()]
    if not any(t.name == DEFAULT_NAME for t in types):
        types.append(builtin_default_instance_type())
    return types
