"""Airflow Assets for Azure ML data: the ``azureml://`` URI scheme, its normalisation, and asset events.

Azure ML addresses data on a datastore with two URI forms (Microsoft Learn, "Access data in a job" /
"Create data assets"):

- ``azureml://datastores/<datastore>/paths/<path>``, relative to the workspace the job runs in;
- ``azureml://subscriptions/<sub>/resourcegroups/<rg>/workspaces/<ws>/datastores/<datastore>/paths/<path>``.

Both are Assets here, kept in the form the DAG wrote (the short form names no workspace, so two
workspaces' equal short URIs are one Asset; write the long form to tell them apart). Job output
URIs (``azureml://jobs/<job>/outputs/<name>``) are accepted too, but never emitted: they name no place.
Registered with Airflow through ``get_provider_info`` (``asset-uris``: the handler and the factory here,
the OpenLineage converter in ``airflow_azureml.openlineage``, which imports this module and never the
other way). Nothing here imports ``azure.ai.ml`` or OpenLineage at import time.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any
from urllib.parse import SplitResult, urlsplit

if TYPE_CHECKING:
    from airflow.sdk import Asset

SCHEME = "azureml"
_KEYWORDS = ("subscriptions", "resourcegroups", "workspaces", "datastores", "paths", "jobs", "outputs")
_SHORT = re.compile(r"^/?datastores/(?P<ds>[^/]+)/paths(?:/(?P<path>.*))?$", re.IGNORECASE)
_LONG = re.compile(
    r"^/?subscriptions/(?P<sub>[^/]+)/resourcegroups/(?P<rg>[^/]+)/workspaces/(?P<ws>[^/]+)"
    r"/datastores/(?P<ds>[^/]+)/paths(?:/(?P<path>.*))?$",
    re.IGNORECASE,
)
_JOB = re.compile(r"^/?jobs/[^/]+/outputs/[^/]+(?:/paths(?:/.*)?)?$", re.IGNORECASE)


@dataclass(frozen=True)
class DatastorePath:
    """A place on a workspace datastore: what an ``azureml://`` datastore URI names."""

    datastore: str
    path: str  # relative to the datastore root, no leading or trailing slash ("" for the root)
    subscription: str | None = None  # set only by the fully qualified form
    resource_group: str | None = None
    workspace: str | None = None

    @property
    def datastore_root(self) -> str:
        """``azureml://[subscriptions/../resourcegroups/../workspaces/../]datastores/<datastore>``."""
        head = ""
        if self.workspace:
            head = f"subscriptions/{self.subscription}/resourcegroups/{self.resource_group}/"
            head += f"workspaces/{self.workspace}/"
        return f"{SCHEME}://{head}datastores/{self.datastore}"

    @property
    def uri(self) -> str:
        """The normalised URI (no trailing slash), as Airflow stores the Asset."""
        return f"{self.datastore_root}/paths" + (f"/{self.path}" if self.path else "")


def datastore_uri(datastore: str, path: str = "") -> str:
    """``azureml://datastores/<datastore>/paths/<path>`` for a path relative to the datastore root."""
    if not datastore or "/" in datastore:
        raise ValueError(f"datastore must be a datastore name, got {datastore!r}.")
    return DatastorePath(datastore, _clean(path)).uri


def parse_datastore_uri(uri: str) -> DatastorePath | None:
    """The datastore and path an ``azureml://`` URI names; None for any other URI (job outputs, data assets)."""
    parts = urlsplit(str(uri))
    if parts.scheme.lower() != SCHEME or parts.query or parts.fragment:
        return None
    rest = f"{parts.netloc}{parts.path}"
    if match := _SHORT.match(rest):
        return DatastorePath(match["ds"], _clean(match["path"] or ""))
    if match := _LONG.match(rest):
        return DatastorePath(match["ds"], _clean(match["path"] or ""), match["sub"], match["rg"], match["ws"])
    return None


def _clean(path: str) -> str:
    return "/".join(part for part in path.split("/") if part)


