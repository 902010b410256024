"""OpenLineage for the job operators and Assets: datasets named as the OpenLineage naming spec says, the job's facts.

Called only from the operators' ``get_openlineage_facets_on_*`` methods and from Airflow, through the
``azureml`` Asset scheme's converter (``convert_asset_to_openlineage``, registered in ``get_provider_info``;
it lives here, beside the datastore resolution it shares, so that this module imports ``assets`` and
``assets`` never imports it). OpenLineage itself is imported only when a function here runs: the base
install needs neither ``openlineage-python`` nor ``apache-airflow-providers-openlineage`` (extra
``[openlineage]``), and this module imports without them.

Naming (OpenLineage spec, "Dataset Naming"; the same as ``openlineage.client.naming.dataset``):

- ADLS Gen2 datastore: namespace ``abfss://{container}@{account}.dfs.{endpoint}``, name ``{path}``;
- Blob datastore: namespace ``wasbs://{container}@{account}.dfs.{endpoint}``, name ``{object key}``;

where ``endpoint`` is the datastore's storage endpoint (``core.windows.net`` in Azure's public cloud).
An ``azureml://`` datastore URI is resolved with one datastore GET per datastore through the task's
connection. Where that is impossible (another workspace, a file share, a datastore that cannot be read)
the namespace stays ``azureml://[<workspace>/]datastores/<datastore>``, and the task log says why.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from functools import cache
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from airflow_azureml.assets import SCHEME, DatastorePath, parse_datastore_uri
from airflow_azureml.redaction import scrub

if TYPE_CHECKING:
    from airflow.providers.common.compat.openlineage.facet import Dataset
    from airflow.providers.openlineage.extractors import OperatorLineage
    from airflow.sdk import Asset

log = logging.getLogger(__name__)

FACET = "azureml_job"
FACET_SCHEMA = "urn:airflow-azureml:openlineage:AzureMLJobRunFacet:1"


@cache
def job_run_facet_class() -> type:
    """``AzureMLJobRunFacet``: the Azure ML jobs behind one Airflow task run (built on first use, so that
    OpenLineage is imported only then).

    Fields (camelCase, as OpenLineage facets are): ``jobName`` (the job that decided the outcome),
    ``jobNames`` (the chain, oldest first), ``studioUrl``, ``preemptions``, ``resubmissions``, and ``cost``:
    the chain's estimated bill (``cost_facet``); on failure estimated from the usage the task saw, and not
    sent when nothing was seen.
    """
    import attrs
    from airflow.providers.common.compat.openlineage.facet import RunFacet

    @attrs.define
    class AzureMLJobRunFacet(RunFacet):  # type: ignore[misc,valid-type]
        jobName: str | None
        jobNames: list[str]
        studioUrl: str | None
        preemptions: int
        resubmissions: int
        cost: dict[str, Any] | None = None

        @staticmethod
        def _get_schema() -> str:
            return FACET_SCHEMA

    return AzureMLJobRunFacet


class DatastoreResolver:
    """Datastore name -> OpenLineage namespace, read once per datastore through the task's connection."""

    def __init__(self, hook: Any) -> None:
        self.hook = hook
        self._namespaces: dict[str, str | None] = {}

    def namespace(self, place: DatastorePath) -> str:
        if place.workspace and not self._same_workspace(place):
            log.info("OpenLineage: %s is in another workspace; kept its azureml:// namespace.", place.uri)
            return place.datastore_root
        if place.datastore not in self._namespaces:
            self._namespaces[place.datastore] = self._read(place.datastore)
        return self._namespaces[place.datastore] or place.datastore_root

    def _same_workspace(self, place: DatastorePath) -> bool:
        s = self.hook.settings
        ours = (s.subscription_id, s.resource_group, s.workspace_name)
        return [str(x or "").lower() for x in ours] == [
            str(x).lower() for x in (place.subscription, place.resource_group, place.workspace)
        ]

    def _read(self, name: str) -> str | None:
        try:
            store = self.hook.get_conn().datastores.get(name)
        except Exception as exc:
            why = scrub(str(exc))
            log.info("OpenLineage: could not read datastore %r (%s); kept its azureml:// namespace.", name, why)
            return None
        return storage_namespace(store)


def storage_namespace(store: Any) -> str | None:
    """The spec's namespace for a datastore entity (``azure.ai.ml``), or None for a kind the spec does not name."""
    account = getattr(store, "account_name", None)
    endpoint = getattr(store, "endpoint", None) or "core.windows.net"
    filesystem = getattr(store, "filesystem", None)
    container = getattr(store, "container_name", None)
    if account and filesystem:  # AzureDataLakeGen2Datastore
        return f"abfss://{filesystem}@{account}.dfs.{endpoint}"
    if account and container:  # AzureBlobDatastore
        return f"wasbs://{container}@{account}.dfs.{endpoint}"
    log.info("OpenLineage: datastore %r is a %s; kept its azureml:// namespace.", store.name, type(store).__name__)
    return None


