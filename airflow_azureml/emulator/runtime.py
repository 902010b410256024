"""The emulated workspace: resources, node allocation, and the batch-scoring runtime.

Batch semantics follow the source documents: input files are cut into mini-batches,
mini-batches run on ``instance_count`` nodes x ``max_concurrency_per_instance`` workers,
an evicted node's in-flight mini-batches go back in the queue (finished ones are kept),
and a whole-cluster preemption ends the job (Canceled for lack of capacity, or Failed with
the PreemptionError that users report).
"""

from __future__ import annotations

import asyncio
import logging
import random
import re
import uuid
from dataclasses import asdict, dataclass, fields
from pathlib import Path, PurePosixPath
from typing import Any

from airflow_azureml.emulator.azure_rules import (
    DEFAULT_NAME,
    RuleViolation,
    check_datastore_name,
    check_job_name,
    check_mlflow_minimum,
    check_output_file_name,
    check_resources,
    from_compute_entry,
)
from airflow_azureml.emulator.billing import Ledger
from airflow_azureml.emulator.blobs import BlobStore
from airflow_azureml.emulator.codes import CodeAssets
from airflow_azureml.emulator.kubernetes.store import KubeCluster
from airflow_azureml.emulator.models import (
    ACTIVE_JOB_STATES,
    CAPACITY_LOST_MESSAGE,
    NO_RESULT_MESSAGE,
    PREEMPTION_ERROR_MESSAGE,
    RUNNER_FAILED_MESSAGE,
    TERMINAL_JOB_STATES,
    Compute,
    Job,
    Node,
    TrackedResource,
    parse_duration_seconds,
    utcnow,
)
from airflow_azureml.emulator.pricing import PriceBook, PriceError
from airflow_azureml.emulator.scoring import ScoringRegistry
from airflow_azureml.emulator.scoring.script import ScriptScorer

log = logging.getLogger(__name__)
#: ``azureml://datastores/<name>/paths/<path>`` and the long form with the workspace's ARM scope before it.
_DATA_URI = re.compile(
    r"^azureml:(?://|/)(?:subscriptions/[^/]+/resourcegroups/[^/]+/(?:providers/microsoft\.machinelearningservices/)?"
    r"workspaces/[^/]+/)?datastores/(?P<datastore>[^/]*)/paths/(?P<path>.*)$",
    re.IGNORECASE,
)


@dataclass
class Timing:
    """Simulated durations, in seconds. Small by default so that tests and the demo stay fast."""

    provisioning: float = 0.05
    node_startup: float = 0.1
    mini_batch: float = 0.05
    command_job: float = 0.3
    tick: float = 0.02


# An environment version's create-only properties (swagger 2024-10-01, x-ms-mutability: create, read).
_ENVIRONMENT_DEFINITION = ("image", "condaFile", "build", "inferenceConfig", "osType", "autoRebuild")


