"""Scoring processes forked from the emulator's warm template (emulator.scoring.forks), as MLflow models' are.

The template here preloads only ``json`` (an MLflow one takes seconds): what is checked is the process
each job gets, which must behave as the process ``ScriptScorer`` starts without a template.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from airflow_azureml.emulator.scoring import forks
from airflow_azureml.emulator.scoring.script import _KEPT_ENV, ScoringScriptError, ScriptScorer

pytestmark = pytest.mark.skipif(not forks.supported(), reason="the fork server needs Linux")

SCRIPT = """
import json as shared
import os
import sys
import time


def init():
    global before
    if os.environ.get("FAIL_INIT"):
        raise ValueError("no model here")
    before = getattr(shared, "_marker", None)  # what an earlier job left in a module the template imported
    shared._marker = os.getpid()
    print("init in", os.getpid(), file=sys.stderr)


def run(mini_batch):
    if "crash" in mini_batch:
        os._exit(42)
    if "slow" in mini_batch:
        time.sleep(30)
    print("scoring", mini_batch)  # a print goes to the user log, never into the protocol
    return [f"{os.getpid()},{os.getppid()},{before},{os.environ['AZUREML_MODEL_DIR']},{os.getcwd()}"]
"""


@pytest.fixture
def server() -> Iterator[forks.ForkServer]:
    fork_server = forks.ForkServer(forks.server_env(_KEPT_ENV), preload=("json",))
    yield fork_server
    fork_server.close()


@pytest.fixture
def code(tmp_path: Path) -> Path:
    (tmp_path / "code").mkdir()
    (tmp_path / "code" / "score.py").write_text(SCRIPT)
    return tmp_path / "code"


def scorer(code: Path, tmp_path: Path, server: forks.ForkServer | None, job: str, timeout: float = 20) -> ScriptScorer:
    return ScriptScorer(
        code, "score.py", model_dir=tmp_path / "model", work_dir=tmp_path / job, timeout=timeout, forks=server
    )


def gone(pid: int, seconds: float = 5) -> bool:
    deadline = time.monotonic() + seconds
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    return not Path(f"/proc/{pid}").exists()


def test_each_job_gets_a_fresh_child_of_the_template(server: forks.ForkServer, code: Path, tmp_path: Path) -> None:
    answers = []
    for job in ("job-1", "job-2"):
        script = scorer(code, tmp_path, server, job)
        script.start()
        assert isinstance(script._process, forks.ForkedProcess)
        answers.append(script.run(["a.csv"])[0].split(","))
        script.close()
        log = (tmp_path / job / "user_logs" / "std_log.txt").read_text()
        assert "init in" in log and "scoring ['a.csv']" in log
    (pid1, parent1, before1, model1, cwd1), (pid2, parent2, before2, _, cwd2) = answers
    assert pid1 != pid2 and parent1 == parent2 == str(server._process.pid)  # forked by the one template
    assert before1 == before2 == "None"  # nothing of the first job's init() reached the second
    assert model1 == str(tmp_path / "model") and cwd1 == str(tmp_path / "job-1") and cwd2 == str(tmp_path / "job-2")
    assert gone(int(pid1)) and gone(int(pid2))


def test_a_crash_fails_the_mini_batch_and_the_next_one_gets_a_new_process(
    server: forks.ForkServer, code: Path, tmp_path: Path
) -> None:
    script = scorer(code, tmp_path, server, "job")
    script.start()
    with pytest.raises(ScoringScriptError, match="exited with status code 42"):
        script.run(["crash"])
    assert script.run(["a.csv"]) and script.inits == 2
    script.close()


def test_a_timed_out_mini_batch_kills_its_process(server: forks.ForkServer, code: Path, tmp_path: Path) -> None:
    script = scorer(code, tmp_path, server, "job", timeout=1)
    script.start()
    pid = script._process.pid
    with pytest.raises(ScoringScriptError, match="TimeoutError"):
        script.run(["slow"])
    assert gone(pid)
    script.close()


def test_a_raising_init_is_the_jobs_failure(server: forks.ForkServer, code: Path, tmp_path: Path) -> None:
    (code / "score.py").write_text(SCRIPT.replace('os.environ.get("FAIL_INIT")', "True"))
    with pytest.raises(ScoringScriptError, match="init\\(\\) failed: ValueError: no model here"):
        scorer(code, tmp_path, server, "job").start()
    assert "no model here" in (tmp_path / "job" / "user_logs" / "std_log.txt").read_text()  # its traceback


def test_closing_the_template_ends_the_processes_left(code: Path, tmp_path: Path) -> None:
    server = forks.ForkServer(forks.server_env(_KEPT_ENV), preload=("json",))
    script = scorer(code, tmp_path, server, "job")
    script.start()
    child, template = script._process.pid, server._process.pid
    server.close()
    assert gone(child) and gone(template)
    script.close()


def test_without_a_template_a_job_gets_a_process_of_its_own(
    code: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(forks, "_SERVER", tmp_path / "missing.py")  # the template cannot start
    server = forks.ForkServer(forks.server_env(_KEPT_ENV), preload=("json",))
    script = scorer(code, tmp_path, server, "job")
    script.start()
    assert not isinstance(script._process, forks.ForkedProcess)
    _, parent = script.run(["a.csv"])[0].split(",")[:2]
    assert parent == str(os.getpid())
    script.close()
    server.close()
