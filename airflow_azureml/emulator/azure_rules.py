"""Azure ML's instance-type and resources rules, as the emulated service applies them.

Written from the Azure ML article "Create and manage instance types for efficient utilization of compute
resources" (source document 003) and Kubernetes' quantity and object-name rules, independently of the
provider's offline checks (``airflow_azureml.instance_types``): the emulator must never share the
provider's code, or a mistake in those rules could never show up as a failing test.
``tests/integration/test_emulator_protocol.py`` holds the two implementations against each other.

The article's rules:

- An ``InstanceType`` needs a name (unique in the cluster), ``resources.requests`` and
  ``resources.limits`` with ``cpu`` and ``memory``: strings, never 0 or empty. CPU is millicores
  (``"100m"``) or cores (``"1"`` = ``1000m``); memory a number and a suffix (``"1024Mi"``).
  ``nvidia.com/gpu`` is an integer, and only in ``limits``. ``nodeSelector`` is a string map.
- When the extension was installed with a nodeSelector, every instance type's nodeSelector must be a
  subset of it: each key=value pair of the instance type's is also the extension's.
- MLflow model deployments need at least 2 CPU cores and 4 GB of memory requested, or the deployment
  fails (``check_mlflow_minimum``).
- A deployment's or job's ``resources`` section needs ``requests.cpu`` and ``requests.memory``
  (memory at least 1 MB). ``limits`` may be left out unless a GPU is wanted; then ``limits.cpu``,
  ``limits.memory`` and ``limits.nvidia.com/gpu`` are all needed. The resources must be under
  (``下回る``) the instance type's limits.

Where the document reads two ways, this module takes the strict reading (docs/instance_types.md lists
each rule; the provider refuses only what both readings refuse and warns in between):

- "4 GB" is 4Gi (4 x 2^30 bytes): the article itself calls the default type's ``2Gi`` "2 GB".
- "1 MB" is 1Mi (2^20 bytes).
- "under the instance type's limits" is strictly below, for cpu and memory (requests and limits alike).
  A GPU count may equal the instance type's: GPUs are whole devices, and "strictly fewer" would leave
  the article's own one-GPU instance type with no GPU for any deployment that declares its resources.
- "a subset of the extension's nodeSelector" is a subset of its key=value pairs: a key the extension's
  selector does not have is refused.

Kubernetes adds: object names are DNS-1123 subdomains (lowercase, at most 253 characters), CPU cannot be
finer than 1m, and a request above its limit is invalid. Unknown fields are refused (strict field
validation), so that a typo such as ``memroy`` does not silently vanish.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

GROUP = "amlarc.azureml.com"
VERSION = "v1alpha1"
PLURAL = "instancetypes"
KIND = "InstanceType"
LIST_KIND = "InstanceTypeList"
API_VERSION = f"{GROUP}/{VERSION}"
DEFAULT_NAME = "defaultinstancetype"
GPU_KEY = "nvidia.com/gpu"

#: "Memory may not be less than 1 MB", read strictly as 1Mi.
ONE_MEGABYTE = 1024**2
_OBJECT_NAME = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_QUANTITY = re.compile(r"(?P<number>[0-9]+(\.[0-9]+)?|\.[0-9]+)(?P<suffix>[A-Za-z]*)")
_BYTE_SUFFIXES = {
    "": 1,
    "k": 1000,
    "M": 1000**2,
    "G": 1000**3,
    "T": 1000**4,
    "P": 1000**5,
    "E": 1000**6,
    "Ki": 1024,
    "Mi": 1024**2,
    "Gi": 1024**3,
    "Ti": 1024**4,
    "Pi": 1024**5,
    "Ei": 1024**6,
}


class RuleViolation(ValueError):
    """A definition the service refuses; the message names the field, as the service's does."""


@dataclass(frozen=True)
class InstanceTypeRecord:
    """A stored instance type as the service reads it: quantities as written, plus their values."""

    name: str
    requests: dict[str, str] = field(default_factory=dict)
    limits: dict[str, Any] = field(default_factory=dict)
    node_selector: dict[str, str] | None = None

    @property
    def cpu_limit(self) -> int:
        return cpu_millicores(self.limits["cpu"], "limits.cpu")

    @property
    def memory_limit(self) -> int:
        return memory_bytes(self.limits["memory"], "limits.memory")

    @property
    def gpu_limit(self) -> int:
        value = self.limits.get(GPU_KEY)
        return 0 if value is None else int(value)

    def compute_entry(self) -> dict[str, Any]:
        """The entry under an ARM Kubernetes compute's ``properties.instanceTypes`` (values are strings)."""
        limits = {"cpu": str(self.limits["cpu"]), "memory": str(self.limits["memory"])}
        if GPU_KEY in self.limits:
            limits[GPU_KEY] = str(self.limits[GPU_KEY])
        return {
            "nodeSelector": dict(self.node_selector) if self.node_selector else None,
            "resources": {
                "requests": {"cpu": self.requests["cpu"], "memory": self.requests["memory"]},
                "limits": limits,
            },
        }


