"""Validated, normalised descriptions of the resources our operators create.

Each operator accepts a resource in three forms: keyword arguments, an ``azure.ai.ml`` entity,
or the path of an az ml CLI YAML file. All three become one spec here, validated before any API
call, so bad input fails fast with a message that names the field. Nothing here imports
``azure.ai.ml`` at module level.
"""

from __future__ import annotations

import difflib
import math
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from functools import cached_property
from pathlib import Path
from typing import Any

import yaml

from airflow_azureml.asset_refs import (
    CODE_TAG,
    ENVIRONMENT_TAG,
    asset_ref,
    code_fingerprint,
    code_ref,
    environment_fingerprint,
    inline_model_ref,
    is_local_code,
    local_path,
    model_ref,
    scoring_script_of,
    short_name,
)
from airflow_azureml.exceptions import AzureMLConfigError
from airflow_azureml.redaction import yaml_error_summary

# Azure ML naming rules (compute clusters, batch endpoints/deployments, jobs).
COMPUTE_NAME = re.compile(r"^[a-zA-Z][a-zA-Z0-9-]{0,14}[a-zA-Z0-9]$")
ENDPOINT_NAME = re.compile(r"^[a-zA-Z][a-zA-Z0-9-]{1,30}[a-zA-Z0-9]$")
DEPLOYMENT_NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9-]{1,30}[a-zA-Z0-9]$")
JOB_NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_-]{0,254}$")
DATA_URI = re.compile(r"^(azureml://|https://|abfss://|wasbs://|azureml:)")

TIERS = {"dedicated": "dedicated", "low_priority": "low_priority", "lowpriority": "low_priority"}
OUTPUT_ACTIONS = {
    "append_row": "append_row",
    "appendrow": "append_row",
    "summary_only": "summary_only",
    "summaryonly": "summary_only",
}


def check_name(kind: str, value: Any, pattern: re.Pattern[str], rule: str) -> str:
    if not isinstance(value, str) or not pattern.match(value):
        raise AzureMLConfigError(f"Invalid {kind} name {value!r}: {rule}.")
    return value


def check_compute_name(value: Any) -> str:
    return check_name(
        "compute",
        value,
        COMPUTE_NAME,
        "2-16 characters, letters, digits and '-', starting with a letter and not ending with '-'",
    )


def check_endpoint_name(value: Any) -> str:
    return check_name(
        "batch endpoint",
        value,
        ENDPOINT_NAME,
        "3-32 characters, letters, digits and '-', starting with a letter and not ending with '-'",
    )


def check_deployment_name(value: Any) -> str:
    return check_name(
        "deployment", value, DEPLOYMENT_NAME, "3-32 characters, letters, digits and '-', not ending with '-'"
    )


def check_data_uri(label: str, value: Any) -> str:
    from airflow_azureml.redaction import safe_uri

    if not isinstance(value, str) or not value.strip():
        raise AzureMLConfigError(f"{label} must be a non-empty data URI, got {value!r}.")
    if "{{" in value or "{%" in value:
        raise AzureMLConfigError(f"{label} {safe_uri(value)!r} still contains an unrendered template.")
    if not DATA_URI.match(value):
        raise AzureMLConfigError(
            f"{label} {safe_uri(value)!r} is not a data URI; use azureml://datastores/<store>/paths/<path>/ "
            "(or an https:// / abfss:// URI, or azureml:<data-asset>:<version>)."
        )
    return value


def read_yaml(path: str | Path, kind: str) -> dict[str, Any]:
    """Read an az ml CLI YAML file; malformed or missing files fail before any API call."""
    p = Path(path)
    if not p.is_file():
        raise AzureMLConfigError(f"{kind} YAML file {str(p)!r} does not exist.")
    try:
        data = yaml.safe_load(p.read_text())
    except yaml.YAMLError as exc:
        raise AzureMLConfigError(f"{kind} YAML file {str(p)!r} is not valid YAML: {yaml_error_summary(exc)}.") from None
    if not isinstance(data, dict):
        raise AzureMLConfigError(f"{kind} YAML file {str(p)!r} must contain a mapping at the top level.")
    return data


def rendered_later(value: Any) -> bool:
    """A template field's value that only ``render_template_fields`` turns into the real one: a Jinja string,
    or an ``XComArg`` (anything with ``resolve``). Checked when the task runs, not when the DAG is parsed."""
    if isinstance(value, str):
        return "{{" in value or "{%" in value
    return hasattr(value, "resolve")


