"""Runs a deployment's own scoring script in its own process: ``init()`` once, then ``run(mini_batch)`` per request.

Started by ``emulator.scoring.script.ScriptScorer`` as ``python -I _script_host.py <code folder> <script>``.
It imports nothing of the emulator, so user code cannot reach the emulator's state. Protocol: one JSON
object per line on the original stdout (the script's own prints go to stderr, the job's user log);
requests ``{"mini_batch": [paths]}`` on stdin.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import traceback
from typing import Any


def _render(result: Any) -> list[str]:
    """What ``append_row`` writes for one mini-batch: one line per element (DataFrame: per row, no header)."""
    if hasattr(result, "to_csv") and hasattr(result, "columns"):  # a pandas DataFrame: rows, no header
        text = result.to_csv(sep=" ", header=False, index=False)
        return [line for line in text.splitlines() if line != ""]
    if isinstance(result, (list, tuple)):
        return [item if isinstance(item, str) else str(item) for item in result]
    raise TypeError(f"run() returned {type(result).__name__}; it must return a list or a pandas DataFrame")


def _error(exc: BaseException) -> str:
    frames = traceback.format_exception(type(exc), exc, exc.__traceback__)
    print("".join(frames), file=sys.stderr, flush=True)
    return f"{type(exc).__name__}: {exc}"


def main() -> None:
    channel = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)  # the script's prints (and its libraries') go to the user log, never into the protocol
    sys.stdout = sys.stderr
    code_dir, script = sys.argv[1], sys.argv[2]

    def send(message: dict[str, Any]) -> None:
        channel.write(json.dumps(message) + "\n")
        channel.flush()

    try:
        sys.path.insert(0, code_dir)
        spec = importlib.util.spec_from_file_location(os.path.splitext(os.path.basename(script))[0], script)
        if spec is None or spec.loader is None:
            raise ImportError(f"cannot import the scoring script {os.path.basename(script)!r}")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        if not callable(getattr(module, "run", None)):
            raise AttributeError(f"the scoring script {os.path.basename(script)!r} has no run(mini_batch)")
        if callable(getattr(module, "init", None)):
            module.init()
    except BaseException as exc:  # everything the script does is reported, never raised here
        send({"ok": False, "error": _error(exc)})
        return
    send({"ok": True})
    for line in sys.stdin:
        request = json.loads(line)
        try:
            rows = _render(module.run(list(request["mini_batch"])))
        except BaseException as exc:  # a raising run() fails its mini-batch, not the host
            send({"ok": False, "error": _error(exc)})
            continue
        send({"ok": True, "rows": rows})


if __name__ == "__main__":
    main()
