"""Apply Kubernetes ``InstanceType`` resources to the cluster behind an Azure ML Kubernetes compute.

Azure ML places jobs and deployments on a Kubernetes compute by instance type, and reads the instance
types from ``InstanceType`` custom resources (``amlarc.azureml.com/v1alpha1``) in the attached cluster.
Azure only rejects a bad definition when it is applied, or later when something is scheduled on it, so
this operator checks every rule offline first (``airflow_azureml.instance_types``), then applies the
definitions idempotently through the official ``kubernetes`` client.

The ``kubernetes`` package is imported inside ``execute`` only: DAG parsing stays fast.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator

from airflow_azureml.exceptions import AzureMLConfigError, AzureMLError
from airflow_azureml.redaction import mask, scrub, yaml_error_summary

if TYPE_CHECKING:
    from kubernetes.client import ApiClient

    from airflow_azureml.instance_types import InstanceType

#: How often a write is retried after another writer changed the object in between (HTTP 409).
MAX_CONFLICT_RETRIES = 3
_TRUE = ("true", "1", "yes", "on")


class AzureMLApplyInstanceTypesOperator(BaseOperator):
    """Create or update ``InstanceType`` resources so that a Kubernetes compute offers exactly these sizes.

    ``instance_types`` is a YAML file path, YAML text (``InstanceType``/``InstanceTypeList`` documents, as
    in Microsoft's examples), a list of such manifests as dicts, or a list of ``InstanceType`` objects.
    All of them are validated (names unique, cpu/memory quantities, GPU only in limits, nodeSelector a
    subset of ``extension_node_selector``) before the cluster is contacted; a bad definition fails the
    task with ``AzureMLConfigError`` and is never retried.

    The cluster is reached with ``kubeconfig`` (a file path, optionally ``context``) or with the Airflow
    connection ``kubernetes_conn_id`` (extra ``kube_config_path`` or ``kube_config``, and optionally
    ``cluster_context``, as the cncf.kubernetes provider names them). TLS verification stays on.

    Idempotent: an instance type that is absent is created, one with another spec is merge-patched (keys
    that are no longer wanted are removed), and one that already matches is left alone, so re-running the
    task writes nothing. Instance types on the cluster that are not listed are kept. Returns
    ``{"created": [...], "patched": [...], "unchanged": [...]}``.
    """

    template_fields: Sequence[str] = ("instance_types", "kubeconfig", "context", "kubernetes_conn_id")
    ui_color = "#e8f4fd"

    def __init__(
        self,
        *,
        instance_types: str | os.PathLike[str] | Sequence[Mapping[str, Any]] | Sequence[InstanceType],
        kubeconfig: str | os.PathLike[str] | None = None,
        context: str | None = None,
        kubernetes_conn_id: str | None = None,
        extension_node_selector: Mapping[str, str] | None = None,
        request_timeout: float = 60.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if (kubeconfig is None) == (kubernetes_conn_id is None):
            raise AzureMLConfigError(
                "Give exactly one of kubeconfig (a kubeconfig file) or kubernetes_conn_id (an Airflow connection)."
            )
        self.instance_types = instance_types
        self.kubeconfig = os.fspath(kubeconfig) if isinstance(kubeconfig, os.PathLike) else kubeconfig
        self.context = context
        self.kubernetes_conn_id = kubernetes_conn_id
        self.extension_node_selector = dict(extension_node_selector) if extension_node_selector else None
        self.request_timeout = request_timeout

    # ------------------------------------------------------------------ validation (no network)
    def load(self) -> list[InstanceType]:
        """The definitions to apply, fully validated. Raises ``AzureMLConfigError``; sends nothing."""
        from airflow_azureml.instance_types import InstanceType, load_instance_types  # not at DAG parse

        source: Any = self.instance_types
        if isinstance(source, os.PathLike):
            source = os.fspath(source)
        if isinstance(source, InstanceType):
            source = [source]
        if isinstance(source, (list, tuple)):
            source = [item.to_custom_object() if isinstance(item, InstanceType) else item for item in source]
        types = load_instance_types(source, extension_node_selector=self.extension_node_selector)
        if not types:
            raise AzureMLConfigError(f"No instance types found in {self.instance_types!r}; nothing to apply.")
        return types

    # ------------------------------------------------------------------ cluster access
    def _kube_settings(self) -> tuple[str | None, dict[str, Any] | None, str | None]:
        """``(kubeconfig path, kubeconfig dict, context)`` from the arguments or the Airflow connection."""
        if self.kubernetes_conn_id is None:
            return self.kubeconfig, None, self.context
        from airflow.sdk import BaseHook

        extra = BaseHook.get_connection(self.kubernetes_conn_id).extra_dejson

        def get(key: str) -> Any:  # plain keys, or the prefixed form older connection forms wrote
            value = extra.get(key)
            return value if value not in (None, "") else extra.get(f"extra__kubernetes__{key}")

        where = f"connection {self.kubernetes_conn_id!r}"
        if str(get("in_cluster") or "").lower() in _TRUE:
            raise AzureMLConfigError(
                f"{where}: in_cluster is not supported here; give kube_config_path or kube_config."
            )
        if str(get("disable_verify_ssl") or "").lower() in _TRUE:
            raise AzureMLConfigError(f"{where}: disable_verify_ssl is refused; TLS verification is never turned off.")
        path, content = get("kube_config_path"), get("kube_config")
        if path and content:
            raise AzureMLConfigError(f"{where}: give kube_config_path or kube_config in extra, not both.")
        context = self.context or get("cluster_context")
        if path:
            return str(path), None, context
        if not content:
            raise AzureMLConfigError(f"{where}: extra needs kube_config_path or kube_config (kubeconfig content).")
        if isinstance(content, str):
            import yaml

            try:
                content = yaml.safe_load(content)  # JSON is YAML too
            except yaml.YAMLError as exc:
                # PyYAML's message quotes the offending line, which may hold the token: never pass it on
                raise AzureMLConfigError(
                    f"{where}: kube_config is neither JSON nor YAML ({yaml_error_summary(exc)})."
                ) from None
        if not isinstance(content, Mapping):
            raise AzureMLConfigError(
                f"{where}: kube_config must be a kubeconfig mapping, not {type(content).__name__}."
            )
        _mask_kubeconfig_secrets(content)
        return None, dict(content), context

    def _api_client(self) -> ApiClient:
        """A client for the chosen cluster and context. Loading a kubeconfig sends nothing."""
        from kubernetes import config
        from kubernetes.config.config_exception import ConfigException

        path, content, context = self._kube_settings()
        try:
            if path is not None:
                if not os.path.isfile(path):
                    raise AzureMLConfigError(f"kubeconfig file {path!r} does not exist.")
                _mask_kubeconfig_secrets(_read_kubeconfig_file(path))
                api_client = config.new_client_from_config(config_file=path, context=context, persist_config=False)
            else:
                api_client = config.new_client_from_config_dict(
                    config_dict=content, context=context, persist_config=False
                )
        except AzureMLConfigError:
            raise
        except ConfigException as exc:
            raise AzureMLConfigError(f"Invalid kubeconfig: {scrub(str(exc))}") from None
        except (TypeError, ValueError, AttributeError, KeyError) as exc:  # a malformed entry: its text may be a secret
            raise AzureMLConfigError(f"Invalid kubeconfig: a malformed entry ({type(exc).__name__}).") from None
        if not api_client.configuration.verify_ssl:
            api_client.close()
            raise AzureMLConfigError(
                "The kubeconfig's cluster sets insecure-skip-tls-verify; TLS verification is never turned off."
            )
        return api_client

    # ------------------------------------------------------------------ apply
    def execute(self, context: Any) -> dict[str, list[str]]:
        types = self.load()  # everything is validated before the cluster is contacted
        try:
            from kubernetes import client
        except ImportError:
            raise AzureMLConfigError(
                "AzureMLApplyInstanceTypesOperator needs the kubernetes package: "
                "pip install 'airflow-azureml[kubernetes]'."
            ) from None

        api_client = self._api_client()
        host = api_client.configuration.host
        result: dict[str, list[str]] = {"created": [], "patched": [], "unchanged": []}
        try:
            api = client.CustomObjectsApi(api_client)
            for instance_type in types:
                action = self._apply_one(api, instance_type, host)
                result[action].append(instance_type.name)
        finally:
            api_client.close()
        self.log.info(
            "Instance types on %s: %d created, %d patched, %d unchanged.",
            host,
            len(result["created"]),
            len(result["patched"]),
            len(result["unchanged"]),
        )
        return result

    def _apply_one(self, api: Any, instance_type: InstanceType, host: str) -> str:
        """GET, then create / merge-patch / nothing. Returns ``created``, ``patched`` or ``unchanged``."""
        from kubernetes.client.exceptions import ApiException

        from airflow_azureml.instance_types import GROUP, PLURAL, VERSION

        name = instance_type.name
        desired = instance_type.to_custom_object()
        timeout = self.request_timeout
        for attempt in range(1, MAX_CONFLICT_RETRIES + 1):
            try:
                try:
                    existing = api.get_cluster_custom_object(GROUP, VERSION, PLURAL, name, _request_timeout=timeout)
                except ApiException as exc:
                    if exc.status != 404:
                        raise
                    existing = None
                if existing is None:
                    api.create_cluster_custom_object(GROUP, VERSION, PLURAL, desired, _request_timeout=timeout)
                    self.log.info("Created instance type %s on %s.", name, host)
                    return "created"
                current_spec = existing.get("spec") or {}
                if _normalised_spec(existing) == desired["spec"]:
                    self.log.info("Instance type %s on %s already matches; nothing to do.", name, host)
                    return "unchanged"
                patch = {
                    # the resourceVersion makes the patch conditional: a concurrent change gets a 409, not lost
                    "metadata": {"resourceVersion": existing["metadata"]["resourceVersion"]},
                    "spec": merge_patch_for(current_spec, desired["spec"]),
                }
                api.patch_cluster_custom_object(GROUP, VERSION, PLURAL, name, patch, _request_timeout=timeout)
                self.log.info("Patched instance type %s on %s: %s", name, host, patch["spec"])
                return "patched"
            except ApiException as exc:
                if exc.status == 409 and attempt < MAX_CONFLICT_RETRIES:
                    self.log.info("Instance type %s changed while being applied; reading it again.", name)
                    continue
                raise _api_error(exc, name, host) from None
        raise AssertionError("unreachable")  # pragma: no cover


def _read_kubeconfig_file(path: str) -> Mapping[str, Any]:
    """The file's content; a malformed file fails without PyYAML's quote of a line (it may hold the token)."""
    import yaml

    try:
        with open(path) as handle:
            content = yaml.safe_load(handle)
    except yaml.YAMLError as exc:
        raise AzureMLConfigError(f"kubeconfig file {path!r} is not valid YAML ({yaml_error_summary(exc)}).") from None
    return content if isinstance(content, Mapping) else {}


_KUBECONFIG_SECRETS = ("token", "password", "client-key-data", "client-certificate-data")


def _mask_kubeconfig_secrets(content: Mapping[str, Any]) -> None:
    """Register the kubeconfig's credentials, so that no later log line or error can show them."""
    for entry in content.get("users") or []:
        user = entry.get("user") if isinstance(entry, Mapping) else None
        if isinstance(user, Mapping):
            for key in _KUBECONFIG_SECRETS:
                if isinstance(user.get(key), str):
                    mask(user[key])


def _normalised_spec(obj: Mapping[str, Any]) -> Any:
    """The spec as ``InstanceType.to_custom_object`` writes it, so that equal definitions compare equal."""
    from airflow_azureml.instance_types import load_instance_types

    try:
        metadata = {"name": (obj.get("metadata") or {}).get("name")}
        (model,) = load_instance_types({**obj, "metadata": metadata})
    except (AzureMLConfigError, ValueError):
        return obj.get("spec")  # not valid as stored: it differs from any valid definition
    return model.to_custom_object()["spec"]


def merge_patch_for(current: Mapping[str, Any], desired: Mapping[str, Any]) -> dict[str, Any]:
    """The RFC 7386 merge patch that turns ``current`` into ``desired`` (``None`` removes a key)."""
    patch: dict[str, Any] = {key: None for key in sorted(set(current) - set(desired))}
    for key, value in desired.items():
        old = current.get(key)
        if isinstance(value, Mapping) and isinstance(old, Mapping):
            nested = merge_patch_for(old, value)
            if nested:
                patch[key] = nested
        elif key not in current or old != value:
            patch[key] = value
    return patch


def _api_error(exc: Any, name: str, host: str) -> AzureMLError:
    """A typed error with the API server's own message (its ``Status``); invalid input is not retried."""
    import json

    message = exc.reason
    with contextlib.suppress(TypeError, ValueError, AttributeError):  # the body is a Status when the server sent one
        message = json.loads(exc.body).get("message") or message
    text = f"Applying instance type {name!r} on {host} failed: HTTP {exc.status}: {message}"
    if exc.status in (400, 422):
        return AzureMLConfigError(text)
    return AzureMLError(text)


__all__ = ["AzureMLApplyInstanceTypesOperator", "merge_patch_for"]
