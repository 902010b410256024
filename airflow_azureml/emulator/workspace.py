"""The emulated workspace: all its state, and the parts that act on it, one Azure concept a module.

``Workspace`` holds every resource of one emulated Azure ML workspace (computes, endpoints and
deployments, jobs, models, environments, code, storage) and the background tasks that move them; its
methods run on the emulator's event loop. Each concept's behaviour is a part (a mixin) in its own module:
``behaviour``, ``datastores``, ``registry``, ``computes``, ``nodes``, ``batch_endpoints``, ``invoke``,
``jobs`` and ``runner``; this module only puts them together (docs/emulator.md, "Layout").
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
from pathlib import Path
from typing import Any

from airflow_azureml.emulator.batch_endpoints import BatchEndpointStore
from airflow_azureml.emulator.behaviour import Behaviour, BehaviourControl, Timing
from airflow_azureml.emulator.billing import Ledger
from airflow_azureml.emulator.blobs import BlobStore
from airflow_azureml.emulator.codes import CodeAssets
from airflow_azureml.emulator.computes import ComputeStore
from airflow_azureml.emulator.datastores import Datastores
from airflow_azureml.emulator.errors import EmulatorError
from airflow_azureml.emulator.invoke import BatchInvoke
from airflow_azureml.emulator.jobs import JobStore
from airflow_azureml.emulator.kubernetes.store import KubeCluster
from airflow_azureml.emulator.models import Compute, Job, TrackedResource, utcnow
from airflow_azureml.emulator.nodes import NodePool
from airflow_azureml.emulator.pricing import PriceBook
from airflow_azureml.emulator.registry import AssetRegistry
from airflow_azureml.emulator.runner import JobRunner
from airflow_azureml.emulator.scoring import ScoringRegistry, forks
from airflow_azureml.emulator.scoring.script import ScriptScorer, new_fork_server

# server.py imports EmulatorError, Timing and Workspace from here in one line; EmulatorError's home is errors.
__all__ = ["EmulatorError", "Timing", "Workspace"]


class Workspace(
    BehaviourControl,
    Datastores,
    AssetRegistry,
    ComputeStore,
    NodePool,
    BatchEndpointStore,
    BatchInvoke,
    JobStore,
    JobRunner,
):
    """All state of one emulated workspace. Methods run on the emulator's event loop."""

    def __init__(
        self,
        data_dir: Path,
        *,
        seed: int = 0,
        timing: Timing | None = None,
        fork_server: forks.ForkServer | None = None,
    ) -> None:
        self.data_dir = data_dir
        # a copy: a test that changes its emulator's timing must not change the next emulator's (a shared FAST)
        self.timing = dataclasses.replace(timing) if timing is not None else Timing()
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
        self._forks: forks.ForkServer | None = fork_server  # the warm template of MLflow models' scoring processes
        self._owns_forks = fork_server is None  # a shared template is its owner's to close
        self.eviction_rate: dict[str, float] = {}  # cluster -> evictions per node per second
        # Test control, not an Azure behaviour: a Running job on a held cluster keeps its nodes but takes no
        # work (and a command job does not end) until it is released, so that a test's fault lands while the
        # job runs, with its work still ahead, however loaded the machine is.
        self.held_clusters: set[str] = set()
        self.released_jobs: set[str] = set()
        self.held_preemptions: dict[str, tuple[int | None, set[str], str]] = {}  # see preempt_cluster
        self.held_nodes: dict[str, list[Any]] = {}  # evicted nodes kept in the gauge: preempt_cluster(hold_nodes)
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

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    def fork_server(self) -> forks.ForkServer | None:
        """The template MLflow models' scoring processes are forked from (started with the first such job),
        or None where fork is not available (a process per job then)."""
        if self._forks is None:
            self._forks = new_fork_server()
        return self._forks

    async def shutdown(self) -> None:
        for task in list(self._background):
            task.cancel()
        await asyncio.gather(*self._background, return_exceptions=True)
        if self._forks is not None and self._owns_forks:
            await asyncio.to_thread(self._forks.close)