# ------------------------------------------------------------------------------------------ quantities
def _quantity(value: Any, where: str) -> tuple[Decimal, str]:
    if not isinstance(value, str):
        raise RuleViolation(f"{where}: must be a string value, not {type(value).__name__} {value!r}")
    if value.strip() == "":
        raise RuleViolation(f"{where}: must not be empty")
    match = _QUANTITY.fullmatch(value)
    if match is None:
        raise RuleViolation(f"{where}: {value!r} is not a valid quantity")
    try:
        number = Decimal(match["number"])
    except InvalidOperation:
        raise RuleViolation(f"{where}: {value!r} is not a valid quantity") from None
    if number == 0:
        raise RuleViolation(f"{where}: must not be 0")
    return number, match["suffix"]


def cpu_millicores(value: Any, where: str = "cpu") -> int:
    """``"100m"`` -> 100, ``"1"`` -> 1000, ``"0.5"`` -> 500. Finer than 1m is refused, as Kubernetes does."""
    number, suffix = _quantity(value, where)
    if suffix not in ("", "m"):
        raise RuleViolation(f"{where}: {value!r} is not a CPU quantity (use millicores such as 100m, or cores)")
    millis = number if suffix == "m" else number * 1000
    if millis != millis.to_integral_value():
        raise RuleViolation(f"{where}: {value!r} is finer than 1m")
    return int(millis)


def memory_bytes(value: Any, where: str = "memory") -> int:
    """``"1024Mi"`` -> bytes. Fractions round up to a whole byte; the milli suffix ``m`` is refused."""
    number, suffix = _quantity(value, where)
    if suffix not in _BYTE_SUFFIXES:
        raise RuleViolation(f"{where}: {value!r} is not a memory quantity (use a number and a suffix such as 1024Mi)")
    amount = number * _BYTE_SUFFIXES[suffix]
    whole = int(amount.to_integral_value(rounding="ROUND_CEILING"))
    return whole


def _gpu_count(value: Any, where: str, *, strings_allowed: bool) -> int:
    if strings_allowed and isinstance(value, str) and value.isdigit():
        return int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise RuleViolation(f"{where}: must be an integer, not {value!r}")
    if value < 0:
        raise RuleViolation(f"{where}: must not be negative")
    return value


def _known_keys(section: Mapping[str, Any], allowed: tuple[str, ...], where: str) -> None:
    for key in section:
        if key == GPU_KEY and GPU_KEY not in allowed:
            raise RuleViolation(f"{where}.{GPU_KEY}: a GPU can only be given in limits")
        if key not in allowed:
            raise RuleViolation(f'{where}: unknown field "{key}"')


def _string_map(value: Any, where: str) -> dict[str, str]:
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and k and isinstance(v, str) for k, v in value.items()
    ):
        raise RuleViolation(f"{where}: must be a map of strings to strings")
    return dict(value)


def _section(resources: Mapping[str, Any], name: str, where: str) -> Mapping[str, Any]:
    section = resources.get(name)
    if not isinstance(section, Mapping):
        raise RuleViolation(f"{where}.{name}: is required")
    return section


