"""Batch endpoints: create/update a deployment, and invoke it with preemption-aware resubmission."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow_azureml import naming
from airflow_azureml.exceptions import AzureMLConfigError, AzureMLError
from airflow_azureml.operators.base import AzureMLBaseOperator
from airflow_azureml.operators.job_base import AzureMLJobOperatorBase
from airflow_azureml.redaction import scrub
from airflow_azureml.specs import (
    DeploymentSpec,
    check_data_uri,
    check_deployment_name,
    check_endpoint_name,
    short_name,
)


class AzureMLCreateBatchDeploymentOperator(AzureMLBaseOperator):
    """Create or update a batch endpoint and a model deployment on it, idempotently.

    Give the deployment as keyword arguments, a ``ModelBatchDeployment`` entity, or the az ml
    CLI YAML path (the source documents' ``deployment.yml`` works as written). A deployment
    that already has the wanted settings is left untouched (no PUT).
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
        endpoint_description: str | None = None,
        set_default: bool = True,
        instance_types: Any = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
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
        )

    def check_kubernetes(self, spec: DeploymentSpec) -> None:
        """On Kubernetes compute the instance type must exist, and MLflow models need 2 CPU / 4 GB.

        Uses ``instance_types`` when given (no API call), else one read of the compute; always before any write.
        """
        from airflow_azureml.instance_types import check_mlflow_minimum, load_instance_types, resolve_instance_type

        if self.instance_types is not None:
            types = load_instance_types(self.instance_types)
        else:
            types = self.hook.kubernetes_instance_types(short_name(spec.compute))
        if types is None:
            if spec.instance_type:
                raise AzureMLConfigError(f"instance_type applies to Kubernetes compute only; {spec.compute!r} is not.")
            return
        chosen = resolve_instance_type(types, spec.instance_type)
        if spec.code_configuration is None:  # no scoring script: an MLflow model deployment
            check_mlflow_minimum(chosen)

    def execute(self, context: Any) -> dict[str, Any]:
        spec = self.build_spec()  # validates before any API call
        self.check_kubernetes(spec)
        from azure.ai.ml.entities import BatchEndpoint
        from azure.core.exceptions import ResourceNotFoundError

        ml = self.hook.get_conn()
        changed = False
        try:
            endpoint = ml.batch_endpoints.get(spec.endpoint_name)
        except ResourceNotFoundError:
            self.log.info("Creating batch endpoint %s.", spec.endpoint_name)
            endpoint = ml.batch_endpoints.begin_create_or_update(
                BatchEndpoint(name=spec.endpoint_name, description=self.endpoint_description)
            ).result()
            changed = True
        try:
            existing = ml.batch_deployments.get(name=spec.name, endpoint_name=spec.endpoint_name)
        except ResourceNotFoundError:
            existing = None
        diffs = spec.differences(existing) if existing is not None else {"deployment": (None, spec.name)}
        if diffs:
            self.log.info("Creating/updating deployment %s/%s: %s", spec.endpoint_name, spec.name, diffs)
            try:
                ml.batch_deployments.begin_create_or_update(self._entity(spec)).result()
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
            ml.batch_endpoints.begin_create_or_update(endpoint).result()
            changed = True
        return {
            "endpoint_name": spec.endpoint_name,
            "deployment_name": spec.name,
            "changed": changed,
            "compute": short_name(spec.compute),
        }

    @staticmethod
    def _entity(spec: DeploymentSpec) -> Any:
        entity = spec.to_entity()
        if spec.yaml_path:  # keep what the YAML says beyond our spec (environment, code)
            from azure.ai.ml.entities._load_functions import (
                load_batch_deployment,
                load_model_batch_deployment,
            )

            loader = load_model_batch_deployment if spec.yaml_type == "model" else load_batch_deployment
            loaded = loader(source=spec.yaml_path)
            entity.environment = entity.environment or getattr(loaded, "environment", None)
            entity.code_configuration = entity.code_configuration or getattr(loaded, "code_configuration", None)
        return entity


class AzureMLInvokeBatchEndpointOperator(AzureMLJobOperatorBase):
    """Invoke a batch endpoint for one unit of work and wait for the job; resubmit preempted jobs.

    Exactly once and preemption handling come from ``AzureMLJobOperatorBase``. Outcomes
    (``airflow_azureml.outcomes.classify``):
    - Completed: returns job names, output URI, resubmission and preemption counts.
    - Preempted (Canceled for lost capacity, or Failed with PreemptionError): resubmitted with
      back-off up to ``max_resubmits`` times, on ``fallback_compute`` after ``fallback_after``
      preemptions; then ``AzureMLJobPreemptedError``.
    - Failed: ``AzureMLJobFailedError`` with the service's message.
    - Canceled by a person or Airflow: ``AzureMLJobCanceledError``; never resubmitted.
    """

    template_fields: Sequence[str] = (
        "endpoint_name",
        "deployment_name",
        "inputs",
        "outputs",
        "output_file_name",
        "job_identity",
        "experiment_name",
        "max_queue_time",
    )
    template_fields_renderers = {"inputs": "json", "outputs": "json"}

    def __init__(
        self,
        *,
        endpoint_name: str,
        inputs: dict[str, str],
        deployment_name: str | None = None,
        outputs: dict[str, str] | None = None,
        output_file_name: str | None = None,
        mini_batch_size: int | None = None,
        instance_count: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.endpoint_name = endpoint_name
        self.deployment_name = deployment_name
        self.inputs = inputs
        self.outputs = outputs
        self.output_file_name = output_file_name
        self.mini_batch_size = mini_batch_size
        self.instance_count = instance_count

    def validate(self) -> None:
        super().validate()
        check_endpoint_name(self.endpoint_name)
        if self.deployment_name:
            check_deployment_name(self.deployment_name)
        if not isinstance(self.inputs, dict) or not self.inputs:
            raise AzureMLConfigError("inputs must be a non-empty mapping of input name -> data URI.")
        for key, uri in self.inputs.items():
            check_data_uri(f"input {key!r}", uri)
        for key, uri in (self.outputs or {}).items():
            check_data_uri(f"output {key!r}", uri)
        if self.output_file_name is not None and ("/" in self.output_file_name or not self.output_file_name):
            raise AzureMLConfigError(f"output_file_name must be a plain file name, got {self.output_file_name!r}.")
        for label in ("mini_batch_size", "instance_count"):
            value = getattr(self, label)
            if value is not None and (not isinstance(value, int) or value < 1):
                raise AzureMLConfigError(f"{label} must be a positive integer, got {value!r}.")

    def submit_job(self, context: Any, name: str, compute: str | None) -> None:
        self.hook.invoke_batch_endpoint(
            endpoint_name=self.endpoint_name,
            deployment_name=self.deployment_name,
            inputs=self.inputs,
            outputs=self.outputs,
            job_name=name,
            experiment_name=self.experiment_name or naming.experiment_name(self.dag_id),
            mini_batch_size=self.mini_batch_size,
            instance_count=self.instance_count,
            output_file_name=self.output_file_name,
            compute=compute,
        )

    def default_compute(self) -> str | None:
        try:
            ml = self.hook.get_conn()
            name = self.deployment_name
            if not name:
                name = ml.batch_endpoints.get(self.endpoint_name).defaults.deployment_name
            return short_name(ml.batch_deployments.get(name=name, endpoint_name=self.endpoint_name).compute)
        except Exception as exc:  # only used as evidence for classification
            self.log.debug("Could not read the deployment's compute: %s", scrub(str(exc)))
            return None
