"""Keep the jobs on a cluster within its capacity, waiting in Airflow (a pool slot) rather than in Azure's queue."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from airflow_azureml.operators.base import AzureMLBaseOperator


class AzureMLSyncCapacityPoolOperator(AzureMLBaseOperator):
    """Create or update the Airflow pool whose slots are the jobs a cluster runs at once.

    ``slots = max_instances // instance_count + queue_ahead``: ``compute`` gives ``max_instances`` (the az ml
    CLI YAML the create-cluster operator takes, an ``AmlCompute`` entity, or a cluster's name to read the live
    cluster) and ``instance_count`` (an int) or ``deployment`` (its YAML or entity: ``resources.instance_count``,
    default 1) the nodes of one job. Give every task that runs jobs on the cluster ``pool=<pool_name>``: a task
    beyond the capacity then waits for a slot in Airflow, not as a queued Azure job whose ``max_queue_time`` runs
    out.

    ``queue_ahead`` (default 0, at most 8) adds that many slots, so that as many jobs wait in Azure's queue and
    the nodes a job frees start the next one at once instead of idling through Airflow's turn (the trigger's
    poll, the resume, the next task's start and submit: seconds a job). A job queued ahead waits for running
    jobs to end, and through any preemption or spot shortage, with its ``max_queue_time`` running: use it
    where jobs are much shorter than ``max_queue_time`` (docs/backfills.md). In a pool sized in nodes
    (``instance_count=1``), it counts nodes.

    The pool counts deferred tasks (``include_deferred=True``), since a deferrable task's job runs while the
    task is deferred; without it every deferred task would free its slot and the pool would limit nothing.
    The pool is written through Airflow's public REST API (``airflow_conn_id``: ``AirflowPoolsHook``), only when
    it is missing or its slots, ``include_deferred`` or description differ. ``dag.test()`` runs tasks without
    the scheduler, so it ignores pools: there the pool is written but limits nothing.
    Returns the pool's name, slots, cluster, ``queue_ahead``, and whether it was written.
    """

    template_fields: Sequence[str] = ("pool_name", "compute", "deployment", "instance_count", "queue_ahead")

    def __init__(
        self,
        *,
        compute: Any,
        pool_name: str | None = None,
        deployment: Any = None,
        instance_count: int | str | None = None,
        queue_ahead: int | str = 0,
        include_deferred: bool = True,
        description: str | None = None,
        airflow_conn_id: str = "airflow_api",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.compute = compute
        self.pool_name = pool_name
        self.deployment = deployment
        self.instance_count = instance_count
        self.queue_ahead = queue_ahead
        from airflow_azureml.specs import rendered_later

        if not rendered_later(queue_ahead):  # a template or an XComArg is checked once rendered, before any call
            from airflow_azureml.capacity import check_queue_ahead

            check_queue_ahead(queue_ahead)
        self.include_deferred = include_deferred
        self.description = description
        self.airflow_conn_id = airflow_conn_id

    def sizing(self) -> tuple[str, int, int]:
        """``(cluster name, max_instances, instance_count)`` from the arguments; checked before any API call.

        ``max_instances`` is 0 when ``compute`` is a bare name: the live cluster is read for it.
        """
        from airflow_azureml.asset_refs import short_name
        from airflow_azureml.capacity import rendered_number
        from airflow_azureml.exceptions import AzureMLConfigError
        from airflow_azureml.specs import ClusterSpec, DeploymentSpec, check_compute_name

        if isinstance(self.compute, str) and not self.compute.lower().endswith((".yml", ".yaml")):
            cluster, max_instances = check_compute_name(short_name(self.compute)), 0
        else:
            spec = ClusterSpec.from_any(self.compute)
            cluster, max_instances = spec.name, spec.max_instances
        count: Any = self.instance_count
        if self.deployment is not None:
            deployment = DeploymentSpec.from_any(self.deployment)
            if short_name(deployment.compute).lower() != cluster.lower():
                raise AzureMLConfigError(
                    f"Deployment {deployment.name!r} runs on compute {short_name(deployment.compute)!r}, not on "
                    f"{cluster!r}: the pool would be sized for the wrong cluster."
                )
            if count is None:
                count = deployment.instance_count
        count = rendered_number(count)
        count = 1 if count is None else count
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            raise AzureMLConfigError(f"instance_count must be a positive integer, got {count!r}.")
        return cluster, max_instances, count

    def execute(self, context: Any) -> dict[str, Any]:
        from airflow_azureml.capacity import capacity_pool_name, check_pool_name, check_queue_ahead, pool_slots
        from airflow_azureml.hooks.airflow_pools import AirflowPoolsHook

        cluster, max_instances, count = self.sizing()
        ahead = check_queue_ahead(self.queue_ahead)
        name = check_pool_name(self.pool_name or capacity_pool_name(cluster))
        if max_instances:
            slots = pool_slots(max_instances, count, cluster=f"cluster {cluster!r}")
        pools = AirflowPoolsHook(self.airflow_conn_id)
        pools.base_url()  # the connection is checked before any call to Azure or Airflow
        if not max_instances:
            live = self.hook.get_conn().compute.get(cluster)
            max_instances = int(live.max_instances or 1)
            self.log.info("Cluster %s (live) has max_instances %d.", cluster, max_instances)
            slots = pool_slots(max_instances, count, cluster=f"cluster {cluster!r}")
        sizing = f"max_instances {max_instances} // instance_count {count}"
        if ahead:
            sizing += f" + queue_ahead {ahead}"
        description = self.description or (
            f"Jobs on Azure ML cluster {cluster}: {sizing} (airflow_azureml.AzureMLSyncCapacityPoolOperator)"
        )
        slots += ahead
        wanted = {"slots": slots, "include_deferred": self.include_deferred, "description": description}
        self.log.info(
            "Pool %s: %d slot(s) = %s of cluster %s (include_deferred=%s).",
            name,
            slots,
            sizing,
            cluster,
            self.include_deferred,
        )
        try:
            written = self._sync(pools, name, wanted)
        finally:
            pools.close()
        return {"pool": name, "slots": slots, "cluster": cluster, "queue_ahead": ahead, "written": written}

    def _sync(self, pools: Any, name: str, wanted: dict[str, Any]) -> bool:
        current = pools.get_pool(name)
        if current is None:
            if pools.create_pool(name, **wanted) is not None:
                self.log.info("Created pool %s.", name)
                return True
            current = pools.get_pool(name)  # created meanwhile by another run: bring it to the wanted settings
            if current is None:
                from airflow_azureml.exceptions import AirflowException

                raise AirflowException(f"Pool {name} was reported as existing, then not found: try again.")
        changes = {k: v for k, v in wanted.items() if current.get(k) != v}
        if not changes:
            self.log.info("Pool %s already has %d slot(s); nothing to write.", name, wanted["slots"])
            return False
        self.log.info(
            "Updating pool %s: %s",
            name,
            ", ".join(f"{k} {current.get(k)!r} -> {v!r}" for k, v in changes.items()),
        )
        pools.update_pool(name, wanted, list(changes))
        return True
