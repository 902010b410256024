"""An Airflow home of the benchmark's own when the shell sets none.

Imported, Airflow makes ``~/airflow`` (and ``~/airflow/logs``) in the user's home unless ``AIRFLOW_HOME`` names
another folder; a benchmark should leave nothing behind.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile


def use_a_scratch_airflow_home() -> None:
    """Point ``AIRFLOW_HOME`` at a temporary folder, removed at exit, unless it is already set."""
    if os.environ.get("AIRFLOW_HOME"):
        return
    home = tempfile.mkdtemp(prefix="benchmark-airflow-home-")
    os.environ["AIRFLOW_HOME"] = home
    atexit.register(shutil.rmtree, home, True)
