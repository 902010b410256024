"""One cluster's ``InstanceType`` objects, kept as its API server keeps them.

- ``resourceVersion`` changes only when the stored object changes (spec, labels, annotations), and
  ``generation`` only when the spec changes, as in Kubernetes: a no-op update is observable. One
  counter per cluster, as etcd's revision.
- Replace needs the current ``resourceVersion`` (custom resources allow no unconditional update);
  patch and delete honour one when given.
- Bodies are validated with the emulator's own copy of Azure's rules (``emulator.azure_rules``, never
  the provider's code); a bad one is ``422 Invalid``.
"""

from __future__ import annotations

import copy
import datetime as dt
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from airflow_azureml.emulator.azure_rules import (
    API_VERSION,
    KIND,
    LIST_KIND,
    InstanceTypeRecord,
    RuleViolation,
    check_instance_type,
)
from airflow_azureml.emulator.kubernetes.api import (
    KubeError,
    conflict,
    invalid,
    not_found,
    qualified_name,
    status_details,
)
from airflow_azureml.emulator.kubernetes.patches import JSON_PATCH, MERGE_PATCH, json_patch, merge_patch


def _timestamp() -> str:
    return dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def _string_map(value: Any, where: str, name: str) -> dict[str, str] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise invalid(name, f"{where} must be a map of strings to strings", where)
    return dict(value)


def _label_matcher(selector: str) -> Callable[[Mapping[str, str]], bool]:
    """Equality-based label selectors: ``k=v``, ``k==v``, ``k!=v``, ``k``, ``!k`` joined by commas."""
    tests: list[Callable[[Mapping[str, str]], bool]] = []
    for term in filter(None, (t.strip() for t in selector.split(","))):
        if "!=" in term:
            key, value = (s.strip() for s in term.split("!=", 1))
            tests.append(lambda labels, k=key, v=value: labels.get(k) != v)
        elif "=" in term:
            key, value = (s.strip() for s in term.replace("==", "=").split("=", 1))
            tests.append(lambda labels, k=key, v=value: labels.get(k) == v)
        elif term.startswith("!"):
            tests.append(lambda labels, k=term[1:].strip(): k not in labels)
        else:
            tests.append(lambda labels, k=term: k in labels)
    return lambda labels: all(test(labels) for test in tests)


