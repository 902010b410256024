"""``AzureMLHook``: credentials, clouds and a cached ``MLClient`` for an ``azure_ml`` connection.

``azure.ai.ml`` costs about a second to import, so it is imported only inside methods that
need it; importing this module (and every operator) stays cheap for the DAG processor.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from functools import cached_property
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseHook

from airflow_azureml.exceptions import AzureMLConfigError, AzureMLError, AzureMLJobQueueTimeoutError

# The connection layer lives beneath this module and hooks.rest; these names stay importable from here.
from airflow_azureml.hooks.connection import (  # noqa: F401
    CUSTOM_CLOUD,
    EXTRA_FIELDS,
    KNOWN_CLOUDS,
    AzureMLConnectionSettings,
    build_async_credential,
    build_credential,
    credential_kwargs,
    default_chain_kwargs,
    is_missing_connection,
    missing_connection_message,
    parse_connection,
    quiet_sdk_logging,
)
from airflow_azureml.naming import DEFAULT_CONN_ID
from airflow_azureml.outcomes import ActivityEvidence, ComputeFacts, GaugeEvidence, JobSnapshot, node_count
from airflow_azureml.polling import (
    COMPUTE_READS,
    GAUGE_STATE,
    GaugeReading,
    JobWatch,
    PollingPolicy,
    TransientBudgetExceeded,
)
from airflow_azureml.redaction import scrub

if TYPE_CHECKING:
    from azure.ai.ml import MLClient
    from azure.core.credentials import TokenCredential
    from azure.core.credentials_async import AsyncTokenCredential

    from airflow_azureml.hooks.rest import AsyncRestClient, RestClient
    from airflow_azureml.instance_types import InstanceType
    from airflow_azureml.spot_history_store import HistoryStore
    from airflow_azureml.unit_journal import UnitJournal

# Retries of single calls: short delays (Retry-After when sent), five retries, the same back-off rule as polls.
ONE_SHOT_RETRIES = PollingPolicy(interval=2.0, max_interval=30.0, max_transient_errors=5)


def _forget_inherited_custom_cloud() -> None:
    """Drop an ``AZUREML_CURRENT_CLOUD`` that names a cloud registered by another process.

    ``MLClient`` writes the cloud's name to ``os.environ``; a child process (a task runner, a
    subprocess of a task) inherits it, and importing ``azure.ai.ml`` there fails with "Unknown
    cloud environment", because the custom cloud is registered per process. Our names are only
    ever ours, so dropping one is safe: the hook registers it again with its metadata.
    """
    if os.environ.get("AZUREML_CURRENT_CLOUD", "").startswith("AirflowCustom-") and "azure.ai.ml" not in sys.modules:
        del os.environ["AZUREML_CURRENT_CLOUD"]


# Also at import: every operator imports this module when its DAG file is parsed, before an execute()
# may import azure.ai.ml ahead of any hook (so operators/base.py imports the hook at module level:
# tests/integration/test_hook_environment.py fails when it does not).
_forget_inherited_custom_cloud()


class AzureMLHook(BaseHook):
    """Talks to one Azure ML workspace through an ``azure_ml`` connection.

    A client secret selects ``ClientSecretCredential``; otherwise ``DefaultAzureCredential``
    (environment, workload identity, managed identity, Azure CLI...) is used, honouring a
    managed identity client id given alone.
    """

    conn_name_attr = "azure_ml_conn_id"
    default_conn_name = DEFAULT_CONN_ID
    conn_type = "azure_ml"
    hook_name = "Azure Machine Learning"

    def __init__(self, azure_ml_conn_id: str = default_conn_name, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.azure_ml_conn_id = azure_ml_conn_id
        self._client: MLClient | None = None
        self._rest: RestClient | None = None

    @cached_property
    def settings(self) -> AzureMLConnectionSettings:
        return parse_connection(self._connection())

    def _connection(self) -> Any:
        """The Airflow connection; a missing one is a configuration error (fatal at once, never retried)."""
        try:
            return self.get_connection(self.azure_ml_conn_id)
        except Exception as exc:
            if is_missing_connection(exc):
                raise AzureMLConfigError(missing_connection_message(self.azure_ml_conn_id)) from None
            raise

    async def _aconnection(self) -> Any:
        try:
            return await self.aget_connection(self.azure_ml_conn_id)
        except Exception as exc:
            if is_missing_connection(exc):
                raise AzureMLConfigError(missing_connection_message(self.azure_ml_conn_id)) from None
            raise

    # ----------------------------------------------------------- credentials
    def get_credential(self) -> TokenCredential:
        return build_credential(self.settings)

    def get_async_credential(self) -> AsyncTokenCredential:
        """The same identity as ``get_credential``, from ``azure.identity.aio`` for triggers."""
        return build_async_credential(self.settings)

    def _default_chain_kwargs(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        return default_chain_kwargs(self.settings, kwargs)

    def _fresh_credential(self) -> TokenCredential:
        """A new credential from the connection as it is now (a rotated secret is picked up)."""
        return build_credential(parse_connection(self._connection()))

    async def _fresh_async_credential(self) -> AsyncTokenCredential:
        return build_async_credential(parse_connection(await self._aconnection()))

    # ----------------------------------------------------------------- client
    def get_conn(self) -> MLClient:
        """A cached ``MLClient`` bound to the connection's workspace and cloud."""
        if self._client is None:
            _forget_inherited_custom_cloud()
            from azure.ai.ml import MLClient

            quiet_sdk_logging()  # the MLClient's own requests too
            s = self.settings
            kwargs: dict[str, Any] = {"connection_verify": s.connection_verify, "show_progress": False}
            if s.cloud == CUSTOM_CLOUD:
                kwargs["cloud"] = s.sdk_cloud_name
                kwargs["cloud_metadata"] = {
                    "azure_portal": s.studio_url + "/",
                    "resource_manager": s.resource_manager_url + "/",
                    "active_directory": s.authority_url + "/",
                    # the data plane's token audience (invoke); not ARM's (https://ml.azure.com/ in Azure)
                    "aml_resource_id": (self._extra("aml_resource_id") or "https://ml.azure.com").rstrip("/") + "/",
                    "storage_endpoint": "core.windows.net",
                    "registry_discovery_endpoint": s.resource_manager_url + "/",
                }
            else:
                kwargs["cloud"] = s.cloud
            try:
                self._client = MLClient(
                    self.get_credential(), s.subscription_id, s.resource_group, s.workspace_name, **kwargs
                )
            except Exception as exc:
                raise AzureMLConfigError(f"Could not create MLClient: {scrub(str(exc))}") from None
        return self._client

    # -------------------------------------------------------------- job reads
    def rest(self) -> RestClient:
        """Sync REST reads (job status, run details, compute facts) with this connection's identity."""
        if self._rest is None:
            from airflow_azureml.hooks.rest import RestClient

            self._rest = RestClient(self.settings, self.get_credential(), self._fresh_credential)
        return self._rest

    async def async_rest(self) -> AsyncRestClient:
        """A new native-asyncio REST client (the caller closes it). Reads the connection without blocking."""
        from airflow_azureml.hooks.rest import AsyncRestClient

        if "settings" not in self.__dict__:
            self.__dict__["settings"] = parse_connection(await self._aconnection())
        return AsyncRestClient(self.settings, self.get_async_credential(), self._fresh_async_credential)

    def job_snapshot(self, name: str, *, transient_retries: bool = True) -> JobSnapshot | None:
        """The job's state, or None when no job has that name.

        ``transient_retries=False``: one attempt; a transient failure raises ``TransientRestError``
        (a sensor's poke then simply pokes again later).
        """
        from airflow_azureml.hooks.rest import ResourceNotFound

        try:
            if not transient_retries:
                return self.rest().snapshot(name)
            return self._with_transient_retries(lambda: self.rest().snapshot(name))
        except ResourceNotFound:
            return None

    def job_cancel_requests(self, snapshot: JobSnapshot, now: float | None = None) -> ActivityEvidence:
        """The Azure Activity Log's record of cancel requests for this job (``outcomes.ActivityEvidence``).

        One read (paged) of the resource group's events from a day before the job's start to now. A
        principal without read access there (Reader on the resource group) or any failure leaves the
        witness out, with a note: it never fails the task.
        """
        from airflow_azureml.hooks.rest import TransientRestError

        now = time.time() if now is None else now
        since = min(now, snapshot.started_at or snapshot.ended_at or now) - 86400
        try:
            client = self.rest()
            cancels = self._with_transient_retries(lambda: client.job_cancels(snapshot.name, since, now + 300))
        except Exception as exc:  # a witness that cannot be read is left out; it never fails the task
            note = scrub(str(exc)) if isinstance(exc, (AzureMLError, TransientRestError)) else type(exc).__name__
            if " 403" in note or "AuthorizationFailed" in note:
                note = (
                    "no read access: the identity needs Reader on the resource group "
                    "(Microsoft.Insights/eventtypes/values/read)"
                )
            self.log.info("The Activity Log could not be read for job %s: %s", snapshot.name, note)
            return ActivityEvidence(read=False, note=note[:300])
        own = client.own_identity()
        return ActivityEvidence(
            read=True, cancels=tuple(cancels), own_identity=tuple(sorted({c for c, _ in cancels if c in own}))
        )

    def compute_facts(self, name: str | None) -> ComputeFacts | None:
        if not name:
            return None
        return ComputeFacts.from_rest(self._with_transient_retries(lambda: self.rest().get_compute(name)))

    def kubernetes_instance_types(self, compute: str) -> list[InstanceType] | None:
        """The instance types of a Kubernetes compute (one ARM read), or None for other compute types."""
        from airflow_azureml.instance_types import from_compute_properties

        arm = self._with_transient_retries(lambda: self.rest().get_compute(compute))
        if arm is None:
            raise AzureMLConfigError(
                f"Compute {compute!r} does not exist in workspace {self.settings.workspace_name!r}."
            )
        props = arm.get("properties") or {}
        if props.get("computeType") != "Kubernetes":
            return None
        return from_compute_properties((props.get("properties") or {}).get("instanceTypes"))

    def submit_command_job(self, job: Any) -> str:
        """Create a command job (an ``azure.ai.ml`` ``Command``) under its own, caller-chosen name."""
        from azure.core.exceptions import HttpResponseError

        try:
            return str(self.get_conn().jobs.create_or_update(job).name)
        except HttpResponseError as exc:
            if exc.status_code == 409 and self.job_snapshot(job.name) is not None:
                self.log.info("Job %s already exists (submitted by an earlier attempt); attaching.", job.name)
                return str(job.name)
            raise AzureMLError(f"Submitting job {job.name!r} failed: {scrub(str(exc))}") from None

    def find_jobs(self, properties: dict[str, str]) -> list[JobSnapshot]:
        """Jobs whose user properties have these values, archived or not (one filtered, paged LIST).

        Snapshots from the LIST carry no run-history details; ``job_snapshot`` reads those.
        """
        return [JobSnapshot.from_rest(item) for item in self.find_job_resources(properties)]

    def find_job_resources(self, properties: dict[str, str]) -> list[dict[str, Any]]:
        """As ``find_jobs``, but the ARM resources themselves (their ``systemData`` says when each was created)."""
        query = {"listViewType": "All"}
        if properties:  # none: every job of the workspace (the unit journal's carrier search)
            query["properties"] = ",".join(f"{k}={v}" for k, v in properties.items())
        return self._with_transient_retries(lambda: list(self.rest().list_jobs(query)))

    def cancel_job(self, name: str) -> None:
        from airflow_azureml.hooks.rest import ResourceNotFound

        try:
            self._with_transient_retries(lambda: self.rest().cancel_job(name))
        except ResourceNotFound:
            self.log.info("Job %s does not exist; nothing to cancel.", name)

    def wait_for_job(
        self,
        name: str,
        policy: PollingPolicy,
        on_status: Callable[[JobSnapshot], None] | None = None,
    ) -> JobSnapshot:
        """Poll until the job is terminal; ``wait_for_job_evidence`` also returns the gauge evidence."""
        return self.wait_for_job_evidence(name, policy, on_status)[0]

    def wait_for_job_evidence(
        self,
        name: str,
        policy: PollingPolicy,
        on_status: Callable[[JobSnapshot], None] | None = None,
        *,
        with_usage: bool = False,
    ) -> tuple[JobSnapshot, GaugeEvidence] | tuple[JobSnapshot, GaugeEvidence, dict[str, Any]]:
        """Poll until the job is terminal (sync path; the trigger runs the same ``JobWatch`` on asyncio).

        While the job is not terminal, its compute is read through reads shared by every wait in this
        process: after each poll and, between polls, every ``policy.evidence_interval`` (a preempted node
        is counted only until it is replaced), and once more when the job is seen ended.
        Returns ``(snapshot, GaugeEvidence)``: the ``preemptedNodeCount`` samples taken while the job was
        Running, for ``outcomes.classify``; with ``with_usage``, ``(snapshot, evidence, usage)``, where
        ``usage`` is the node counts' change points for ``cost.estimate`` (a JSON-ready dict).
        """
        from airflow_azureml.hooks.rest import TransientRestError

        watch = JobWatch(policy)
        while True:
            try:
                snapshot = self.rest().snapshot(name)
            except TransientRestError as exc:
                try:
                    delay = watch.transient_error(exc.retry_after)
                except TransientBudgetExceeded:
                    raise AzureMLError(f"Gave up polling job {name}: {exc}") from None
                self.log.warning("Transient error polling %s (%s); retrying in %.1fs", name, exc, delay)
                time.sleep(delay)
                continue
            if snapshot.status != watch.last_status and on_status is not None:
                on_status(snapshot)
            delay = watch.observe(snapshot)
            if delay is None:
                self._read_at_end(watch, snapshot)
                return (snapshot, watch.gauge, watch.usage_dict()) if with_usage else (snapshot, watch.gauge)
            if watch.queue_time_exceeded():
                raise AzureMLJobQueueTimeoutError(
                    f"Job {name} stayed {snapshot.status} for more than {policy.max_queue_time}s "
                    "(no capacity); giving up.",
                    job_name=name,
                    status=snapshot.status,
                )
            next_poll = time.monotonic() + delay
            max_age = min(policy.interval, policy.evidence_interval)
            while snapshot.compute:  # queued and preparing too: nodes are billed from their start-up
                reading = self._gauge_reading(snapshot.compute, max_age)
                watch.offer_gauge(reading)  # evidence only from readings taken while the job ran
                watch.offer_usage(reading)
                if watch.wants_poll_now():  # every node preempted: is the job still Running?
                    next_poll = time.monotonic()
                    break
                evidence = watch.evidence_delay()  # between polls, the cluster is read at the evidence cadence
                if evidence is None or time.monotonic() + evidence >= next_poll:
                    break
                time.sleep(evidence)
            time.sleep(max(0.0, next_poll - time.monotonic()))

    def ended_job_evidence(
        self, name: str, policy: PollingPolicy
    ) -> tuple[JobSnapshot, GaugeEvidence, dict[str, Any]] | None:
        """One poll of a job a look found ended, and the read of its compute just after the end (the evidence
        ``wait_for_job_evidence`` gathers when it sees a job end); None when that poll finds it not ended."""
        watch = JobWatch(policy)
        snapshot = self._with_transient_retries(lambda: self.rest().snapshot(name))
        if watch.observe(snapshot) is not None:
            return None
        self._read_at_end(watch, snapshot)
        return snapshot, watch.gauge, watch.usage_dict()

    def _read_at_end(self, watch: JobWatch, snapshot: JobSnapshot) -> None:
        """The compute once more when the job is seen ended: the nodes' last state, and the first read after the
        end (``JobWatch``) that tells a preemption Azure cancelled at once from a person's cancel."""
        if watch.wants_usage() and snapshot.compute:
            reading = self._gauge_reading(snapshot.compute, 0.0)  # fresh: a shared one may predate the end
            watch.offer_gauge(reading)
            watch.offer_usage(reading)

    def usage_sample(self, snapshot: JobSnapshot, max_age: float) -> dict[str, Any]:
        """One reading of the job's compute as usage (``cost``): the look a deferring task takes before
        the triggerer's first poll, which may come seconds later while the job's nodes start and bill.

        Not while the job is Running: that shared reading would be served to the triggerer's first poll,
        which cannot take it as preemption evidence (it predates that wait's sight of Running), and the
        evidence would wait an interval more.
        """
        watch = JobWatch(ONE_SHOT_RETRIES)
        watch.observe(snapshot)
        if snapshot.compute and snapshot.status != GAUGE_STATE:
            watch.offer_usage(self._gauge_reading(snapshot.compute, max_age))
        return watch.usage_dict()

    def _gauge_reading(self, compute: str, max_age: float) -> GaugeReading | None:
        """The compute's gauge and node counts, read at most once per ``max_age`` by all waits of this process."""
        from airflow_azureml.hooks.rest import TransientRestError

        client = self.rest()

        def read(taken: float) -> GaugeReading | None:
            return GaugeReading.from_rest(compute, client.get_compute(compute), taken)

        try:
            return COMPUTE_READS.get(client.paths.compute(compute), max_age, read)
        except (TransientRestError, AzureMLError) as exc:  # a missed sample is missing evidence, not an error
            self.log.info("Could not read compute %s for its preemption gauge: %s", compute, exc)
            return None

    # ------------------------------------------------------------------ prices
    def price_quote(
        self, vm_size: str, location: str | None, manual: dict[str, dict[str, float]] | None = None
    ) -> dict[str, Any] | None:
        """Hourly USD rates of one node of ``vm_size`` in ``location``: ``{"dedicated", "spot", "source"}``, and
        from the API since when each rate is in force and when it was read (``effective_from``, ``retrieved_at``).

        Prices set by hand come first (``manual``: an operator's ``prices``, checked; then the connection's
        ``prices`` extra), else the Retail Prices API at the connection's ``prices_endpoint`` (default
        https://prices.azure.com), cached a day (``hooks.prices``). None: unknown (the API could not be read).
        """
        from airflow_azureml.hooks.prices import DEFAULT_ENDPOINT, RetailPrices, manual_hourly

        for source, table in (("operator prices", manual), ("connection prices", self.settings.manual_prices)):
            rates = manual_hourly(table or {}, vm_size)
            if rates is not None:
                return {**rates, "source": source}
        endpoint = self.settings.prices_endpoint
        home = os.environ.get("AIRFLOW_HOME")
        cache_dir = self.settings.prices_cache_dir or (os.path.join(home, "cache") if home else None)
        api = RetailPrices(
            endpoint or DEFAULT_ENDPOINT,
            verify=self.settings.connection_verify if endpoint else True,  # a private CA is for a private endpoint
            cache_dir=cache_dir,
        )
        quote = api.quote(vm_size, location)
        if quote is None:
            return None
        from airflow_azureml.cost import iso_time

        return {
            "dedicated": quote["dedicated"],
            "spot": quote["spot"],
            "source": f"Retail Prices API ({api.endpoint})",
            "retrieved_at": iso_time(quote["retrieved_at"]),  # when read from the API (cached a day)
            "effective_from": {"dedicated": quote.get("dedicated_from"), "spot": quote.get("spot_from")},
        }

    def hourly_prices(
        self, vm_size: str, location: str | None, manual: dict[str, dict[str, float]] | None = None
    ) -> tuple[float | None, float | None] | None:
        """``(dedicated, spot)`` USD per node-hour for a compute's size and region, or None when unknown."""
        quote = self.price_quote(vm_size, location, manual)
        return None if quote is None else (quote.get("dedicated"), quote.get("spot"))

    def _with_transient_retries(self, call: Callable[[], Any]) -> Any:
        """One-shot reads and cancels, retried on 429/5xx/dropped connections by the shared policy."""
        from airflow_azureml.hooks.rest import TransientRestError

        watch = JobWatch(ONE_SHOT_RETRIES)
        while True:
            try:
                return call()
            except TransientRestError as exc:
                try:
                    delay = watch.transient_error(exc.retry_after)
                except TransientBudgetExceeded:
                    raise exc from None
                self.log.warning("Transient Azure error (%s); retry %d in %.1fs", exc, watch.transient_errors, delay)
                time.sleep(delay)

    def deployment_runs(self, endpoint: str, deployment: str | None) -> str | None:
        """The fingerprint of what a batch deployment runs now (``naming.deployment_fingerprint``); with no
        deployment, the endpoint's default one. None when it cannot be read: the caller then keeps what it has."""
        from airflow_azureml.naming import deployment_fingerprint

        document = self._batch_deployment(endpoint, deployment)
        return deployment_fingerprint(document) if document else None

    def deployment_nodes(self, endpoint: str, deployment: str | None) -> tuple[str | None, int | None]:
        """``(compute, nodes)`` of a batch deployment: the compute's name and how many nodes each of its jobs
        takes (``resources.instanceCount``; Azure's default is 1); with no deployment, the endpoint's default
        one. ``(None, None)`` when it cannot be read. A batch job's own GET does not say how many nodes it held
        (its ``compute.instanceCount`` is null), and the bill's floor needs it."""
        document = self._batch_deployment(endpoint, deployment)
        if not document:
            return None, None
        from airflow_azureml.asset_refs import short_name

        props = document.get("properties") or {}
        compute = short_name(props.get("compute")) or None  # an ARM id, or azureml:<name>
        count = (props.get("resources") or {}).get("instanceCount", 1)
        return compute, node_count(count)

    def _batch_deployment(self, endpoint: str, deployment: str | None) -> dict[str, Any] | None:
        """A batch deployment's REST document (no deployment named: the endpoint's default), or None when it
        cannot be read (logged)."""
        rest = self.rest()
        try:
            if not deployment:
                found = self._with_transient_retries(lambda: rest.get_batch_resource(endpoint)) or {}
                deployment = ((found.get("properties") or {}).get("defaults") or {}).get("deploymentName")
                if not deployment:
                    return None
            name = deployment
            document = self._with_transient_retries(lambda: rest.get_batch_resource(endpoint, name))
        except AzureMLError as exc:
            self.log.warning("Could not read batch deployment %s/%s: %s", endpoint, deployment, exc)
            return None
        return document if isinstance(document, dict) else None

    # ------------------------------------------------------------ batch invoke
    def invoke_batch_endpoint(
        self,
        *,
        endpoint_name: str,
        deployment_name: str | None,
        inputs: dict[str, str],
        job_name: str,
        outputs: dict[str, str] | None = None,
        experiment_name: str | None = None,
        mini_batch_size: int | None = None,
        instance_count: int | None = None,
        output_file_name: str | None = None,
        properties: dict[str, str] | None = None,
    ) -> str:
        """Submit a batch job under a caller-chosen name. A name that already exists is not an error:
        the SDK retries the POST itself, and a retry after a lost response must not fail or duplicate.
        Returns the name the service gave the job (Azure may ignore the requested one). ``properties``
        become the job's properties (the SDK's invoke cannot send tags).
        """
        from azure.ai.ml import Input, Output
        from azure.ai.ml.constants._endpoint import EndpointInvokeFields
        from azure.core.exceptions import HttpResponseError

        ml = self.get_conn()
        # The SDK keeps the deployment header in a class-level dict across calls: clear it.
        EndpointInvokeFields.DEFAULT_HEADER.pop(EndpointInvokeFields.MODEL_DEPLOYMENT, None)
        params_override: list[dict[str, Any]] = []
        if mini_batch_size is not None:
            params_override.append({"mini_batch_size": int(mini_batch_size)})
        if output_file_name is not None:
            params_override.append({"output_file_name": output_file_name})
        if instance_count is not None:
            params_override.append({"compute.instance_count": int(instance_count)})
        if properties:  # the SDK sends experimentName in the same dict: merge rather than override it
            merged = {**properties, **({"experimentName": experiment_name} if experiment_name else {})}
            params_override.append({"properties": merged})
            experiment_name = None
        try:
            job = ml.batch_endpoints.invoke(
                endpoint_name=endpoint_name,
                deployment_name=deployment_name,
                inputs={key: Input(type="uri_folder", path=uri) for key, uri in inputs.items()},
                outputs={key: Output(type="uri_folder", path=uri) for key, uri in (outputs or {}).items()} or None,
                job_name=job_name,
                experiment_name=experiment_name,
                params_override=params_override,
            )
        except HttpResponseError as exc:
            if exc.status_code == 409 and self.job_snapshot(job_name) is not None:
                self.log.info("Job %s already exists (submitted by an earlier attempt); attaching.", job_name)
                return job_name
            raise AzureMLError(f"Invoking batch endpoint {endpoint_name!r} failed: {scrub(str(exc))}") from None
        finally:
            EndpointInvokeFields.DEFAULT_HEADER.pop(EndpointInvokeFields.MODEL_DEPLOYMENT, None)
        return str(job.name)

    # ------------------------------------------------- what triggers need
    def resource_url(self, relative: str = "") -> str:
        """Absolute ARM URL of the workspace, or of a resource below it (e.g. ``jobs/abc``)."""
        base = f"{self.settings.resource_manager_url}{self.settings.workspace_path}"
        return f"{base}/{relative.lstrip('/')}" if relative else base

    def studio_job_url(self, job_name: str) -> str:
        """The job's Studio page for this connection's cloud (``links.studio.job_url``); may be empty."""
        from airflow_azureml.links.studio import job_url

        return job_url(self.settings, self._connection().extra_dejson or {}, job_name)

    def _extra(self, name: str) -> str | None:
        extra = self._connection().extra_dejson or {}
        return extra.get(name) or extra.get(f"extra__azure_ml__{name}")

    # ------------------------------------------------------------ UI support
    def spot_history_store(self, target: str) -> HistoryStore:
        """Where the spot policy shares what it saw on ``target`` (``spot_history_store`` says why a blob).

        The connection's ``spot_history_url`` container, else the workspace's storage account in a known
        cloud; an Airflow Variable when neither is known, the extra says ``variable``, or Storage refuses
        this identity (no data role).
        """
        from airflow_azureml import spot_history_store as stores
        from airflow_azureml.hooks.connection import SPOT_HISTORY_IN_VARIABLE

        variable = stores.VariableHistoryStore(stores.variable_name(self.azure_ml_conn_id, target))
        s = self.settings
        if s.spot_history_url == SPOT_HISTORY_IN_VARIABLE:
            return variable
        container = s.spot_history_url or self._workspace_history_container()
        if not container:
            self.log.info(
                "No storage account known for the spot history of %s; using %s (set the connection's "
                "spot_history_url: concurrent tasks may overwrite each other's updates in a Variable).",
                target,
                variable.where,
            )
            return variable
        blob = stores.BlobHistoryStore(
            stores.blob_url(container, self.azure_ml_conn_id, target), self.get_credential(), s.connection_verify
        )
        return stores.FallbackStore(blob, variable)

    def unit_journal(self, key: str) -> UnitJournal | None:
        """Unit ``key``'s journal (``unit_journal``), beside the spot history; None where no container is known."""
        from airflow_azureml.blob_records import EtagBlob
        from airflow_azureml.hooks.connection import SPOT_HISTORY_IN_VARIABLE
        from airflow_azureml.unit_journal import UnitJournal, journal_url

        s = self.settings
        if s.spot_history_url == SPOT_HISTORY_IN_VARIABLE:
            container = self._workspace_history_container()
        else:
            container = s.spot_history_url or self._workspace_history_container()
        if not container:
            return None
        url = journal_url(container, self.azure_ml_conn_id, key)
        return UnitJournal(EtagBlob(url, self.get_credential(), s.connection_verify, what="the unit journal"), key)

    def _workspace_history_container(self) -> str | None:
        """The default container, in the workspace's own storage account (a known cloud only; read once)."""
        if "_history_container" not in self.__dict__:
            self.__dict__["_history_container"] = self._read_workspace_container()
        return self.__dict__["_history_container"]

    def _read_workspace_container(self) -> str | None:
        from airflow_azureml import spot_history_store as stores

        suffix = KNOWN_CLOUDS.get(self.settings.cloud, {}).get("storage_suffix")
        if not suffix:
            return None
        try:
            workspace = self.rest().request("GET", self.rest().paths.url(""), what="GET workspace")
        except AzureMLError as exc:
            self.log.info("Could not read the workspace's storage account: %s", scrub(str(exc)))
            return None
        account = ((workspace or {}).get("properties") or {}).get("storageAccount") or ""
        return stores.storage_container_url(str(account), suffix)

    def test_connection(self) -> tuple[bool, str]:
        """Sign in and read the workspace: proves credential, cloud endpoints and names."""
        try:
            workspace = self.get_conn().workspaces.get(self.settings.workspace_name)
            return True, f"Connected to workspace {workspace.name!r} in {workspace.location or 'unknown location'}."
        except Exception as exc:
            # The UI's and the CLI's test runs on a copy of the connection under a temporary random id:
            # naming that id would point the user at a connection they never made.
            message = scrub(str(exc)).replace(f"Connection {self.azure_ml_conn_id!r}", "The connection")
            return False, f"{type(exc).__name__}: {message}"
