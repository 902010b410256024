"""What parsing an example DAG costs over ``import airflow.sdk`` alone (target: CPU x1.03, +5 MiB).

Each run is a fresh ``python -c`` child with the same environment (a temporary
``AIRFLOW_HOME``, removed afterwards) and the same ``sys.path`` (``dags/`` first, as the DAG
processor has it). Runs alternate, baseline, control (a DAG of the same shape with Airflow alone,
not a target), then the DAG, so drift on this shared machine falls on all three alike. Per run,
the child's CPU time (user + sys) and peak RSS are read from ``os.wait4``; printed: the median CPU
of each side, the median of the per-run ratios, and the peak RSS delta. The DAG child also
reports whether ``azure.ai.ml`` (and other modules only needed when a task runs) got imported;
``azure.ai.ml`` must not be.

Bytecode: an installed provider has its ``.pyc`` files, so by default the children share a
bytecode cache in the temporary directory (``PYTHONPYCACHEPREFIX``, filled by a warm-up pair)
even where ``PYTHONDONTWRITEBYTECODE`` is set, as on this project's machines. ``--as-is`` keeps
the caller's setting instead; with no cache, each child compiles every source it imports.

    python benchmarks/dag_parse.py [--pairs 15] [--dag low_priority_batch_scoring ...] [--as-is]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

DAGS = Path(__file__).resolve().parent.parent / "dags"
DEFAULT_DAGS = ("low_priority_batch_scoring", "kubernetes_instance_type_scoring")
# Needed only when a task runs or a trigger waits; reported when a DAG parse imports them.
EXECUTE_TIME = ("azure.ai.ml", "azure.identity", "azure.core", "aiohttp", "kubernetes", "airflow.triggers.base")
TARGET_RATIO = 1.03
TARGET_MIB = 5.0

PRELUDE = f"import sys\nsys.path.insert(0, {str(DAGS)!r})\n"
BASELINE = PRELUDE + "import airflow.sdk\n"
# A control, not a target: a DAG of the same shape with Airflow alone (the same airflow.sdk names, a
# daily schedule, params, a mapped @task and a classic operator), so the figures tell Airflow's own
# DAG-building cost (its lazily loaded definitions, the timetable) apart from the provider's.
CONTROL = PRELUDE + (
    "import pendulum\n"
    "from airflow.sdk import DAG, BaseOperator, Param, task\n"
    "with DAG('control', schedule='@daily', start_date=pendulum.datetime(2026, 11, 1, tz='UTC'),\n"
    "         params={'partitions': Param(4, type='integer', minimum=1)}, catchup=False):\n"
    "    @task\n"
    "    def plan(n: int) -> list[int]:\n"
    "        return list(range(n))\n"
    "    @task\n"
    "    def score(part: int) -> int:\n"
    "        return part\n"
    "    BaseOperator(task_id='setup') >> score.expand(part=plan(4))\n"
)


def dag_code(module: str) -> str:
    return (
        PRELUDE
        + f"import {module}\n"
        + f"late = [m for m in {EXECUTE_TIME!r} if m in sys.modules]\n"
        + "print('LATE=' + ','.join(late))\n"
        + "import airflow_azureml\n"
        + "print('PROVIDER=' + airflow_azureml.__path__[0])\n"
    )


@dataclass
class Run:
    cpu_ms: float
    maxrss_mib: float
    stdout: str


def run(code: str, env: dict[str, str]) -> Run:
    """One child process; its own rusage (not the sum over children) from ``wait4``."""
    proc = subprocess.Popen(
        [sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    stdout, stderr = proc.stdout.read(), proc.stderr.read()  # type: ignore[union-attr]
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"child failed ({proc.returncode}):\n{stderr[-3000:]}")
    return Run((usage.ru_utime + usage.ru_stime) * 1000, usage.ru_maxrss / 1024, stdout)  # ru_maxrss: KiB


def measure(module: str, pairs: int, env: dict[str, str]) -> tuple[list[Run], list[Run], list[Run]]:
    """Alternating baseline, control, DAG: drift on a shared machine falls on all three alike."""
    run(BASELINE, env), run(CONTROL, env), run(dag_code(module), env)  # warm-up: page cache, .pyc, airflow.cfg
    baseline: list[Run] = []
    control: list[Run] = []
    dag: list[Run] = []
    for _ in range(pairs):
        baseline.append(run(BASELINE, env))
        control.append(run(CONTROL, env))
        dag.append(run(dag_code(module), env))
    return baseline, control, dag


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pairs", type=int, default=15)
    parser.add_argument("--dag", nargs="+", default=list(DEFAULT_DAGS), help="module names under dags/")
    parser.add_argument("--as-is", action="store_true", help="no shared bytecode cache: the caller's setting")
    args = parser.parse_args()
    missed = False
    with tempfile.TemporaryDirectory(prefix="dag-parse-") as home:
        env = {**os.environ, "AIRFLOW_HOME": home}
        if not args.as_is:
            env.pop("PYTHONDONTWRITEBYTECODE", None)
            env["PYTHONPYCACHEPREFIX"] = str(Path(home) / "pycache")
        header = f"{'DAG (median of ' + str(args.pairs) + ' triples)':<36}{'base ms':>9}{'DAG ms':>9}{'+ms':>7}"
        header += f"{'ratio':>8}{'base MiB':>10}{'DAG MiB':>9}{'+MiB':>7}"
        lines = []
        controls: list[float] = []  # control / baseline, per DAG's run
        over_control: list[float] = []  # DAG / control: what the provider and the DAG's own code add
        for module in args.dag:
            baseline, control, dag = measure(module, args.pairs, env)
            controls.append(statistics.median(d.cpu_ms / b.cpu_ms for b, d in zip(baseline, control, strict=True)))
            over_control.append(statistics.median(d.cpu_ms / c.cpu_ms for c, d in zip(control, dag, strict=True)))
            base_ms = statistics.median(r.cpu_ms for r in baseline)
            dag_ms = statistics.median(r.cpu_ms for r in dag)
            ratio = statistics.median(d.cpu_ms / b.cpu_ms for b, d in zip(baseline, dag, strict=True))
            base_mib = statistics.median(r.maxrss_mib for r in baseline)
            dag_mib = statistics.median(r.maxrss_mib for r in dag)
            late = dag[-1].stdout.split("LATE=", 1)[1].split("\n", 1)[0].strip()
            provider = dag[-1].stdout.split("PROVIDER=", 1)[1].strip()
            lines.append((module, base_ms, dag_ms, ratio, base_mib, dag_mib, [m for m in late.split(",") if m]))
    mode = "caller's setting (--as-is)" if args.as_is else "cached in the temporary directory"
    print(f"python {sys.version.split()[0]}; bytecode: {mode}; provider: {provider}")
    print(header)
    print("-" * len(header))
    for module, base_ms, dag_ms, ratio, base_mib, dag_mib, _late in lines:
        print(
            f"{module:<36}{base_ms:>9.0f}{dag_ms:>9.0f}{dag_ms - base_ms:>7.0f}"
            f"x{ratio:>7.3f}{base_mib:>10.1f}{dag_mib:>9.1f}{dag_mib - base_mib:>7.1f}"
        )
    print("-" * len(header))
    for module, _base_ms, _dag_ms, ratio, base_mib, dag_mib, late in lines:
        cpu_ok = ratio <= TARGET_RATIO
        mem_ok = dag_mib - base_mib <= TARGET_MIB
        missed |= not (cpu_ok and mem_ok)
        print(
            f"{module}: CPU x{ratio:.4f} (target <= x{TARGET_RATIO}) {'OK' if cpu_ok else 'MISS'}; "
            f"peak RSS {dag_mib - base_mib:+.1f} MiB (target <= +{TARGET_MIB:.0f}) {'OK' if mem_ok else 'MISS'}"
        )
        print(f"  imported by the parse, needed only at run time: {', '.join(late) or 'none'}")
        assert "azure.ai.ml" not in late, f"parsing {module} imported azure.ai.ml"
        print("  azure.ai.ml in sys.modules after the parse: no")
    for module, control_ratio, dag_over_control in zip(args.dag, controls, over_control, strict=True):
        print(
            f"control (Airflow alone, a DAG of the same shape) x{control_ratio:.4f} over the baseline; "
            f"{module} x{dag_over_control:.4f} over the control"
        )
    print("all targets met" if not missed else "some targets missed (shared machine: rerun before concluding)")


if __name__ == "__main__":
    main()