# ------------------------------------------------------------------ Airflow's asset-uris registration
def sanitize_uri(uri: SplitResult) -> SplitResult:
    """Airflow's URI handler: Azure's keywords in lower case, no empty path segments; anything else is refused.

    Airflow has already lower-cased the scheme and dropped trailing slashes, query-less fragments and
    user info. Datastore names and paths keep their case (blob paths are case-sensitive).
    """
    rest = f"{uri.netloc}{uri.path}"
    if not (_SHORT.match(rest) or _LONG.match(rest) or _JOB.match(rest)):
        raise ValueError(
            "An azureml:// Asset URI must be azureml://datastores/<datastore>/paths/<path>, "
            "azureml://subscriptions/<sub>/resourcegroups/<rg>/workspaces/<ws>/datastores/<datastore>/paths/<path> "
            f"or azureml://jobs/<job>/outputs/<name>; got {uri.geturl()!r}."
        )
    if uri.query:
        raise ValueError(f"An azureml:// Asset URI has no query; got {uri.geturl()!r}.")
    segments = [s for s in rest.split("/") if s]
    keyword_at = {"datastores": {0, 2}, "jobs": {0, 2, 4}}.get(segments[0].lower(), {0, 2, 4, 6, 8})
    segments = [s.lower() if i in keyword_at and s.lower() in _KEYWORDS else s for i, s in enumerate(segments)]
    return uri._replace(netloc=segments[0], path="/" + "/".join(segments[1:]))


def create_asset(*, datastore: str, path: str = "", extra: dict[str, Any] | None = None) -> Asset:
    """Airflow's asset factory for the scheme: the Asset for a datastore path."""
    from airflow.sdk import Asset

    return Asset(uri=datastore_uri(datastore, path), extra=extra)


# ------------------------------------------------------------------ asset events at run time
def output_places(outputs: Mapping[str, Any] | None, fallback_uri: str | None = None) -> dict[str, DatastorePath]:
    """The rendered outputs that name a datastore place, by output name (``score`` for Azure's default)."""
    found = {name: parse_datastore_uri(str(uri)) for name, uri in (outputs or {}).items() if uri}
    if not found and fallback_uri:
        found = {"score": parse_datastore_uri(fallback_uri)}
    return {name: place for name, place in found.items() if place is not None}


def record_output_events(
    context: Mapping[str, Any] | None,
    outlets: Iterable[Any],
    places: Mapping[str, DatastorePath],
    extra: dict[str, Any],
) -> list[str]:
    """Turn a finished job's outputs into asset events; returns the URIs emitted.

    Outputs rendered at run time (templates, mapped tasks) are known only now, so they are emitted
    through each ``AssetAlias`` among the task's outlets; an ``Asset`` outlet whose URI is one of the
    outputs gets the job's facts as its event's extra (Airflow emits it on success). A task without
    such outlets emits nothing.
    """
    from airflow.sdk import Asset, AssetAlias

    events = context.get("outlet_events") if context is not None else None
    if events is None or not places:
        return []
    emitted: list[str] = []
    by_uri = {place.uri: name for name, place in places.items()}
    for outlet in outlets or ():
        if isinstance(outlet, AssetAlias):
            for name, place in places.items():
                events[outlet].add(Asset(uri=place.uri), extra={**extra, "output": name})
                emitted.append(place.uri)
        elif isinstance(outlet, Asset) and outlet.uri in by_uri:
            events[outlet].extra.update({**extra, "output": by_uri[outlet.uri]})
            emitted.append(outlet.uri)
    return emitted


# ------------------------------------------------------------------ partition keys (Airflow 3.3)
PARTITION_KEY_TIME_FORMAT = "%Y-%m-%dT%H:%M:%S"  # the temporal partition mappers' default input_format
PARTITION_KEY_DELIMITER = "|"  # ProductMapper's default delimiter


def partition_key(interval_start: datetime, partition: str) -> str:
    """The partition key of one scored partition of one interval: ``2026-11-01T00:00:00|part-000``.

    Why this form: Airflow's mappers read it as is. ``ProductMapper``'s default delimiter splits it in two,
    and the first part is in the temporal mappers' default ``input_format``, so a consumer can schedule with
    ``ProductMapper(StartOfDayMapper(), IdentityMapper())`` (a run per day and partition) or the default
    ``IdentityMapper`` (a run per key) without configuring a format. The interval start is taken in UTC.
    """
    if not partition or PARTITION_KEY_DELIMITER in partition:
        raise ValueError(f"a partition name is not empty and has no {PARTITION_KEY_DELIMITER!r}; got {partition!r}.")
    start = interval_start.astimezone(timezone.utc) if interval_start.tzinfo else interval_start
    return f"{start.strftime(PARTITION_KEY_TIME_FORMAT)}{PARTITION_KEY_DELIMITER}{partition}"


def split_partition_key(key: str) -> tuple[datetime, str]:
    """``(interval start in UTC, partition)`` of a key ``partition_key`` made; ValueError for any other key."""
    start, delimiter, partition = key.partition(PARTITION_KEY_DELIMITER)
    if not delimiter or not partition or PARTITION_KEY_DELIMITER in partition:
        raise ValueError(f"not an interval|partition key: {key!r}")
    return datetime.strptime(start, PARTITION_KEY_TIME_FORMAT).replace(tzinfo=timezone.utc), partition
