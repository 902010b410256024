"""Test harness: an isolated Airflow home, a real metadata DB, and a fresh emulator per test.

Airflow reads its configuration from the environment at import time, so ``pytest_configure``
sets it before any test module imports ``airflow``. Everything the suite writes lives under
pytest's own temporary directory (``--basetemp``, by default ``/tmp/pytest-of-<user>/``), so a
run leaves nothing behind elsewhere; ``.ci/run`` checks that.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from airflow_azureml.emulator import Emulator, Timing

REPO = Path(__file__).resolve().parents[1]
_HOME = Path()  # set by pytest_configure, under pytest's temporary directory
DAGS_FOLDER = Path()


@pytest.hookimpl(trylast=True)  # after pytest's own tmpdir plugin has set up its temp path factory
def pytest_configure(config: pytest.Config) -> None:
    global _HOME, DAGS_FOLDER
    _HOME = config._tmp_path_factory.mktemp("airflow-home", numbered=False)  # type: ignore[attr-defined]
    DAGS_FOLDER = _HOME / "dags"
    DAGS_FOLDER.mkdir()
    os.environ.update(
        {
            "AIRFLOW_HOME": str(_HOME),
            "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS_FOLDER),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{_HOME / 'airflow.db'}",
            "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
            "AIRFLOW__OPERATORS__DEFAULT_DEFERRABLE": "False",
            # kubectl caches API discovery in ~/.kube/cache unless told otherwise
            "KUBECACHEDIR": str(_HOME / "kube-cache"),
            # MLflow (tests that load the example model) would report usage and write ~/.config/mlflow
            "MLFLOW_DISABLE_TELEMETRY": "true",
        }
    )
    # The example DAGs' retries start at 2 min (for Azure's throttling); a test's emulator answers at once.
    os.environ.setdefault("AZUREML_RETRY_DELAY_SECONDS", "1")
    for source in [*(REPO / "dags").glob("*.py"), *(REPO / "tests" / "dags").glob("*.py")]:
        shutil.copy(source, DAGS_FOLDER / source.name)
    shutil.copytree(REPO / "dags" / "azureml", DAGS_FOLDER / "azureml")
    shutil.copy(REPO / "dags" / ".airflowignore", DAGS_FOLDER / ".airflowignore")
    sys.path.insert(0, str(DAGS_FOLDER))  # as Airflow does for DAG files: shared modules next to them import
    keep_the_data_lake_library_out_of_home()


def keep_the_data_lake_library_out_of_home() -> None:
    """azure-datalake-store (the Microsoft Azure provider's Data Lake hook, which Airflow's ProvidersManager
    imports when it lists hooks) makes ``~/.config/azure-datalake-store`` at import. Imported first here with
    HOME in this session's Airflow home, it makes its folder there: a test leaves nothing in the user's home."""
    home = os.environ.get("HOME")
    os.environ["HOME"] = str(_HOME)
    try:
        with contextlib.suppress(ImportError):
            import azure.datalake.store.utils  # noqa: F401
    finally:
        if home is None:
            os.environ.pop("HOME", None)
        else:
            os.environ["HOME"] = home


# Tests that `make test-airflow-3.1` / `-3.2` leave out (marked `same_on_every_airflow`; `make test`, on 3.3,
# runs them): what each checks beyond the tests that do run on every version is not Airflow's code, so its
# outcome cannot differ between Airflow versions (docs/airflow_versions.md, "What runs on 3.1 and 3.2").
# tests/unit/test_version_scope.py holds each reason to the code.
EMULATOR_ONLY = (  # the emulator itself: airflow_azureml.emulator imports nothing of Airflow
    "tests/integration/test_conformance.py",
    "tests/integration/test_contract.py",
    "tests/integration/test_emulator_behaviour.py",
    "tests/integration/test_emulator_control.py",
    "tests/integration/test_emulator_billing.py",
    "tests/integration/test_emulator_garbage.py",
    "tests/integration/test_emulator_protocol.py",
    "tests/integration/test_emulator_refusals.py",
    "tests/integration/test_emulator_sdk.py",
    "tests/integration/test_spot_model.py",
    "tests/integration/test_storage_sas.py",
)
# More runs of the example DAG, whose run under each version's dag.test() is
# test_example_dag_survives_whole_cluster_preemption[canceled]: these vary the emulator's faults or the data,
# which the provider and the DAG's own code handle (no Airflow code differs between them), or run it through
# scripts/demo.py's `airflow dags test` on 3.3 only.
EXAMPLE_DAG_VARIANTS = (
    "tests/integration/test_demo.py",
    "tests/integration/test_example_dag.py::test_example_dag_survives_whole_cluster_preemption[failed]",
    "tests/integration/test_example_dag.py::test_etl_marker_is_not_sent_as_input",
    "tests/integration/test_example_dag.py::test_two_overlapping_runs_both_succeed",
    "tests/integration/test_example_dag.py::test_partition_with_failed_files_is_redone_not_skipped",
    "tests/integration/test_example_dag.py::test_a_changed_partition_count_does_not_repartition_a_scored_interval",
    "tests/integration/test_mlflow_model.py::test_example_dag_scores_every_row_once_with_the_mlflow_model",
)
SAME_ON_EVERY_AIRFLOW = EMULATOR_ONLY + EXAMPLE_DAG_VARIANTS


# Wall seconds of the slowest integration files in a `make test` run (per-test profile of 30b4819, 2026-12-06:
# docs/benchmarks.md, "Where make test's time goes"). pytest-xdist (--dist loadfile --no-loadscope-reorder) hands
# files to idle workers in collection order: the e2e files first (one a worker), then the long integration files,
# so that the short ones and the unit tests fill the workers' ends.
SLOW_FILES = {
    "test_exactly_once.py": 219,
    "test_verdict_ladder.py": 139,
    "test_spot_fallback.py": 134,
    "test_demo.py": 130,
    "test_example_dag.py": 127,
    "test_lost_responses.py": 126,
    "test_deferrable.py": 90,
    "test_emulator_behaviour.py": 87,
    "test_operators.py": 87,
    "test_capacity.py": 71,
    "test_openlineage.py": 60,
    "test_kubernetes_jobs.py": 52,
    "test_waits.py": 46,
    "test_verdict_model.py": 43,
    "test_emulator_protocol.py": 42,
    "test_assets.py": 37,
    "test_resources.py": 36,
    "test_cost_estimate.py": 36,
}


def run_order(item: pytest.Item) -> tuple[int, int]:
    """e2e, then integration longest first, then unit; a file's own tests keep their order (stable sort)."""
    path = item.nodeid.split("::")[0]
    tier = 0 if path.startswith("tests/e2e/") else 1 if path.startswith("tests/integration/") else 2
    return tier, -SLOW_FILES.get(path.rsplit("/", 1)[-1], 0)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    items.sort(key=run_order)
    for item in items:
        if any(item.nodeid == scope or item.nodeid.startswith(scope + "::") for scope in SAME_ON_EVERY_AIRFLOW):
            item.add_marker(pytest.mark.same_on_every_airflow)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    """The conformance test's coverage (test_conformance.py), which a pytest-xdist worker cannot print itself."""
    for report in terminalreporter.stats.get("passed", []) + terminalreporter.stats.get("failed", []):
        for key, value in getattr(report, "user_properties", []):
            if str(key).startswith("conformance") and report.when == "call":
                terminalreporter.write_line(value if key == "conformance" else f"{key}: {value}")