def dataset(uri: Any, resolver: DatastoreResolver) -> Dataset | None:
    """The OpenLineage dataset for a job input or output URI; None for a value that names no data."""
    from airflow.providers.common.compat.openlineage.facet import Dataset

    if not isinstance(uri, str) or "://" not in uri:
        return None  # a literal input (a number, a string) or a data asset reference (azureml:name:version)
    place = parse_datastore_uri(uri)
    if place is not None:
        return Dataset(namespace=resolver.namespace(place), name=place.path or "/")
    parts = urlsplit(uri)  # abfss://, wasbs://, https://, azureml://jobs/...: the URI as written
    return Dataset(namespace=f"{parts.scheme}://{parts.netloc}", name=parts.path.lstrip("/") or "/")


def convert_asset_to_openlineage(asset: Asset, lineage_context: Any) -> Any:
    """Airflow's OpenLineage converter. The datastore is resolved to its storage account (``abfss://``,
    ``wasbs://``) only when the context is an ``AzureMLHook`` (hook lineage); for a task's declared
    inlets and outlets Airflow gives no context, so the namespace stays
    ``azureml://[<workspace>/]datastores/<datastore>`` and the name is the path."""
    from airflow.providers.common.compat.openlineage.facet import Dataset

    place = parse_datastore_uri(asset.uri)
    if place is None:  # a job output: the URI itself is the only name it has
        parts = urlsplit(asset.uri)
        return Dataset(namespace=f"{SCHEME}://{parts.netloc}", name=parts.path.lstrip("/") or "/")
    from airflow_azureml.hooks.azure_ml import AzureMLHook

    if isinstance(lineage_context, AzureMLHook):
        return Dataset(namespace=DatastoreResolver(lineage_context).namespace(place), name=place.path or "/")
    return Dataset(namespace=place.datastore_root, name=place.path or "/")


def _datasets(uris: Iterable[Any], resolver: DatastoreResolver) -> list[Dataset]:
    found: dict[tuple[str, str], Dataset] = {}
    for uri in uris:
        ds = dataset(uri, resolver)
        if ds is not None:
            found.setdefault((ds.namespace, ds.name), ds)
    return list(found.values())


def cost_facet(report: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The facet's ``cost``: the headline figures of the task's cost report (docs/cost.md), camelCase."""
    if not report:
        return None
    equivalent = report.get("dedicated_equivalent") or {}
    return {
        "currency": report.get("currency"),
        "cost": report.get("cost"),
        "nodeHours": report.get("node_hours_total"),
        "evictedNodeHours": report.get("evicted_node_hours"),
        "lostNodeHours": report.get("lost_node_hours"),
        "dedicatedEquivalentCost": equivalent.get("cost"),
        "savings": report.get("savings"),
        "savingsPct": report.get("savings_pct"),
        "costUnknown": report.get("cost_unknown"),
    }


def _cost_report(operator: Any, state: Any) -> Mapping[str, Any] | None:
    """The bill the task reported; for a task that failed before reporting one, an estimate from the same
    usage (the preempted attempts it paid for), made here without the report's log, XCom or metrics."""
    report = operator._cost_report
    if report is None and state is not None and (state.usage or {}).get("spans"):
        report = operator._estimate_cost(state)
    return report


def job_lineage(operator: Any, inputs: Mapping[str, Any] | None, outputs: Mapping[str, Any] | None) -> OperatorLineage:
    """Inputs, outputs and the job facts of a job operator's task run, from its state (``_state``)."""
    from airflow.providers.common.compat.openlineage.facet import ExternalQueryRunFacet
    from airflow.providers.openlineage.extractors import OperatorLineage

    resolver = DatastoreResolver(operator.hook)
    state = getattr(operator, "_state", None)
    names = list(state.job_names) if state is not None else []
    current = names[-1] if names else None
    studio = None
    if current:
        try:
            studio = operator.hook.studio_job_url(current)
        except Exception as exc:  # lineage never fails the task
            log.info("OpenLineage: no Studio URL for job %s: %s", current, scrub(str(exc)))
    run_facets: dict[str, Any] = {
        FACET: job_run_facet_class()(
            jobName=current,
            jobNames=names,
            studioUrl=studio,
            preemptions=state.preemptions if state is not None else 0,
            resubmissions=state.resubmits if state is not None else 0,
            cost=cost_facet(_cost_report(operator, state)),
        )
    }
    if current:
        run_facets["externalQuery"] = ExternalQueryRunFacet(externalQueryId=current, source="azureml")
    return OperatorLineage(
        inputs=_datasets((inputs or {}).values(), resolver),
        outputs=_datasets((outputs or {}).values(), resolver),
        run_facets=run_facets,
    )
