"""Node life on AmlCompute clusters: allocation, start-up, eviction and preemption, and the bill.

``NodePool`` is the part of ``Workspace`` that gives a job its nodes (as far as the cluster's capacity
goes), counts the nodes a job still waits for (``targetNodeCount``), and takes nodes back the way a
low-priority cluster loses them: one node evicted (its work redone elsewhere), or the whole cluster
preempted (its jobs Canceled for lost capacity, or Failed with PreemptionError). These are the
emulator's spot-capacity faults; the HTTP faults are ``emulator.faults``. After every change to a
cluster's nodes the bill follows (``emulator.billing``).
"""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from airflow_azureml.emulator.errors import EmulatorError
from airflow_azureml.emulator.models import (
    ACTIVE_JOB_STATES,
    CAPACITY_LOST_MESSAGE,
    PREEMPTION_ERROR_MESSAGE,
    Compute,
    Job,
    Node,
    utcnow,
)
from airflow_azureml.emulator.pricing import PriceError


class NodePool:
    """The part of ``Workspace`` (emulator.workspace) that runs the clusters' nodes."""

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

    async def _start_node(self, compute: Compute, node: Node) -> None:
        await asyncio.sleep(self.timing.node_startup)
        if node.state == "preparing":
            node.state = "idle"
            self._billed(compute)

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

    def _evict(self, compute: Compute, node: Node, *, hold: bool = False) -> None:
        """One node taken back: counted in preemptedNodeCount until it is deallocated (a gauge); with
        ``hold`` (a test control) not before ``end_held_preemption``."""
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
        if not hold:
            self._spawn(self._deallocate(compute, node, self.behaviour.preempted_node_release_seconds))

    async def _deallocate(self, compute: Compute, node: Node, after: float) -> None:
        await asyncio.sleep(after)
        if node in compute.nodes:
            compute.nodes.remove(node)
            compute.modified = utcnow()
            self._billed(compute)

    def deallocate_preempted(self, cluster: str) -> int:
        """Test control: deallocate now every evicted node still in the gauge; returns how many. With a long
        ``preempted_node_release_seconds`` a test decides when the nodes go (e.g. once a wait has read them),
        instead of racing a timer against a loaded machine."""
        compute = self._cluster(cluster)
        gone = [n for n in compute.nodes if n.state == "preempted"]
        if gone:
            compute.nodes = [n for n in compute.nodes if n.state != "preempted"]
            compute.modified = utcnow()
            self._billed(compute)
        return len(gone)

    def preempt_cluster(
        self, cluster: str, form: str = "canceled", *, hold_end: bool = False, hold_nodes: bool = False
    ) -> list[str]:
        """Preempt every node; running jobs end as Canceled (lost capacity) or Failed (PreemptionError).

        ``hold_end`` is a test control, not an Azure behaviour: the jobs that lost their capacity stay as they
        were (capacity gone) until ``end_held_preemption``, so a test decides how long the service takes to
        end them, e.g. until the waits have read the gauge up, however loaded the machine is. ``hold_nodes``
        (with ``hold_end``) keeps the evicted nodes in the gauge until then too: their deallocation
        (``preempted_node_release_seconds``) starts when the jobs end.
        """
        if form not in ("canceled", "failed"):
            raise EmulatorError(400, "BadRequest", "form must be 'canceled' or 'failed'")
        if hold_nodes and not hold_end:
            raise EmulatorError(400, "BadRequest", "hold_nodes needs hold_end")
        compute = self._cluster(cluster)
        # The jobs that lose capacity are those that held nodes (seeds 000/001: the job running on a
        # wholly preempted cluster is cancelled); a job still queued for nodes keeps waiting.
        holders = {n.job_name for n in compute.nodes if n.job_name and n.state != "preempted"}
        evicted = [n for n in compute.nodes if n.state != "preempted"]
        for node in evicted:
            self._evict(compute, node, hold=hold_nodes)
        jobs = {
            j.name
            for j in self.jobs.values()
            if j.compute == cluster and j.status in ACTIVE_JOB_STATES and j.name in holders
        }
        if hold_end:
            if cluster in self.held_preemptions:
                raise EmulatorError(409, "Conflict", f"a held preemption of {cluster!r} has not ended yet")
            self.held_preemptions[cluster] = (compute.capacity_override, jobs, form)
            self.held_nodes[cluster] = evicted if hold_nodes else []
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
            for node in self.held_nodes.pop(cluster, []):
                self._spawn(self._deallocate(compute, node, self.behaviour.preempted_node_release_seconds))

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
