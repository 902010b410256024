"""How the emulated workspace behaves: its simulated durations and its behaviour switches.

``Timing`` sets how long simulated work takes (small, so that tests stay fast); ``Behaviour`` holds the
switches whose defaults are Azure's documented behaviour (docs/emulator.md, "Behaviours"), and
``DEPLOYMENT_SWITCHES`` the per-deployment ones. ``BehaviourControl`` is the part of ``Workspace`` that
changes them (``Emulator.set_behaviour``, ``POST /_emulator/behaviour``). Not an Azure resource: the
knobs every other part of the workspace reads.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from airflow_azureml.emulator.errors import EmulatorError


@dataclass
class Timing:
    """Simulated durations, in seconds. Small by default so that tests and the demo stay fast."""

    provisioning: float = 0.05
    node_startup: float = 0.1
    mini_batch: float = 0.05
    command_job: float = 0.3
    tick: float = 0.02


@dataclass
class Behaviour:
    """Switches of the emulator's behaviour; each default is Azure's where Azure is documented.

    docs/emulator.md ("Behaviours") gives the source of every default. Change them with
    ``Emulator.set_behaviour(**switches)`` or ``POST /_emulator/behaviour``.
    """

    preempted_gauge: bool = True  # preemptedNodeCount counts nodes in preempted state now (swagger 2024-10-01)
    preempted_node_release_seconds: float = 0.5  # how long an evicted node stays "preempted" before deallocation
    single_node_eviction_cancels: bool = True  # seed 000/001: a single-node cluster's eviction cancels its jobs
    capacity_cancel_message: bool = False  # a capacity-lost cancel carries a warning text (Azure documents none)
    capacity_cancel_after_seconds: float = 0.0  # how long a job that lost its capacity stays as it was before its end
    cancel_requested_seconds: float = 0.0  # how long every cancel shows CancelRequested (0: one timing.tick)
    cancel_lag_seconds: float = 0.0  # a cancel Azure accepted shows on the job this much later (it reads as before)
    honour_repeatability_id: bool = False  # invoke replays a job for a repeated Repeatability-Request-Id
    immutable_jobs: bool = True  # PUT of an existing job may change only description/tags/displayName/...
    stall_seconds: float = 0.0  # every job, once Running, goes NotResponding this long, then resumes
    honour_error_threshold: bool = True  # error_threshold counts failed files; -1 ignores failures
    validate_deployments: bool = True  # a deployment's settings are checked when it is written
    check_api_versions: bool = True  # ARM refuses a missing or unregistered api-version (emulator.api_versions)
    check_audiences: bool = True  # each plane refuses tokens issued for another audience (emulator.identity)
    list_ignores_properties_filter: bool = False  # the jobs LIST answers as if no ``properties`` filter was sent
    list_lag_seconds: float = 0.0  # a job shows in the jobs LIST only this long after it was created (GET at once)
    invoke_properties_dropped: bool = False  # a batch invoke's user properties never reach its job (Azure's own stay)
    batch_job_compute_id_null: bool = False  # a batch job's computeId is null, as in Azure's one recording of one
    storage_data_role: bool = True  # the service principal holds Storage Blob Data Contributor on the account
    activity_log_lag_seconds: float = 60.0  # an Activity Log event shows this long after it happened (ingestion)
    activity_log_reader: bool = True  # the service principal may read the Activity Log (Reader at the group)

    def update(self, values: dict[str, Any]) -> None:
        known = {f.name for f in fields(self)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise EmulatorError(400, "BadRequest", f"unknown behaviour switches {unknown}; known: {sorted(known)}")
        for key, value in values.items():
            if isinstance(getattr(self, key), bool):
                if not isinstance(value, bool):
                    raise EmulatorError(400, "BadRequest", f"behaviour {key!r} is a boolean, got {value!r}")
            elif isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise EmulatorError(400, "BadRequest", f"behaviour {key!r} is a number of seconds >= 0, got {value!r}")
            else:
                value = float(value)
            setattr(self, key, value)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


DEPLOYMENT_SWITCHES = frozenset({"ignore_job_name"})  # per-deployment behaviour switches


class BehaviourControl:
    """The part of ``Workspace`` (emulator.workspace) that changes the behaviour switches."""

    def set_behaviour(self, values: dict[str, Any]) -> dict[str, Any]:
        self.behaviour.update(values)
        for compute in self.computes.values():
            compute.preempted_gauge = self.behaviour.preempted_gauge
        return self.behaviour.to_dict()

    def set_deployment_behaviour(self, endpoint: str, deployment: str, values: dict[str, Any]) -> dict[str, bool]:
        unknown = sorted(set(values) - DEPLOYMENT_SWITCHES)
        if unknown:
            raise EmulatorError(400, "BadRequest", f"unknown deployment switches {unknown}")
        if any(not isinstance(v, bool) for v in values.values()):
            raise EmulatorError(400, "BadRequest", "deployment switches are booleans")
        current = self.deployment_behaviour.setdefault((endpoint, deployment), {})
        current.update(values)
        return dict(current)