@dataclass
class KubeCluster:
    """The ``InstanceType`` objects of one Kubernetes cluster (what its API server stores)."""

    name: str
    objects: dict[str, dict[str, Any]] = field(default_factory=dict)  # name -> stored object
    #: The Azure ML extension's nodeSelector; every instance type's nodeSelector must be a subset of it.
    extension_node_selector: dict[str, str] | None = None
    #: The last resourceVersion handed out (one counter per cluster, as etcd's revision).
    revision: int = 1000

    def _next_version(self) -> str:
        self.revision += 1
        return str(self.revision)

    # ------------------------------------------------------------------ views
    def instance_types(self) -> list[InstanceTypeRecord]:
        """The stored objects as the service reads them (they were validated when written)."""
        return [_model(obj) for obj in self.objects.values()]

    def compute_instance_types(self) -> dict[str, dict[str, Any]]:
        """``properties.instanceTypes`` entries of the attached compute, keyed by name."""
        return {t.name: t.compute_entry() for t in self.instance_types()}

    def get(self, name: str) -> dict[str, Any]:
        obj = self.objects.get(name)
        if obj is None:
            raise not_found(name)
        return copy.deepcopy(obj)

    def list(self, label_selector: str = "", field_selector: str = "") -> dict[str, Any]:
        matches = _label_matcher(label_selector)
        names: set[str] | None = None
        for term in filter(None, (t.strip() for t in field_selector.split(","))):
            key, _, value = term.replace("==", "=").partition("=")
            if key.strip() != "metadata.name":
                raise KubeError(400, "BadRequest", f'field label not supported: "{key.strip()}"')
            names = {value.strip()} if names is None else names & {value.strip()}
        items = [
            copy.deepcopy(obj)
            for name, obj in sorted(self.objects.items())
            if matches(obj["metadata"].get("labels") or {}) and (names is None or name in names)
        ]
        return {
            "apiVersion": API_VERSION,
            "kind": LIST_KIND,
            "metadata": {"resourceVersion": str(self.revision)},
            "items": items,
        }

    # --------------------------------------------------------------- writes
    def _checked(self, body: Any, name_hint: str | None) -> tuple[str, dict[str, Any], dict[str, Any]]:
        """Validate a full object body; returns ``(name, spec, metadata-to-keep)``."""
        if not isinstance(body, Mapping):
            raise KubeError(400, "BadRequest", "the request body must be a JSON object")
        metadata = body.get("metadata")
        name = metadata.get("name") if isinstance(metadata, Mapping) else None
        label = name if isinstance(name, str) and name else (name_hint or "")
        if body.get("kind") not in (None, KIND) or body.get("apiVersion") not in (None, API_VERSION):
            raise KubeError(
                400,
                "BadRequest",
                f"the API version in the data ({body.get('apiVersion')}) and kind ({body.get('kind')}) do not "
                f"match the expected {API_VERSION}, Kind={KIND}",
            )
        if name_hint is not None and isinstance(name, str) and name and name != name_hint:
            raise KubeError(
                400, "BadRequest", f"the name of the object ({name}) does not match the name on the URL ({name_hint})"
            )
        try:
            model = check_instance_type(name, body.get("spec"), self.extension_node_selector)
        except RuleViolation as exc:
            raise invalid(label, str(exc)) from None
        keep = {
            "labels": _string_map(metadata.get("labels"), "metadata.labels", model.name),
            "annotations": _string_map(metadata.get("annotations"), "metadata.annotations", model.name),
        }
        return model.name, copy.deepcopy(dict(body["spec"])), {k: v for k, v in keep.items() if v}

    def create(self, body: Any, *, dry_run: bool = False) -> dict[str, Any]:
        if isinstance(body, dict) and (body.get("metadata") or {}).get("resourceVersion"):
            raise KubeError(400, "BadRequest", "resourceVersion should not be set on objects to be created")
        name, spec, keep = self._checked(body, None)
        if name in self.objects:
            raise KubeError(409, "AlreadyExists", f"{qualified_name(name)} already exists", status_details(name))
        obj = {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": {
                "name": name,
                "uid": str(uuid.uuid4()),
                "resourceVersion": str(self.revision + 1) if dry_run else self._next_version(),
                "generation": 1,
                "creationTimestamp": _timestamp(),
                **keep,
            },
            "spec": spec,
        }
        if not dry_run:
            self.objects[name] = obj
        return copy.deepcopy(obj)

    def _check_preconditions(self, name: str, current: dict[str, Any], metadata: Any, *, required: bool) -> None:
        metadata = metadata if isinstance(metadata, Mapping) else {}
        wanted_version = metadata.get("resourceVersion")
        if wanted_version in (None, ""):
            if required:  # custom resources do not allow unconditional updates
                raise invalid(name, "metadata.resourceVersion: Invalid value: 0x0: must be specified for an update")
        elif str(wanted_version) != current["metadata"]["resourceVersion"]:
            raise conflict(name)
        uid = metadata.get("uid")
        if uid not in (None, "") and uid != current["metadata"]["uid"]:
            raise conflict(name)

    def replace(self, name: str, body: Any, *, dry_run: bool = False) -> dict[str, Any]:
        current = self.objects.get(name)
        if current is None:
            raise not_found(name)
        if not isinstance(body, Mapping):
            raise KubeError(400, "BadRequest", "the request body must be a JSON object")
        self._check_preconditions(name, current, body.get("metadata"), required=True)
        _, spec, keep = self._checked(body, name)
        return self._store(current, spec, keep, dry_run=dry_run)

    def patch(self, name: str, patch: Any, content_type: str, *, dry_run: bool = False) -> dict[str, Any]:
        current = self.objects.get(name)
        if current is None:
            raise not_found(name)
        if content_type == MERGE_PATCH:
            if not isinstance(patch, dict):
                raise KubeError(400, "BadRequest", "a merge patch must be a JSON object")
            patched = merge_patch(current, patch)
        elif content_type == JSON_PATCH:
            try:
                patched = json_patch(current, patch)
            except ValueError as exc:
                raise KubeError(422, "Invalid", f"the server rejected our request due to an error: {exc}") from None
        else:
            raise KubeError(
                415,
                "UnsupportedMediaType",
                f"the body of the request was in an unknown format ({content_type or 'none'}) - "
                f"accepted media types include: {JSON_PATCH}, {MERGE_PATCH}",
            )
        if not isinstance(patched, dict):
            raise KubeError(422, "Invalid", "the patched object is not a JSON object")
        metadata = patched.get("metadata") if isinstance(patched.get("metadata"), Mapping) else {}
        if metadata.get("name") != name:
            raise invalid(name, "metadata.name: Invalid value: field is immutable", "metadata.name")
        self._check_preconditions(name, current, metadata, required=False)
        _, spec, keep = self._checked(patched, name)
        return self._store(current, spec, keep, dry_run=dry_run)

    def _store(self, current: dict[str, Any], spec: dict[str, Any], keep: dict[str, Any], *, dry_run: bool) -> dict:
        metadata = current["metadata"]
        old_keep = {k: metadata[k] for k in ("labels", "annotations") if metadata.get(k)}
        spec_changed = spec != current["spec"]
        if not spec_changed and keep == old_keep:
            return copy.deepcopy(current)  # nothing changed: same resourceVersion, nothing written
        updated = copy.deepcopy(current)
        updated["spec"] = spec
        new_meta = {k: v for k, v in metadata.items() if k not in ("labels", "annotations")}
        new_meta.update(keep)
        new_meta["resourceVersion"] = str(self.revision + 1) if dry_run else self._next_version()
        if spec_changed:
            new_meta["generation"] = int(metadata.get("generation", 1)) + 1
        updated["metadata"] = new_meta
        if not dry_run:
            self.objects[metadata["name"]] = updated
        return copy.deepcopy(updated)

    def delete(self, name: str, options: Any = None, *, dry_run: bool = False) -> dict[str, Any]:
        current = self.objects.get(name)
        if current is None:
            raise not_found(name)
        preconditions = options.get("preconditions") if isinstance(options, Mapping) else None
        self._check_preconditions(name, current, preconditions, required=False)
        if not dry_run:
            del self.objects[name]
            self._next_version()
        return copy.deepcopy(current)


def _model(obj: Mapping[str, Any]) -> InstanceTypeRecord:
    return check_instance_type(obj["metadata"]["name"], obj["spec"])