# ---------------------------------------------------------------------------------------- instance types
def check_instance_type(
    name: Any, spec: Any, extension_node_selector: Mapping[str, str] | None = None
) -> InstanceTypeRecord:
    """Validate one ``InstanceType`` (its ``metadata.name`` and ``spec``) as the cluster accepts it."""
    if not isinstance(name, str) or not name:
        raise RuleViolation("metadata.name: Required value: name is required")
    if len(name) > 253 or not _OBJECT_NAME.fullmatch(name):
        raise RuleViolation(
            f"metadata.name: Invalid value: {name!r}: a lowercase RFC 1123 subdomain must consist of lower case "
            "alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character"
        )
    if not isinstance(spec, Mapping):
        raise RuleViolation("spec: Required value")
    _known_keys(spec, ("nodeSelector", "resources"), "spec")
    resources = spec.get("resources")
    if not isinstance(resources, Mapping):
        raise RuleViolation("spec.resources: Required value")
    _known_keys(resources, ("requests", "limits"), "spec.resources")
    requests = _section(resources, "requests", "spec.resources")
    limits = _section(resources, "limits", "spec.resources")
    _known_keys(requests, ("cpu", "memory"), "spec.resources.requests")
    _known_keys(limits, ("cpu", "memory", GPU_KEY), "spec.resources.limits")
    values: dict[str, int] = {}
    for section_name, section in (("requests", requests), ("limits", limits)):
        for key in ("cpu", "memory"):
            where = f"spec.resources.{section_name}.{key}"
            if key not in section or section[key] is None:
                raise RuleViolation(f"{where}: is required")
            parse = cpu_millicores if key == "cpu" else memory_bytes
            values[f"{section_name}.{key}"] = parse(section[key], where)
    kept_limits = dict(limits)
    if kept_limits.get(GPU_KEY, 0) is None:  # the built-in default's ``nvidia.com/gpu: null`` means none
        del kept_limits[GPU_KEY]
    if GPU_KEY in kept_limits:
        _gpu_count(kept_limits[GPU_KEY], f"spec.resources.limits.{GPU_KEY}", strings_allowed=False)
    for key in ("cpu", "memory"):
        if values[f"requests.{key}"] > values[f"limits.{key}"]:
            raise RuleViolation(
                f"spec.resources.requests.{key}: Invalid value: {requests[key]!r}: must be less than or equal to "
                f"{key} limit of {limits[key]!r}"
            )
    selector = None if spec.get("nodeSelector") is None else _string_map(spec["nodeSelector"], "spec.nodeSelector")
    for key, value in (selector or {}).items():
        if extension_node_selector and extension_node_selector.get(key) != value:
            raise RuleViolation(
                f"spec.nodeSelector.{key}: must be a subset of the Azure ML extension's nodeSelector "
                f"{dict(extension_node_selector)}"
            )
    return InstanceTypeRecord(
        name=name,
        requests={"cpu": requests["cpu"], "memory": requests["memory"]},
        limits=kept_limits,
        node_selector=selector or None,
    )


def from_compute_entry(name: str, entry: Mapping[str, Any] | None) -> InstanceTypeRecord:
    """An instance type from an ARM ``instanceTypes`` entry (all values strings, absent ones null)."""
    entry = entry or {}
    resources = entry.get("resources") or {}
    sections: dict[str, dict[str, Any]] = {}
    for section_name in ("requests", "limits"):
        section = {k: v for k, v in (resources.get(section_name) or {}).items() if v not in (None, "")}
        if GPU_KEY in section and isinstance(section[GPU_KEY], str) and section[GPU_KEY].isdigit():
            section[GPU_KEY] = int(section[GPU_KEY])
        sections[section_name] = section
    spec: dict[str, Any] = {"resources": sections}
    if entry.get("nodeSelector"):
        spec["nodeSelector"] = entry["nodeSelector"]
    return check_instance_type(name.lower(), spec)


# ----------------------------------------------------------------------------------------- resources
def check_resources(resources: Any, instance_type: InstanceTypeRecord) -> None:
    """A job's or deployment's ``resources`` section against the instance type it runs on.

    No section (or an empty one) means the instance type's own resources: nothing to check.
    """
    if not resources:
        return
    if not isinstance(resources, Mapping):
        raise RuleViolation("resources: must be a map")
    requests = resources.get("requests")
    if not isinstance(requests, Mapping):
        raise RuleViolation("resources.requests: is required when a resources section is given")
    _known_keys(requests, ("cpu", "memory"), "resources.requests")
    asked: dict[str, tuple[int, Any]] = {}
    for key in ("cpu", "memory"):
        if requests.get(key) is None:
            raise RuleViolation(f"resources.requests.{key}: is required")
        parse = cpu_millicores if key == "cpu" else memory_bytes
        asked[f"requests.{key}"] = (parse(requests[key], f"resources.requests.{key}"), requests[key])
    if asked["requests.memory"][0] < ONE_MEGABYTE:
        raise RuleViolation(f"resources.requests.memory: {requests['memory']!r} is less than 1 MB (1Mi)")
    limits = resources.get("limits")
    gpus = 0
    if limits is not None:
        if not isinstance(limits, Mapping):
            raise RuleViolation("resources.limits: must be a map")
        _known_keys(limits, ("cpu", "memory", GPU_KEY), "resources.limits")
        if GPU_KEY in limits:
            if limits[GPU_KEY] in (None, ""):
                raise RuleViolation(f"resources.limits.{GPU_KEY}: must not be empty")
            gpus = _gpu_count(limits[GPU_KEY], f"resources.limits.{GPU_KEY}", strings_allowed=True)
        for key in ("cpu", "memory"):
            if limits.get(key) is None:
                if gpus:
                    raise RuleViolation(f"resources.limits.{key}: is required when a GPU is requested")
                continue
            parse = cpu_millicores if key == "cpu" else memory_bytes
            asked[f"limits.{key}"] = (parse(limits[key], f"resources.limits.{key}"), limits[key])
            if asked[f"requests.{key}"][0] > asked[f"limits.{key}"][0]:
                raise RuleViolation(
                    f"resources.requests.{key}: {requests[key]!r} must be less than or equal to "
                    f"resources.limits.{key} {limits[key]!r}"
                )
    capacity = {"cpu": instance_type.cpu_limit, "memory": instance_type.memory_limit}
    for path, (amount, text) in asked.items():
        key = path.split(".", 1)[1]
        if amount > capacity[key]:
            raise RuleViolation(
                f"resources.{path}: {text!r} is above the {key} limit {instance_type.limits[key]!r} "
                f"of instance type {instance_type.name!r}"
            )
        if amount == capacity[key]:
            raise RuleViolation(
                f"resources.{path}: {text!r} is not below the {key} limit {instance_type.limits[key]!r} "
                f"of instance type {instance_type.name!r}; the resources must be less than the instance type's limits"
            )
    if gpus > instance_type.gpu_limit:
        raise RuleViolation(
            f"resources.limits.{GPU_KEY}: {gpus} is above the GPU limit {instance_type.gpu_limit} "
            f"of instance type {instance_type.name!r}"
        )