FAST = Timing(provisioning=0.02, node_startup=0.05, mini_batch=0.03, command_job=0.2, tick=0.01)


@pytest.fixture(scope="session")
def airflow_db() -> Path:
    """Create the metadata DB once per session (``dag.test()`` needs it)."""
    subprocess.run(
        [sys.executable, "-m", "airflow", "db", "migrate"],
        check=True,
        capture_output=True,
        env=os.environ.copy(),
    )
    reuse_the_in_process_execution_api()
    return _HOME


def reuse_the_in_process_execution_api() -> None:
    """On Airflow 3.1 and 3.2, build ``dag.test()``'s in-process Execution API once per process, as 3.3 does.

    Before apache/airflow#65235 (in 3.3) every task run built a new FastAPI app and Cadwyn initialised its
    versioned routes again: about 2.5 s of CPU a task here, 70 of a 3.2 example-DAG test's 95 s. The backport
    is that change: ``in_process_api_server`` cached, and a client built without a DAG drops the DAG bag a
    previous one set. What the app does with a request is unchanged; a production API server is one app too.
    """
    import functools

    from airflow.sdk.execution_time import supervisor

    if hasattr(supervisor.in_process_api_server, "cache_info"):
        return  # Airflow 3.3: cached already
    build = supervisor.in_process_api_server
    supervisor.in_process_api_server = functools.lru_cache(maxsize=1)(build)
    client_for = supervisor.InProcessTestSupervisor._api_client

    def api_client(dag: Any = None) -> Any:
        if dag is None:
            from airflow.api_fastapi.common.dagbag import dag_bag_from_app

            supervisor.in_process_api_server().app.dependency_overrides.pop(dag_bag_from_app, None)
        return client_for(dag)

    supervisor.InProcessTestSupervisor._api_client = staticmethod(api_client)


