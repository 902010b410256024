"""Batch endpoints: create/update a deployment, and invoke it with preemption-aware resubmission."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow_azureml import naming
from airflow_azureml.exceptions import AzureMLConfigError, AzureMLError
from airflow_azureml.operators.base import AzureMLBaseOperator
from airflow_azureml.operators.compute import DEFAULT_WAIT_TIMEOUT, wait_for_lro
from airflow_azureml.operators.job_base import AzureMLJobOperatorBase
from airflow_azureml.operators.job_chain import data_place, job_places
from airflow_azureml.redaction import scrub

if TYPE_CHECKING:
    from airflow_azureml.operators.job_base import ResubmissionState
    from airflow_azureml.outcomes import Classification, JobSnapshot
    from airflow_azureml.specs import DeploymentSpec


class AzureMLCreateBatchDeploymentOperator(AzureMLBaseOperator):
    """Create or update a batch endpoint and a model deployment on it, idempotently.

    Give the deployment as keyword arguments, a ``ModelBatchDeployment`` entity, or the az ml
    CLI YAML path (the source documents' ``deployment.yml`` works as written). An unknown key
    in the YAML or the arguments fails before any API call, naming the nearest known key.

    The deployment is updated when any setting that changes what it does differs from what the
    service has: the model name or version (``@latest`` is resolved to today's latest version),
    environment, code configuration, compute, instance count/type, resources, mini-batch,
    retry, output and ``error_threshold`` settings. Otherwise it is left untouched (no PUT).
    Every long-running write waits at most ``wait_timeout`` seconds.
    """

    template_fields: Sequence[str] = ("endpoint_name", "name", "deployment", "model", "compute")

    def __init__(
        self,
        *,
        endpoint_name: str | None = None,
        name: str | None = None,
        deployment: Any = None,
        model: str | None = None,
        compute: str | None = None,
        instance_count: int | None = None,
        instance_type: str | None = None,
        max_concurrency_per_instance: int | None = None,
        mini_batch_size: int | None = None,
        output_action: str | None = None,
        output_file_name: str | None = None,
        max_retries: int | None = None,
        retry_timeout: int | None = None,
        error_threshold: int | None = None,
        environment: Any = None,
        code_configuration: Any = None,
        endpoint_description: str | None = None,
        set_default: bool = True,
        instance_types: Any = None,
        wait_timeout: float = DEFAULT_WAIT_TIMEOUT,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.error_threshold = error_threshold
        self.environment = environment
        self.code_configuration = code_configuration
        self.wait_timeout = wait_timeout
        self.instance_types = instance_types
        self.endpoint_name = endpoint_name
        self.name = name
        self.deployment = deployment
        self.model = model
        self.compute = compute
        self.instance_count = instance_count
        self.instance_type = instance_type
        self.max_concurrency_per_instance = max_concurrency_per_instance
        self.mini_batch_size = mini_batch_size
        self.output_action = output_action
        self.output_file_name = output_file_name
        self.max_retries = max_retries
        self.retry_timeout = retry_timeout
        self.endpoint_description = endpoint_description
        self.set_default = set_default

    def build_spec(self) -> DeploymentSpec:
        from airflow_azureml.specs import DeploymentSpec  # the rules cost DAG parsing nothing

        return DeploymentSpec.from_any(
            self.deployment,
            endpoint_name=self.endpoint_name,
            name=self.name,
            model=self.model,
            compute=self.compute,
            instance_count=self.instance_count,
            instance_type=self.instance_type,
            max_concurrency_per_instance=self.max_concurrency_per_instance,
            mini_batch_size=self.mini_batch_size,
            output_action=self.output_action,
            output_file_name=self.output_file_name,
            max_retries=self.max_retries,
            retry_timeout=self.retry_timeout,
            error_threshold=self.error_threshold,
            environment=self.environment,
            code_configuration=self.code_configuration,
        )

    def check_kubernetes(self, spec: DeploymentSpec) -> None:
        """On Kubernetes compute the instance type must exist, the deployment's own resources must fit it,
        and MLflow models need 2 CPU / 4 GB requested.

        The deployment's own resources are ``resources.properties.resources`` (sent as REST
        ``resources.properties``); they are checked against the instance type as a command job's are, and the
        MLflow minimum applies to their requests, else to the instance type's (docs/instance_types.md).
        Uses ``instance_types`` when given (no API call), else one read of the compute; always before any write.
        """
        from airflow_azureml.asset_refs import short_name
        from airflow_azureml.instance_types import (
            check_mlflow_minimum,
            check_resources_fit,
            load_instance_types,
            resolve_instance_type,
        )

        if self.instance_types is not None:
            types = load_instance_types(self.instance_types)
        else:
            types = self.hook.kubernetes_instance_types(short_name(spec.compute))
        if types is None:
            if spec.instance_type:
                raise AzureMLConfigError(f"instance_type applies to Kubernetes compute only; {spec.compute!r} is not.")
            return
        chosen = resolve_instance_type(types, spec.instance_type)
        own = (spec.resource_properties or {}).get("resources")
        check_resources_fit(own, chosen)
        if spec.code_configuration is None and self._model_is_mlflow(spec):  # no scoring script, an MLflow model
            check_mlflow_minimum(own if own else chosen)

    def execute(self, context: Any) -> dict[str, Any]:
        spec = self.build_spec()  # validates before any API call
        # local code / inline environment hashed now, so a missing file fails before any API call
        self.log.debug("Content fingerprints of %s/%s: %s", spec.endpoint_name, spec.name, spec.fingerprints)
        self.check_kubernetes(spec)
        from azure.ai.ml.entities import BatchEndpoint
        from azure.core.exceptions import ResourceNotFoundError

        ml = self.hook.get_conn()
        changed = False
        endpoint = self._get_endpoint(ml, spec.endpoint_name)
        if endpoint is None:
            self.log.info("Creating batch endpoint %s.", spec.endpoint_name)
            endpoint = self._wait(
                ml.batch_endpoints.begin_create_or_update(
                    BatchEndpoint(name=spec.endpoint_name, description=self.endpoint_description)
                ),
                f"Creating batch endpoint {spec.endpoint_name!r}",
                lambda: self._settled(self._get_endpoint(ml, spec.endpoint_name)),
            )
            changed = True
        try:
            existing = ml.batch_deployments.get(name=spec.name, endpoint_name=spec.endpoint_name)
        except ResourceNotFoundError:
            existing = None
        latest = self._latest_model_version(ml, spec)
        diffs = (
            spec.differences(existing, latest_model_version=latest)
            if existing is not None
            else {"deployment": (None, spec.name)}
        )
        if diffs:
            self.log.info("Creating/updating deployment %s/%s: %s", spec.endpoint_name, spec.name, diffs)

            def deployment_done() -> tuple[bool, Any]:
                try:
                    current = ml.batch_deployments.get(name=spec.name, endpoint_name=spec.endpoint_name)
                except ResourceNotFoundError:
                    return False, None
                done, _ = self._settled(current)
                return done and not spec.differences(current, latest_model_version=latest), current

            try:
                self._wait(
                    ml.batch_deployments.begin_create_or_update(self._entity(spec)),
                    f"Deployment {spec.endpoint_name}/{spec.name}",
                    deployment_done,
                )
            except AzureMLError:
                raise
            except Exception as exc:
                raise AzureMLError(f"Deployment {spec.endpoint_name}/{spec.name} failed: {scrub(str(exc))}") from None
            changed = True
        else:
            self.log.info("Deployment %s/%s already has the wanted settings.", spec.endpoint_name, spec.name)
        default = getattr(endpoint.defaults, "deployment_name", None) if endpoint.defaults else None
        if self.set_default and default != spec.name:
            self.log.info("Making %s the default deployment of %s.", spec.name, spec.endpoint_name)
            endpoint = ml.batch_endpoints.get(spec.endpoint_name)
            endpoint.defaults = {"deployment_name": spec.name}

            def default_set() -> tuple[bool, Any]:
                current = self._get_endpoint(ml, spec.endpoint_name)
                done, _ = self._settled(current)
                name = getattr(getattr(current, "defaults", None), "deployment_name", None)
                return done and name == spec.name, current

            self._wait(
                ml.batch_endpoints.begin_create_or_update(endpoint),
                f"Setting the default deployment of {spec.endpoint_name!r}",
                default_set,
            )
            changed = True
        from airflow_azureml.asset_refs import short_name

        return {
            "endpoint_name": spec.endpoint_name,
            "deployment_name": spec.name,
            "changed": changed,
            "compute": short_name(spec.compute),
        }

    def _wait(self, poller: Any, what: str, probe: Any) -> Any:
        return wait_for_lro(poller, what=what, timeout=self.wait_timeout, interval=self.polling.interval, probe=probe)

    @staticmethod
    def _get_endpoint(ml: Any, name: str) -> Any:
        from azure.core.exceptions import ResourceNotFoundError

        try:
            return ml.batch_endpoints.get(name)
        except ResourceNotFoundError:
            return None

    @staticmethod
    def _settled(resource: Any) -> tuple[bool, Any]:
        """``(done, resource)`` from the resource's own provisioning state."""
        state = str(getattr(resource, "provisioning_state", "") or "")
        if state.lower() in ("failed", "canceled"):
            raise AzureMLError(f"{getattr(resource, 'name', 'resource')!r} ended in provisioning state {state}.")
        return resource is not None and state.lower() == "succeeded", resource

    def _model_is_mlflow(self, spec: DeploymentSpec) -> bool:
        """Whether the deployment's registered model is an MLflow model (one GET of the model version).

        Only an MLflow model runs without a scoring script, so a model that cannot be read is taken for
        one: the minimum is then checked rather than skipped (the service refuses the rest itself).
        """
        from airflow_azureml.asset_refs import model_ref

        name, version = model_ref(spec.model)
        if not name:
            return True
        try:
            ml = self.hook.get_conn()
            found = ml.models.get(name=name, version=version) if version else ml.models.get(name=name, label="latest")
        except Exception as exc:
            self.log.warning("Could not read model %s to check its type: %s", spec.model, scrub(str(exc)))
            return True
        return str(getattr(found, "type", "") or "").lower() in ("mlflow_model", "mlflowmodel")

    def _latest_model_version(self, ml: Any, spec: DeploymentSpec) -> str | None:
        """Today's version behind ``@latest``, so that registering a new one updates the deployment."""
        from airflow_azureml.asset_refs import model_ref

        name, version = model_ref(spec.model)
        if version is not None or not name:
            return None
        try:
            return str(ml.models.get(name=name, label="latest").version)
        except Exception as exc:  # unknown: the comparison then counts the model as changed
            self.log.warning("Could not resolve %s@latest: %s", name, scrub(str(exc)))
            return None

    @staticmethod
    def _entity(spec: DeploymentSpec) -> Any:
        entity = spec.to_entity()
        if spec.yaml_path:  # keep what the YAML says beyond our spec (environment, code)
            from azure.ai.ml.entities._load_functions import (
                load_batch_deployment,
                load_model_batch_deployment,
            )

            from airflow_azureml.specs import DeploymentSpec

            loader = load_model_batch_deployment if spec.yaml_type == "model" else load_batch_deployment
            loaded = loader(source=spec.yaml_path)
            written = DeploymentSpec.from_yaml(spec.yaml_path)  # an override replaces what the YAML says
            env, code = spec.environment, spec.code_configuration
            entity.environment = (
                getattr(loaded, "environment", None) if env == written.environment else spec.environment_to_send(env)
            )
            entity.code_configuration = spec.code_to_send(
                getattr(loaded, "code_configuration", None) if code == written.code_configuration else code
            )
        return entity


class AzureMLInvokeBatchEndpointOperator(AzureMLJobOperatorBase):
    """Invoke a batch endpoint for one unit of work and wait for the job; resubmit preempted jobs.

    Exactly once and preemption handling come from ``AzureMLJobOperatorBase``; the unit of work is
    the endpoint, deployment, rendered inputs and outputs unless ``job_identity`` is given.
    Outcomes (``airflow_azureml.outcomes.classify``, on evidence only):
    - Completed: returns job names, output URI, resubmission and preemption counts, the verdict.
    - Preempted (Canceled for lost capacity, or Failed with PreemptionError): resubmitted at once
      (a loop of preemptions backs off) up to ``max_resubmits`` times per run of the task; then
      ``AzureMLJobPreemptedError``.
    - Spot that does not pay: ``fallback_deployment`` is a second deployment of the same model on
      the same endpoint, bound to dedicated compute (``min_instances: 0`` costs nothing until used).
      A deployment's compute is fixed for all its jobs, so the fallback is a deployment, not a
      compute override. The work moves there after ``fallback_after`` preemptions, when spot is
      expected to cost more (``airflow_azureml.spot_policy``), or when a job waited for spot
      capacity longer than ``max_queue_time``; it stays there for this run of the task.
    - Failed: ``AzureMLJobFailedError`` with the service's message.
    - Canceled by a person: ``AzureMLJobCanceledError``, no retries; clearing the task runs it again.
    """

    template_fields: Sequence[str] = (
        "endpoint_name",
        "deployment_name",
        "fallback_deployment",
        "inputs",
        "outputs",
        "output_file_name",
        "job_identity",
        "experiment_name",
        "max_queue_time",
        "deadline",
        "on_infeasible_deadline",
    )
    template_fields_renderers = {"inputs": "json", "outputs": "json"}

    def __init__(
        self,
        *,
        endpoint_name: str,
        inputs: dict[str, str],
        deployment_name: str | None = None,
        fallback_deployment: str | None = None,
        outputs: dict[str, str] | None = None,
        output_file_name: str | None = None,
        mini_batch_size: int | None = None,
        instance_count: int | None = None,
        **kwargs: Any,
    ) -> None:
        refused_fallback_compute = kwargs.pop("fallback_compute", None)  # refused in validate()
        super().__init__(**kwargs)
        self._refused_fallback_compute = refused_fallback_compute
        self.endpoint_name = endpoint_name
        self.deployment_name = deployment_name
        self.fallback_deployment = fallback_deployment
        self.inputs = inputs
        self.outputs = outputs
        self.output_file_name = output_file_name
        self.mini_batch_size = mini_batch_size
        self.instance_count = instance_count

    def validate(self) -> None:
        from airflow_azureml.specs import (
            check_data_uri,
            check_deployment_name,
            check_endpoint_name,
            check_output_file_name,
            check_positive_int,
        )

        if self._refused_fallback_compute is not None:
            raise AzureMLConfigError(
                "fallback_compute does not apply to a batch invoke: a deployment's compute is fixed for all its "
                "jobs. Give fallback_deployment, a deployment of the same model on dedicated compute."
            )
        super().validate()
        check_endpoint_name(self.endpoint_name)
        if self.deployment_name:
            check_deployment_name(self.deployment_name)
        if self.fallback_deployment is not None:
            check_deployment_name(self.fallback_deployment)
            if self.fallback_deployment == self.deployment_name:
                raise AzureMLConfigError("fallback_deployment must differ from deployment_name.")
        if not isinstance(self.inputs, dict) or not self.inputs:
            raise AzureMLConfigError("inputs must be a non-empty mapping of input name -> data URI.")
        for key, uri in self.inputs.items():
            check_data_uri(f"input {key!r}", uri)
        for key, uri in (self.outputs or {}).items():
            check_data_uri(f"output {key!r}", uri)
        if self.output_file_name is not None:
            check_output_file_name(self.output_file_name)
        for label in ("mini_batch_size", "instance_count"):
            if getattr(self, label) is not None:
                check_positive_int(label, getattr(self, label))

    def fallback_target(self) -> str | None:
        return self.fallback_deployment or None

    def check_fallback(self) -> None:
        """The fallback deployment exists on this endpoint and runs on dedicated compute (two reads)."""
        from azure.core.exceptions import ResourceNotFoundError

        name = self.fallback_deployment or ""
        try:
            deployment = self.hook.get_conn().batch_deployments.get(name=name, endpoint_name=self.endpoint_name)
        except ResourceNotFoundError:
            raise AzureMLConfigError(
                f"fallback_deployment {name!r} does not exist on batch endpoint {self.endpoint_name!r}; create it "
                "(the same model on a dedicated cluster with min_instances: 0) before the work can fall back."
            ) from None
        except Exception as exc:  # e.g. the SDK's ValidationException for an unknown deployment
            if "not found" in str(exc).lower():
                raise AzureMLConfigError(
                    f"fallback_deployment {name!r} does not exist on batch endpoint {self.endpoint_name!r}."
                ) from None
            raise
        self._check_dedicated(getattr(deployment, "compute", None), f"fallback_deployment {name!r}")

    def spot_target(self) -> str | None:
        """The spot deployment: its compute is fixed, so it names the cluster its jobs run on."""
        return f"{self.endpoint_name}/{self.deployment_name or 'default'}"

    def _fallback_argument(self) -> str:
        return "fallback_deployment"

    def submit_markers(self, fallback: str | None) -> dict[str, str]:
        """What the deployment runs now (no deployment named: the endpoint's default): a later run or a clear
        reuses the job only while it still runs that (``superseded_by``)."""
        runs = self.hook.deployment_runs(self.endpoint_name, fallback or self.deployment_name)
        return {naming.DEPLOYMENT_RUNS_TAG: runs} if runs is not None else {}

    def submit_job(self, context: Any, name: str, fallback: str | None, markers: dict[str, str]) -> str | None:
        return self.hook.invoke_batch_endpoint(
            endpoint_name=self.endpoint_name,
            deployment_name=fallback or self.deployment_name,
            inputs=self.inputs,
            outputs=self.outputs,
            job_name=name,
            experiment_name=self.experiment_name or naming.experiment_name(self.dag_id),
            mini_batch_size=self.mini_batch_size,
            instance_count=self.instance_count,
            output_file_name=self.output_file_name,
            properties=markers,
        )

    def job_nodes(self, state: ResubmissionState, job_name: str, compute: str) -> int | None:
        """The invoke's ``instance_count``, else that of the deployment whose compute the job ran on: the one
        the chain sent it to first, then the other (a clear or a lost try state forgets the switch). Each
        deployment is read once per task process: Azure's GET of a batch job leaves its node count null."""
        if self.instance_count is not None:
            return int(self.instance_count)
        sent_to = self.fallback_deployment if state.on_fallback(job_name) else self.deployment_name
        other = self.deployment_name if sent_to == self.fallback_deployment else self.fallback_deployment
        cache: dict[str | None, tuple[str | None, int | None]] = self.__dict__.setdefault("_deployment_nodes", {})
        for deployment in (sent_to, other) if other else (sent_to,):
            if deployment not in cache:
                cache[deployment] = self.hook.deployment_nodes(self.endpoint_name, deployment)
            ran_on, nodes = cache[deployment]
            if ran_on == compute:
                return nodes
        return None  # neither deployment runs on that compute now: unknown

    def superseded_by(self, snapshot: JobSnapshot) -> str | None:
        """The deployment the job ran on now runs another model, code or environment than when it was
        submitted (``naming.DEPLOYMENT_RUNS_TAG``): a model update followed by a re-run or a clear of an
        interval scores it again. A job without the record (Azure dropped its properties) is reused."""
        ran = snapshot.properties.get(naming.DEPLOYMENT_RUNS_TAG)
        if not ran:
            return None
        ran_on = snapshot.tags.get("azureml.deploymentname")
        on_fallback = bool(self.fallback_deployment) and ran_on == self.fallback_deployment
        # no deployment named: the endpoint's default now, which a blue/green update moves to a new deployment
        deployment = ran_on if on_fallback else self.deployment_name
        now = self.hook.deployment_runs(self.endpoint_name, deployment)
        if now is None or now == ran:
            return None
        where = f"{self.endpoint_name}/{deployment or 'default'}"
        return f"batch deployment {where} now runs another model, code or environment"

    def carries_unit(self, arm_job: dict[str, Any]) -> bool:
        """A batch job is this unit's when Azure's own record of it matches: the endpoint
        (``azureml.endpointname``), the deployment (``azureml.deploymentname``, the spot one or the fallback),
        the experiment, the same input paths, and our output paths (without ``outputs``: only Azure's
        default ones, under the job's own name). With ``job_identity`` only when ``outputs`` are given: the
        identity may set apart units of the same work, and then their own output paths tell their jobs apart
        (as in ``dags/``: one output folder per attempt; docs/operators.md)."""
        if self.job_identity and not self.outputs:
            return False
        props = arm_job.get("properties") or {}
        if (props.get("properties") or {}).get("azureml.endpointname") != self.endpoint_name:
            return False
        deployments = {d for d in (self.deployment_name, self.fallback_deployment) if d}
        if deployments and (props.get("tags") or {}).get("azureml.deploymentname") not in deployments:
            return False
        if props.get("experimentName") != (self.experiment_name or naming.experiment_name(self.dag_id)):
            return False
        inputs = job_places(arm_job, "inputs")
        if not inputs or inputs != {data_place(uri) for uri in self.inputs.values()}:
            return False
        outputs = job_places(arm_job, "outputs")
        if not self.outputs:  # Azure's default outputs name the job: another unit asked for its own paths
            name = str(arm_job.get("name") or "")
            return bool(name) and all(name in place for place in outputs)
        return {data_place(uri) for uri in self.outputs.values()} <= outputs

    def work_identity(self) -> dict[str, Any]:
        """The work itself: what is scored, by which deployment, and where the output goes."""
        return {
            "endpoint": self.endpoint_name,
            "deployment": self.deployment_name,
            "inputs": self.inputs,
            "outputs": self.outputs or {},
        }

    def result(self, state: ResubmissionState, snapshot: JobSnapshot, verdict: Classification) -> dict[str, Any]:
        """The completed job's result; its outputs become asset events (``airflow_azureml.assets``)."""
        from airflow_azureml.assets import output_places, record_output_events

        result = super().result(state, snapshot, verdict)
        self._completed = result
        extra = {"job_name": result["job_name"], "job_names": result["job_names"], "endpoint": self.endpoint_name}
        places = output_places(self.outputs, result.get("output_uri"))
        record_output_events(self._context, self.outlets, places, extra)
        return result

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """OpenLineage: the inputs, the outputs and the job chain (``airflow_azureml.openlineage``)."""
        from airflow_azureml.openlineage import job_lineage

        completed = getattr(self, "_completed", None) or {}
        outputs = self.outputs or ({"score": completed["output_uri"]} if completed.get("output_uri") else {})
        return job_lineage(self, self.inputs, outputs)

    def get_openlineage_facets_on_failure(self, task_instance: Any) -> Any:
        """OpenLineage on failure: the inputs, the outputs the work was to write, and the jobs tried."""
        from airflow_azureml.openlineage import job_lineage

        return job_lineage(self, self.inputs, self.outputs)
