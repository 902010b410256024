"""A deployment's own scoring script, run from its uploaded code folder in a child process.

One process per batch job: ``init()`` once when the job's first node is ready, then ``run(mini_batch)``
for every mini-batch (a list of the mini-batch's file paths), as the Azure docs for batch scoring
scripts describe. The process is the isolation: the script cannot touch the emulator's memory, and an
exception, an ``exit()`` or a crash in ``run()`` fails that mini-batch only, which then goes through the
emulator's retries and ``error_threshold`` as any failed mini-batch does. A crashed or timed-out process
is started again (``init()`` again) for the next mini-batch, as a worker would be. The environment is
not built: the script runs on the emulator's own Python, with a minimal environment (no secrets of the
emulator's process) plus ``AZUREML_MODEL_DIR``. It is not a sandbox: the script runs as the emulator's
user, so it can read and write the emulator's files (its data folder holds the test client secret and
the blob store). The emulator runs the project's own scripts, not untrusted code.
"""

from __future__ import annotations

import json
import os
import selectors
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO, Any

from airflow_azureml.emulator.scoring import forks
from airflow_azureml.emulator.scoring.forks import ForkServer, ForkServerError

_HOST = Path(__file__).with_name("_script_host.py")
_KEPT_ENV = ("PATH", "LANG", "LC_ALL", "TZ", "SYSTEMROOT", "TMPDIR", "TEMP", "TMP")


def new_fork_server() -> ForkServer | None:
    """A template for scoring processes, with the environment a job's process starts from; None where fork
    is not available (a process per job then)."""
    return ForkServer(forks.server_env(_KEPT_ENV)) if forks.supported() else None


class ScoringScriptError(RuntimeError):
    """The script's init() or run() raised, or its process died."""


class ScriptScorer:
    """``run(mini_batch) -> list[str]`` backed by the script's process; ``close()`` when the job ends."""

    def __init__(
        self,
        code_dir: Path,
        script: str,
        *,
        model_dir: Path,
        work_dir: Path,
        timeout: float,
        forks: ForkServer | None = None,
    ) -> None:
        self.code_dir = code_dir
        self.script = code_dir / script
        self.model_dir = model_dir
        self.work_dir = work_dir
        self.timeout = timeout
        self.inits = 0  # how often init() ran (a new process after a crash or timeout runs it again)
        self.forks = forks  # a warm template to fork the process from (emulator.scoring.forks), if any
        self._process: Any = None  # a subprocess.Popen, or a forks.ForkedProcess
        self._log: IO[str] | None = None
        self._lock = threading.Lock()

    def start(self) -> None:
        """Start the process and run ``init()``; its failure is the job's (raised as ScoringScriptError)."""
        with self._lock:
            self._start()

    def _start(self) -> None:
        if not self.script.is_file():
            raise ScoringScriptError(f"FileNotFoundError: the scoring script {self.script.name!r} is not in the code")
        self.work_dir.mkdir(parents=True, exist_ok=True)
        (self.work_dir / "user_logs").mkdir(exist_ok=True)
        if self._log is None:
            self._log = (self.work_dir / "user_logs" / "std_log.txt").open("a", encoding="utf-8")
        env = {k: os.environ[k] for k in _KEPT_ENV if k in os.environ}
        env.update({"AZUREML_MODEL_DIR": str(self.model_dir), "PYTHONDONTWRITEBYTECODE": "1"})
        # MLflow (an MLflow model, or a script that loads one) would otherwise send usage telemetry over the
        # network and write an installation id under the user's home: a local emulator does neither
        env.update({"MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "true"})
        self._process = None
        if self.forks is not None:
            try:
                self._process = self.forks.start(
                    code_dir=self.code_dir, script=self.script, cwd=self.work_dir, env=env, log=self._log
                )
            except ForkServerError:
                self._process = None  # no template: a process of its own, as without one
        if self._process is None:
            self._process = subprocess.Popen(
                [sys.executable, "-I", str(_HOST), str(self.code_dir), str(self.script)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self._log,
                cwd=self.work_dir,
                env=env,
                text=True,
            )
        self.inits += 1
        answer = self._read(self.timeout)
        if not answer.get("ok"):
            self._stop()
            raise ScoringScriptError(f"init() failed: {answer.get('error')}")

    def run(self, mini_batch: list[str]) -> list[str]:
        with self._lock:
            if self._process is None or self._process.poll() is not None:
                self._start()
            assert self._process is not None and self._process.stdin is not None
            try:
                self._process.stdin.write(json.dumps({"mini_batch": list(mini_batch)}) + "\n")
                self._process.stdin.flush()
            except (BrokenPipeError, OSError):
                self._stop()
                raise ScoringScriptError("the scoring process exited") from None
            answer = self._read(self.timeout)
        if not answer.get("ok"):
            raise ScoringScriptError(str(answer.get("error")))
        return [str(row) for row in answer.get("rows") or []]

    def _read(self, timeout: float) -> dict[str, Any]:
        """The process's next answer; its death or silence past ``timeout`` ends it (raised)."""
        process = self._process
        assert process is not None and process.stdout is not None
        # a selector, not select.select(): that refuses a descriptor above 1023 ("filedescriptor out of
        # range in select()"), which a long-lived process running many emulators reaches
        with selectors.DefaultSelector() as selector:
            selector.register(process.stdout, selectors.EVENT_READ)
            ready = selector.select(timeout)
        if not ready:
            self._stop()
            raise ScoringScriptError(f"TimeoutError: the mini-batch took longer than {timeout:g} s")
        line = process.stdout.readline()
        if not line:
            code = process.wait()
            self._process = None
            raise ScoringScriptError(f"the scoring process exited with status code {code}")
        return dict(json.loads(line))

    def _stop(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        if process.poll() is None:
            process.kill()
        process.wait()
        for pipe in (process.stdin, process.stdout):
            if pipe is not None:
                pipe.close()

    def close(self) -> None:
        process = self._process
        if process is not None and process.poll() is None and process.stdin is not None:
            try:
                process.stdin.close()  # the host's loop ends: a normal exit
                process.wait(timeout=1)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self._stop()
        if self._log is not None:
            self._log.close()
            self._log = None
