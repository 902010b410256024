"""Models: register a model version (az ml model YAML), idempotently."""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from airflow_azureml.exceptions import AzureMLConfigError, AzureMLError
from airflow_azureml.operators.base import AzureMLBaseOperator
from airflow_azureml.redaction import scrub

# az ml model YAML (CLI v2 "model" schema): the keys this operator sends.
_KEYS = ("$schema", "name", "version", "type", "path", "description", "tags", "properties")
MODEL_TYPES = ("custom_model", "mlflow_model", "triton_model")


def load_model_spec(model: Any) -> dict[str, Any]:
    """The model version as a dict, checked before any API call; a local ``path`` becomes absolute.

    ``version`` is required: a fixed version is what makes a re-run find the version it registered
    instead of registering another. An ``mlflow_model`` folder given locally must hold its ``MLmodel``
    file ("The folder must include the MLmodel file", Microsoft Learn, *Deploy your MLflow model to a
    batch endpoint*).
    """
    base = Path.cwd()
    if isinstance(model, (str, Path)):
        import yaml

        source = Path(model)
        if not source.is_file():
            raise AzureMLConfigError(f"model: no such YAML file {str(source)!r}")
        spec = yaml.safe_load(source.read_text())
        base = source.parent
    elif isinstance(model, Mapping):
        spec = dict(model)
    else:
        raise AzureMLConfigError(f"model must be an az ml model YAML path or a dict, not {type(model).__name__}")
    if not isinstance(spec, dict):
        raise AzureMLConfigError("model: the YAML must be a mapping of keys")
    for key in spec:
        if key not in _KEYS:
            near = difflib.get_close_matches(str(key), _KEYS, n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            raise AzureMLConfigError(f"model: unknown key {key!r}{hint}; known keys: {', '.join(_KEYS)}")
    for key in ("name", "version", "path"):
        if spec.get(key) in (None, ""):
            raise AzureMLConfigError(f"model: {key} is required")
    spec["version"] = str(spec["version"])
    spec.setdefault("type", "custom_model")
    if spec["type"] not in MODEL_TYPES:
        raise AzureMLConfigError(f"model: type {spec['type']!r} is not one of {', '.join(MODEL_TYPES)}")
    path = str(spec["path"])
    if "://" not in path and not path.startswith("azureml:"):
        local = (base / path).resolve()
        if not local.exists():
            raise AzureMLConfigError(f"model: path {path!r} does not exist ({local})")
        if spec["type"] == "mlflow_model" and not (local / "MLmodel").is_file():
            raise AzureMLConfigError(f"model: an mlflow_model path is a folder with an MLmodel file; {local} has none")
        spec["path"] = str(local)
    return spec


def _datastore_part(path: str) -> str:
    """``datastores/<name>/paths/<p>`` of a short or long azureml:// datastore URI, to compare the two forms."""
    text = path.rstrip("/")
    return text[text.find("datastores/") :] if "datastores/" in text else text


class AzureMLRegisterModelOperator(AzureMLBaseOperator):
    """Register a model version from the az ml model YAML (or a dict of its keys), idempotently.

    The version is fixed in the YAML. When it exists already with the same files (``path``) and type
    nothing is written; with other files the task fails, since a model version cannot change (register
    another version). Returns ``{"name", "version", "type", "path", "changed"}``.
    """

    template_fields: Sequence[str] = ("model",)

    def __init__(self, *, model: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.model = model

    def execute(self, context: Any) -> dict[str, Any]:
        spec = load_model_spec(self.model)  # before any API call
        from azure.ai.ml.entities import Model
        from azure.core.exceptions import ResourceNotFoundError

        ml = self.hook.get_conn()
        name, version = spec["name"], spec["version"]
        try:
            existing = ml.models.get(name=name, version=version)
        except ResourceNotFoundError:
            existing = None
        result = {"name": name, "version": version, "type": spec["type"], "path": spec["path"], "changed": False}
        if existing is not None:
            same_type = str(existing.type or "").lower() == spec["type"]
            local = "://" not in spec["path"]  # uploaded by the SDK: its blob path is the SDK's choice
            if same_type and (local or _datastore_part(str(existing.path)) == _datastore_part(spec["path"])):
                self.log.info("Model %s:%s is registered already.", name, version)
                return {**result, "path": str(existing.path)}
            raise AzureMLConfigError(
                f"Model {name}:{version} is registered already as {existing.type} at {existing.path}; "
                "a model version cannot change: register another version."
            )
        self.log.info("Registering model %s:%s (%s) from %s.", name, version, spec["type"], spec["path"])
        keys = ("name", "version", "type", "path", "description", "tags", "properties")
        fields = {k: spec.get(k) for k in keys}
        try:
            created = ml.models.create_or_update(Model(**{k: v for k, v in fields.items() if v is not None}))
        except Exception as exc:
            raise AzureMLError(f"Registering model {name}:{version} failed: {scrub(str(exc))}") from None
        return {**result, "path": str(created.path), "changed": True}
