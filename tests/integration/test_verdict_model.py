"""The verdicts' fast model (benchmarks/verdicts.py) agrees with the real wait on the emulator.

Each case runs the real operator (``dag.test()``, the real SDK and REST waits) against the emulator
with one preemption or cancel, then gives the model the same timeline as the emulator recorded it (the
job's start and end, the loss, the case's node release time) and the same polling policy. The
model must reach the verdict the operator reached, witness included: the benchmark's matrix is only as
good as this agreement.
"""

from __future__ import annotations

import random
import time
from typing import Any

import pytest

from airflow_azureml.emulator import Emulator
from airflow_azureml.polling import PollingPolicy
from benchmarks.verdicts import Timeline, wait
from tests.conftest import xcom_value
from tests.helpers import evicted_nodes_released_on_resubmit, when_running
from tests.integration import test_exactly_once as exactly_once
from tests.integration.test_exactly_once import CLUSTER, first_gauge_read_while_running

workspace = exactly_once.workspace  # the fixtures
run_case = exactly_once.run_case

CASES = {
    # Azure cancels 4 s after the loss, the next poll is 12 s away: the reads between polls see it
    "lost between polls": (
        {"capacity_cancel_after_seconds": 4, "preempted_node_release_seconds": 8},
        {"interval": 12, "max_interval": 12, "jitter": 0, "evidence_interval": 1},
        "preemption",
        "gauge",
    ),
    # Azure cancels at once; the nodes stay preempted up to 30 s: the first read after the end sees them
    "cancelled at once": (
        {"capacity_cancel_after_seconds": 0, "preempted_node_release_seconds": 30},
        {"interval": 0.5, "max_interval": 0.5, "jitter": 0, "evidence_interval": 1},
        "preemption",
        "gauge_near_end",
    ),
    # cancelled at once and the nodes gone within a tenth of the evidence interval: no witness. The loss
    # strikes STRIKE_AFTER_READ after the wait's read of the running job, so no read of either schedule is
    # near it (below): struck at random, a read that a loaded machine delays could land in the 0.1 s and see
    # the gauge up (a .ci/run saw that), which is the "cancelled at once" case, not this one
    "replaced at once": (
        {"capacity_cancel_after_seconds": 0, "preempted_node_release_seconds": 0.1},
        {"interval": 8, "max_interval": 8, "jitter": 0, "evidence_interval": 8},
        "preemption",
        "none",
    ),
    # a person's cancel through Studio's path: nothing logged, no loss
    "unlogged cancel": ({}, {"interval": 0.5, "max_interval": 0.5, "jitter": 0}, "person (unlogged)", "none"),
}


# "replaced at once": the loss comes this long after the wait's first read of the running job, so that it is
# seconds from every read of the real wait (the next is 8 s after that one) and of the model's, whose reads
# are at its own first poll (0-2 s after the submit) + 0.2 s + 8 s steps while the real first read comes
# after the job started (tenths of a second): with the loss just after the real read, the two schedules
# could be a tenth of a second apart and the model alone see the gauge up.
STRIKE_AFTER_READ = 3.0


def read_running_a_while_ago(emulator: Emulator, job: Any) -> bool:
    """The wait read the cluster after seeing ``job`` Running, STRIKE_AFTER_READ or more ago."""
    read = first_gauge_read_while_running(emulator, job)
    return read is not None and time.time() - read >= STRIKE_AFTER_READ


@pytest.mark.parametrize("name", list(CASES))
def test_the_model_reaches_the_operators_verdict(
    workspace: Emulator, run_case, name: str, capfd: pytest.CaptureFixture[str]
) -> None:
    behaviour, polling, kind, expected = CASES[name]
    workspace.set_behaviour(**behaviour)
    lost: dict[str, float] = {}

    def act(emulator: Emulator, job: str) -> None:
        lost["at"] = time.time()
        if kind == "preemption":
            emulator.preempt_cluster(CLUSTER, form="canceled")
        else:
            emulator.cancel_unlogged(job)

    ready = read_running_a_while_ago if name == "replaced at once" else None
    # The nodes stay preempted for the case's release time (the model's replaced_after), or less: until the
    # resubmitted job's wait has read the cluster. The real verdict and its witness are settled before that
    # job exists, and the model never reads the emulator, so the early release changes nothing compared.
    with (
        evicted_nodes_released_on_resubmit(workspace, CLUSTER),
        when_running(workspace, act, cluster=CLUSTER, ready=ready),
    ):
        run, _ = run_case({"polling": polling, "evidence_wait": 1})
    verdict = xcom_value(run, "invoke", key="azureml_verdict")
    real = verdict["witness"]
    if verdict["outcome"] == "succeeded":  # resubmitted: the XCom holds the last job's; the log the first's
        log = capfd.readouterr().out
        assert "was wholly preempted" in log, verdict
        real = "gauge_near_end" if "at a read near its end" in log else "gauge"
    first = workspace.jobs()[0]
    submit = first.created.timestamp()
    timeline = Timeline(
        kind=kind,
        nodes=2,
        job_nodes=2,
        shared=False,
        start=first.started.timestamp() - submit,
        length=600,
        end=first.ended.timestamp() - submit,
        status_at_end="Canceled",
        lost_at=lost["at"] - submit if kind == "preemption" else None,
        lost_nodes=2,
        replaced_after=behaviour.get("preempted_node_release_seconds", 0.0),
        # the emulator's cancel for lost capacity goes through CancelRequested after its delay, as the model's does
        cancel_requested_at=lost["at"] - submit + behaviour.get("capacity_cancel_after_seconds", 0.0),
        skew=0.0,
    )
    model = wait(timeline, PollingPolicy(**polling), random.Random(1))
    assert (real, model.witness) == (expected, expected), (verdict, model)


def test_the_model_is_the_benchmarks_own() -> None:
    """The benchmark sweeps exactly this ``wait`` and ``resubmitted`` (no copy of either to drift)."""
    import benchmarks.verdicts as bench

    assert bench.sweep.__globals__["wait"] is wait
    result: Any = bench.sweep(runs=8, seed=1, cadence=True)
    assert set(result) == set(bench.SETTINGS)
