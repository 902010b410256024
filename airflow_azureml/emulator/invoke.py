"""A batch endpoint's data plane: the invoke that turns a deployment and its input into a batch job.

``BatchInvoke`` is the part of ``Workspace`` that checks an invoke body (endpoint, deployment, job name,
settings, input and output paths, compute) before any job exists, then creates the job as Azure records
a batch-deployment job and starts its runner (``emulator.runner``); a repeated
``Repeatability-Request-Id`` may replay the job. ``InvokeRoutes`` is the part of ``Routes`` that serves
``POST /inference/batch/{endpoint}/jobs`` with the data plane's answer (not the ARM job).
"""

from __future__ import annotations

import uuid
from typing import Any

from aiohttp import web

from airflow_azureml.emulator.arm import short_name
from airflow_azureml.emulator.azure_rules import RuleViolation, check_job_name
from airflow_azureml.emulator.batch_endpoints import BatchSettings
from airflow_azureml.emulator.errors import EmulatorError
from airflow_azureml.emulator.models import Job


class BatchInvoke:
    """The part of ``Workspace`` (emulator.workspace) that creates batch jobs from invokes."""

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
        settings = BatchSettings.from_deployment(dep, props)  # 400 on a bad override, before any job exists
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
        compute = short_name(dep.get("compute")) or ""
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
            compute_id_null=self.behaviour.batch_job_compute_id_null,
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


def _is_pipeline_component(dep: dict[str, Any]) -> bool:
    """A pipeline-component deployment (REST ``deploymentConfiguration.deploymentConfigurationType``)."""
    config = dep.get("deploymentConfiguration") or {}
    return (
        isinstance(config, dict) and str(config.get("deploymentConfigurationType", "")).lower() == "pipelinecomponent"
    )


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
        store = short_name(dataset.get("datastoreId")) or "workspaceblobstore"
        return f"azureml://datastores/{store}/paths/{str(dataset['path']).strip('/')}/"
    return f"azureml://datastores/workspaceblobstore/paths/azureml/{job_name}/score/"


class InvokeRoutes:
    """The part of ``Routes`` (emulator.routes) that serves the scoring URI."""

    async def invoke(self, request: web.Request) -> web.Response:
        body = await request.json()
        job = self.ws.invoke_batch(
            request.match_info["ep"],
            request.headers.get("azureml-model-deployment"),
            body,
            request.headers.get("repeatability-request-id"),
        )
        return self._invoke_response(job, body)

    def _invoke_response(self, job: Job, body: dict[str, Any]) -> web.Response:
        """201, the job as the data plane shows it, and ``Location`` to the deployment on the workspace host
        (batch_endpoint.invoke: Azure's invoke answer, not the ARM job)."""
        props = body.get("properties") or {}
        deployment = self.ws.deployments.get((job.endpoint or "", job.deployment or ""))
        dep = (deployment.body.get("properties") if deployment else None) or {}
        retry = dep.get("retrySettings") or {}
        arm = job.to_arm(self.ws_id)
        path = f"{self.ws_id}/batchEndpoints/{job.endpoint}/deployments/{job.deployment}"
        studio = f"{self.base_url}/_emulator/studio/jobs/{job.name}"
        answer = {
            "id": f"{path}/jobs/{job.name}",
            "name": job.name,
            "type": "Microsoft.MachineLearningServices/workspaces/batchEndpoints/deployments/jobs",
            "properties": {
                "provisioningState": "Succeeded",
                "inputData": {
                    key: {
                        "description": None,
                        "uri": value.get("uri"),
                        "mode": value.get("mode") or "ReadOnlyMount",
                        "jobInputType": value.get("jobInputType"),
                    }
                    for key, value in (props.get("inputData") or {}).items()
                    if isinstance(value, dict)
                },
                "compute": {
                    "target": f"{self.ws_id}/computes/{job.compute}",
                    "instanceCount": None,
                    "isLocal": False,
                    "location": None,
                    "instanceType": None,
                    "properties": None,
                },
                "output": {"datastoreId": None, "path": None},
                "retrySettings": {
                    "maxRetries": int(retry.get("maxRetries", 3)),
                    "timeout": str(retry.get("timeout") or "PT30S"),
                },
                "status": job.status,
                "interactionEndpoints": {
                    name: {"jobEndpointType": name, "port": None, "endpoint": url, "properties": None}
                    for name, url in (
                        ("Studio", studio),
                        ("Tracking", f"azureml://{self.base_url.split('://')[1]}/mlflow"),
                    )
                },
                "tags": dict(props.get("tags") or {}),
                "properties": {k: str(v) for k, v in (props.get("properties") or {}).items()},
                "name": job.name,
            },
            "systemData": {
                k: arm["systemData"][k] for k in ("createdAt", "createdBy", "lastModifiedAt", "lastModifiedBy")
            },
        }
        location = f"{self.base_url}/mferp/managementfrontend{path}?api-version=2020-09-01-dataplanepreview"
        return web.json_response(answer, status=201, headers={"Location": location})