def looks_like_yaml_path(value: Any) -> bool:
    return isinstance(value, (str, Path)) and str(value).lower().endswith((".yml", ".yaml"))


def reject_unknown_keys(where: str, data: Mapping[str, Any], known: Iterable[str], prefix: str = "") -> None:
    """A typo must fail here, in our words, not later in the SDK's loader (or worse, be dropped silently)."""
    allowed = sorted(set(known))
    for key in data:
        if key in allowed:
            continue
        nearest = difflib.get_close_matches(str(key), allowed, n=1, cutoff=0.6)
        hint = f"; did you mean {nearest[0]!r}?" if nearest else f"; known keys: {', '.join(allowed)}."
        raise AzureMLConfigError(f"{where}: unknown key {prefix + str(key)!r}{hint}")


def check_positive_int(label: str, value: Any) -> int:
    """An int >= 1; ``True`` is not one, although Python says ``isinstance(True, int)``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise AzureMLConfigError(f"{label} must be a positive integer, got {value!r}.")
    return value


def check_seconds(label: str, value: Any) -> float:
    """A finite number of seconds > 0, possibly rendered from a template as text (``nan``/``inf`` are not)."""
    try:
        if isinstance(value, bool):
            raise TypeError
        seconds = float(value)
    except (TypeError, ValueError):
        raise AzureMLConfigError(f"{label} must be a number of seconds, got {value!r}.") from None
    if not math.isfinite(seconds) or seconds <= 0:
        raise AzureMLConfigError(f"{label} must be a finite number of seconds > 0, got {value!r}.")
    return seconds


# Azure writes the file into the job's output folder: it must be a name, never a path. Characters that
# Windows-style file shares and the runtime's path handling refuse are refused too.
_BAD_FILE_CHARS = re.compile(r'[/\\:*?"<>|\x00-\x1f\x7f]')


def check_output_file_name(value: Any, label: str = "output_file_name") -> str:
    if (
        not isinstance(value, str)
        or not value.strip()
        or value.strip(".") == ""
        or len(value) > 255
        or _BAD_FILE_CHARS.search(value)
        or value != value.strip()
    ):
        raise AzureMLConfigError(
            f"{label} must be a plain file name (1-255 characters, no path separators, '..', "
            f'control characters or any of :*?"<>|), got {value!r}.'
        )
    return value


def check_instance_type_target(compute: Any, instance_type: str | None, *, kubernetes: bool) -> None:
    """``instance_type`` picks a Kubernetes instance type; on AmlCompute Azure has no such thing to pick."""
    if instance_type and not kubernetes:
        raise AzureMLConfigError(
            f"instance_type applies to Kubernetes compute only; {compute!r} is not. "
            "On AmlCompute the cluster's size decides the VM; remove instance_type."
        )


def _int(label: str, value: Any, minimum: int) -> int:
    try:
        number = int(value)
    except (TypeError, ValueError):
        raise AzureMLConfigError(f"{label} must be an integer, got {value!r}.") from None
    if isinstance(value, bool) or (number != value and not isinstance(value, str)):
        raise AzureMLConfigError(f"{label} must be an integer, got {value!r}.")
    if number < minimum:
        raise AzureMLConfigError(f"{label} must be >= {minimum}, got {number}.")
    return number


# --------------------------------------------------------------------------- clusters
# The keys the az ml CLI accepts in an AmlCompute YAML (its marshmallow schema, without read-only fields).
CLUSTER_YAML_KEYS = (
    "$schema",
    "name",
    "type",
    "size",
    "tier",
    "min_instances",
    "max_instances",
    "idle_time_before_scale_down",
    "location",
    "description",
    "identity",
    "tags",
    "enable_node_public_ip",
    "network_settings",
    "ssh_public_access_enabled",
    "ssh_settings",
)
CLUSTER_ARGUMENTS = (
    "name",
    "size",
    "tier",
    "min_instances",
    "max_instances",
    "idle_time_before_scale_down",
    "location",
    "description",
    "identity",
)


@dataclass(frozen=True)
class ClusterSpec:
    """An AmlCompute cluster as the az ml CLI YAML describes it."""

    name: str
    size: str = "STANDARD_DS3_v2"
    tier: str = "dedicated"
    min_instances: int = 0
    max_instances: int = 1
    idle_time_before_scale_down: int = 120
    location: str | None = None
    description: str | None = None
    identity: Any = None
    yaml_path: str | None = None

    def __post_init__(self) -> None:
        check_compute_name(self.name)
        tier = TIERS.get(str(self.tier).lower())
        if tier is None:
            raise AzureMLConfigError(f"Unknown tier {self.tier!r}: use 'dedicated' or 'low_priority'.")
        object.__setattr__(self, "tier", tier)
        lo = _int("min_instances", self.min_instances, 0)
        hi = _int("max_instances", self.max_instances, 1)
        if lo > hi:
            raise AzureMLConfigError(f"min_instances ({lo}) must be <= max_instances ({hi}).")
        idle = _int("idle_time_before_scale_down", self.idle_time_before_scale_down, 0)
        object.__setattr__(self, "min_instances", lo)
        object.__setattr__(self, "max_instances", hi)
        object.__setattr__(self, "idle_time_before_scale_down", idle)
        if not isinstance(self.size, str) or not self.size.strip():
            raise AzureMLConfigError(f"size must be a VM size such as STANDARD_DS3_v2, got {self.size!r}.")

    @classmethod
    def from_yaml(cls, path: str | Path, **overrides: Any) -> ClusterSpec:
        data = read_yaml(path, "Compute")
        kind = str(data.get("type", "amlcompute")).lower()
        if kind != "amlcompute":
            raise AzureMLConfigError(f"Compute YAML {str(path)!r} has type {kind!r}; expected amlcompute.")
        reject_unknown_keys(f"Compute YAML file {str(path)!r}", data, CLUSTER_YAML_KEYS)
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        return cls(**{**values, **overrides, "yaml_path": str(path)})

    @classmethod
    def from_entity(cls, entity: Any) -> ClusterSpec:
        return cls(
            name=entity.name,
            size=entity.size or "STANDARD_DS3_v2",
            tier=entity.tier or "dedicated",
            min_instances=entity.min_instances or 0,
            max_instances=entity.max_instances or 1,
            idle_time_before_scale_down=entity.idle_time_before_scale_down
            if entity.idle_time_before_scale_down is not None
            else 120,
            location=entity.location,
            description=entity.description,
            identity=entity.identity,
        )

    @classmethod
    def from_any(cls, compute: Any = None, **kwargs: Any) -> ClusterSpec:
        reject_unknown_keys("Cluster arguments", kwargs, CLUSTER_ARGUMENTS)
        kwargs = {k: v for k, v in kwargs.items() if v is not None}
        if compute is None:
            return cls(**kwargs)
        if looks_like_yaml_path(compute):
            return cls.from_yaml(compute, **kwargs)
        if hasattr(compute, "min_instances") and hasattr(compute, "tier"):
            return replace(cls.from_entity(compute), **kwargs) if kwargs else cls.from_entity(compute)
        raise AzureMLConfigError(
            f"compute must be an AmlCompute entity or a path to a .yml/.yaml file, got {type(compute).__name__}."
        )

    def to_entity(self) -> Any:
        from azure.ai.ml.entities import AmlCompute

        return AmlCompute(
            name=self.name,
            size=self.size,
            tier=self.tier,
            min_instances=self.min_instances,
            max_instances=self.max_instances,
            idle_time_before_scale_down=self.idle_time_before_scale_down,
            location=self.location,
            description=self.description,
            identity=self.identity,
        )

    def differences(self, existing: Any) -> dict[str, tuple[Any, Any]]:
        """Fields where an existing ``AmlCompute`` differs from this spec: ``{field: (existing, wanted)}``."""
        diffs: dict[str, tuple[Any, Any]] = {}
        checks = {
            "size": (str(existing.size or "").lower(), self.size.lower()),
            "tier": (TIERS.get(str(existing.tier or "dedicated").lower(), existing.tier), self.tier),
            "min_instances": (existing.min_instances, self.min_instances),
            "max_instances": (existing.max_instances, self.max_instances),
            "idle_time_before_scale_down": (existing.idle_time_before_scale_down, self.idle_time_before_scale_down),
        }
        for key, (have, want) in checks.items():
            if have != want:
                diffs[key] = (have, want)
        return diffs


# ------------------------------------------------------------------------ deployments
# The keys the az ml CLI accepts in a model batch deployment YAML (its marshmallow schema), by section.
DEPLOYMENT_SETTINGS_KEYS = (
    "environment_variables",
    "error_threshold",
    "instance_count",
    "logging_level",
    "max_concurrency_per_instance",
    "mini_batch_size",
    "output_action",
    "output_file_name",
    "retry_settings",
)
DEPLOYMENT_YAML_KEYS = (
    "$schema",
    "name",
    "endpoint_name",
    "description",
    "type",
    "model",
    "compute",
    "resources",
    "settings",
    "environment",
    "code_configuration",
    "tags",
    "properties",
    *DEPLOYMENT_SETTINGS_KEYS,  # the older flat form of the same settings
)
DEPLOYMENT_NESTED_KEYS = {
    "resources": ("instance_count", "instance_type", "properties"),
    "settings": DEPLOYMENT_SETTINGS_KEYS,
    "retry_settings": ("max_retries", "timeout"),
    "code_configuration": ("code", "scoring_script"),
}
_DEPLOYMENT_INTERNAL = ("yaml_path", "yaml_type", "extra", "base_path")
# An inline environment, as the az ml CLI's environment YAML has it (azureml environment schema).
ENVIRONMENT_KEYS = (
    "$schema",
    "name",
    "version",
    "description",
    "tags",
    "image",
    "conda_file",
    "build",
    "inference_config",
    "os_type",
    "datastore",
    "properties",
)
ENVIRONMENT_BUILD_KEYS = ("path", "dockerfile_path")


@dataclass(frozen=True)
class DeploymentSpec:
    """A model batch deployment, with the settings of the source documents' YAML."""

    endpoint_name: str
    name: str
    model: str
    compute: str
    instance_count: int = 1
    max_concurrency_per_instance: int = 1
    mini_batch_size: int = 10
    output_action: str = "append_row"
    output_file_name: str = "predictions.csv"
    max_retries: int = 3
    retry_timeout: int = 30
    error_threshold: int = -1
    instance_type: str | None = None
    resource_properties: dict[str, Any] | None = None
    description: str | None = None
    environment: Any = None
    code_configuration: Any = None
    tags: dict[str, Any] | None = None  # sent as written (plus our fingerprints); not compared
    yaml_path: str | None = None
    yaml_type: str = "model"
    extra: dict[str, Any] = field(default_factory=dict)
    base_path: str | None = None  # where relative code/conda paths resolve: the YAML's folder, else the cwd

    def __post_init__(self) -> None:
        check_endpoint_name(self.endpoint_name)
        check_deployment_name(self.name)
        if not isinstance(self.model, str) or not self.model.strip():
            raise AzureMLConfigError("model must name a registered model, e.g. azureml:heart-classifier@latest.")
        if not isinstance(self.compute, str) or not self.compute.strip():
            raise AzureMLConfigError("compute must name a compute target, e.g. azureml:low-pri-cluster.")
        check_compute_name(short_name(self.compute))
        for label, minimum in (
            ("instance_count", 1),
            ("max_concurrency_per_instance", 1),
            ("mini_batch_size", 1),
            ("max_retries", 0),
            ("retry_timeout", 1),
            ("error_threshold", -1),  # -1: ignore every failed file, as Azure's default
        ):
            object.__setattr__(self, label, _int(label, getattr(self, label), minimum))
        action = OUTPUT_ACTIONS.get(str(self.output_action).lower())
        if action is None:
            raise AzureMLConfigError(f"Unknown output_action {self.output_action!r}: use append_row or summary_only.")
        object.__setattr__(self, "output_action", action)
        if action == "append_row" or self.output_file_name != "predictions.csv":
            check_output_file_name(self.output_file_name)
        if self.resource_properties is not None and not isinstance(self.resource_properties, Mapping):
            raise AzureMLConfigError(f"resources.properties must be a mapping, got {self.resource_properties!r}.")
        if self.tags is not None and not isinstance(self.tags, Mapping):
            raise AzureMLConfigError(f"tags must be a mapping, got {self.tags!r}.")
        if isinstance(self.code_configuration, Mapping):
            reject_unknown_keys(
                "Batch deployment", self.code_configuration, ("code", "scoring_script"), "code_configuration."
            )
            if not self.code_configuration.get("code") or not self.code_configuration.get("scoring_script"):
                raise AzureMLConfigError("code_configuration needs both code (a folder) and scoring_script.")
        if isinstance(self.environment, Mapping):
            reject_unknown_keys("Batch deployment", self.environment, ENVIRONMENT_KEYS, "environment.")
            build = self.environment.get("build")
            if isinstance(build, Mapping):
                reject_unknown_keys("Batch deployment", build, ENVIRONMENT_BUILD_KEYS, "environment.build.")

    @property
    def base(self) -> Path:
        """The folder relative paths resolve against: the YAML's, as the az ml CLI does, else the cwd (as the SDK)."""
        if self.base_path:
            return Path(self.base_path)
        return Path(self.yaml_path).parent if self.yaml_path else Path.cwd()

    @cached_property
    def fingerprints(self) -> dict[str, str]:
        """Content hashes of a local code folder and an inline environment, as deployment tags.

        The service keeps neither in a form we can compare before writing (it names the uploaded copy),
        so the operator records these tags on every write and compares them on the next run. Computed
        from local files only, before any API call; a missing folder or conda file fails here.
        """
        found = {
            CODE_TAG: code_fingerprint(self.code_configuration, self.base),
            ENVIRONMENT_TAG: environment_fingerprint(self.environment, self.base),
        }
        return {k: v for k, v in found.items() if v is not None}

    @classmethod
    def from_yaml(cls, path: str | Path, **overrides: Any) -> DeploymentSpec:
        data = read_yaml(path, "Batch deployment")
        where = f"Batch deployment YAML file {str(path)!r}"
        reject_unknown_keys(where, data, DEPLOYMENT_YAML_KEYS)
        for section, keys in DEPLOYMENT_NESTED_KEYS.items():
            if isinstance(data.get(section), Mapping):
                reject_unknown_keys(where, data[section], keys, prefix=f"{section}.")
        settings = data.get("settings") or {}
        if isinstance(settings.get("retry_settings"), Mapping):
            reject_unknown_keys(
                where, settings["retry_settings"], DEPLOYMENT_NESTED_KEYS["retry_settings"], "settings.retry_settings."
            )
        resources = data.get("resources") or {}
        retry = settings.get("retry_settings") or data.get("retry_settings") or {}
        values: dict[str, Any] = {
            "endpoint_name": data.get("endpoint_name"),
            "name": data.get("name"),
            "model": inline_model_ref(data.get("model")),
            "compute": data.get("compute"),
            "instance_count": resources.get("instance_count", settings.get("instance_count", 1)),
            "instance_type": resources.get("instance_type") or data.get("instance_type"),
            "resource_properties": resources.get("properties"),
            "max_concurrency_per_instance": settings.get(
                "max_concurrency_per_instance", data.get("max_concurrency_per_instance", 1)
            ),
            "mini_batch_size": settings.get("mini_batch_size", data.get("mini_batch_size", 10)),
            "output_action": settings.get("output_action", data.get("output_action", "append_row")),
            "output_file_name": settings.get("output_file_name", data.get("output_file_name", "predictions.csv")),
            "max_retries": retry.get("max_retries", 3),
            "retry_timeout": retry.get("timeout", 30),
            "error_threshold": settings.get("error_threshold", data.get("error_threshold", -1)),
            "description": data.get("description"),
            # compared as written; the entity sent is built by the SDK's own loader (relative paths, inline assets)
            "environment": data.get("environment"),
            "code_configuration": data.get("code_configuration"),
            "tags": data.get("tags"),
            "yaml_path": str(path),
            "yaml_type": str(data.get("type", "model")).lower(),
        }
        return cls(**{**values, **overrides})

    @classmethod
    def from_entity(cls, entity: Any) -> DeploymentSpec:
        settings = getattr(entity, "settings", None) or entity
        retry = getattr(settings, "retry_settings", None)
        resources = getattr(entity, "resources", None)
        instance_count = getattr(resources, "instance_count", None) or getattr(settings, "instance_count", None) or 1
        model = (
            entity.model
            if isinstance(entity.model, str)
            else f"azureml:{entity.model.name}@latest"
            if getattr(entity.model, "version", None) is None
            else f"azureml:{entity.model.name}:{entity.model.version}"
        )
        threshold = getattr(settings, "error_threshold", None)
        return cls(
            endpoint_name=entity.endpoint_name,
            name=entity.name,
            model=model,
            compute=entity.compute,
            instance_count=instance_count,
            max_concurrency_per_instance=getattr(settings, "max_concurrency_per_instance", None) or 1,
            mini_batch_size=getattr(settings, "mini_batch_size", None) or 10,
            output_action=str(getattr(settings, "output_action", None) or "append_row"),
            output_file_name=getattr(settings, "output_file_name", None) or "predictions.csv",
            max_retries=getattr(retry, "max_retries", 3) if retry else 3,
            retry_timeout=getattr(retry, "timeout", 30) if retry else 30,
            error_threshold=-1 if threshold is None else threshold,
            instance_type=getattr(resources, "instance_type", None),
            resource_properties=getattr(resources, "properties", None) or None,
            description=entity.description,
            environment=getattr(entity, "environment", None),
            code_configuration=getattr(entity, "code_configuration", None),
            tags=dict(getattr(entity, "tags", None) or {}) or None,
            base_path=str(getattr(entity, "_base_path", None) or "") or None,  # the SDK resolves code against it
        )

    @classmethod
    def from_any(cls, deployment: Any = None, **kwargs: Any) -> DeploymentSpec:
        known = [f.name for f in fields(cls) if f.name not in _DEPLOYMENT_INTERNAL]
        reject_unknown_keys("Deployment arguments", kwargs, known)
        kwargs = {k: v for k, v in kwargs.items() if v is not None}
        if deployment is None:
            return cls(**kwargs)
        if looks_like_yaml_path(deployment):
            return cls.from_yaml(deployment, **kwargs)
        if hasattr(deployment, "endpoint_name") and hasattr(deployment, "compute"):
            spec = cls.from_entity(deployment)
            return replace(spec, **kwargs) if kwargs else spec
        raise AzureMLConfigError(
            f"deployment must be a BatchDeployment entity or a .yml/.yaml path, got {type(deployment).__name__}."
        )

    def to_entity(self) -> Any:
        from azure.ai.ml.entities import (
            BatchRetrySettings,
            ModelBatchDeployment,
            ModelBatchDeploymentSettings,
            ResourceConfiguration,
        )

        resources = ResourceConfiguration(
            instance_count=self.instance_count,
            instance_type=self.instance_type,
            properties=dict(self.resource_properties) if self.resource_properties else None,
        )
        as_written = self.yaml_path is not None  # YAML values are raw; the operator takes the loader's entities
        tags = {**{str(k): str(v) for k, v in (self.tags or {}).items()}, **self.fingerprints}
        return ModelBatchDeployment(
            name=self.name,
            endpoint_name=self.endpoint_name,
            description=self.description,
            tags=tags or None,
            model=self.model[len("azureml:") :] if self.model.startswith("azureml:") else self.model,
            compute=short_name(self.compute),
            environment=None if as_written else self.environment_to_send(self.environment),
            code_configuration=None if as_written else self.code_to_send(self.code_configuration),
            resources=resources,
            settings=ModelBatchDeploymentSettings(
                max_concurrency_per_instance=self.max_concurrency_per_instance,
                mini_batch_size=self.mini_batch_size,
                output_action=self.output_action,
                output_file_name=self.output_file_name,
                retry_settings=BatchRetrySettings(max_retries=self.max_retries, timeout=self.retry_timeout),
                error_threshold=self.error_threshold,
            ),
        )

    def code_to_send(self, code_configuration: Any) -> Any:
        """The code configuration with a local folder made absolute, so the SDK uploads the folder we hashed.

        The SDK resolves a relative ``code`` against the deployment entity's base path (the worker's cwd for
        an entity built here), not against the YAML's folder as the az ml CLI does.
        """
        if code_configuration is None:
            return None
        if isinstance(code_configuration, Mapping):  # the YAML's shape, given as operator arguments
            from azure.ai.ml.entities import CodeConfiguration

            code_configuration = CodeConfiguration(
                code=code_configuration.get("code"), scoring_script=code_configuration.get("scoring_script")
            )
        code = getattr(code_configuration, "code", None)
        if not isinstance(code, (str, os.PathLike)) or not is_local_code(code) or Path(code).is_absolute():
            return code_configuration
        from azure.ai.ml.entities import CodeConfiguration

        return CodeConfiguration(
            code=str(local_path(code, self.base).resolve()), scoring_script=code_configuration.scoring_script
        )

    def environment_to_send(self, environment: Any) -> Any:
        """An inline environment given as the YAML's mapping becomes the SDK's entity (its conda file resolved
        against the YAML's folder, else the cwd, as its fingerprint was); a reference or an entity goes as is."""
        if not isinstance(environment, Mapping):
            return environment
        from azure.ai.ml.entities import Environment

        fields = {str(k): v for k, v in environment.items() if k != "$schema"}
        conda = fields.get("conda_file")
        if isinstance(conda, (str, os.PathLike)):
            fields["conda_file"] = str(local_path(conda, self.base).resolve())
        build = fields.get("build")
        if isinstance(build, Mapping):
            from azure.ai.ml.entities import BuildContext

            path = build.get("path")
            if isinstance(path, (str, os.PathLike)) and not str(path).startswith(("http://", "https://", "azureml:")):
                path = str(local_path(path, self.base).resolve())
            fields["build"] = BuildContext(path=path, dockerfile_path=build.get("dockerfile_path"))
        return Environment(**fields)

    def wanted_model(self, latest_model_version: str | None = None) -> str:
        """``name:version``; ``@latest`` becomes the version the caller resolved (``name@latest`` if unknown)."""
        name, version = model_ref(self.model)
        if version is None:
            version = latest_model_version
        return f"{name}:{version}" if version is not None else f"{name}@latest"

    def differences(self, existing: Any, *, latest_model_version: str | None = None) -> dict[str, tuple[Any, Any]]:
        """Compare with an existing deployment as the service returns it: ``{setting: (existing, wanted)}``.

        Every setting that changes what the deployment does counts (model name and version, environment,
        code, compute, resources, mini-batch, retry, output and error settings); the description does not.
        ``latest_model_version`` is the version ``@latest`` resolves to now, so a new model version counts.
        A local code folder or an inline environment compares by its fingerprint against the tag the
        operator wrote last time; a missing tag counts as a change.
        """
        settings = getattr(existing, "settings", None) or existing  # read back flat; entities nest settings
        retry = getattr(settings, "retry_settings", None)
        resources = getattr(existing, "resources", None)
        if isinstance(resources, Mapping):
            res_count, res_type, res_props = (
                resources.get("instance_count"),
                resources.get("instance_type"),
                resources.get("properties"),
            )
        else:
            res_count = getattr(resources, "instance_count", None)
            res_type = getattr(resources, "instance_type", None)
            res_props = getattr(resources, "properties", None)
        have_action = OUTPUT_ACTIONS.get(str(getattr(settings, "output_action", "")).lower().replace(" ", ""))
        have_model_name, have_version = model_ref(existing.model)
        have_threshold = getattr(settings, "error_threshold", None)
        have_tags = getattr(existing, "tags", None) or {}
        have_env = getattr(existing, "environment", None)
        have_code = getattr(existing, "code_configuration", None)
        checks = {
            "compute": (short_name(existing.compute or ""), short_name(self.compute)),
            "model": (
                f"{have_model_name}:{have_version}" if have_version else f"{have_model_name}@latest",
                self.wanted_model(latest_model_version),
            ),
            "environment": (
                ("inline", have_tags.get(ENVIRONMENT_TAG) if have_env else None)
                if ENVIRONMENT_TAG in self.fingerprints
                else asset_ref(have_env, "environments"),
                ("inline", self.fingerprints[ENVIRONMENT_TAG])
                if ENVIRONMENT_TAG in self.fingerprints
                else asset_ref(self.environment, "environments"),
            ),
            "code_configuration": (
                ("local", have_tags.get(CODE_TAG) if have_code else None, scoring_script_of(have_code))
                if CODE_TAG in self.fingerprints
                else code_ref(have_code),
                ("local", self.fingerprints[CODE_TAG], scoring_script_of(self.code_configuration))
                if CODE_TAG in self.fingerprints
                else code_ref(self.code_configuration),
            ),
            "instance_count": (res_count, self.instance_count),
            "instance_type": (res_type or None, self.instance_type or None),
            "resource_properties": (dict(res_props or {}), dict(self.resource_properties or {})),
            "max_concurrency_per_instance": (
                getattr(settings, "max_concurrency_per_instance", None),
                self.max_concurrency_per_instance,
            ),
            "mini_batch_size": (getattr(settings, "mini_batch_size", None), self.mini_batch_size),
            "output_action": (have_action, self.output_action),
            "output_file_name": (getattr(settings, "output_file_name", None), self.output_file_name),
            "max_retries": (getattr(retry, "max_retries", None), self.max_retries),
            "retry_timeout": (getattr(retry, "timeout", None), self.retry_timeout),
            # Azure's default is -1; the service may leave it out of what it returns
            "error_threshold": (-1 if have_threshold is None else have_threshold, self.error_threshold),
        }
        return {k: v for k, v in checks.items() if v[0] != v[1]}