# ----------------------------------------------------------------------------------------- datastores
#: Azure ML datastore names: lowercase letters, digits and underscores (what Studio and the CLI enforce).
_DATASTORE_NAME = re.compile(r"[a-z0-9_]{1,255}")


def check_datastore_name(name: Any) -> str:
    """A datastore name as the service accepts it; anything else (``..``, ``a/b``, ``Store``) is refused."""
    if not is_datastore_name(name):
        raise RuleViolation(
            f"Datastore name {name!r} is invalid: it may contain only lowercase letters, digits and underscores."
        )
    return name


def is_datastore_name(name: Any) -> bool:
    return isinstance(name, str) and _DATASTORE_NAME.fullmatch(name) is not None


# --------------------------------------------------------------------------------- MLflow deployments
MLFLOW_MIN_CPU_MILLICORES = 2000  # source document 003: "at least 2 CPU cores"
MLFLOW_MIN_MEMORY_BYTES = 4 * 1024**3  # "and 4 GB of memory", read strictly as 4Gi


def check_mlflow_minimum(resources: Any, instance_type: InstanceTypeRecord) -> None:
    """An MLflow model deployment's requests (its ``resources`` section, else its instance type's) need
    2 CPU cores and 4 GB, or the deployment fails (source document 003)."""
    if resources:
        requests = resources.get("requests") if isinstance(resources, Mapping) else None
        if not isinstance(requests, Mapping):
            raise RuleViolation("MLflow deployment: resources.requests (cpu and memory) is required")
        where = "MLflow deployment: resources.requests"
    else:
        requests = instance_type.requests
        where = f"MLflow deployment on instance type {instance_type.name!r}: requests"
    for key in ("cpu", "memory"):
        if requests.get(key) in (None, ""):
            raise RuleViolation(f"{where}.{key}: is required")
    cpu = cpu_millicores(requests["cpu"], f"{where}.cpu")
    memory = memory_bytes(requests["memory"], f"{where}.memory")
    if cpu < MLFLOW_MIN_CPU_MILLICORES or memory < MLFLOW_MIN_MEMORY_BYTES:
        raise RuleViolation(
            f"{where}: cpu {requests['cpu']!r} and memory {requests['memory']!r}; deploying an MLflow model "
            "needs at least 2 CPU cores and 4 GB (4Gi) of memory"
        )


# -------------------------------------------------------------------------------- names of job parts
#: Azure ML job (run) names: letters, digits, '-' and '_', starting with a letter or digit, at most 255.
_JOB_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,254}")
_MAX_FILE_NAME = 255
_FORBIDDEN_IN_FILE_NAME = frozenset('/\\:*?"<>|')


def check_job_name(name: Any) -> str:
    """A job name the service accepts; anything else is refused before a job exists."""
    if not isinstance(name, str) or _JOB_NAME.fullmatch(name) is None:
        raise RuleViolation(
            f"Job name {name!r} is invalid: it may contain only letters, digits, '-' and '_', must start "
            "with a letter or digit, and may be at most 255 characters long."
        )
    return name


def check_output_file_name(name: Any) -> str:
    """``outputFileName`` is one file in the output folder: a plain name, never a path.

    Azure's own rule is not documented beyond "a file name"; least convenient case: no separators,
    no ``.``/``..``, no control or reserved characters, at most 255 characters.
    """
    if (
        not isinstance(name, str)
        or not name.strip()
        or len(name) > _MAX_FILE_NAME
        or name in (".", "..")
        or any(ch in _FORBIDDEN_IN_FILE_NAME or ord(ch) < 32 or ord(ch) == 127 for ch in name)
        or name != name.strip()
    ):
        raise RuleViolation(
            f"Invalid value {name!r} for outputFileName: expected a file name (at most 255 characters, "
            "no path separators, no '..', no control characters)."
        )
    return name