class EmulatorError(Exception):
    """An error the emulator reports to clients as an ARM error body (``extra``: more keys of that body)."""

    def __init__(self, status: int, code: str, message: str, extra: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.extra = extra or {}


# Resource names as Azure ML documents them (emulator's own copy; the provider keeps its own rules).
COMPUTE_NAME = re.compile(r"[A-Za-z][A-Za-z0-9-]{1,22}[A-Za-z0-9]")  # 3-24 (the compute cluster how-to)
ENDPOINT_NAME = re.compile(r"[A-Za-z][A-Za-z0-9-]{1,30}[A-Za-z0-9]")


def check_resource_name(kind: str, name: str, rule: re.Pattern[str], says: str) -> None:
    if not rule.fullmatch(name):
        raise EmulatorError(400, "BadRequest", f"Invalid {kind} name {name!r}: {says}, not ending with '-'")


@dataclass
class Behaviour:
    """Switches of the emulator's behaviour; each default is Azure's where Azure is documented.

    docs/emulator.md ("Behaviours") gives the source of every default. Change them with
    ``Emulator.set_behaviour(**switches)`` or ``POST /_emulator/behaviour``.
    """

    preempted_gauge: bool = True  # preemptedNodeCount counts nodes in preempted state now (swagger 2024-10-01)
    preempted_node_release_seconds: float = 0.5  # how long an evicted node stays "preempted" before deallocation
    single_node_eviction_cancels: bool = True  # seed 000/001: a single-node cluster's eviction cancels its jobs
    capacity_cancel_message: bool = False  # a capacity-lost cancel carries a warning text (Azure documents none)
    capacity_cancel_after_seconds: float = 0.0  # how long a job that lost its capacity stays as it was before its end
    cancel_requested_seconds: float = 0.0  # how long every cancel shows CancelRequested (0: one timing.tick)
    cancel_lag_seconds: float = 0.0  # a cancel Azure accepted shows on the job this much later (it reads as before)
    honour_repeatability_id: bool = False  # invoke replays a job for a repeated Repeatability-Request-Id
    immutable_jobs: bool = True  # PUT of an existing job may change only description/tags/displayName/...
    stall_seconds: float = 0.0  # every job, once Running, goes NotResponding this long, then resumes
    honour_error_threshold: bool = True  # error_threshold counts failed files; -1 ignores failures
    validate_deployments: bool = True  # a deployment's settings are checked when it is written
    check_api_versions: bool = True  # ARM refuses a missing or unregistered api-version (emulator.api_versions)
    check_audiences: bool = True  # each plane refuses tokens issued for another audience (emulator.identity)
    list_ignores_properties_filter: bool = False  # the jobs LIST answers as if no ``properties`` filter was sent
    list_lag_seconds: float = 0.0  # a job shows in the jobs LIST only this long after it was created (GET at once)
    invoke_properties_dropped: bool = False  # a batch invoke's user properties never reach its job (Azure's own stay)
    storage_data_role: bool = True  # the service principal holds Storage Blob Data Contributor on the account
    activity_log_lag_seconds: float = 60.0  # an Activity Log event shows this long after it happened (ingestion)
    activity_log_reader: bool = True  # the service principal may read the Activity Log (Reader at the group)

    def update(self, values: dict[str, Any]) -> None:
        known = {f.name for f in fields(self)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise EmulatorError(400, "BadRequest", f"unknown behaviour switches {unknown}; known: {sorted(known)}")
        for key, value in values.items():
            if isinstance(getattr(self, key), bool):
                if not isinstance(value, bool):
                    raise EmulatorError(400, "BadRequest", f"behaviour {key!r} is a boolean, got {value!r}")
            elif isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise EmulatorError(400, "BadRequest", f"behaviour {key!r} is a number of seconds >= 0, got {value!r}")
            else:
                value = float(value)
            setattr(self, key, value)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


DEPLOYMENT_SWITCHES = frozenset({"ignore_job_name"})  # per-deployment behaviour switches


class Workspace:
    """All state of one emulated workspace. Methods run on the emulator's event loop."""

    def __init__(self, data_dir: Path, *, seed: int = 0, timing: Timing | None = None) -> None:
        self.data_dir = data_dir
        self.timing = timing or Timing()
        self.rng = random.Random(seed)
        self.created = utcnow()  # when the workspace (and its default datastores) came to be
        self.computes: dict[str, Compute] = {}
        self.endpoints: dict[str, TrackedResource] = {}
        self.deployments: dict[tuple[str, str], TrackedResource] = {}
        self.jobs: dict[str, Job] = {}
        self.models: dict[str, dict[str, dict[str, Any]]] = {}
        self.environments: dict[tuple[str, str], TrackedResource] = {}  # (name, version) -> environment version
        self.scoring = ScoringRegistry()
        self.blobs = BlobStore(data_dir / "blobs")  # the workspace's storage account (emulator.blobs)
        self.codes = CodeAssets(self.blobs)  # code versions, uploaded there (emulator.codes)
        self.scripts: dict[str, ScriptScorer] = {}  # job -> its deployment's own scoring script, while it runs
        self.eviction_rate: dict[str, float] = {}  # cluster -> evictions per node per second
        # Test control, not an Azure behaviour: a Running job on a held cluster keeps its nodes but takes no
        # work (and a command job does not end) until it is released, so that a test's fault lands while the
        # job runs, with its work still ahead, however loaded the machine is.
        self.held_clusters: set[str] = set()
        self.released_jobs: set[str] = set()
        self.held_preemptions: dict[str, tuple[int | None, set[str], str]] = {}  # see preempt_cluster
        self.behaviour = Behaviour()
        self.prices = PriceBook()
        self.billing = Ledger(self.prices)  # the emulator's own bill (control API only), fed by _billed()
        self.deployment_behaviour: dict[tuple[str, str], dict[str, bool]] = {}
        self._nodes_wanted: dict[str, tuple[str, int]] = {}  # job -> (compute, nodes it waits for)
        self.kube_clusters: dict[str, KubeCluster] = {}  # Kubernetes clusters, attached or not yet
        self._runners: dict[str, asyncio.Task[None]] = {}
        self._node_workers: dict[str, list[asyncio.Task[None]]] = {}
        self._background: set[asyncio.Task[Any]] = set()
        self.register_model("heart-classifier", "1", scoring_module="airflow_azureml.emulator.scoring.heart")

    # ------------------------------------------------------------------ paths
    def datastore_root(self, datastore: str, *, create: bool = True) -> Path:
        """``DIR/datastores/<name>``, for a name Azure accepts only: nothing resolves outside that folder."""
        try:
            check_datastore_name(datastore)
        except RuleViolation as exc:
            raise EmulatorError(400, "UserError", str(exc)) from None
        root = self.data_dir / "datastores" / datastore
        if create:
            root.mkdir(parents=True, exist_ok=True)
        return root

    def resolve_uri(self, uri: str, *, existing: bool = False) -> Path:
        """Map ``azureml://datastores/<ds>/paths/<p>`` (or the long ARM form) to a folder under its datastore.

        ``existing``: the datastore must exist already (``workspaceblobstore`` or a folder under
        ``DIR/datastores/``), else 404, and nothing is created: what a request's data paths need.
        """
        match = _DATA_URI.match(uri) if isinstance(uri, str) else None
        if match is None:
            raise EmulatorError(
                400, "UserError", f"Unsupported data path {uri!r}: use azureml://datastores/<name>/paths/<path>"
            )
        root = self.datastore_root(match["datastore"], create=not existing)
        if existing and match["datastore"] != "workspaceblobstore" and not root.is_dir():
            raise EmulatorError(
                404,
                "UserError",
                f"Datastore {match['datastore']!r} was not found in the workspace (data path {uri!r}).",
            )
        root = root.resolve()
        target = (root / match["path"].strip("/")).resolve()
        if root not in target.parents and target != root:
            raise EmulatorError(400, "UserError", f"Data path {uri!r} escapes its datastore")
        return target

    # ----------------------------------------------------------------- models
    def register_model(self, name: str, version: str, *, scoring_module: str | None = None) -> None:
        now = utcnow().isoformat()
        self.models.setdefault(name, {})[version] = {
            "description": "demo model served by the emulator",
            "modelType": "mlflow_model",
            "flavors": {"python_function": {"data": {"loader_module": "mlflow.pyfunc.model"}}},
            "modelUri": f"azureml://datastores/workspaceblobstore/paths/models/{name}/{version}",
            "properties": {},
            "tags": {},
            "createdAt": now,
        }
        if scoring_module:
            self.scoring.register(name, scoring_module)

    # -------------------------------------------------------------- behaviour
    def set_behaviour(self, values: dict[str, Any]) -> dict[str, Any]:
        self.behaviour.update(values)
        for compute in self.computes.values():
            compute.preempted_gauge = self.behaviour.preempted_gauge
        return self.behaviour.to_dict()

    def set_deployment_behaviour(self, endpoint: str, deployment: str, values: dict[str, Any]) -> dict[str, bool]:
        unknown = sorted(set(values) - DEPLOYMENT_SWITCHES)
        if unknown:
            raise EmulatorError(400, "BadRequest", f"unknown deployment switches {unknown}")
        if any(not isinstance(v, bool) for v in values.values()):
            raise EmulatorError(400, "BadRequest", "deployment switches are booleans")
        current = self.deployment_behaviour.setdefault((endpoint, deployment), {})
        current.update(values)
        return dict(current)

    # --------------------------------------------------------------- computes
    def kube_cluster(self, name: str) -> KubeCluster:
        """The Kubernetes cluster ``name`` (created on first use: a cluster exists before it is attached)."""
        cluster = self.kube_clusters.get(name)
        if cluster is None:
            cluster = self.kube_clusters[name] = KubeCluster(name=name)
        return cluster

    def put_compute(self, name: str, body: dict[str, Any]) -> tuple[Compute, bool]:
        props = dict(body.get("properties") or {})
        compute_type = props.get("computeType", "AmlCompute")
        if compute_type not in ("AmlCompute", "Kubernetes"):
            raise EmulatorError(400, "BadRequest", f"computeType {compute_type!r} is not supported here")
        existing = self.computes.get(name)
        if existing is None:
            check_resource_name("compute", name, COMPUTE_NAME, "3-24 characters: letters, digits, '-'; a letter first")
        if existing is not None and existing.compute_type != compute_type:
            raise EmulatorError(409, "Conflict", f"Compute {name!r} exists with type {existing.compute_type}")
        inner = dict(props.get("properties") or {})
        if compute_type == "AmlCompute":
            scale = inner.get("scaleSettings") or {}
            lo, hi = int(scale.get("minNodeCount", 0)), int(scale.get("maxNodeCount", 1))
            if lo > hi:
                raise EmulatorError(400, "BadRequest", "minNodeCount cannot exceed maxNodeCount")
            if existing is not None and existing.low_priority != (
                str(inner.get("vmPriority", "Dedicated")).lower() == "lowpriority"
            ):
                raise EmulatorError(409, "Conflict", "vmPriority of an existing cluster cannot be changed")
            old_size = str((existing.body.get("properties") or {}).get("vmSize", "")).lower() if existing else ""
            if old_size and str(inner.get("vmSize", "")).lower() != old_size:
                raise EmulatorError(409, "Conflict", "vmSize of an existing cluster cannot be changed")
        props.pop("provisioningState", None)
        created = existing is None
        if existing is None:
            existing = Compute(
                name=name, compute_type=compute_type, location=body.get("location") or "eastus", body=props
            )
            existing.preempted_gauge = self.behaviour.preempted_gauge
            self.computes[name] = existing
            if compute_type == "Kubernetes":  # attach: the cluster's InstanceType objects become the compute's
                existing.kube = self.kube_cluster(name)
        else:
            existing.body = props
            existing.modified = utcnow()
            existing.provisioning_state = "Updating"
        self._spawn(self._finish_provisioning(existing))
        return existing, created

    async def _finish_provisioning(self, compute: Compute) -> None:
        await asyncio.sleep(self.timing.provisioning)
        compute.provisioning_state = "Succeeded"
        compute.modified = utcnow()

    def delete_compute(self, name: str) -> bool:
        compute = self.computes.pop(name, None)
        if compute is None:
            return False
        self.billing.close(name)
        for job in self.jobs.values():
            if job.compute == name and job.status in ACTIVE_JOB_STATES:
                self._end_job(job, "Failed", error={"code": "UserError", "message": "Compute was deleted"})
        return True

    # -------------------------------------------------------- batch resources
    def put_endpoint(self, name: str, body: dict[str, Any]) -> tuple[TrackedResource, bool]:
        existing = self.endpoints.get(name)
        auth_mode = (body.get("properties") or {}).get("authMode", "AADToken")
        if (
            str(auth_mode).lower() != "aadtoken"
        ):  # batch endpoints take Microsoft Entra tokens only (the SDK sends aadToken)
            raise EmulatorError(400, "BadRequest", f"authMode {auth_mode!r} is not supported by batch endpoints")
        if existing is None:
            check_resource_name("batch endpoint", name, ENDPOINT_NAME, "3-32 characters: letters, digits and '-'")
        if existing is None:
            self.endpoints[name] = TrackedResource(name=name, body=body)
            return self.endpoints[name], True
        existing.body = body
        existing.modified = utcnow()
        return existing, False

    def put_deployment(self, endpoint: str, name: str, body: dict[str, Any]) -> tuple[TrackedResource, bool]:
        if endpoint not in self.endpoints:
            raise EmulatorError(404, "ResourceNotFound", f"Batch endpoint {endpoint!r} not found")
        props = body.get("properties") or {}
        compute_name = _short_name(props.get("compute"))
        if not compute_name or compute_name not in self.computes:
            raise EmulatorError(400, "UserError", f"Compute {props.get('compute')!r} not found in the workspace")
        compute = self.computes[compute_name]
        if self.behaviour.validate_deployments:
            _BatchSettings.from_deployment(props, {})  # refuse bad settings now, not at the first invoke
        resources = props.get("resources") or {}
        model = props.get("model") or {}
        asset = model.get("assetId") or ""
        model_name = _model_name_from_asset(asset)
        if model_name and model_name not in self.models:
            raise EmulatorError(400, "UserError", f"Model {model_name!r} is not registered")
        code_configuration = props.get("codeConfiguration")
        code_id = (code_configuration or {}).get("codeId")
        if code_id and self.codes.folder(code_id) is None:
            raise EmulatorError(400, "UserError", f"Code {code_id!r} was not found in the workspace")
        if code_configuration is not None:  # 2024-10-01 swagger: CodeConfiguration.scoringScript, required, minLength 1
            script = str(code_configuration.get("scoringScript") or "")
            if not script.strip():
                raise EmulatorError(400, "UserError", "codeConfiguration.scoringScript is required")
            if PurePosixPath(script.replace("\\", "/")).is_absolute() or ".." in PurePosixPath(script).parts:
                raise EmulatorError(400, "UserError", f"Scoring script {script!r} must be a path inside the code")
        if compute.compute_type == "Kubernetes":
            type_name = resources.get("instanceType") or DEFAULT_NAME
            itype = self.check_instance_type(compute, resources.get("instanceType"))
            if model_name and not props.get("codeConfiguration") and self._is_mlflow(model_name, asset):
                try:  # source document 003: an MLflow model needs 2 CPU and 4 GB, or the deployment fails
                    check_mlflow_minimum(
                        (resources.get("properties") or {}).get("resources"), from_compute_entry(type_name, itype)
                    )
                except RuleViolation as exc:
                    raise EmulatorError(400, "UserError", str(exc)) from None
        key = (endpoint, name)
        existing = self.deployments.get(key)
        if existing is None:
            self.deployments[key] = TrackedResource(name=name, body=body)
            return self.deployments[key], True
        existing.body = body
        existing.modified = utcnow()
        return existing, False

    def put_environment_version(self, name: str, version: str, body: dict[str, Any]) -> tuple[TrackedResource, bool]:
        """Create an environment version, or update its description/tags; its definition never changes.

        The swagger (2024-10-01, ``EnvironmentVersion``) marks image, condaFile, build, inferenceConfig,
        osType and autoRebuild ``x-ms-mutability: [create, read]``: another definition under an existing
        version is refused (409, as the SDK's ``ResourceExistsError`` handling expects), the same one is a 200.
        """
        props = body.get("properties") or {}
        existing = self.environments.get((name, version))
        if existing is None:
            self.environments[(name, version)] = TrackedResource(name=version, body=body)
            return self.environments[(name, version)], True
        have = existing.body.get("properties") or {}
        changed = [k for k in _ENVIRONMENT_DEFINITION if have.get(k) != props.get(k)]
        if changed:
            raise EmulatorError(
                409,
                "UserError",
                f"Environment {name}:{version} already exists with another {', '.join(changed)}; "
                "an environment version cannot be changed, create a new version.",
            )
        mutable = {k: props[k] for k in ("description", "tags", "properties", "isArchived", "stage") if k in props}
        existing.body = {**existing.body, "properties": {**have, **mutable}}
        existing.modified = utcnow()
        return existing, False

    def _is_mlflow(self, model_name: str, asset: str) -> bool:
        """Whether the deployment's model (any registered version, or the one named) is an MLflow model."""
        versions = self.models.get(model_name) or {}
        version = asset.rsplit(":", 1)[-1] if asset.count(":") >= 2 else asset.rsplit("/versions/", 1)[-1]
        chosen = [versions[version]] if version in versions else list(versions.values())
        return any(str(v.get("modelType", "")).lower() in ("mlflow_model", "mlflowmodel") for v in chosen)

    def check_instance_type(self, compute: Compute, instance_type: str | None) -> dict[str, Any]:
        types = compute.instance_types()
        chosen = instance_type or DEFAULT_NAME
        lowered = {k.lower(): v for k, v in types.items()}
        if chosen.lower() not in lowered:
            raise EmulatorError(
                400,
                "UserError",
                f"Instance type {chosen!r} is not defined on Kubernetes compute {compute.name!r}; "
                f"known: {sorted(types)}",
            )
        return lowered[chosen.lower()]

    # ------------------------------------------------------------------- jobs
    def find_job_by_repeatability(self, request_id: str | None) -> Job | None:
        if not request_id:
            return None
        return next((j for j in self.jobs.values() if j.repeatability_id == request_id), None)

    def invoke_batch(
        self, endpoint: str, deployment_name: str | None, body: dict[str, Any], request_id: str | None
    ) -> Job:
        """Create a batch job from the data-plane invoke body (as ``batch_endpoints.invoke`` sends it).

        Everything is checked before the job exists: a refused invoke leaves no job behind.
        """
        replay = self.find_job_by_repeatability(request_id) if self.behaviour.honour_repeatability_id else None
        if replay is not None:
            return replay
        ep = self.endpoints.get(endpoint)
        if ep is None:
            raise EmulatorError(404, "ResourceNotFound", f"Batch endpoint {endpoint!r} not found")
        if not deployment_name:
            deployment_name = ((ep.body.get("properties") or {}).get("defaults") or {}).get("deploymentName")
        deployment = self.deployments.get((endpoint, deployment_name or ""))
        if deployment is None:
            raise EmulatorError(
                404, "ResourceNotFound", f"Deployment {deployment_name!r} not found on endpoint {endpoint!r}"
            )
        props = body.get("properties") or {}
        dep = dict(deployment.body.get("properties") or {})
        ignore_name = self.deployment_behaviour.get((endpoint, deployment.name), {}).get(
            "ignore_job_name",
            _is_pipeline_component(dep),  # Azure/azure-sdk-for-python#32763
        )
        requested = props.get("name")
        if requested is not None:
            try:  # a name Azure refuses is refused even where Azure would not use it
                check_job_name(requested)
            except RuleViolation as exc:
                raise EmulatorError(400, "UserError", str(exc)) from None
        name = (None if ignore_name else requested) or f"batchjob-{uuid.uuid4()}"
        if name in self.jobs:
            raise EmulatorError(409, "UserError", f"A job named {name!r} already exists in this workspace")
        settings = _BatchSettings.from_deployment(dep, props)  # 400 on a bad override, before any job exists
        inputs = props.get("inputData") or props.get("inputDataset") or {}
        input_uri = _first_input_uri(inputs)
        if not input_uri:
            raise EmulatorError(400, "UserError", "The invocation has no input data")
        input_dir = self.resolve_uri(input_uri, existing=True)
        if not input_dir.exists():
            raise EmulatorError(400, "UserError", f"Input path {input_uri!r} does not exist")
        if not any(p.is_file() for p in input_dir.rglob("*")):
            raise EmulatorError(400, "UserError", f"No input files found under {input_uri!r}")
        output_uri = _output_uri(props, name)
        self.resolve_uri(output_uri, existing=True)  # 400/404 now, not a job that fails when it writes
        # A deployment's compute is fixed for all its jobs ("per-job configuration is not possible",
        # 000/001): an invoke's compute.target is accepted and ignored, the least convenient reading.
        compute = _short_name(dep.get("compute")) or ""
        if compute not in self.computes:
            raise EmulatorError(400, "UserError", f"Compute {compute!r} not found in the workspace")
        user_props = dict(props.get("properties") or {})
        experiment = user_props.pop("experimentName", None) or endpoint
        if self.behaviour.invoke_properties_dropped:  # nothing documents that they reach the job
            user_props = {}
        input_name = next((k for k, v in inputs.items() if isinstance(v, dict)), "input_data")
        job = Job(
            name=name,
            job_type="Pipeline",
            compute=compute,
            experiment_name=experiment,
            repeatability_id=request_id,
            endpoint=endpoint,
            deployment=deployment.name,
            output_uri=output_uri,
            input_uri=input_uri,
            properties={
                "displayName": name,
                # what Azure itself tags and records on a batch job (a real batch-deployment job's record)
                "tags": {
                    "azureml.batchrun": "true",
                    "azureml.deploymentname": deployment.name,
                    "azureml.jobtype": "azureml.pipelinejob",
                },
                "properties": {
                    # the invoke body's user properties are kept, as Azure keeps a job's properties
                    **{k: str(v) for k, v in user_props.items()},
                    "azureml.endpointname": endpoint,
                    "azureml.parameters": "{}",
                    "azureml.pipelineComponent": "pipelinerun",
                    "azureml.runLineageType": "batchDeployment",
                    "azureml.runsource": "azureml.PipelineRun",
                    "runSource": "BatchDeployment",
                    "runType": "HTTP",
                },
                "inputs": {input_name: {"jobInputType": "uri_folder", "uri": input_uri, "mode": "ReadOnlyMount"}},
                "outputs": {"score": {"jobOutputType": "uri_folder", "uri": output_uri, "mode": "Upload"}},
            },
        )
        self.jobs[name] = job
        self._runners[name] = self._spawn(self._run_batch(job, settings, input_dir))
        return job

    def put_command_job(self, name: str, body: dict[str, Any]) -> tuple[Job, bool]:
        props = dict(body.get("properties") or {})
        existing = self.jobs.get(name)
        if existing is not None:
            if self.behaviour.immutable_jobs:
                self._update_job(existing, props)
            return existing, False
        if props.get("jobType", "Command") == "Command" and not str(props.get("command") or "").strip():
            raise EmulatorError(400, "UserError", "A command job needs a command (CommandJob.command is required)")
        compute_name = _short_name(props.get("computeId")) or ""
        compute = self.computes.get(compute_name)
        if compute is None:
            raise EmulatorError(400, "UserError", f"Compute {props.get('computeId')!r} not found")
        if compute.compute_type == "Kubernetes":
            resources = props.get("resources") or {}
            itype = self.check_instance_type(compute, resources.get("instanceType"))
            _check_fits(resources.get("properties") or {}, itype, resources.get("instanceType") or DEFAULT_NAME)
        job = Job(
            name=name,
            job_type=props.get("jobType", "Command"),
            compute=compute_name,
            experiment_name=props.get("experimentName") or "Default",
            properties={k: v for k, v in props.items() if k not in ("status", "computeId", "jobType")},
            submitted=props,
        )
        self.jobs[name] = job
        self._runners[name] = self._spawn(self._run_command(job, compute))
        return job, True

    def _update_job(self, job: Job, props: dict[str, Any]) -> None:
        """A PUT of an existing job: only Azure's mutable fields may change; the rest must be identical."""
        baseline = job.submitted if job.submitted is not None else job.properties
        old, new = _immutable_view(baseline), _immutable_view(props)
        changed = sorted(k for k in set(old) | set(new) if old.get(k) != new.get(k))
        stored = job.properties.setdefault("properties", {}) or {}
        altered = [k for k, v in (props.get("properties") or {}).items() if k in stored and stored[k] != v]
        if changed or altered:
            prop = (changed[0][:1].upper() + changed[0][1:]) if changed else "Properties"
            raise EmulatorError(
                400,
                "UserError",
                "A job with this name already exists. If you are trying to create a new job, use a different name. "
                f"If you are trying to update an existing job, the existing job's {prop} cannot be changed. "
                "Only description, tags, displayName, properties, and isArchived can be updated.",
                {"messageParameters": {"property": f" {prop}"}, "innerError": {"code": "Immutable"}},
            )
        for key in ("description", "displayName", "isArchived"):
            if key in props:
                job.properties[key] = props[key]
        job.properties["tags"] = {**(job.properties.get("tags") or {}), **(props.get("tags") or {})}
        stored.update(props.get("properties") or {})
        job.modified = utcnow()

    def stall_job(self, name: str, seconds: float) -> Job:
        """The job stops responding for ``seconds`` (status NotResponding), then resumes where it was."""
        job = self.jobs.get(name)
        if job is None:
            raise EmulatorError(404, "UserError", f"Job {name!r} not found")
        if job.status != "Running":
            raise EmulatorError(409, "Conflict", f"Job {name!r} is {job.status}; only a Running job can stall")
        job.stalled = True
        job.set_status("NotResponding")
        self._spawn(self._resume(job, seconds))
        return job

    async def _resume(self, job: Job, seconds: float) -> None:
        await asyncio.sleep(seconds)
        if job.status == "NotResponding":
            job.set_status("Running")

    async def _while_stalled(self, job: Job) -> None:
        while job.status == "NotResponding" or self._held(job):
            await asyncio.sleep(self.timing.tick)

    def _held(self, job: Job) -> bool:
        return job.status == "Running" and job.compute in self.held_clusters and job.name not in self.released_jobs

    def hold_cluster(self, name: str, held: bool = True) -> None:
        """Hold (or let go) the Running jobs on a cluster before their end; see ``held_clusters``."""
        if held:
            self.held_clusters.add(name)
        else:
            self.held_clusters.discard(name)

    def release_job(self, name: str) -> None:
        self.released_jobs.add(name)

    def _now_running(self, job: Job) -> None:
        job.set_status("Running")
        if self.behaviour.stall_seconds > 0 and not job.stalled:
            self.stall_job(job.name, self.behaviour.stall_seconds)

    def create_synthetic_jobs(
        self,
        prefix: str,
        durations: list[float],
        queue_seconds: float = 0.0,
        properties: dict[str, str] | None = None,
    ) -> list[str]:
        """Jobs with fixed timelines and no compute, for load tests of the waiting side.

        ``properties``: user properties every job carries, as a submitter's would (a load test of
        waits on the provider's own jobs needs the property its job LIST filters on).
        """
        names = []
        for index, duration in enumerate(durations):
            name = f"{prefix}-{index:05d}"
            if name in self.jobs:
                raise EmulatorError(409, "UserError", f"A job named {name!r} already exists in this workspace")
            job = Job(
                name=name,
                job_type="Command",
                compute="",
                properties={"displayName": name, "properties": dict(properties or {})},
            )
            self.jobs[name] = job
            self._runners[name] = self._spawn(self._run_synthetic(job, queue_seconds, float(duration)))
            names.append(name)
        return names

    async def _run_synthetic(self, job: Job, queue_seconds: float, duration: float) -> None:
        job.set_status("Queued")
        await asyncio.sleep(queue_seconds)
        job.set_status("Running")
        await asyncio.sleep(duration)
        self._end_job(job, "Completed")

    def cancel_job(self, name: str) -> Job:
        job = self.jobs.get(name)
        if job is None:
            raise EmulatorError(404, "UserError", f"Job {name!r} not found")
        if job.status in TERMINAL_JOB_STATES:
            return job
        job.cancel_requested = True  # kept for tests only: nothing on the wire tells who canceled
        if self.behaviour.cancel_lag_seconds > 0:  # accepted now, seen later: reads still show the job running
            self._spawn(self._land_cancel(job, self.behaviour.cancel_lag_seconds))
            return job
        job.set_status("CancelRequested")
        self._spawn(self._finish_cancel(job))
        return job

    async def _land_cancel(self, job: Job, lag: float) -> None:
        await asyncio.sleep(lag)
        if job.status not in TERMINAL_JOB_STATES:
            job.set_status("CancelRequested")
            await self._finish_cancel(job)

    async def _finish_cancel(self, job: Job) -> None:
        await asyncio.sleep(self.behaviour.cancel_requested_seconds or self.timing.tick)
        if job.status == "CancelRequested":
            self._end_job(job, "Canceled")

    # ------------------------------------------------------------- node pool
    def _free_capacity(self, compute: Compute) -> int:
        return max(0, compute.capacity - len(compute.nodes))

    def _allocate(self, compute: Compute, job: Job, wanted: int) -> list[Node]:
        take = min(wanted, self._free_capacity(compute))
        nodes = [Node(node_id=f"tvm-{uuid.uuid4().hex[:12]}", job_name=job.name) for _ in range(take)]
        compute.nodes.extend(nodes)
        self._billed(compute)
        return nodes

    def _release(self, compute: Compute | None, job: Job) -> None:
        self._want_nodes(job, None, 0)
        if compute is None:
            return
        compute.nodes = [n for n in compute.nodes if n.job_name != job.name]
        self._billed(compute)

    def _want_nodes(self, job: Job, compute: Compute | None, count: int) -> None:
        """Record how many nodes ``job`` still waits for: the cluster's targetNodeCount includes them."""
        previous = self._nodes_wanted.pop(job.name, None)
        if compute is not None and count > 0:
            self._nodes_wanted[job.name] = (compute.name, count)
        for name in {c for c in (previous[0] if previous else None, compute.name if compute else None) if c}:
            if name in self.computes:
                self.computes[name].replacements_wanted = sum(n for c, n in self._nodes_wanted.values() if c == name)

    # ----------------------------------------------------------- batch runner
    async def _run_batch(self, job: Job, settings: _BatchSettings, input_dir: Path) -> None:
        """Run the job to an end, whatever happens inside: a runner failure ends it Failed, as in Azure."""
        workers: dict[asyncio.Task[None], Node] = {}
        try:
            await self._batch_body(job, settings, input_dir, workers)
        except (_JobEnded, asyncio.CancelledError):
            return
        except Exception as exc:  # scoring module import/init, output writing, anything else in the runner
            log.warning("batch job %s failed in the runner: %s", job.name, exc)
            detail = f"{type(exc).__name__}: {exc}"
            self._end_job(
                job, "Failed", error={"code": "UserError", "message": RUNNER_FAILED_MESSAGE.format(detail=detail)}
            )
        finally:
            for task in list(workers):
                task.cancel()
            script = self.scripts.pop(job.name, None)
            if script is not None:
                script.close()
            self._release(self.computes.get(job.compute), job)

    async def _batch_body(
        self, job: Job, settings: _BatchSettings, input_dir: Path, workers: dict[asyncio.Task[None], Node]
    ) -> None:
        files = sorted(str(p) for p in input_dir.rglob("*") if p.is_file())
        batches = [files[i : i + settings.mini_batch_size] for i in range(0, len(files), settings.mini_batch_size)]
        job.mini_batches_total = len(batches)
        results: dict[int, list[str]] = {}
        failures: dict[int, str] = {}
        attempts: dict[int, int] = {}
        queue: list[int] = list(range(len(batches)))
        in_flight: dict[asyncio.Task[None], int] = {}
        await asyncio.sleep(self.timing.tick)
        if job.status == "CancelRequested":  # cancelled before it queued: the cancel ends it, as in Azure
            return
        job.set_status("Queued")
        if self.computes.get(job.compute) is None:
            self._end_job(job, "Failed", error={"code": "UserError", "message": "Compute not found"})
            return
        scorer: Any = None

        async def work(node: Node, index: int) -> None:
            attempts[index] = attempts.get(index, 0) + 1
            job.mini_batch_attempts += 1
            try:
                await asyncio.sleep(self.timing.mini_batch)
                rows = await asyncio.wait_for(asyncio.to_thread(scorer.run, batches[index]), timeout=settings.timeout)
                results[index] = rows
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the scoring script failed this mini-batch
                if attempts[index] <= settings.max_retries:
                    queue.append(index)
                else:
                    failures[index] = f"{type(exc).__name__}: {exc}"

        while len(results) + len(failures) < len(batches):
            compute = self.computes.get(job.compute)
            if compute is None:
                raise _JobEnded()
            mine = [n for n in compute.nodes if n.job_name == job.name]
            missing = settings.instance_count - len(mine)
            if missing > 0 and job.status != "CancelRequested":  # a job being canceled takes no new nodes
                for node in self._allocate(compute, job, missing):
                    self._spawn(self._start_node(compute, node))
                mine = [n for n in compute.nodes if n.job_name == job.name]
            self._want_nodes(job, compute, settings.instance_count - len(mine))
            ready = [n for n in mine if n.state in ("idle", "running")]
            if ready and scorer is None:
                # init() runs on the nodes: an import error or a raising init() fails the job
                scorer = await self._load_scorer(job, settings)
            if ready and job.status == "Queued":
                self._now_running(job)
            # evicted nodes: put their unfinished mini-batches back in the queue
            for task, node in list(workers.items()):
                if (node not in compute.nodes or node.state == "preempted") and not task.done():
                    task.cancel()
            for task in [t for t in workers if t.done()]:
                index = in_flight.pop(task)
                node = workers.pop(task)
                if task.cancelled() and index not in results:
                    queue.insert(0, index)
                if node in compute.nodes and node.state == "running" and not any(w is node for w in workers.values()):
                    node.state = "idle"
                    self._billed(compute)
            failed_files = sum(len(batches[i]) for i in failures)
            if failures and self._over_threshold(settings, failed_files):
                self._fail_batch(job, settings, failures, failed_files, len(files))
                return
            if job.status == "Running" and not self._held(job):  # a NotResponding (or held) job takes no new work
                for node in ready:
                    busy = sum(1 for n in workers.values() if n is node)
                    while queue and busy < settings.max_concurrency:
                        index = queue.pop(0)
                        task = asyncio.get_running_loop().create_task(work(node, index))
                        workers[task] = node
                        in_flight[task] = index
                        node.state = "running"
                        self._billed(compute)
                        busy += 1
            job.mini_batches_done = len(results)
            await asyncio.sleep(self.timing.tick)
        failed_files = sum(len(batches[i]) for i in failures)
        if failures and self._over_threshold(settings, failed_files):  # the last mini-batches to end failed
            self._fail_batch(job, settings, failures, failed_files, len(files))
            return
        await self._while_stalled(job)
        if job.status == "CancelRequested":
            return  # the cancel ends it (_finish_cancel), not the last mini-batch
        job.set_status("Finalizing")
        if failures and not results:
            self._end_job(job, "Failed", error={"code": "UserError", "message": NO_RESULT_MESSAGE})
            return
        rows = [row for index in range(len(batches)) if index in results for row in results[index]]
        job.rows_scored = len(rows)
        if settings.output_action == "append_row":
            self._write_output(job, settings.output_file_name, rows)
        self._end_job(job, "Completed")

    def _over_threshold(self, settings: _BatchSettings, failed_files: int) -> bool:
        if not self.behaviour.honour_error_threshold:
            return True  # legacy: the first mini-batch that fails after its retries fails the job
        return settings.error_threshold >= 0 and failed_files > settings.error_threshold

    def _fail_batch(
        self, job: Job, settings: _BatchSettings, failures: dict[int, str], failed_files: int, total: int
    ) -> None:
        first = min(failures)
        if self.behaviour.honour_error_threshold:
            detail = (
                f"The error threshold {settings.error_threshold} was exceeded: {failed_files} of {total} "
                f"file(s) failed. First failure: mini-batch {first}: {failures[first]}"
            )
        else:
            detail = (
                f"{len(failures)} mini-batch(es) failed after {settings.max_retries} retries; "
                f"first: mini-batch {first}: {failures[first]}"
            )
        self._end_job(
            job, "Failed", error={"code": "UserError", "message": RUNNER_FAILED_MESSAGE.format(detail=detail)}
        )

    async def _load_scorer(self, job: Job, settings: _BatchSettings) -> Any:
        """The deployment's own scoring script (its uploaded code) if it has one, else the model's built-in one."""
        dep = self.deployments.get((job.endpoint or "", job.deployment or ""))
        code = ((dep.body if dep else {}).get("properties") or {}).get("codeConfiguration") or {}
        folder = self.codes.folder(code.get("codeId") or "") if code.get("codeId") else None
        if folder is None:
            return await asyncio.to_thread(self.scoring.load, self._model_of(job))
        model = self._model_of(job)
        versions = self.models.get(model) or {}
        asset = str((((dep.body if dep else {}).get("properties") or {}).get("model") or {}).get("assetId") or "")
        named = asset.rsplit("/versions/", 1)[-1] if "/versions/" in asset else None
        chosen = named if named in versions else (max(versions, key=_version_number) if versions else None)
        uri = versions[chosen]["modelUri"] if chosen else ""
        model_dir = self.resolve_uri(uri) if uri else self.data_dir / "models" / model
        model_dir.mkdir(parents=True, exist_ok=True)
        script = ScriptScorer(
            folder,
            str(code.get("scoringScript") or ""),
            model_dir=model_dir,
            work_dir=self.data_dir / "job-runs" / job.name,
            timeout=settings.timeout,
        )
        self.scripts[job.name] = script
        await asyncio.to_thread(script.start)
        return script

    def _model_of(self, job: Job) -> str:
        dep = self.deployments.get((job.endpoint or "", job.deployment or ""))
        asset = (((dep.body if dep else {}).get("properties") or {}).get("model") or {}).get("assetId") or ""
        return _model_name_from_asset(asset) or "heart-classifier"

    async def _start_node(self, compute: Compute, node: Node) -> None:
        await asyncio.sleep(self.timing.node_startup)
        if node.state == "preparing":
            node.state = "idle"
            self._billed(compute)

    def _write_output(self, job: Job, file_name: str, rows: list[str]) -> None:
        folder = self.resolve_uri(job.output_uri or "")
        check_output_file_name(file_name)  # checked when written; again here so that nothing lands elsewhere
        target = (folder / file_name).resolve()
        if target.parent != folder:
            raise RuntimeError(f"The output file {file_name!r} is not inside the output folder")
        tmp = folder / f".{file_name}.{job.name}.tmp"
        try:
            folder.mkdir(parents=True, exist_ok=True)
            tmp.write_text("".join(r if r.endswith("\n") else r + "\n" for r in rows))
            tmp.replace(target)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise RuntimeError(f"Cannot write the output file {file_name!r}: {exc.strerror or exc}") from None

    async def _run_command(self, job: Job, compute: Compute) -> None:
        try:
            await asyncio.sleep(self.timing.tick)
            job.set_status("Queued")
            nodes: list[Node] = []
            if compute.compute_type == "AmlCompute":
                while not nodes:
                    nodes = self._allocate(compute, job, 1)
                    self._want_nodes(job, compute, 1 - len(nodes))
                    if not nodes:
                        await asyncio.sleep(self.timing.tick)
                await asyncio.sleep(self.timing.node_startup)
                for node in nodes:
                    node.state = "running"
                self._billed(compute)
            self._now_running(job)
            await asyncio.sleep(self.timing.command_job)
            await self._while_stalled(job)
            if compute.compute_type == "AmlCompute" and not any(n.job_name == job.name for n in compute.nodes):
                return  # preempted: the preemption already ended the job
            if job.status == "CancelRequested":
                return  # the cancel ends it
            self._end_job(job, "Completed")
        except asyncio.CancelledError:
            return
        finally:
            self._release(self.computes.get(job.compute), job)

    def _end_job(self, job: Job, status: str, *, error: dict[str, Any] | None = None) -> None:
        if job.status in TERMINAL_JOB_STATES:
            return
        job.error = error
        job.set_status(status)
        runner = self._runners.pop(job.name, None)
        current = asyncio.current_task()
        if runner is not None and runner is not current and not runner.done():
            runner.cancel()
        self._release(self.computes.get(job.compute), job)

    # ---------------------------------------------------------------- faults
    def evict_nodes(self, cluster: str, count: int) -> int:
        """Evict ``count`` busy nodes: their in-flight mini-batches are redone elsewhere."""
        compute = self._cluster(cluster)
        busy = [n for n in compute.nodes if n.state in ("running", "idle", "preparing")]
        busy.sort(key=lambda n: n.state != "running")
        victims = busy[:count]
        jobs = {n.job_name for n in victims if n.job_name}
        for node in victims:
            self._evict(compute, node)
        if victims and compute.max_nodes == 1 and self.behaviour.single_node_eviction_cancels:
            delay = self.behaviour.capacity_cancel_after_seconds  # seed 000/001: a single-node cluster cannot go on
            if delay > 0:
                self._spawn(self._lose_capacity_later(compute, jobs, "canceled", delay))
            else:
                self._lose_capacity(compute, jobs, "canceled")
        return len(victims)

    def _evict(self, compute: Compute, node: Node) -> None:
        """One node taken back: counted in preemptedNodeCount until it is deallocated (a gauge)."""
        if node not in compute.nodes or node.state == "preempted":
            return
        compute.preempted_node_count += 1
        compute.modified = utcnow()
        node.job_name = None
        node.state = "preempted"
        if not self.behaviour.preempted_gauge:
            compute.nodes.remove(node)
            self._billed(compute)
            return
        self._billed(compute)
        node.preempted_at = asyncio.get_running_loop().time()
        self._spawn(self._deallocate(compute, node, self.behaviour.preempted_node_release_seconds))

    async def _deallocate(self, compute: Compute, node: Node, after: float) -> None:
        await asyncio.sleep(after)
        if node in compute.nodes:
            compute.nodes.remove(node)
            compute.modified = utcnow()
            self._billed(compute)

    def preempt_cluster(self, cluster: str, form: str = "canceled", *, hold_end: bool = False) -> list[str]:
        """Preempt every node; running jobs end as Canceled (lost capacity) or Failed (PreemptionError).

        ``hold_end`` is a test control, not an Azure behaviour: the jobs that lost their capacity stay as they
        were (capacity gone) until ``end_held_preemption``, so a test decides how long the service takes to
        end them, e.g. until the waits have read the gauge up, however loaded the machine is.
        """
        if form not in ("canceled", "failed"):
            raise EmulatorError(400, "BadRequest", "form must be 'canceled' or 'failed'")
        compute = self._cluster(cluster)
        # The jobs that lose capacity are those that held nodes (seeds 000/001: the job running on a
        # wholly preempted cluster is cancelled); a job still queued for nodes keeps waiting.
        holders = {n.job_name for n in compute.nodes if n.job_name and n.state != "preempted"}
        for node in list(compute.nodes):
            self._evict(compute, node)
        jobs = {
            j.name
            for j in self.jobs.values()
            if j.compute == cluster and j.status in ACTIVE_JOB_STATES and j.name in holders
        }
        if hold_end:
            if cluster in self.held_preemptions:
                raise EmulatorError(409, "Conflict", f"a held preemption of {cluster!r} has not ended yet")
            self.held_preemptions[cluster] = (compute.capacity_override, jobs, form)
            compute.capacity_override = 0  # no replacement node before the jobs end
            return sorted(jobs)
        delay = self.behaviour.capacity_cancel_after_seconds
        if delay > 0:  # the service ends the jobs a while after their nodes went
            self._spawn(self._lose_capacity_later(compute, jobs, form, delay))
            return sorted(jobs)
        return self._lose_capacity(compute, jobs, form)

    def end_held_preemption(self, cluster: str) -> list[str]:
        """Test control: end the jobs of a ``preempt_cluster(..., hold_end=True)`` and give the capacity back."""
        compute = self._cluster(cluster)
        if cluster not in self.held_preemptions:
            raise EmulatorError(409, "Conflict", f"no held preemption of {cluster!r} to end")
        before, jobs, form = self.held_preemptions.pop(cluster)
        try:
            return self._lose_capacity(compute, jobs, form)
        finally:
            compute.capacity_override = before

    async def _lose_capacity_later(self, compute: Compute, job_names: set[str], form: str, delay: float) -> None:
        # The spot capacity is gone while the service waits to get it back: no replacement node
        # is allocated before the jobs end, so they cannot finish in the meantime.
        before = compute.capacity_override
        compute.capacity_override = 0
        try:
            await asyncio.sleep(delay)
            self._lose_capacity(compute, job_names, form)
        finally:
            if compute.capacity_override == 0:
                compute.capacity_override = before

    def _lose_capacity(self, compute: Compute, job_names: set[str], form: str) -> list[str]:
        """End the jobs that lost their capacity, as Azure shows it: status (and the PreemptionError text)."""
        ended = []
        for job in list(self.jobs.values()):
            if job.name not in job_names or job.compute != compute.name or job.status not in ACTIVE_JOB_STATES:
                continue
            if form == "canceled":
                if self.behaviour.capacity_cancel_message:
                    job.warnings.append({"source": "capacity", "message": CAPACITY_LOST_MESSAGE})
                # through CancelRequested, as a person's cancel goes: a poller cannot tell them apart by status
                job.set_status("CancelRequested")
                self._spawn(self._finish_cancel(job))
            else:
                self._end_job(job, "Failed", error={"code": "UserError", "message": PREEMPTION_ERROR_MESSAGE})
            ended.append(job.name)
        return ended

    def set_capacity(self, cluster: str, nodes: int | None) -> None:
        self._cluster(cluster).capacity_override = nodes

    def set_eviction_rate(self, cluster: str, per_node_per_second: float) -> None:
        self._cluster(cluster)
        self.eviction_rate[cluster] = per_node_per_second
        if per_node_per_second > 0:
            self._spawn(self._random_evictions(cluster))

    async def _random_evictions(self, cluster: str) -> None:
        step = max(self.timing.tick, 0.02)
        while self.eviction_rate.get(cluster, 0) > 0 and cluster in self.computes:
            compute = self.computes[cluster]
            for node in list(compute.nodes):
                if node.state == "running" and self.rng.random() < self.eviction_rate[cluster] * step:
                    self._evict(compute, node)
            await asyncio.sleep(step)

    # ---------------------------------------------------------------- billing
    def _billed(self, compute: Compute) -> None:
        """After every change to a cluster's nodes: the bill follows it (emulator.billing)."""
        self.billing.sync(compute)

    def bill(self) -> dict[str, Any]:
        return self.billing.snapshot(self.computes.values())

    def set_price_ratio(
        self, vm_size: str, *, spot: float | None = None, low_priority: float | None = None
    ) -> dict[str, Any]:
        """Change a size's Spot / Low Priority rate against pay-as-you-go; time before it is billed at the old rate."""
        self.billing.sync_all(self.computes.values())
        try:
            return self.prices.set_ratio(vm_size, spot=spot, low_priority=low_priority)
        except PriceError as exc:
            raise EmulatorError(400, "BadRequest", str(exc)) from None

    def _cluster(self, name: str) -> Compute:
        compute = self.computes.get(name)
        if compute is None or compute.compute_type != "AmlCompute":
            raise EmulatorError(404, "ResourceNotFound", f"AmlCompute cluster {name!r} not found")
        return compute

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    async def shutdown(self) -> None:
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)


class _JobEnded(Exception):
    pass


@dataclass
class _BatchSettings:
    mini_batch_size: int
    instance_count: int
    max_concurrency: int
    max_retries: int
    timeout: float
    output_action: str
    output_file_name: str
    error_threshold: int

    @classmethod
    def from_deployment(cls, dep: dict[str, Any], invoke: dict[str, Any]) -> _BatchSettings:
        """The deployment's settings with the invoke's overrides; a bad value is a 400, as the service answers."""
        retry = {**(dep.get("retrySettings") or {}), **(invoke.get("retrySettings") or {})}
        action = str(dep.get("outputAction") or "AppendRow")
        if action.lower() not in ("appendrow", "append_row", "summaryonly", "summary_only"):
            raise _bad_setting("outputAction", action, "AppendRow or SummaryOnly")
        timeout = parse_duration_seconds(retry.get("timeout"), -1.0) if retry.get("timeout") is not None else 30.0
        if timeout <= 0:
            raise _bad_setting("retrySettings.timeout", retry.get("timeout"), "a positive ISO 8601 duration")
        return cls(
            mini_batch_size=_int_setting("miniBatchSize", invoke.get("miniBatchSize"), dep.get("miniBatchSize"), 10, 1),
            instance_count=_int_setting(
                "resources.instanceCount",
                (invoke.get("compute") or {}).get("instanceCount"),
                (dep.get("resources") or {}).get("instanceCount"),
                1,
                1,
            ),
            max_concurrency=_int_setting("maxConcurrencyPerInstance", None, dep.get("maxConcurrencyPerInstance"), 1, 1),
            max_retries=_int_setting("retrySettings.maxRetries", None, retry.get("maxRetries"), 3, 0),
            timeout=timeout,
            output_action="append_row" if action.lower() in ("appendrow", "append_row") else "summary_only",
            output_file_name=_output_file_name(invoke.get("outputFileName") or dep.get("outputFileName")),
            error_threshold=_int_setting(
                "errorThreshold", invoke.get("errorThreshold"), dep.get("errorThreshold"), -1, -1
            ),
        )


def _version_number(version: str) -> tuple[int, str]:
    return (int(version), "") if version.isdigit() else (-1, version)


def _output_file_name(value: Any) -> str:
    try:
        return check_output_file_name("predictions.csv" if value is None or value == "" else value)
    except RuleViolation as exc:
        raise EmulatorError(400, "UserError", str(exc)) from None


def _is_pipeline_component(dep: dict[str, Any]) -> bool:
    """A pipeline-component deployment (REST ``deploymentConfiguration.deploymentConfigurationType``)."""
    config = dep.get("deploymentConfiguration") or {}
    return (
        isinstance(config, dict) and str(config.get("deploymentConfigurationType", "")).lower() == "pipelinecomponent"
    )


def _bad_setting(field_name: str, value: Any, wanted: str) -> EmulatorError:
    return EmulatorError(400, "UserError", f"Invalid value {value!r} for {field_name}: expected {wanted}.")


def _int_setting(field_name: str, override: Any, value: Any, default: int, minimum: int) -> int:
    chosen = override if override is not None else value
    if chosen is None:
        return default
    if isinstance(chosen, bool) or not isinstance(chosen, (int, str)) or not str(chosen).lstrip("-").isdigit():
        raise _bad_setting(field_name, chosen, f"an integer >= {minimum}")
    if int(chosen) < minimum:
        raise _bad_setting(field_name, chosen, f"an integer >= {minimum}")
    return int(chosen)


_READ_ONLY_JOB_FIELDS = frozenset({"status", "services"})
_MUTABLE_JOB_FIELDS = frozenset({"description", "tags", "displayName", "properties", "isArchived"})


def _immutable_view(props: dict[str, Any]) -> dict[str, Any]:
    """The job fields Azure will not change on a PUT, with absent and null treated alike."""
    return {
        k: _without_nulls(v)
        for k, v in props.items()
        if k not in _READ_ONLY_JOB_FIELDS and k not in _MUTABLE_JOB_FIELDS and v is not None
    }


def _without_nulls(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


def _short_name(ref: Any) -> str | None:
    if not ref:
        return None
    text = str(ref)
    if text.startswith("azureml:"):
        text = text[len("azureml:") :]
    return text.rstrip("/").rsplit("/", 1)[-1]


def _model_name_from_asset(asset: str) -> str | None:
    if not asset:
        return None
    if "/models/" in asset:
        return asset.split("/models/", 1)[1].split("/", 1)[0]
    text = asset[len("azureml:") :] if asset.startswith("azureml:") else asset
    return text.split(":", 1)[0].split("@", 1)[0]


def _first_input_uri(data: dict[str, Any]) -> str | None:
    for value in data.values():
        if isinstance(value, dict):
            uri = value.get("uri") or value.get("path")
            if uri:
                return str(uri)
    return None


def _output_uri(props: dict[str, Any], job_name: str) -> str:
    out = props.get("outputData") or {}
    for value in out.values():
        if isinstance(value, dict) and value.get("uri"):
            return str(value["uri"]).rstrip("/") + "/"
    dataset = props.get("outputDataset") or {}
    if dataset.get("path"):
        store = _short_name(dataset.get("datastoreId")) or "workspaceblobstore"
        return f"azureml://datastores/{store}/paths/{str(dataset['path']).strip('/')}/"
    return f"azureml://datastores/workspaceblobstore/paths/azureml/{job_name}/score/"


def _check_fits(resource_props: dict[str, Any], itype: dict[str, Any], name: str) -> None:
    """Reject a job whose ``resources`` do not fit the instance type, by the service's rules (``azure_rules``)."""
    if not resource_props.get("resources"):
        return  # the job takes the instance type's own resources
    try:
        check_resources(resource_props.get("resources"), from_compute_entry(name, itype))
    except RuleViolation as exc:
        raise EmulatorError(400, "UserError", str(exc)) from None
