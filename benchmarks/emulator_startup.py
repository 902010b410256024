"""Emulator start-up time (target: under 2 s), in-process and as ``python -m airflow_azureml.emulator``.

Prints the median of several starts. The in-process figure includes generating the TLS
certificate (cold) or reusing it (warm); the CLI figure is the wall time until
``emulator.json`` exists, i.e. what a user waits for, Python start-up included.

    python benchmarks/emulator_startup.py [--runs 5]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def in_process(cold: bool, base: Path) -> float:
    from airflow_azureml.emulator import Emulator

    data = base / ("cold" if cold else "warm")
    if cold:
        shutil.rmtree(data, ignore_errors=True)
    started = time.perf_counter()
    emulator = Emulator(data).start()
    elapsed = time.perf_counter() - started
    emulator.stop()
    return elapsed


def cli(base: Path) -> float:
    data = base / "cli"
    shutil.rmtree(data, ignore_errors=True)
    started = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, "-m", "airflow_azureml.emulator", "--data-dir", str(data)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        while not (data / "emulator.json").exists():
            if proc.poll() is not None:
                raise SystemExit("emulator exited")
            time.sleep(0.01)
        return time.perf_counter() - started
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    base = Path(tempfile.mkdtemp(prefix="emulator-startup-"))
    in_process(True, base)  # import cost paid once, as a long-lived test process would
    cold = [in_process(True, base) for _ in range(args.runs)]
    warm = [in_process(False, base) for _ in range(args.runs)]
    cold_cli = [cli(base) for _ in range(args.runs)]
    shutil.rmtree(base, ignore_errors=True)
    print(f"{'start-up (median of ' + str(args.runs) + ')':<44}{'seconds':>10}")
    print(f"{'in-process, new certificate':<44}{statistics.median(cold):>10.3f}")
    print(f"{'in-process, existing certificate':<44}{statistics.median(warm):>10.3f}")
    print(f"{'python -m airflow_azureml.emulator (cold)':<44}{statistics.median(cold_cli):>10.3f}")
    print(f"target: under 2 s; CLI / in-process warm = x{statistics.median(cold_cli) / statistics.median(warm):.1f}")


if __name__ == "__main__":
    main()
