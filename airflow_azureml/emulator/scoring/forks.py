"""Scoring processes forked from a warm template, so that a job with an MLflow model does not pay Python's
start and MLflow's import (seconds, ~200 MB) each time.

Azure starts a scoring process per node and it imports the model's stack there; the emulator runs every
job's scoring process on this machine, so it keeps a template process (``_fork_server.py``) that has
imported MLflow, scikit-learn and pandas, and forks a fresh child for each job's scoring process: one
template per workspace, or one that several emulators share (``Emulator(fork_server=...)``, as the test
suite does). The child is what ``ScriptScorer`` would otherwise start with ``subprocess``: its own
process, with the job's environment, working folder and user log, running ``_script_host.py``, whose
``init()`` (loading the model) runs in it as before. Nothing of one job's state reaches another: each
child starts from the template, which never runs a job. Linux only (``SOCK_SEQPACKET`` and ``fork``);
elsewhere ``ScriptScorer`` starts a process per job, as before.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO, Any

_SERVER = Path(__file__).with_name("_fork_server.py")
# What a job with an MLflow model imports: MLflow's pyfunc loader and the sklearn flavour (the example's model,
# its custom script), pandas (the inputs), and the parts of scikit-learn a pickled pipeline names.
PRELOAD = (
    "pandas",
    "mlflow.pyfunc",
    "mlflow.sklearn",
    "mlflow.models",
    "sklearn.pipeline",
    "sklearn.compose",
    "sklearn.preprocessing",
    "sklearn.linear_model",
    # mlflow.pyfunc.load_model compares the model's requirements with what is installed, and maps every
    # installed distribution to its modules for that once per process (~0.5 s, seconds on a busy machine):
    # done in the template, each child starts with the map (the installation is the same). A private
    # function: if it goes away in another MLflow, the children build the map themselves, as before.
    "mlflow.utils.requirements_utils:_init_packages_to_modules_map",
)
READY_TIMEOUT = 300.0


def supported() -> bool:
    return sys.platform.startswith("linux") and hasattr(os, "fork") and hasattr(socket, "SOCK_SEQPACKET")


class ForkServerError(RuntimeError):
    pass


class ForkServer:
    """The emulator's end of one template process; thread-safe. ``close()`` stops it and its children."""

    def __init__(self, env: dict[str, str], preload: tuple[str, ...] = PRELOAD) -> None:
        self._env = env
        self._preload = preload
        self._lock = threading.Lock()
        self._cond = threading.Condition()
        self._process: subprocess.Popen[bytes] | None = None
        self._channel: socket.socket | None = None
        self._started: dict[int, int] = {}  # request id -> pid
        self._exits: dict[int, int] = {}  # pid -> exit code
        self._next_id = 0
        self._closed = False
        self.preloaded: list[str] = []

    # ------------------------------------------------------------------ the template
    def _ensure(self) -> socket.socket:
        """The running template (started on first use: an emulator that runs no MLflow job never starts it)."""
        if self._closed:
            raise ForkServerError("the emulator's fork server is closed")
        if self._channel is not None and self._process is not None and self._process.poll() is None:
            return self._channel
        self._stop_process()
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._process = subprocess.Popen(
                [sys.executable, "-I", str(_SERVER), str(theirs.fileno()), *self._preload],
                pass_fds=[theirs.fileno()],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                env=self._env,
                cwd="/",
            )
        finally:
            theirs.close()
        mine.settimeout(READY_TIMEOUT)
        try:
            ready = json.loads(mine.recv(1 << 16) or b"{}")
        except (OSError, ValueError):
            ready = {}
        if "ready" not in ready:
            mine.close()
            self._stop_process()
            raise ForkServerError("the scoring template process did not start")
        self.preloaded = list(ready["ready"])
        mine.settimeout(None)
        self._channel = mine
        threading.Thread(target=self._listen, args=(mine,), name="azureml-emulator-forks", daemon=True).start()
        return mine

    def _listen(self, channel: socket.socket) -> None:
        while True:
            try:
                data = channel.recv(1 << 16)
            except OSError:
                data = b""
            with self._cond:
                if not data:
                    if self._channel is channel:
                        self._channel = None
                    self._cond.notify_all()
                    return
                message = json.loads(data)
                if "started" in message:
                    self._started[int(message["id"])] = int(message["started"])
                elif "exited" in message:
                    self._exits[int(message["exited"])] = int(message["code"])
                self._cond.notify_all()

    def start(self, *, code_dir: Path, script: Path, cwd: Path, env: dict[str, str], log: IO[str]) -> ForkedProcess:
        """A new scoring process for ``script`` (as ``python -I _script_host.py <code_dir> <script>``)."""
        stdin_r, stdin_w = os.pipe()
        stdout_r, stdout_w = os.pipe()
        try:
            with self._lock:
                channel = self._ensure()
                self._next_id += 1
                request_id = self._next_id
                request = {
                    "id": request_id,
                    "cwd": str(cwd),
                    "env": env,
                    "code_dir": str(code_dir),
                    "script": str(script),
                }
                socket.send_fds(channel, [json.dumps(request).encode()], [stdin_r, stdout_w, log.fileno()])
            with self._cond:
                if not self._cond.wait_for(lambda: request_id in self._started or self._channel is None, 60):
                    raise ForkServerError("the scoring template process did not answer")
                if request_id not in self._started:
                    raise ForkServerError("the scoring template process exited")
                pid = self._started.pop(request_id)
        except BaseException:
            for fd in (stdin_w, stdout_r):
                os.close(fd)
            raise
        finally:
            os.close(stdin_r)
            os.close(stdout_w)
        stdin, stdout = os.fdopen(stdin_w, "w", encoding="utf-8"), os.fdopen(stdout_r, encoding="utf-8")
        return ForkedProcess(self, pid, stdin, stdout)

    def exit_code(self, pid: int, timeout: float | None) -> int | None:
        with self._cond:
            self._cond.wait_for(lambda: pid in self._exits or self._channel is None, timeout)
            if pid in self._exits:  # taken once (ForkedProcess keeps it): a long-lived template sees pids reused
                return self._exits.pop(pid)
            return None if self._channel is not None else -9

    def kill(self, pid: int) -> None:
        with self._lock:
            channel = self._channel
            if channel is not None:
                with contextlib.suppress(OSError):
                    channel.send(json.dumps({"kill": pid}).encode())

    def _stop_process(self) -> None:
        process, self._process = self._process, None
        if process is not None:
            if process.poll() is None:
                process.kill()
            process.wait()

    def close(self) -> None:
        """Stop the template; it kills the children left (each job's scorer closes its own before)."""
        with self._lock:
            self._closed = True
            channel, self._channel = self._channel, None
            if channel is not None:
                with contextlib.suppress(OSError):
                    channel.shutdown(socket.SHUT_RDWR)
                channel.close()
            process = self._process
            if process is not None:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(timeout=5)
            self._stop_process()
        with self._cond:
            self._cond.notify_all()


class ForkedProcess:
    """A forked scoring process, with the part of ``subprocess.Popen`` that ``ScriptScorer`` uses."""

    def __init__(self, server: ForkServer, pid: int, stdin: IO[str], stdout: IO[str]) -> None:
        self.server = server
        self.pid = pid
        self.stdin: IO[str] | None = stdin
        self.stdout: IO[str] | None = stdout
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.server.exit_code(self.pid, 0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.returncode = self.server.exit_code(self.pid, timeout)
        if self.returncode is None:
            raise subprocess.TimeoutExpired(f"scoring process {self.pid}", timeout or 0)
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:
            self.server.kill(self.pid)


def server_env(kept: tuple[str, ...]) -> dict[str, Any]:
    env = {k: os.environ[k] for k in kept if k in os.environ}
    env.update({"PYTHONDONTWRITEBYTECODE": "1", "MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "true"})
    return env
