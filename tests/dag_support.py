"""Shared by the test DAG files: record why a task failed, so tests can assert on typed errors."""

from __future__ import annotations

import json
import os
from typing import Any


def record_failure(context: dict[str, Any]) -> None:
    path = os.environ.get("AZUREML_TEST_FAILURES")
    if path:
        exc = context.get("exception")
        with open(path, "a") as handle:
            handle.write(json.dumps({"task": context["ti"].task_id, "type": type(exc).__name__, "message": str(exc)}))
            handle.write("\n")
