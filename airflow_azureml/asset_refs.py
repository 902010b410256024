"""References to Azure ML assets (models, code, environments), and the content fingerprints of local ones.

A deployment names its model, code and environment by reference or defines them inline; the operators compare
what they want with what Azure holds, so each reference is reduced to a comparable form here, and a local code
folder or an inline environment to a fingerprint of its content (Azure renames them when it stores them).
Nothing here imports ``azure.ai.ml``.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from airflow_azureml.exceptions import AzureMLConfigError
from airflow_azureml.redaction import yaml_error_summary


def short_name(ref: Any) -> str:
    """``azureml:name``, ``azureml:/subscriptions/.../computes/name`` or ``name`` -> ``name``."""
    text = str(ref or "")
    if text.startswith("azureml:"):
        text = text[len("azureml:") :]
    return text.rstrip("/").rsplit("/", 1)[-1]


def _arm_name_version(text: str, collection: str) -> tuple[str, str | None] | None:
    """``.../<collection>/<name>/versions/<version>`` -> ``(name, version)``; None when not such an id."""
    marker = f"/{collection}/"
    if marker not in text:
        return None
    parts = text.split(marker, 1)[1].strip("/").split("/")
    return parts[0], parts[2] if len(parts) >= 3 and parts[1] == "versions" else None


def model_ref(ref: Any) -> tuple[str, str | None]:
    """``(name, version)`` of a model reference; version None for ``@latest`` or a bare name."""
    if ref is None:
        return "", None
    if not isinstance(ref, str):
        version = getattr(ref, "version", None)
        return str(getattr(ref, "name", ref)), None if version is None else str(version)
    text = ref[len("azureml:") :] if ref.startswith("azureml:") else ref
    arm = _arm_name_version(text, "models")
    if arm is not None:
        return arm
    if "@" in text:
        return text.split("@", 1)[0], None
    name, _, version = text.partition(":")
    return name, version or None


def asset_ref(value: Any, collection: str) -> Any:
    """A comparable form of an environment (or code) reference: ``name:version`` for a registered asset.

    An inline definition (a dict from YAML, or an anonymous entity) compares by its own content, so
    against the service's registered id it always counts as a change: an update that may be needless,
    never a change that is missed. ``DeploymentSpec.differences`` compares inline ones by fingerprint.
    """
    if value is None or value == "":
        return None
    if isinstance(value, str):
        text = value[len("azureml:") :] if value.startswith("azureml:") else value
        arm = _arm_name_version(text, collection)
        if arm is not None:
            return f"{arm[0]}:{arm[1]}" if arm[1] else f"{arm[0]}@latest"
        return text
    name = value.get("name") if isinstance(value, Mapping) else getattr(value, "name", None)
    version = value.get("version") if isinstance(value, Mapping) else getattr(value, "version", None)
    anonymous = getattr(value, "_is_anonymous", False)
    if name and not anonymous:
        return f"{name}:{version}" if version is not None else f"{name}@latest"
    if isinstance(value, Mapping):
        return ("inline", tuple(sorted((str(k), str(v)) for k, v in value.items())))
    return ("inline", getattr(value, "image", None), str(getattr(value, "conda_file", None)), id(value))


def code_ref(value: Any) -> Any:
    """``(code asset, scoring script)`` of a code configuration; a local folder compares as inline content."""
    if value is None:
        return None
    if isinstance(value, Mapping):
        code, script = value.get("code"), value.get("scoring_script")
    else:
        code, script = getattr(value, "code", None), getattr(value, "scoring_script", None)
    if is_local_code(code):
        code = ("local", str(getattr(code, "path", code)))  # uploaded on write; compared by fingerprint
    elif code is not None:
        code = asset_ref(code, "codes")
    return code, script


def inline_model_ref(value: Any) -> Any:
    """A deployment YAML's model as a reference: an inline definition by its name (``@latest``), else as given."""
    if isinstance(value, dict):  # inline model definition in YAML: keep its name
        return f"azureml:{value.get('name')}@latest" if value.get("name") else None
    return value


# ------------------------------------------------------------ content fingerprints (local code, inline environments)
# Deployment tags (Azure stores and returns them) holding what the operator last wrote: the service renames a
# local code folder and an inline environment when it stores them, so their content is compared through these.
CODE_TAG = "airflow_azureml.code_sha256"
ENVIRONMENT_TAG = "airflow_azureml.environment_sha256"
_IGNORE_FILES = (".amlignore", ".gitignore")  # the SDK's choice: the first found in the folder's root wins


def scoring_script_of(code_configuration: Any) -> Any:
    """The scoring script of a code configuration, given as a YAML mapping or an SDK entity."""
    if isinstance(code_configuration, Mapping):
        return code_configuration.get("scoring_script")
    return getattr(code_configuration, "scoring_script", None)