@pytest.fixture(autouse=True, scope="module")
def fresh_secrets_masker() -> None:
    """Each test file starts with Airflow's secrets masker empty, as each task process does.

    The masker recompiles one regex of every secret it holds on each new one (``Connection.get`` adds the
    connection's), and a pytest worker runs hundreds of tests, each with an emulator of its own secrets: 7.7 %
    of a py-spy profile of three integration files run in one process, and ``make test`` took 1,316 CPU-s
    before the reset and 1,135 after (docs/benchmarks.md, "Airflow's secrets masker"). Per file, not per test,
    so that a secret a module-scoped fixture registered stays masked for every test of its file.
    """
    for module in ("airflow.sdk._shared.secrets_masker", "airflow._shared.secrets_masker"):
        with contextlib.suppress(ImportError, AttributeError):
            importlib.import_module(module).reset_secrets_masker()


@pytest.fixture(autouse=True)
def fresh_spot_histories() -> None:
    """Each test starts with no spot history: the Variables the spot policy shares between tasks would
    otherwise carry one test's preemptions into the next test's decisions (the DB is per session)."""
    import sqlite3

    db = _HOME / "airflow.db"
    if not db.exists():
        return
    conn = sqlite3.connect(db)
    try:
        with conn, contextlib.suppress(sqlite3.OperationalError):  # not migrated yet: nothing to forget
            conn.execute("DELETE FROM variable WHERE key LIKE 'azureml_spot_history%'")
    finally:
        conn.close()


@pytest.fixture(scope="session")
def fork_server() -> Iterator[Any]:
    """One template for the MLflow models' scoring processes, shared by a pytest worker's emulators.

    Each emulator would otherwise start its own on its first MLflow job and import MLflow, scikit-learn and
    pandas there: about 3 s of CPU per test, most of the suite's CPU on 2 cores (docs/benchmarks.md, "Test
    suite"). Each job still gets a fresh process forked from it, as with an emulator's own template."""
    from airflow_azureml.emulator.scoring.script import new_fork_server

    server = new_fork_server()
    yield server
    if server is not None:
        server.close()


@pytest.fixture
def emulator(tmp_path: Path, fork_server: Any) -> Iterator[Emulator]:
    """An emulator with the example's MLflow model registered (as the example DAG's setup registers it)."""
    from tests.helpers import register_example_model

    with Emulator(tmp_path / "emulator", timing=FAST, fork_server=fork_server) as emu:
        register_example_model(emu)
        yield emu


