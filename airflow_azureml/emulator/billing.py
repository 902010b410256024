"""The emulator's own bill: node-seconds per AmlCompute cluster, by node state and tier, times its prices.

Rules (docs/billing.md gives each source): every allocated node is billed while it is up, whatever its
state (preparing, idle, running, leaving, preempted), so an evicted node is billed until it is
deallocated and a replacement is billed from the moment it starts preparing; nothing is refunded.
A dedicated node is billed at the Linux pay-as-you-go rate of the cluster's size and region, a
low-priority node at the Spot rate in force at that moment (``PriceBook``; seed 000). The bill is
for the control API only: nothing of it appears in Azure's own resources.

``Workspace`` calls ``sync(compute)`` right after every change to a cluster's nodes; time between two
syncs is billed to the state the node had, so the bill is exact at every change.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from airflow_azureml.emulator.pricing import PriceBook

STATES = ("preparing", "running", "idle", "leaving", "preempted")
TIERS = ("dedicated", "low_priority")


def _zero() -> dict[str, float]:
    return dict.fromkeys(STATES, 0.0)


@dataclass
class _NodeBill:
    node_id: str
    job: str | None  # the job the node was allocated for (kept after an eviction clears node.job_name)
    state: str
    since: float
    allocated_at: float
    deallocated_at: float | None = None
    seconds: dict[str, float] = field(default_factory=_zero)
    cost: float = 0.0
    evicted: bool = False

    def to_dict(self, origin: float) -> dict[str, Any]:
        return {
            "node_id": self.node_id,
            "job": self.job,
            "state": None if self.deallocated_at is not None else self.state,
            "allocated_at": self.allocated_at - origin,  # seconds since the emulator started
            "deallocated_at": None if self.deallocated_at is None else self.deallocated_at - origin,
            "evicted": self.evicted,
            "node_seconds": dict(self.seconds),
            "cost": self.cost,
        }


@dataclass
class _ClusterBill:
    name: str
    vm_size: str
    location: str
    tier: str
    nodes: dict[str, _NodeBill] = field(default_factory=dict)  # every node ever allocated, for the report
    open: dict[str, _NodeBill] = field(default_factory=dict)  # those still allocated: the only ones synced
    deleted: bool = False


class Ledger:
    """Node-seconds and cost per cluster; read with ``snapshot()`` (all state lives on the event loop)."""

    def __init__(self, prices: PriceBook, clock: Callable[[], float] = time.monotonic) -> None:
        self.prices = prices
        self.clock = clock
        self.origin = clock()
        self.clusters: dict[str, _ClusterBill] = {}

    def sync(self, compute: Any, now: float | None = None) -> None:
        """Bill ``compute``'s nodes up to now, then follow their current states (call after every change)."""
        if getattr(compute, "compute_type", "AmlCompute") != "AmlCompute":
            return  # Kubernetes compute: its nodes are the cluster's, not billed per node here
        now = self.clock() if now is None else now
        bill = self._bill(compute)
        current = {n.node_id: n for n in compute.nodes}
        for node_id, record in list(bill.open.items()):
            self._accrue(bill, record, now)
            node = current.get(node_id)
            if node is None:
                record.deallocated_at = now
                del bill.open[node_id]
                continue
            if node.state == "preempted":
                record.evicted = True
            record.state = node.state
        for node_id, node in current.items():
            if node_id not in bill.nodes:
                bill.nodes[node_id] = bill.open[node_id] = _NodeBill(
                    node_id=node_id,
                    job=node.job_name,
                    state=node.state,
                    since=now,
                    allocated_at=now,
                    evicted=node.state == "preempted",
                )

    def close(self, name: str, now: float | None = None) -> None:
        """The cluster was deleted: its nodes are billed up to now and no further."""
        bill = self.clusters.get(name)
        if bill is None:
            return
        now = self.clock() if now is None else now
        for record in bill.open.values():
            self._accrue(bill, record, now)
            record.deallocated_at = now
        bill.open.clear()
        bill.deleted = True

    def sync_all(self, computes: Iterable[Any]) -> None:
        now = self.clock()
        for compute in computes:
            self.sync(compute, now)

    def _bill(self, compute: Any) -> _ClusterBill:
        tier = "low_priority" if compute.low_priority else "dedicated"
        size = str(compute.inner.get("vmSize") or "STANDARD_DS3_V2")  # the service's default size (models.py)
        bill = self.clusters.get(compute.name)
        if bill is None or bill.deleted:  # a cluster created again under a deleted one's name: a new bill
            if bill is not None:
                self.clusters[f"{compute.name}#deleted-{len(self.clusters)}"] = bill
            bill = self.clusters[compute.name] = _ClusterBill(compute.name, size, compute.location, tier)
        return bill

    def _price(self, bill: _ClusterBill) -> tuple[float, str] | None:
        return self.prices.hourly(bill.vm_size, bill.location, low_priority=bill.tier == "low_priority")

    def _accrue(self, bill: _ClusterBill, record: _NodeBill, now: float) -> None:
        seconds = max(0.0, now - record.since)
        record.since = now
        if seconds == 0:
            return
        record.seconds[record.state if record.state in STATES else "leaving"] += seconds
        price = self._price(bill)
        if price is not None:
            record.cost += seconds * price[0] / 3600.0  # the rate in force while the node was up

    def snapshot(self, computes: Iterable[Any]) -> dict[str, Any]:
        """The bill now: per cluster (with its nodes and jobs), per tier, and in total."""
        self.sync_all(computes)
        clusters: dict[str, Any] = {}
        by_tier = {t: {"node_seconds": _zero(), "node_seconds_total": 0.0, "cost": 0.0} for t in TIERS}
        total = {"node_seconds": _zero(), "node_seconds_total": 0.0, "cost": 0.0}
        for key, bill in self.clusters.items():
            price = self._price(bill)
            seconds, jobs = _zero(), {}
            cost = 0.0
            for record in bill.nodes.values():
                job = jobs.setdefault(record.job or "", {"node_seconds": _zero(), "cost": 0.0})
                for state, value in record.seconds.items():
                    seconds[state] += value
                    job["node_seconds"][state] += value
                job["cost"] += record.cost
                cost += record.cost
            node_total = sum(seconds.values())
            clusters[key] = {
                "name": bill.name,
                "vm_size": bill.vm_size,
                "location": bill.location,
                "tier": bill.tier,
                "deleted": bill.deleted,
                "hourly_price": None if price is None else price[0],
                "price_meter": None if price is None else price[1],
                "node_seconds": seconds,
                "node_seconds_total": node_total,
                "nodes_allocated": len(bill.nodes),
                "evictions": sum(1 for r in bill.nodes.values() if r.evicted),
                "evicted_node_seconds": sum(sum(r.seconds.values()) for r in bill.nodes.values() if r.evicted),
                "cost": None if price is None else cost,
                "jobs": jobs,
                "nodes": [r.to_dict(self.origin) for r in bill.nodes.values()],
            }
            for bucket in (by_tier[bill.tier], total):
                for state, value in seconds.items():
                    bucket["node_seconds"][state] += value
                bucket["node_seconds_total"] += node_total
                bucket["cost"] += cost
        return {"currency": "USD", "clusters": clusters, "by_tier": by_tier, "total": total}
