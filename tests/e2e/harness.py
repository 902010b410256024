"""A real Airflow deployment for the e2e suite: PostgreSQL + api-server + scheduler + dag-processor + triggerer.

Everything runs as separate processes, so faults (kill -9, restarts) hit the same code paths as in
production: with LocalExecutor, or with CeleryExecutor on a throwaway Redis, its Celery workers and a
second triggerer (``AirflowDeployment(celery_workers=2, triggerers=2)``).
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil
import requests

REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    """A port no one listens on now, below the kernel's ephemeral range.

    A port the kernel hands out for ``bind(0)`` is an ephemeral one: between this check and the service's own
    bind, any process's outgoing connection or another ``free_port()`` can take it (``.ci/run`` saw an e2e
    api-server fail to bind, and the harness then talked to another deployment's). Below the range only
    listeners compete, and ``AirflowDeployment.start`` still checks that the api-server bound its port.
    """
    low, high = 20000, 32000
    with open("/proc/sys/net/ipv4/ip_local_port_range") as ranges:
        high = min(high, int(ranges.read().split()[0]))
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randrange(low, high)
        with contextlib.suppress(OSError), socket.socket() as probe:
            probe.bind(("0.0.0.0", port))
            return port
    raise RuntimeError(f"no free port in {low}-{high}")


def pg_bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}")) or [shutil.which(name) or ""]
    if not found[-1]:
        raise RuntimeError(f"PostgreSQL's {name} not found: run scripts/ensure_postgres.sh (make test does)")
    return found[-1]


class Postgres:
    """A throwaway PostgreSQL cluster on 127.0.0.1 (run as the postgres user when we are root).

    Its data dir lives in ``base`` (pytest's temporary directory). As root, the server runs as the
    postgres user, who cannot pass through pytest's 0700 folders (and any pytest session started
    meanwhile resets them to 0700), so the data dir is then a private folder of the postgres user
    in the system temp dir instead. ``stop`` removes it, keeping the server log in ``base``; a data
    dir left by a run that was killed is removed by the next start.
    """

    PREFIX = "airflow-azureml-pgdata-"

    def __init__(self, base: Path) -> None:
        self.base = base
        self.as_root = os.geteuid() == 0
        self._lock: Any = None
        if self.as_root:
            # <tmp>/<PREFIX>XXXX/{lock,data}: the lock is held while this run lives, so another
            # run's clean-up never removes a live run's folder (not even during its initdb).
            self.holder = Path(tempfile.mkdtemp(prefix=self.PREFIX))
            self.holder.chmod(0o711)  # the postgres user may pass through to data/, nothing more
            # Locked under another name, then renamed: ``lock`` appears already held. Created as ``lock``, another
            # worker's ``remove_stale`` could take it between open and flock, and remove this live folder (a
            # .ci/run: BlockingIOError at the flock, every row of a matrix file in error).
            self._lock = open(self.holder / "lock.new", "w")  # noqa: SIM115 - held for the run's life
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            os.rename(self.holder / "lock.new", self.holder / "lock")
            self.dir = self.holder / "data"
        else:
            self.holder = None
            self.dir = base / "pgdata"
        self.port = free_port()
        self.url = f"postgresql+psycopg2://airflow@127.0.0.1:{self.port}/airflow"

    @classmethod
    def remove_stale(cls) -> None:
        """Folders of runs that were killed before their teardown: nobody holds their lock any more."""
        for folder in Path(tempfile.gettempdir()).glob(cls.PREFIX + "*"):
            lock_path = folder / "lock"
            if not lock_path.is_file():
                # a run between mkdtemp and its lock's rename (microseconds), or one killed there: only the latter
                # is left minutes later, and nobody holds its lock.new
                if cls._abandoned_before_its_lock(folder):
                    shutil.rmtree(folder, ignore_errors=True)
                continue
            try:
                with open(lock_path) as lock:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # raises while a live run holds it
                    pid_file = folder / "data" / "postmaster.pid"
                    pid = int(pid_file.read_text().split()[0]) if pid_file.exists() else 0
                    if pid and psutil.pid_exists(pid):
                        continue
                    shutil.rmtree(folder, ignore_errors=True)
            except (OSError, ValueError, IndexError):
                continue

    @staticmethod
    def _abandoned_before_its_lock(folder: Path, age: float = 600.0) -> bool:
        try:
            if not folder.is_dir() or time.time() - folder.stat().st_mtime < age:
                return False
            new = folder / "lock.new"
            if new.is_file():
                with open(new) as lock:
                    fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)  # raises while a live run holds it
            return True
        except OSError:
            return False

    def _run(self, *cmd: str) -> None:
        prefix = ["runuser", "-u", "postgres", "--"] if self.as_root else []
        subprocess.run([*prefix, *cmd], check=True, capture_output=True)

    def start(self) -> Postgres:
        self.remove_stale()
        self.dir.mkdir(parents=True, exist_ok=True)
        if self.as_root:
            shutil.chown(self.dir, "postgres", "postgres")
        self._run(pg_bin("initdb"), "-D", str(self.dir), "-A", "trust", "-U", "airflow", "-E", "UTF8")
        self._run(
            pg_bin("pg_ctl"),
            "-D",
            str(self.dir),
            "-l",
            str(self.dir / "server.log"),
            "-w",
            "start",
            "-o",
            f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c max_connections=200 -c fsync=off",
        )
        self._run(
            pg_bin("psql"),
            "-h",
            "127.0.0.1",
            "-p",
            str(self.port),
            "-U",
            "airflow",
            "-d",
            "postgres",
            "-c",
            "CREATE DATABASE airflow",
        )
        return self

    def stop(self) -> None:
        """A fast (clean) shutdown, so no shared memory is left behind; then the data dir goes."""
        with contextlib.suppress(subprocess.CalledProcessError):
            self._run(pg_bin("pg_ctl"), "-D", str(self.dir), "-m", "fast", "-w", "stop")
        with contextlib.suppress(OSError):  # keep the server log in pytest's temp dir
            shutil.copy(self.dir / "server.log", self.base / "postgres.log")
        shutil.rmtree(self.holder or self.dir, ignore_errors=True)
        if self._lock is not None:
            self._lock.close()
            self._lock = None


class Redis:
    """A throwaway Redis on 127.0.0.1, the Celery broker: no persistence, its folder in ``base``."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.port = free_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, timeout: float = 30) -> Redis:
        binary = shutil.which("redis-server") or "/usr/bin/redis-server"
        if not os.path.exists(binary):
            raise RuntimeError("redis-server not found: run scripts/ensure_redis.sh (make test-distributed does)")
        folder = self.base / "redis"
        folder.mkdir(parents=True, exist_ok=True)
        log = open(self.base / "redis.log", "ab")  # noqa: SIM115 - owned by the process
        args = ["--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
        self.proc = subprocess.Popen(
            [binary, *args, "--dir", str(folder)], stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited; see {self.base / 'redis.log'}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", self.port), timeout=1) as conn:
                conn.sendall(b"PING\r\n")
                if conn.recv(16).startswith(b"+PONG"):
                    return self
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"redis-server did not answer in {timeout}s; see {self.base / 'redis.log'}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        self.proc = None


# What docs/deferrable.md shows: in the processes whose children run tasks (the scheduler, whose LocalExecutor
# workers fork them; a Celery worker), drop a custom cloud's name inherited from a process that built an MLClient
# (importing azure.ai.ml fails on a cloud this process never registered), then import the SDK once. The API
# server, DAG processor and triggerers never call the SDK (the triggers use the REST API): they skip it.
PRELOAD_SDK = """import os
import sys

if sys.argv[1:2] == ["scheduler"] or sys.argv[1:3] == ["celery", "worker"]:
    if os.environ.get("AZUREML_CURRENT_CLOUD", "").startswith("AirflowCustom-"):
        del os.environ["AZUREML_CURRENT_CLOUD"]
    import azure.ai.ml  # noqa: F401
"""


class AirflowDeployment:
    """Airflow's services as processes; ``kill``/``start`` one to inject a fault."""

    SERVICES = ("api-server", "scheduler", "dag-processor", "triggerer")

    def __init__(
        self,
        base: Path,
        db_url: str,
        extra_env: dict[str, str],
        *,
        broker_url: str | None = None,
        celery_workers: int = 0,
        triggerers: int = 1,
    ) -> None:
        self.home = base / "airflow"
        self.dags = self.home / "dags"
        self.logs = self.home / "logs"
        self.api_port = free_port()
        self.procs: dict[str, subprocess.Popen[bytes]] = {}
        self.dags.mkdir(parents=True)
        for source in (REPO / "dags").glob("*.py"):
            shutil.copy(source, self.dags / source.name)
        shutil.copy(REPO / "dags" / ".airflowignore", self.dags / ".airflowignore")
        shutil.copytree(REPO / "dags" / "azureml", self.dags / "azureml")
        # Every Airflow process imports airflow_local_settings at start. Importing azure.ai.ml there in the
        # scheduler (about 3.5 s of CPU) lets its LocalExecutor workers, and the task processes they fork,
        # share one import instead of paying it in every task: the matrix runs about 200 tasks that call the SDK.
        # A production deployment may preload the same way (docs/deferrable.md); the provider's own lazy
        # import is held by tests/unit/test_provider.py and tests/integration/test_hook_environment.py.
        (self.home / "config").mkdir(parents=True)
        (self.home / "config" / "airflow_local_settings.py").write_text(PRELOAD_SDK)
        self.env = {
            **os.environ,
            "AIRFLOW_HOME": str(self.home),
            "AIRFLOW__CORE__DAGS_FOLDER": str(self.dags),
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
            "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
            "AIRFLOW__CORE__PARALLELISM": "8",
            "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": db_url,
            "AIRFLOW__API__PORT": str(self.api_port),
            # the scheduler's and the triggerers' log servers: ports of this deployment's own, so that
            # several deployments (one per e2e file under pytest-xdist) run side by side
            "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
            "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port()),
            "AIRFLOW__API__BASE_URL": f"http://127.0.0.1:{self.api_port}",
            "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"http://127.0.0.1:{self.api_port}/execution/",
            "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
            "AIRFLOW__API_AUTH__JWT_SECRET": "e2e-jwt-secret-not-a-real-one",
            # The DAG files never change during a run: parsed once at start-up, not every 5 s (each parse is
            # a process of its own, and three deployments share two cores with the rest of the suite).
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "600",
            "AIRFLOW__DAG_PROCESSOR__MIN_FILE_PROCESS_INTERVAL": "600",
            # Every row triggers its own run for its own interval. The scheduler creates none of its own: the
            # example DAGs' latest @daily runs (one of them fails on a missing Kubernetes id, with retries) only
            # took the CPU of every deployment's start, and the rows waited for them.
            "AIRFLOW__SCHEDULER__USE_JOB_SCHEDULE": "False",
            "AIRFLOW__SCHEDULER__SCHEDULER_HEARTBEAT_SEC": "1",
            "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_SEC": "2",
            "AIRFLOW__TRIGGERER__JOB_HEARTBEAT_SEC": "1",
            "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
            "PYTHONUNBUFFERED": "1",
            **extra_env,
        }
        self.env.pop("AIRFLOW__CORE__UNIT_TEST_MODE", None)
        # A pytest worker that built an MLClient before holds AZUREML_CURRENT_CLOUD naming a cloud registered in
        # that process only: inherited, the preload above would fail ("Unknown cloud environment") in every service.
        self.env.pop("AZUREML_CURRENT_CLOUD", None)
        self._token: str | None = None
        # name -> (airflow's arguments, extra environment) of the services this deployment runs besides SERVICES
        self.specs: dict[str, tuple[list[str], dict[str, str]]] = {}
        for n in range(2, triggerers + 1):  # each triggerer serves its triggers' logs on a port of its own
            self.specs[f"triggerer-{n}"] = (
                ["triggerer"],
                {"AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port())},
            )
        if celery_workers:
            if broker_url is None:
                raise ValueError("a Celery deployment needs a broker_url")
            self.env.update(
                {
                    "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
                    "AIRFLOW__CELERY__BROKER_URL": broker_url,
                    "AIRFLOW__CELERY__RESULT_BACKEND": "db+" + db_url,
                    "AIRFLOW__CELERY__WORKER_CONCURRENCY": "4",
                    "AIRFLOW__CELERY__WORKER_PREFETCH_MULTIPLIER": "1",
                    # a task whose worker was killed is found by its missing heartbeats: 30 s, not the default 300 s
                    "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": "30",
                    # ... and one it had taken but not yet started stays queued (Celery acks late; the broker
                    # redelivers after its visibility timeout, a day) until the scheduler requeues it: after
                    # 120 s, looked for every 15 s, not the defaults' 600 s and 120 s (docs/backfills.md). Most
                    # likely why a .ci/run's rolling-restart row timed out 600 s after its kill -9 of a worker.
                    "AIRFLOW__SCHEDULER__TASK_QUEUED_TIMEOUT": "120",
                    "AIRFLOW__SCHEDULER__TASK_QUEUED_TIMEOUT_CHECK_INTERVAL": "15",
                    # Celery's pool (billiard) makes a pymp-* folder in the temp dir, which a killed worker
                    # leaves behind (a .ci/run found two in /tmp): the deployment's own temp dir instead
                    "TMPDIR": str(base / "tmp"),
                }
            )
            (base / "tmp").mkdir(exist_ok=True)
        for n in range(1, celery_workers + 1):
            # each worker serves its task logs on a port of its own (they share this machine)
            args = ["celery", "worker", "--celery-hostname", f"worker-{n}@%h"]
            self.specs[f"worker-{n}"] = (args, {"AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port())})

    # ---------------------------------------------------------------- lifecycle
    def airflow(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "airflow", *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=True,
        )

    def start(self) -> AirflowDeployment:
        self.airflow("db", "migrate")
        self._start_api_server()
        # the example DAGs' infrastructure tasks run in this pool, one at a time (docs/azure.md, step 4)
        self.api("POST", "/pools", json={"name": "azureml_infrastructure", "slots": 1, "include_deferred": False})
        # this Airflow's own REST API, for the capacity pool's sync (docs/backfills.md), once its port is known
        self.env["AIRFLOW_CONN_AIRFLOW_API"] = json.dumps({"conn_type": "http", "host": self.base})
        for service in [*self.SERVICES, *self.specs]:
            if service != "api-server":
                self.start_service(service)
        return self

    def _start_api_server(self, attempts: int = 3) -> None:
        """The api-server first, on a port it is seen to hold; only then the services that call it.

        A port taken between ``free_port()`` and the api-server's bind makes uvicorn exit, while another
        deployment's api-server answers on that port: every call of this harness and of this deployment's
        scheduler and triggerers would then reach the wrong Airflow. So the api-server must be alive and
        listening itself before anything goes on; otherwise it starts again on another port.
        """
        for _ in range(attempts):
            self.start_service("api-server")
            if self.wait_for_api():
                return
            self._use_api_port(free_port())
        log = self.home / "api-server.log"
        raise RuntimeError(f"api-server did not hold its port in {attempts} attempts; see {log}")

    def _use_api_port(self, port: int) -> None:
        self.api_port = port
        self.env["AIRFLOW__API__PORT"] = str(port)
        self.env["AIRFLOW__API__BASE_URL"] = f"http://127.0.0.1:{port}"
        self.env["AIRFLOW__CORE__EXECUTION_API_SERVER_URL"] = f"http://127.0.0.1:{port}/execution/"

    def start_service(self, service: str, name: str | None = None) -> None:
        """Start ``service``; ``name`` (default: the service) tells a second instance apart, e.g. a 2nd triggerer."""
        name = name or service
        log = open(self.home / f"{name}.log", "ab")  # noqa: SIM115 - owned by the process
        if service == "triggerer" and name != service and name not in self.specs:
            # another triggerer: its own trigger log port (two on one port, the second's log server fails to bind)
            self.specs[name] = ([service], {"AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port())})
        args, env = self.specs.get(name, ([service], {}))
        if service == "api-server":
            args = [service, "--port", str(self.api_port)]
        self.procs[name] = subprocess.Popen(
            [sys.executable, "-m", "airflow", *args],
            env={**self.env, **env},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def kill(self, service: str, sig: int = signal.SIGKILL) -> None:
        """kill -9 a service and every process it started."""
        proc = self.procs[service]
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        proc.wait(timeout=30)

    def stop_service(self, name: str) -> None:
        """SIGTERM (a clean shutdown), then kill -9 after 20 s."""
        proc = self.procs.get(name)
        if proc is not None and proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=20)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                self.kill(name)

    def kill_tree(self, name: str) -> None:
        """kill -9 of a service and every process below it, as a container's end takes them all. ``kill`` signals
        the service's process group only, and Airflow 3.3's task runner leaves it for a group of its own."""
        proc = self.procs[name]
        try:
            tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
        except psutil.NoSuchProcess:
            tree = []
        for member in tree:
            with contextlib.suppress(psutil.NoSuchProcess):
                member.kill()
        psutil.wait_procs(tree, timeout=30)
        proc.wait(timeout=30)

    def terminate(self, name: str, timeout: float = 120) -> None:
        """SIGTERM to the service's main process only, as a rolling deploy sends it (Kubernetes signals a pod's
        PID 1): a Celery worker then finishes its running tasks first. kill -9 of the group after ``timeout``."""
        proc = self.procs[name]
        with contextlib.suppress(ProcessLookupError):
            os.kill(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill(name)

    def stop(self) -> None:
        extra = [name for name in self.procs if name not in self.SERVICES]
        for name in [*extra, *reversed(self.SERVICES)]:
            self.stop_service(name)

    def wait_for_api(self, timeout: float = 120) -> bool:
        """True once this deployment's own api-server answers on its port; False if it exited (its port was
        taken). An answer from a process that is not ours does not count."""
        deadline = time.monotonic() + timeout
        proc = self.procs["api-server"]
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                return False
            try:
                if requests.get(f"{self.base}/api/v2/monitor/health", timeout=2).ok and self._holds_api_port(proc):
                    return True
            except requests.RequestException:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"api-server did not come up; see {self.home / 'api-server.log'}")

    def _holds_api_port(self, proc: subprocess.Popen[bytes]) -> bool:
        """Whether ``proc`` or one of its children listens on the api port."""
        try:
            ours = {proc.pid, *(child.pid for child in psutil.Process(proc.pid).children(recursive=True))}
        except psutil.NoSuchProcess:
            return False
        return any(
            conn.pid in ours and conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == self.api_port
            for conn in psutil.net_connections(kind="tcp")
        )

    # -------------------------------------------------------------------- API
    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.api_port}"

    def token_for(self, username: str | None = None) -> str:
        """A token from the api-server: with ``simple_auth_manager_all_admins`` (the default here) anyone's
        (``GET /auth/token``); else ``username``'s, signed in with its password from the simple auth manager's
        passwords file, as a person signs in (``POST /auth/token``)."""
        if username is None:
            return str(requests.get(f"{self.base}/auth/token", timeout=10).json()["access_token"])
        passwords = json.loads(Path(self.env["AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_PASSWORDS_FILE"]).read_text())
        answer = requests.post(
            f"{self.base}/auth/token", json={"username": username, "password": passwords[username]}, timeout=10
        )
        answer.raise_for_status()
        return str(answer.json()["access_token"])

    def api(self, method: str, path: str, **kwargs: Any) -> Any:
        if self._token is None:  # AZUREML_E2E_LOGIN: the user the harness signs in as, where not all are admins
            self._token = self.token_for(self.env.get("AZUREML_E2E_LOGIN"))
        response = requests.request(
            method,
            f"{self.base}/api/v2{path}",
            timeout=30,
            headers={"Authorization": f"Bearer {self._token}"},
            **kwargs,
        )
        if not response.ok:
            raise RuntimeError(f"{method} {path}: {response.status_code} {response.text[:500]}")
        return response.json() if response.content else None

    def wait_for_dag(self, dag_id: str, timeout: float = 180) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                self.api("GET", f"/dags/{dag_id}")
                return
            except RuntimeError:
                time.sleep(1)
        raise RuntimeError(f"DAG {dag_id} was not parsed; see {self.home / 'dag-processor.log'}")

    def trigger(self, dag_id: str, logical_date: str, conf: dict[str, Any] | None = None) -> str:
        run = self.api("POST", f"/dags/{dag_id}/dagRuns", json={"logical_date": logical_date, "conf": conf or {}})
        return str(run["dag_run_id"])

    def run_state(self, dag_id: str, run_id: str) -> str:
        return str(self.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}")["state"])

    def wait_for_run(self, dag_id: str, run_id: str, timeout: float = 300) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            state = self.run_state(dag_id, run_id)
            if state in ("success", "failed"):
                return state
            time.sleep(1)
        raise TimeoutError(f"run {run_id} still {state} after {timeout}s")

    def task_instances(self, dag_id: str, run_id: str) -> list[dict[str, Any]]:
        return list(self.api("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances?limit=1000")["task_instances"])

    def set_task_state(self, dag_id: str, run_id: str, task_id: str, map_index: int, state: str) -> None:
        self.api(
            "PATCH", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/{map_index}", json={"new_state": state}
        )

    def clear_run(self, dag_id: str, run_id: str) -> None:
        self.api(
            "POST",
            f"/dags/{dag_id}/clearTaskInstances",
            json={"dry_run": False, "dag_run_id": run_id, "only_failed": False, "reset_dag_runs": True},
        )
