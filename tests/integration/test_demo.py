"""``make demo`` as a new user runs it: the example DAG against the emulator, with a preemption mid-run."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_demo_scores_every_row_once_and_logs_no_error(tmp_path: Path) -> None:
    env = {**os.environ, "AZUREML_DEMO_DIR": str(tmp_path / "demo")}
    for key in [k for k in env if k.startswith("AIRFLOW")]:  # the demo sets up its own Airflow home
        del env[key]
    result = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "demo.py")],
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    out = result.stdout + result.stderr
    log = tmp_path / "demo" / "dags-test.log"
    errors = [line for line in log.read_text(errors="replace").splitlines() if "[error" in line] if log.exists() else []
    assert errors == [], out[-3000:]
    assert result.returncode == 0, out[-3000:]
    assert "each row exactly once" in out and "errors logged            0" in out, out[-3000:]