def is_local_code(code: Any) -> bool:
    """Whether ``code_configuration.code`` is a local path the SDK uploads (not a registered code asset)."""
    if code is not None and not isinstance(code, (str, os.PathLike)):  # a ``Code`` entity: local when it has a path
        return getattr(code, "path", None) is not None and not getattr(code, "id", None)
    return isinstance(code, (str, os.PathLike)) and not str(code).startswith(
        ("azureml:", "/subscriptions/", "https://", "http://")
    )


def local_path(value: Any, base: Path) -> Path:
    """``value`` resolved against ``base`` unless it is absolute, as the az ml CLI resolves YAML paths."""
    path = Path(os.fspath(value)).expanduser()
    return path if path.is_absolute() else base / path


def _ignored(root: Path) -> Any:
    """A matcher for the patterns of the folder's ``.amlignore`` (else ``.gitignore``), as the SDK applies them."""
    for name in _IGNORE_FILES:
        if (root / name).is_file():
            import pathspec  # a dependency of azure-ai-ml, which uses it for the same files

            lines = (root / name).read_text(encoding="utf-8", errors="replace").splitlines()
            return pathspec.PathSpec.from_lines("gitwildmatch", [line.rstrip() for line in lines if line])
    return None


def folder_digest(path: Path) -> str:
    """sha256 over every uploaded file's relative path and bytes, in a fixed order; the location does not count."""
    digest = hashlib.sha256(b"airflow_azureml folder v1\0")
    if path.is_file():
        files = [(path.name, path)]
    else:
        spec = _ignored(path)
        files = []
        for folder, dirs, names in os.walk(path, followlinks=True):
            dirs.sort()
            for name in names:
                full = Path(folder) / name
                rel = full.relative_to(path).as_posix()
                if spec is None or not spec.match_file(rel):
                    files.append((rel, full))
    for rel, full in sorted(files):
        digest.update(f"{rel}\0{full.stat().st_size}\0".encode())  # the size ends one file's bytes
        with full.open("rb") as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                digest.update(chunk)
    return digest.hexdigest()


def code_fingerprint(code_configuration: Any, base: Path) -> str | None:
    """sha256 of a local code folder (files and bytes) and the scoring script; None for a registered code asset."""
    if code_configuration is None:
        return None
    code = (
        code_configuration.get("code")
        if isinstance(code_configuration, Mapping)
        else getattr(code_configuration, "code", None)
    )
    if not is_local_code(code):
        return None
    path = local_path(getattr(code, "path", code), base)
    if not path.exists():
        raise AzureMLConfigError(f"code_configuration.code {str(path)!r} does not exist.")
    canonical = {"code": folder_digest(path), "scoring_script": scoring_script_of(code_configuration)}
    return hashlib.sha256(json.dumps(canonical, sort_keys=True).encode()).hexdigest()


def _conda_content(value: Any, base: Path) -> Any:
    """A conda file's parsed content (what the SDK sends); a path is read, relative to ``base``."""
    if not isinstance(value, (str, os.PathLike)):
        return value
    path = local_path(value, base)
    if not path.is_file():
        raise AzureMLConfigError(f"conda_file {str(path)!r} does not exist.")
    try:
        return yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise AzureMLConfigError(f"conda_file {str(path)!r} is not valid YAML: {yaml_error_summary(exc)}.") from None


def environment_fingerprint(environment: Any, base: Path) -> str | None:
    """sha256 of an inline environment's definition (image, conda content, build folder, inference config...).

    None for a registered environment (``azureml:name:version`` or a named entity), which compares by id.
    The conda file counts by content, not path; a YAML dict and the same ``Environment`` entity hash alike.
    """
    if not isinstance(asset_ref(environment, "environments"), tuple):  # a reference, or a named entity
        return None
    if isinstance(environment, Mapping):
        definition = {str(k): v for k, v in environment.items()}
    else:
        definition = {
            key: getattr(environment, key, None)
            for key in ("image", "conda_file", "build", "inference_config", "os_type", "description", "tags")
        }
    definition["conda_file"] = _conda_content(definition.get("conda_file"), base)
    build = definition.get("build")
    if build is not None:
        build_path = build.get("path") if isinstance(build, Mapping) else getattr(build, "path", None)
        dockerfile = (
            build.get("dockerfile_path") if isinstance(build, Mapping) else getattr(build, "dockerfile_path", None)
        )
        if build_path and not str(build_path).startswith(("http://", "https://", "azureml:")):
            folder = local_path(build_path, base)
            if not folder.exists():
                raise AzureMLConfigError(f"environment build path {str(folder)!r} does not exist.")
            build_path = folder_digest(folder)
        definition["build"] = {"path": build_path, "dockerfile_path": dockerfile}
    canonical = {k: v for k, v in definition.items() if v not in (None, {}, "")}
    return hashlib.sha256(json.dumps(canonical, sort_keys=True, default=str).encode()).hexdigest()
