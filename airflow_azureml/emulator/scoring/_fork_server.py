"""A warm template for scoring processes: imports MLflow's stack once, then forks a fresh child per job.

Started by ``emulator.scoring.forks.ForkServer`` as ``python -I _fork_server.py <socket fd> <module>...``.
It imports the named modules (those missing are skipped; ``module:function`` also calls the function, a
warm-up), then waits on its socket (a ``SOCK_SEQPACKET``
pair, one JSON message a packet). A ``start`` request carries three file descriptors (the job's stdin
pipe, its stdout pipe, its user log) and the job's working folder, environment, code folder and script:
the server forks, and the child, with those descriptors as its 0, 1 and 2, that folder and that
environment, runs ``_script_host.main()`` exactly as a process started for the job would, and exits. A
child is a fresh copy of the template: nothing of one job's ``init()`` or ``run()`` reaches another job.

Answers: ``{"ready": [...]}`` once imported, ``{"started": <pid>, "id": ...}`` per start,
``{"exited": <pid>, "code": <exit code>}`` when a child ends (reaped here), and ``{"kill": pid}`` kills a
child of this server (only its own, so a reused pid is never hit). The emulator closing its end stops the
server, which kills the children left. It imports nothing of the emulator.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import importlib.util
import json
import os
import select
import signal
import socket
import sys
import traceback
from pathlib import Path
from typing import Any

_HOST = Path(__file__).with_name("_script_host.py")


def _load_host() -> Any:
    spec = importlib.util.spec_from_file_location("_script_host", _HOST)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _child(request: dict[str, Any], fds: list[int], channel: socket.socket, host: Any) -> None:
    """In the forked child: become the job's scoring process; never returns."""
    code = 1
    try:
        channel.close()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        for fd in fds:
            if fd > 2:
                os.close(fd)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        sys.stdin = open(0, encoding="utf-8", closefd=False)  # noqa: SIM115 - fds 0-2 stay open until exit
        sys.stdout = open(1, "w", encoding="utf-8", closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", encoding="utf-8", errors="backslashreplace", buffering=1, closefd=False)  # noqa: SIM115
        sys.argv = [str(_HOST), request["code_dir"], request["script"]]
        gc.unfreeze()
        host.main()
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)


def main() -> None:
    channel = socket.socket(fileno=int(sys.argv[1]))
    loaded = []
    for name in sys.argv[2:]:
        module_name, _, function = name.partition(":")
        try:
            module = importlib.import_module(module_name)
            if function:  # a warm-up call: a cache every child would otherwise fill again
                getattr(module, function)()
        except Exception:  # not installed here: a job that needs it imports it (and fails) itself
            continue
        loaded.append(name)
    host = _load_host()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the emulator's Ctrl-C is its own: it closes the socket
    children: set[int] = set()

    def send(message: dict[str, Any]) -> None:
        channel.send(json.dumps(message).encode())

    send({"ready": loaded})
    gc.collect()
    gc.freeze()  # the template's objects stay out of the children's collections: fewer pages copied
    while True:
        readable, _, _ = select.select([channel], [], [], 0.05)
        while children:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            children.discard(pid)
            send({"exited": pid, "code": os.waitstatus_to_exitcode(status)})
        if not readable:
            continue
        data, fds, _, _ = socket.recv_fds(channel, 1 << 20, 3)
        if not data:
            break  # the emulator has gone
        request = json.loads(data)
        if "kill" in request:
            if request["kill"] in children:
                os.kill(request["kill"], signal.SIGKILL)
            continue
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _child(request, fds, channel, host)
        for fd in fds:
            os.close(fd)
        children.add(pid)
        send({"started": pid, "id": request["id"]})
    for pid in children:
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except OSError:
            pass


if __name__ == "__main__":
    main()
