"""``make demo`` as a new user runs it, twice: the example DAG against the emulator, a preemption mid-run,
and on the second run a new interval plus a re-run of the first that reuses its finished partitions."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
DEMO_SCRIPT = REPO / "scripts" / "demo.py"
DEMO_TIMEOUT = 400  # one `make demo`: about 2 min on an idle 2-core machine, more than twice that when busy


def run_demo(demo: Path, *args: str) -> str:
    """One ``make demo`` in ``demo`` (never the repository's ``.demo/``); its output, after checking it passed."""
    # a worker that built an MLClient on its own custom cloud (test_emulator_protocol) holds its name here; a
    # user's shell holds none
    env = {**{k: v for k, v in os.environ.items() if k != "AZUREML_CURRENT_CLOUD"}, "AZUREML_DEMO_DIR": str(demo)}
    for key in [k for k in env if k.startswith("AIRFLOW")]:  # the demo sets up its own Airflow home
        del env[key]
    # A home of its own, which must stay empty: `make demo` writes nothing into a user's home (a .ci/run found
    # ~/airflow/logs, made by the demo script's own import of Airflow before it had set AIRFLOW_HOME).
    home = demo.parent / "home"
    home.mkdir(exist_ok=True)
    env["HOME"] = str(home)
    result = subprocess.run(
        [sys.executable, str(DEMO_SCRIPT), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=DEMO_TIMEOUT,
        check=False,
    )
    out = result.stdout + result.stderr
    errors = [
        line
        for log in sorted((demo / "logs").glob("*.log"))
        for line in log.read_text(errors="replace").splitlines()
        if "[error" in line and "Variable not found" not in line  # Airflow 3.1/3.2's level for it; 3.3 logs debug
    ]
    assert errors == [], out[-3000:]
    assert result.returncode == 0, out[-3000:]
    assert sorted(p.name for p in home.rglob("*")) == [], "the demo wrote into the user's home"
    return out


def emulator_jobs(demo: Path) -> dict[str, list[dict[str, Any]]]:
    """The ARM records of the jobs the emulator held at the end of the last run, by the interval their input names."""
    grouped: dict[str, list[dict[str, Any]]] = {}
    for job in json.loads((demo / "logs" / "emulator-jobs.json").read_text()):
        (uri,) = [v["uri"] for v in job["properties"]["inputs"].values()]
        grouped.setdefault(uri.split("/scoring/input/")[1].split("/")[0], []).append(job)
    return grouped


def checkpointed_jobs(demo: Path, interval: str) -> set[str]:
    """The jobs named in the interval's verified checkpoints on the emulator's datastore."""
    folder = demo / "emulator" / "datastores" / "workspaceblobstore" / "scoring" / "checkpoints" / interval
    states = [json.loads(p.read_text()) for p in sorted(folder.glob("part-*.json"))]
    assert len(states) == 4 and all(s["verified"] for s in states), states
    return {name for s in states for name in s["jobs"]}


# Two demos in one test: its timeout holds both (the suite's 300 s cut the second one short on a busy
# machine, inside its own 400 s).
@pytest.mark.timeout(2 * DEMO_TIMEOUT + 60)
def test_second_demo_scores_a_new_interval_and_reuses_the_first_without_a_job(tmp_path: Path) -> None:
    demo = tmp_path / "demo"
    first = run_demo(demo, "--fresh")
    assert "interval 1: 2026-11-29  (data interval 20261129T0000, new)" in first, first[-3000:]
    assert "each row exactly once" in first and "errors logged            0" in first, first[-3000:]
    assert "(re-run)" not in first, first[-3000:]
    # the run's bill: the spot cost, what all-dedicated would have cost, the savings (issue 11), and the
    # emulator's own bill beside it
    for line in ("bill of this run", "estimated cost     $", "all-dedicated      $", "savings            $"):
        assert line in first, first[-3000:]
    assert "emulator's own bill      low-pri-cluster:" in first, first[-3000:]
    jobs = emulator_jobs(demo)
    assert list(jobs) == ["20261129T0000"], jobs.keys()
    first_jobs = {j["name"] for j in jobs["20261129T0000"]}
    # The whole-cluster preemption: one job canceled, resubmitted once; every job named by a checkpoint.
    assert sorted(j["properties"]["status"] for j in jobs["20261129T0000"]) == ["Canceled"] + ["Completed"] * 4
    assert checkpointed_jobs(demo, "20261129T0000") == first_jobs

    second = run_demo(demo)
    assert "interval 1: 0 new jobs (all 4 partitions were finished checkpoints)" in second, second[-3000:]
    assert "interval 2: 2026-11-30  (data interval 20261130T0000, new)" in second, second[-3000:]
    assert "rows in / rows scored    600 / 600  (each row exactly once)" in second, second[-3000:]
    assert "preemptions seen         1" in second and "resubmissions            1" in second, second[-3000:]
    # The emulator's own records agree: no job of this run reads interval 1's input, none reuses a name.
    jobs = emulator_jobs(demo)
    assert list(jobs) == ["20261130T0000"], jobs.keys()
    second_jobs = {j["name"] for j in jobs["20261130T0000"]}
    assert len(second_jobs) == 5 and not second_jobs & first_jobs, (first_jobs, second_jobs)
    assert sorted(j["properties"]["status"] for j in jobs["20261130T0000"]) == ["Canceled"] + ["Completed"] * 4
    assert checkpointed_jobs(demo, "20261130T0000") == second_jobs
    # The re-run left interval 1's checkpoints as they were.
    assert checkpointed_jobs(demo, "20261129T0000") == first_jobs