@pytest.fixture
def azureml_conn(emulator: Emulator, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Point the ``azure_ml_default`` connection at this test's emulator (as a user would, via env)."""
    info = emulator.connection_info()
    monkeypatch.setenv("AIRFLOW_CONN_AZURE_ML_DEFAULT", info["airflow_conn_json"])
    return info


# The DAG files this test loaded. Airflow 3.3's dag.test() parses and serializes every DAG file of the folder on
# each call (apache/airflow#64884): nine files, about 0.25 s of CPU a call in a suite that makes hundreds. The
# folder's .airflowignore hides the files this test has not loaded, until the test ends. A DAG of a hidden file
# run by dag.test() would run its last serialized version without an error: run only DAGs from load_dag().
_LOADED_DAG_FILES: set[str] = set()


def show_only_loaded_dag_files(file_name: str) -> None:
    """Hide from the DAG folder's parse (``.airflowignore``) every top-level DAG file this test has not loaded."""
    assert DAGS_FOLDER.is_absolute(), "pytest_configure sets DAGS_FOLDER: never write an .airflowignore elsewhere"
    _LOADED_DAG_FILES.add(file_name)
    hidden = sorted(p.name for p in DAGS_FOLDER.glob("*.py") if p.name not in _LOADED_DAG_FILES)
    text = (REPO / "dags" / ".airflowignore").read_text() + "".join(f"/{name}\n" for name in hidden)
    ignore = DAGS_FOLDER / ".airflowignore"
    if ignore.read_text() != text:  # written whole (os.replace): a parse never reads half a file
        scratch = ignore.with_name(f".airflowignore.{os.getpid()}")
        scratch.write_text(text)
        os.replace(scratch, ignore)


@pytest.fixture(autouse=True)
def whole_dag_folder_after_each_test() -> Iterator[None]:
    """Each test starts with the whole DAG folder visible. (A subprocess a test starts after its load_dag() sees
    the narrowed folder: such tests run the file they loaded.)"""
    yield
    if _LOADED_DAG_FILES:
        _LOADED_DAG_FILES.clear()
        scratch = DAGS_FOLDER / f".airflowignore.{os.getpid()}"
        shutil.copy(REPO / "dags" / ".airflowignore", scratch)
        os.replace(scratch, DAGS_FOLDER / ".airflowignore")


def load_dag(file_name: str, dag_id: str | None = None) -> Any:
    """Import a DAG file from the test DAGS_FOLDER and return its DAG object; the folder's other DAG files are
    hidden from ``dag.test()``'s parse until the test ends (``show_only_loaded_dag_files``)."""
    path = DAGS_FOLDER / file_name
    show_only_loaded_dag_files(file_name)
    spec = importlib.util.spec_from_file_location(f"dagfile_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    from airflow.sdk import DAG

    dags = [v for v in vars(module).values() if isinstance(v, DAG)]
    if dag_id is not None:
        dags = [d for d in dags if d.dag_id == dag_id]
    assert len(dags) == 1, f"expected one DAG in {file_name}, found {[d.dag_id for d in dags]}"
    from tests.dag_support import sync_dag_folder_as_dag_test_does

    sync_dag_folder_as_dag_test_does(dags[0])  # Airflow < 3.3's dag.test() would run the first-synced shape
    return dags[0]


def task_states(dag_run: Any) -> dict[str, str]:
    """``{task_id[map_index]: state}`` of a finished ``dag.test()`` run."""
    from airflow.models import TaskInstance
    from airflow.utils.session import create_session

    with create_session() as session:
        tis = session.query(TaskInstance).filter_by(dag_id=dag_run.dag_id, run_id=dag_run.run_id).all()
        return {(ti.task_id if ti.map_index < 0 else f"{ti.task_id}[{ti.map_index}]"): str(ti.state) for ti in tis}


def xcom_value(dag_run: Any, task_id: str, map_index: int = -1, key: str = "return_value") -> Any:
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        row = (
            session.query(XComModel)
            .filter_by(dag_id=dag_run.dag_id, run_id=dag_run.run_id, task_id=task_id, map_index=map_index, key=key)
            .one_or_none()
        )
        if row is None:
            return None
        value = row.value
        if isinstance(value, str):
            try:
                return json.loads(value)
            except json.JSONDecodeError:
                return value
        return value
