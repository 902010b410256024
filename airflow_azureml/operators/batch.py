"""Batch endpoints: create/update a deployment, and invoke it with preemption-aware resubmission."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from airflow.sdk import conf

from airflow_azureml import naming
from airflow_azureml.exceptions import (
    AzureMLConfigError,
    AzureMLError,
    AzureMLJobPreemptedError,
    AzureMLJobQueueTimeoutError,
)
from airflow_azureml.links.studio import AzureMLStudioJobLink
from airflow_azureml.operators.base import AzureMLBaseOperator
from airflow_azureml.outcomes import Classification, JobSnapshot, Outcome, classify, exception_for
from airflow_azureml.redaction import scrub
from airflow_azureml.specs import (
    DeploymentSpec,
    check_compute_name,
    check_data_uri,
    check_deployment_name,
    check_endpoint_name,
    short_name,
)
from airflow_azureml.triggers.job import AzureMLJobTrigger

MAX_CHAIN = 1000  # upper bound on the job names one unit of work can have
BASELINE_XCOM = "azureml_preempted_baseline"  # the cluster's preempted-node count at submission


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
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
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

    def execute(self, context: Any) -> dict[str, Any]:
        spec = self.build_spec()  # validates before any API call
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


@dataclass
class ResubmissionState:
    """Where one unit of work stands: its job chain, preemptions so far, and the job being watched."""

    key: str
    job_names: list[str] = field(default_factory=list)
    preemptions: int = 0
    preempted_baseline: int | None = None
    canceled_by_airflow: bool = False

    @property
    def current(self) -> str | None:
        return self.job_names[-1] if self.job_names else None

    @property
    def resubmits(self) -> int:
        return max(0, len(self.job_names) - 1)


class AzureMLInvokeBatchEndpointOperator(AzureMLBaseOperator):
    """Invoke a batch endpoint for one unit of work and wait for the job; resubmit preempted jobs.

    Exactly once: the job name is derived from ``job_identity`` (default: dag, task, run, map
    index) plus a resubmission number. Before submitting, the chain of earlier names is looked
    up, so a retry attaches to a running job, returns a completed one, and never pays twice.

    Outcomes (see ``airflow_azureml.outcomes.classify``):
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
    )
    template_fields_renderers = {"inputs": "json", "outputs": "json"}
    operator_extra_links = (AzureMLStudioJobLink(),)

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
        max_resubmits: int = 3,
        resubmit_backoff: float = 30.0,
        fallback_compute: str | None = None,
        fallback_after: int | None = None,
        job_identity: str | None = None,
        experiment_name: str | None = None,
        deferrable: bool = conf.getboolean("operators", "default_deferrable", fallback=False),
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
        self.max_resubmits = max_resubmits
        self.resubmit_backoff = resubmit_backoff
        self.fallback_compute = fallback_compute
        self.fallback_after = fallback_after
        self.job_identity = job_identity
        self.experiment_name = experiment_name
        self.deferrable = deferrable
        self._state: ResubmissionState | None = None

    # ------------------------------------------------------------- validation
    def validate(self) -> None:
        """Everything we can check without Azure. Runs before any API call."""
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
        if self.max_resubmits < 0:
            raise AzureMLConfigError("max_resubmits must be >= 0.")
        if self.fallback_compute is not None:
            check_compute_name(short_name(self.fallback_compute))
            if self.fallback_after is None or self.fallback_after < 1:
                raise AzureMLConfigError(
                    "fallback_compute needs fallback_after >= 1 (preemptions before falling back)."
                )

    # --------------------------------------------------------------- identity
    def _unit_key(self, context: Any) -> str:
        ti = context["ti"]
        if self.job_identity:
            return naming.work_key(self.dag_id, self.task_id, self.job_identity)
        return naming.work_key(self.dag_id, self.task_id, context["run_id"], getattr(ti, "map_index", -1))

    def _name(self, state: ResubmissionState, n: int) -> str:
        return naming.job_name(self.dag_id, self.task_id, state.key, n)

    # -------------------------------------------------------------- execution
    def execute(self, context: Any) -> dict[str, Any]:
        self.validate()
        state = ResubmissionState(key=self._unit_key(context))
        self._state = state
        snapshot = self._discover(state)
        if snapshot is None or not self._is_reusable(snapshot):
            snapshot = None
            self._submit(context, state)
        else:
            self.log.info("Found job %s from an earlier attempt (%s); attaching.", snapshot.name, snapshot.status)
            AzureMLStudioJobLink.persist(context, self.hook.studio_job_url(snapshot.name))
        return self._wait(context, state, snapshot)

    def execute_complete(self, context: Any, event: dict[str, Any]) -> dict[str, Any]:
        """Back from the triggerer. The resubmission state is rebuilt from the job-name chain."""
        state = ResubmissionState(key=self._unit_key(context))
        self._state = state
        self._discover(state)
        state.preempted_baseline = self._load_baseline(context, event.get("job_name"))
        if event["status"] == "queue_timeout":
            self.hook.cancel_job(event["job_name"])  # do not pay for it once capacity shows up
            raise AzureMLJobQueueTimeoutError(event["message"] + "; cancelled it.", job_name=event["job_name"])
        if event["status"] != "terminal":
            raise AzureMLError(f"Waiting for job {event.get('job_name')} failed: {event.get('message')}")
        return self._wait(context, state, JobSnapshot.from_dict(event["job"]))

    def _wait(self, context: Any, state: ResubmissionState, snapshot: JobSnapshot | None) -> dict[str, Any]:
        """Wait (polling here, or deferring) until the unit of work succeeds or fails for good."""
        while True:
            if snapshot is None or not snapshot.terminal:
                if self.deferrable:
                    snapshot = self.hook.job_snapshot(state.current or "")  # check before deferring
                    if snapshot is None or not snapshot.terminal:
                        self.defer(
                            trigger=AzureMLJobTrigger(
                                job_name=state.current or "",
                                azure_ml_conn_id=self.azure_ml_conn_id,
                                polling=self.polling,
                            ),
                            method_name="execute_complete",
                            timeout=self.execution_timeout,
                        )
                else:
                    snapshot = self.hook.wait_for_job(state.current or "", self.polling, self._log_status)
            result = self._handle_terminal(context, state, snapshot)
            if result is not None:
                return result
            snapshot = None  # a resubmission happened; wait for the new job

    @staticmethod
    def _load_baseline(context: Any, job_name: str | None) -> int | None:
        ti = context["ti"]
        stored = ti.xcom_pull(task_ids=ti.task_id, key=BASELINE_XCOM, map_indexes=ti.map_index)
        if isinstance(stored, dict) and stored.get("job") == job_name:
            return stored.get("preempted_node_count")
        return None

    def _discover(self, state: ResubmissionState) -> JobSnapshot | None:
        """Walk the deterministic chain ``-r0, -r1, ...``; return the newest job's snapshot.

        Earlier jobs of the chain that were preempted count against ``max_resubmits``.
        """
        chain: list[JobSnapshot] = []
        for n in range(MAX_CHAIN):
            snapshot = self.hook.job_snapshot(self._name(state, n))
            if snapshot is None:
                break
            state.job_names.append(snapshot.name)
            chain.append(snapshot)
        state.preemptions = sum(1 for s in chain[:-1] if classify(s).outcome is Outcome.PREEMPTED)
        return chain[-1] if chain else None

    @staticmethod
    def _is_reusable(snapshot: JobSnapshot) -> bool:
        """Running, completed or preempted jobs continue the chain; a job that failed or was cancelled
        in an earlier Airflow try is replaced (the retry is the user's or the retry policy's decision)."""
        if not snapshot.terminal:
            return True
        return classify(snapshot).outcome in (Outcome.SUCCEEDED, Outcome.PREEMPTED)

    def _submit(self, context: Any, state: ResubmissionState) -> str:
        n = len(state.job_names)
        name = self._name(state, n)
        compute = self._target_compute(state)
        facts = self.hook.compute_facts(compute or self._deployment_compute())
        state.preempted_baseline = facts.preempted_node_count if facts else None
        self.log.info("Submitting batch job %s to %s (resubmission %d).", name, self.endpoint_name, n)
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
        state.job_names.append(name)
        AzureMLStudioJobLink.persist(context, self.hook.studio_job_url(name))
        context["ti"].xcom_push(
            key=BASELINE_XCOM, value={"job": name, "preempted_node_count": state.preempted_baseline}
        )
        return name

    def _target_compute(self, state: ResubmissionState) -> str | None:
        if self.fallback_compute and self.fallback_after and state.preemptions >= self.fallback_after:
            return self.fallback_compute
        return None

    def _deployment_compute(self) -> str | None:
        try:
            ml = self.hook.get_conn()
            name = self.deployment_name
            if not name:
                name = ml.batch_endpoints.get(self.endpoint_name).defaults.deployment_name
            return short_name(ml.batch_deployments.get(name=name, endpoint_name=self.endpoint_name).compute)
        except Exception as exc:  # only used as evidence for classification
            self.log.debug("Could not read the deployment's compute: %s", scrub(str(exc)))
            return None

    def _classify(self, state: ResubmissionState, snapshot: JobSnapshot) -> Classification:
        facts = self.hook.compute_facts(snapshot.compute) if snapshot.status == "Canceled" else None
        return classify(
            snapshot,
            compute=facts,
            preempted_baseline=state.preempted_baseline,
            canceled_by_airflow=state.canceled_by_airflow,
        )

    def _handle_terminal(self, context: Any, state: ResubmissionState, snapshot: JobSnapshot) -> dict[str, Any] | None:
        """Turn a terminal job into a result, an exception, or a resubmission (returns None)."""
        verdict = self._classify(state, snapshot)
        if verdict.outcome is Outcome.SUCCEEDED:
            result = {
                "job_name": snapshot.name,
                "job_names": list(state.job_names),
                "status": snapshot.status,
                "output_uri": snapshot.output_uri,
                "resubmits": state.resubmits,
                "preemptions": state.preemptions,
            }
            self.log.info("Job %s completed: %s", snapshot.name, result)
            return result
        if verdict.outcome in (Outcome.FAILED, Outcome.USER_CANCELED):
            raise exception_for(snapshot, verdict)
        state.preemptions += 1
        if state.preemptions > self.max_resubmits:
            raise AzureMLJobPreemptedError(
                f"Job {snapshot.name} was preempted ({verdict.reason}); {state.preemptions} preemption(s), "
                f"resubmission budget max_resubmits={self.max_resubmits} spent.",
                job_name=snapshot.name,
                status=snapshot.status,
            )
        delay = min(600.0, self.resubmit_backoff * (2 ** (state.preemptions - 1)))
        old = snapshot.name
        self.log.warning(
            "Preemption %d of job %s (%s). Resubmitting in %.1fs.", state.preemptions, old, verdict.reason, delay
        )
        time.sleep(delay)
        new = self._submit(context, state)
        self.log.warning(
            "Resubmitted preempted job: reason=%r old=%s new=%s resubmission=%d/%d",
            verdict.reason,
            old,
            new,
            state.resubmits,
            self.max_resubmits,
        )
        return None

    def _log_status(self, snapshot: JobSnapshot) -> None:
        self.log.info("Job %s is %s.", snapshot.name, snapshot.status)

    def on_kill(self) -> None:
        """The task was killed (marked failed, cleared, timed out): cancel the job we started."""
        state = self._state
        if state is None or state.current is None:
            return
        state.canceled_by_airflow = True
        self.log.warning("Task killed; cancelling Azure ML job %s.", state.current)
        try:
            self.hook.cancel_job(state.current)
        except Exception as exc:
            self.log.error("Could not cancel job %s: %s", state.current, scrub(str(exc)))
