"""``AzureMLSubmitCommandJobOperator``: a command job, e.g. on Kubernetes compute with an instance type."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from airflow_azureml import naming
from airflow_azureml.exceptions import AzureMLConfigError
from airflow_azureml.operators.job_base import AzureMLJobOperatorBase

if TYPE_CHECKING:
    from airflow_azureml.instance_types import InstanceType


class AzureMLSubmitCommandJobOperator(AzureMLJobOperatorBase):
    """Run a command job once per unit of work, with the same waiting, deferral and outcomes as batch.

    On Kubernetes compute, ``instance_type`` picks the node pool and limits (``defaultinstancetype``
    when omitted) and ``resource_requests`` (the job's ``resources`` section: ``requests``/``limits``;
    named so because ``resources`` is a ``BaseOperator`` argument) must fit under it. Pass the cluster's
    definitions as ``instance_types`` (YAML path, text or list) to check that with no API call at
    all; otherwise they are read from the compute (one read) before anything is submitted.
    """

    template_fields: Sequence[str] = (
        "command",
        "environment",
        "compute",
        "fallback_compute",
        "instance_type",
        "inputs",
        "environment_variables",
        "display_name",
        "job_identity",
        "experiment_name",
        "max_queue_time",
        "deadline",
        "on_infeasible_deadline",
    )
    template_fields_renderers = {"command": "bash", "inputs": "json"}

    def __init__(
        self,
        *,
        command: str,
        environment: str,
        compute: str,
        instance_type: str | None = None,
        instance_count: int | None = None,
        resource_requests: dict[str, Any] | None = None,
        instance_types: Any = None,
        inputs: dict[str, Any] | None = None,
        environment_variables: dict[str, str] | None = None,
        display_name: str | None = None,
        tags: dict[str, str] | None = None,
        fallback_compute: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.fallback_compute = fallback_compute
        self.command = command
        self.environment = environment
        self.compute = compute
        self.instance_type = instance_type
        self.instance_count = instance_count
        self.resource_requests = resource_requests
        self.instance_types = instance_types
        self.inputs = inputs
        self.environment_variables = environment_variables
        self.display_name = display_name
        self.tags = tags

    def validate(self) -> None:
        # The rules are imported when a task runs, not when the DAG is parsed.
        from airflow_azureml.asset_refs import short_name
        from airflow_azureml.instance_types import load_instance_types
        from airflow_azureml.specs import check_compute_name, check_data_uri, check_positive_int

        super().validate()
        if not isinstance(self.command, str) or not self.command.strip():
            raise AzureMLConfigError("command must be a non-empty string.")
        if not isinstance(self.environment, str) or not self.environment.strip():
            raise AzureMLConfigError("environment must name an environment, e.g. azureml:my-env@latest.")
        check_compute_name(short_name(self.compute))
        if self.fallback_compute is not None:
            check_compute_name(short_name(self.fallback_compute))
        if self.instance_count is not None:
            check_positive_int("instance_count", self.instance_count)
        for key, value in (self.inputs or {}).items():
            if isinstance(value, str) and "://" in value:
                check_data_uri(f"input {key!r}", value)
        if self.instance_types is not None:  # the cluster's definitions are known: check with no API call
            self._check_instance_type(load_instance_types(self.instance_types))

    def _check_instance_type(self, types: list[InstanceType]) -> InstanceType:
        from airflow_azureml.instance_types import check_resources_fit, resolve_instance_type

        chosen = resolve_instance_type(types, self.instance_type)
        check_resources_fit(self.resource_requests, chosen)
        return chosen

    def execute(self, context: Any) -> dict[str, Any]:
        from airflow_azureml.asset_refs import short_name
        from airflow_azureml.specs import check_instance_type_target

        self.validate()
        if self.instance_types is None and (self.instance_type or self.resource_requests):
            types = self.hook.kubernetes_instance_types(short_name(self.compute))
            check_instance_type_target(self.compute, self.instance_type, kubernetes=types is not None)
            if types is None:
                if self.resource_requests:
                    raise AzureMLConfigError(
                        f"resources requests/limits need Kubernetes compute; {self.compute!r} is not."
                    )
            else:
                self._check_instance_type(types)
        return super().execute(context)

    def fallback_target(self) -> str | None:
        """A command job's compute is chosen per job, so its fallback is a compute."""
        return self.fallback_compute or None

    def check_fallback(self) -> None:
        """The fallback compute exists and is dedicated (one read)."""
        self._check_dedicated(self.fallback_compute, f"fallback_compute {self.fallback_compute!r}")

    def spot_target(self) -> str | None:
        from airflow_azureml.asset_refs import short_name

        return short_name(self.compute)

    def submit_job(self, context: Any, name: str, fallback: str | None, markers: dict[str, str]) -> str | None:
        from azure.ai.ml import Input, command
        from azure.ai.ml.entities import JobResourceConfiguration

        from airflow_azureml.asset_refs import short_name

        resources = None
        if self.instance_type or self.instance_count or self.resource_requests:
            resources = JobResourceConfiguration(
                instance_type=self.instance_type,
                instance_count=self.instance_count,
                properties={"resources": self.resource_requests} if self.resource_requests else None,
            )
        inputs = {
            key: Input(type="uri_folder", path=value) if isinstance(value, str) and "://" in value else value
            for key, value in (self.inputs or {}).items()
        }
        job = command(
            name=name,
            command=self.command,
            environment=self.environment,
            compute=short_name(fallback or self.compute),
            inputs=inputs or None,
            environment_variables=self.environment_variables,
            display_name=self.display_name or name,
            experiment_name=self.experiment_name or naming.experiment_name(self.dag_id),
            tags={**(self.tags or {}), "airflow_dag_id": self.dag_id, "airflow_task_id": self.task_id, **markers},
            properties=markers,
            resources=resources,
        )
        return self.hook.submit_command_job(job)

    def work_identity(self) -> dict[str, Any]:
        """The work itself: what runs, in which environment and where, on which inputs."""
        from airflow_azureml.asset_refs import short_name

        return {
            "command": self.command,
            "environment": self.environment,
            "compute": short_name(self.compute),
            "inputs": self.inputs or {},
            "environment_variables": self.environment_variables or {},
        }

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """OpenLineage: the job's data inputs and the job chain (``airflow_azureml.openlineage``)."""
        from airflow_azureml.openlineage import job_lineage

        return job_lineage(self, self.inputs, None)

    def get_openlineage_facets_on_failure(self, task_instance: Any) -> Any:
        """OpenLineage on failure: the same inputs, and the jobs tried."""
        from airflow_azureml.openlineage import job_lineage

        return job_lineage(self, self.inputs, None)
