"""Create (idempotently) and delete AmlCompute clusters, including low-priority (spot) ones."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from airflow_azureml.capacity import check_if_busy
from airflow_azureml.exceptions import AzureMLConfigError, AzureMLError
from airflow_azureml.operators.base import AzureMLBaseOperator
from airflow_azureml.redaction import scrub

if TYPE_CHECKING:
    from airflow_azureml.specs import ClusterSpec

IF_EXISTS = ("update", "skip", "fail")
DEFAULT_WAIT_TIMEOUT = 1800.0


def wait_for_lro(
    poller: Any,
    *,
    what: str,
    timeout: float,
    interval: float = 5.0,
    probe: Callable[[], tuple[bool, Any]] | None = None,
) -> Any:
    """Wait for an SDK long-running operation, never longer than ``timeout`` seconds.

    The SDK's poller sleeps as long as the service's ``Retry-After`` says (a day, if it says so), and
    ``result(timeout=...)`` quietly returns an unfinished result. So wait in slices of ``interval`` and,
    between them, ask ``probe`` (one GET of the resource) whether it has reached the wanted state: the
    resource's own state ends the wait, whatever the operation's ``Retry-After``. On timeout the write
    may still finish in Azure; the next try reads the resource's state before writing anything.
    """
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        poller.wait(timeout=max(0.0, min(interval, remaining)))  # re-raises the operation's own failure
        if poller.done():
            return poller.result()
        if probe is not None:
            finished, value = probe()
            if finished:
                return value
        if time.monotonic() >= deadline:
            raise AzureMLError(
                f"{what} did not finish within {timeout:g}s. It may still finish in Azure; "
                "a retry reads its state before writing anything again."
            )


class AzureMLCreateComputeClusterOperator(AzureMLBaseOperator):
    """Create an AmlCompute cluster, or bring an existing one to the wanted scale settings.

    Give the cluster as keyword arguments, an ``AmlCompute`` entity, or the az ml CLI YAML path
    (``compute="low-pri-cluster.yml"``); keyword arguments override what the entity/YAML says.

    - Exists with the same settings: nothing is changed (no PUT).
    - Exists with other scale settings: updated (``if_exists="update"``, the default), left as is
      (``"skip"``) or an error (``"fail"``). Size and tier cannot change in place: that is an error.
    - Exists in ``Failed`` provisioning state: deleted and created again.
    Returns the cluster's name, tier and scale settings.
    """

    template_fields: Sequence[str] = ("name", "compute", "size", "location")

    def __init__(
        self,
        *,
        name: str | None = None,
        compute: Any = None,
        size: str | None = None,
        tier: str | None = None,
        min_instances: int | None = None,
        max_instances: int | None = None,
        idle_time_before_scale_down: int | None = None,
        location: str | None = None,
        identity: Any = None,
        if_exists: str = "update",
        wait_timeout: float = DEFAULT_WAIT_TIMEOUT,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if if_exists not in IF_EXISTS:
            raise AzureMLConfigError(f"if_exists must be one of {IF_EXISTS}, got {if_exists!r}.")
        self.name = name
        self.compute = compute
        self.size = size
        self.tier = tier
        self.min_instances = min_instances
        self.max_instances = max_instances
        self.idle_time_before_scale_down = idle_time_before_scale_down
        self.location = location
        self.identity = identity
        self.if_exists = if_exists
        self.wait_timeout = wait_timeout

    def build_spec(self) -> ClusterSpec:
        from airflow_azureml.specs import ClusterSpec  # the rules cost DAG parsing nothing

        return ClusterSpec.from_any(
            self.compute,
            name=self.name,
            size=self.size,
            tier=self.tier,
            min_instances=self.min_instances,
            max_instances=self.max_instances,
            idle_time_before_scale_down=self.idle_time_before_scale_down,
            location=self.location,
            identity=self.identity,
        )

    def execute(self, context: Any) -> dict[str, Any]:
        spec = self.build_spec()  # validates before any API call
        ml = self.hook.get_conn()
        existing = self._get(ml, spec.name)
        if existing is not None and existing.provisioning_state in ("Creating", "Updating"):
            self.log.info("Cluster %s is %s; waiting for it.", spec.name, existing.provisioning_state)
            existing = self._wait_provisioned(ml, spec.name)
        if existing is not None and existing.provisioning_state == "Failed":
            self.log.warning("Cluster %s is in Failed state; deleting and creating it again.", spec.name)
            self._delete(ml, spec.name)
            existing = None
        if existing is None:
            self.log.info(
                "Creating %s cluster %s (%s, %d-%d nodes).",
                spec.tier,
                spec.name,
                spec.size,
                spec.min_instances,
                spec.max_instances,
            )
            result = self._put(ml, spec)
            return self._summary(result, changed=True)
        diffs = spec.differences(existing)
        if not diffs:
            self.log.info("Cluster %s already exists with the wanted settings; nothing to do.", spec.name)
            return self._summary(existing, changed=False)
        immutable = {k: v for k, v in diffs.items() if k in ("size", "tier")}
        if immutable:
            raise AzureMLConfigError(
                f"Cluster {spec.name!r} exists with {immutable} (existing, wanted); size and tier cannot "
                "change in place. Delete the cluster or choose another name."
            )
        if self.if_exists == "fail":
            raise AzureMLError(f"Cluster {spec.name!r} already exists with different settings: {diffs}.")
        if self.if_exists == "skip":
            self.log.info("Cluster %s differs (%s) but if_exists='skip'; leaving it.", spec.name, diffs)
            return self._summary(existing, changed=False)
        self.log.info("Updating cluster %s: %s", spec.name, diffs)
        return self._summary(self._put(ml, spec), changed=True)

    def _put(self, ml: Any, spec: ClusterSpec) -> Any:
        entity = spec.to_entity()
        if spec.yaml_path:
            from azure.ai.ml import load_compute

            entity = load_compute(source=spec.yaml_path)
            for key in ("size", "tier", "min_instances", "max_instances", "idle_time_before_scale_down"):
                setattr(entity, key, getattr(spec, key))
            entity.name = spec.name
            if spec.location:
                entity.location = spec.location

        def probe() -> tuple[bool, Any]:
            current = self._get(ml, spec.name)
            if current is None or current.provisioning_state in ("Creating", "Updating"):
                return False, None
            if current.provisioning_state == "Failed":
                raise AzureMLError(f"Creating cluster {spec.name!r} failed: its provisioning state is Failed.")
            return current.provisioning_state == "Succeeded" and not spec.differences(current), current

        try:
            poller = ml.compute.begin_create_or_update(entity)
            return wait_for_lro(
                poller,
                what=f"Creating cluster {spec.name!r}",
                timeout=self.wait_timeout,
                interval=self.polling.interval,
                probe=probe,
            )
        except AzureMLError:
            raise
        except Exception as exc:
            raise AzureMLError(f"Creating cluster {spec.name!r} failed: {scrub(str(exc))}") from None

    def _delete(self, ml: Any, name: str) -> None:
        wait_for_lro(
            ml.compute.begin_delete(name),
            what=f"Deleting cluster {name!r}",
            timeout=self.wait_timeout,
            interval=self.polling.interval,
            probe=lambda: (self._get(ml, name) is None, None),
        )

    def _get(self, ml: Any, name: str) -> Any:
        from azure.core.exceptions import ResourceNotFoundError

        try:
            return ml.compute.get(name)
        except ResourceNotFoundError:
            return None

    def _wait_provisioned(self, ml: Any, name: str) -> Any:
        deadline = time.monotonic() + self.wait_timeout
        delay = min(self.polling.interval, 5.0)
        while time.monotonic() < deadline:
            current = self._get(ml, name)
            if current is None or current.provisioning_state not in ("Creating", "Updating"):
                return current
            time.sleep(max(0.0, min(delay, deadline - time.monotonic())))
        raise AzureMLError(f"Cluster {name!r} did not finish provisioning within {self.wait_timeout}s.")

    @staticmethod
    def _summary(compute: Any, *, changed: bool) -> dict[str, Any]:
        return {
            "name": compute.name,
            "tier": compute.tier,
            "size": compute.size,
            "min_instances": compute.min_instances,
            "max_instances": compute.max_instances,
            "idle_time_before_scale_down": compute.idle_time_before_scale_down,
            "provisioning_state": compute.provisioning_state,
            "changed": changed,
        }


class AzureMLDeleteComputeOperator(AzureMLBaseOperator):
    """Delete a compute target, but not while jobs use it. An absent one counts as deleted.

    Deleting a compute fails the jobs on it, and as a teardown in overlapping runs or a backfill other runs'
    jobs may be running or queued there. So first the cluster is read: nodes running jobs or being prepared
    (AmlCompute ``nodeStateCounts``), then jobs not ended on it in the workspace's job LIST (a queued job holds
    no node). ``if_busy`` (templated) says what a cluster in use means: ``"skip"`` (default: the task is
    skipped, the log says why), ``"wait"`` (read again every ``polling.interval`` until it is free, at most
    ``wait_timeout``), ``"delete"`` (delete anyway, as before). Azure has no conditional delete: a job
    submitted between the last read and the delete still fails.
    """

    template_fields: Sequence[str] = ("name", "if_busy")

    def __init__(
        self,
        *,
        name: str,
        wait: bool = True,
        wait_timeout: float = DEFAULT_WAIT_TIMEOUT,
        if_busy: str = "skip",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        from airflow_azureml.specs import rendered_later

        if not rendered_later(if_busy):  # a template or an XComArg is checked once rendered, before any API call
            check_if_busy(if_busy)
        self.name = name
        self.wait = wait
        self.wait_timeout = wait_timeout
        self.if_busy = if_busy

    def execute(self, context: Any) -> bool:
        from airflow_azureml.specs import check_compute_name

        check_compute_name(self.name)
        if_busy = check_if_busy(self.if_busy)
        from azure.core.exceptions import ResourceNotFoundError

        ml = self.hook.get_conn()
        try:
            ml.compute.get(self.name)
        except ResourceNotFoundError:
            self.log.info("Compute %s does not exist; nothing to delete.", self.name)
            return False
        if if_busy == "delete":
            self.log.warning("if_busy='delete': deleting compute %s without checking for jobs on it.", self.name)
        else:
            reasons = self.busy_reasons()
            deadline = time.monotonic() + self.wait_timeout
            while reasons and if_busy == "wait" and time.monotonic() < deadline:
                self.log.info("Compute %s is in use (%s); waiting (if_busy='wait').", self.name, "; ".join(reasons))
                time.sleep(max(0.0, min(self.polling.interval, deadline - time.monotonic())))
                reasons = self.busy_reasons()
            if reasons:
                message = f"Compute {self.name} is in use, so it is not deleted: {'; '.join(reasons)}."
                if if_busy == "wait":
                    raise AzureMLError(f"{message} Still so after {self.wait_timeout:g}s (if_busy='wait').")
                try:
                    from airflow.sdk.exceptions import AirflowSkipException
                except ImportError:  # Airflow 3.1 has it in core only
                    from airflow.exceptions import AirflowSkipException  # type: ignore[no-redef]

                self.log.info("%s Skipped (if_busy='skip'): another run's jobs keep running.", message)
                raise AirflowSkipException(message)
            self.log.info("Compute %s has no node running or preparing and no job that has not ended.", self.name)
        poller = ml.compute.begin_delete(self.name)
        if self.wait:

            def gone() -> tuple[bool, None]:
                try:
                    ml.compute.get(self.name)
                except ResourceNotFoundError:
                    return True, None
                return False, None

            wait_for_lro(
                poller,
                what=f"Deleting compute {self.name!r}",
                timeout=self.wait_timeout,
                interval=self.polling.interval,
                probe=gone,
            )
        self.log.info("Deleted compute %s.", self.name)
        return True

    def busy_reasons(self) -> list[str]:
        """What shows the compute in use now: its node counts, then (when no node works) the job LIST."""
        from airflow_azureml.capacity import busy_reasons, jobs_on_cluster, node_counts

        rest = self.hook.rest()
        compute = rest.get_compute(self.name)
        if compute is None:
            return []
        counts = node_counts(compute)
        if busy_reasons(counts, []):
            return busy_reasons(counts, [])
        deployments: dict[tuple[str, str], str | None] = {}

        def deployment_compute(endpoint: str, deployment: str) -> str | None:
            if (endpoint, deployment) not in deployments:
                doc = rest.get_batch_resource(endpoint, deployment) or {}
                deployments[endpoint, deployment] = (doc.get("properties") or {}).get("compute")
            return deployments[endpoint, deployment]

        return busy_reasons(counts, jobs_on_cluster(rest.list_jobs({}), self.name, deployment_compute))


class AzureMLAttachKubernetesComputeOperator(AzureMLBaseOperator):
    """Attach an AKS/Arc Kubernetes cluster (with the Azure ML extension) as a compute target, idempotently.

    ``resource_id`` is the ARM id of the managed or connected cluster; ``namespace`` is where jobs run.
    An attached compute with the same cluster and namespace is left as it is.
    """

    template_fields: Sequence[str] = ("name", "resource_id", "namespace")

    def __init__(
        self,
        *,
        name: str,
        resource_id: str,
        namespace: str = "default",
        wait_timeout: float = DEFAULT_WAIT_TIMEOUT,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.name = name
        self.resource_id = resource_id
        self.namespace = namespace
        self.wait_timeout = wait_timeout

    def execute(self, context: Any) -> dict[str, Any]:
        from airflow_azureml.specs import check_compute_name

        check_compute_name(self.name)
        if not str(self.resource_id).startswith("/subscriptions/"):
            raise AzureMLConfigError(
                f"resource_id must be the cluster's ARM id (/subscriptions/...), got {self.resource_id!r}."
            )
        from azure.ai.ml.entities import KubernetesCompute
        from azure.core.exceptions import ResourceNotFoundError

        ml = self.hook.get_conn()
        try:
            existing = ml.compute.get(self.name)
        except ResourceNotFoundError:
            existing = None
        if existing is not None:
            if getattr(existing, "type", "").lower() != "kubernetes":
                raise AzureMLConfigError(f"Compute {self.name!r} exists and is not a Kubernetes compute.")
            if (
                existing.resource_id or ""
            ).lower() == self.resource_id.lower() and existing.namespace == self.namespace:
                self.log.info("Kubernetes compute %s is already attached.", self.name)
                return {"name": self.name, "changed": False}
        self.log.info("Attaching Kubernetes cluster %s as compute %s.", self.resource_id, self.name)

        def attached() -> tuple[bool, None]:
            try:
                current = ml.compute.get(self.name)
            except ResourceNotFoundError:
                return False, None
            if current.provisioning_state == "Failed":
                raise AzureMLError(f"Attaching Kubernetes compute {self.name!r} failed: provisioning state Failed.")
            same = (current.resource_id or "").lower() == self.resource_id.lower()
            return current.provisioning_state == "Succeeded" and same and current.namespace == self.namespace, None

        wait_for_lro(
            ml.compute.begin_create_or_update(
                KubernetesCompute(name=self.name, resource_id=self.resource_id, namespace=self.namespace)
            ),
            what=f"Attaching Kubernetes compute {self.name!r}",
            timeout=self.wait_timeout,
            interval=self.polling.interval,
            probe=attached,
        )
        return {"name": self.name, "changed": True}
