"""OpenLineage events of the invoke and command-job operators, emitted by the real OpenLineage provider's
listener (file transport) while ``dag.test()`` runs the asset example chain against the emulator.

The listener reads its configuration once per process, so the DAGs run in a fresh process configured by
``AIRFLOW__OPENLINEAGE__*``; the test process owns the emulator (and preempts its cluster).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pendulum
import pytest

pytest.importorskip(
    "airflow.providers.openlineage", reason="needs the [openlineage] extra (apache-airflow-providers-openlineage)"
)

from airflow_azureml.emulator import Emulator
from airflow_azureml.hooks import AzureMLHook
from tests import conftest
from tests.helpers import when_running
from tests.integration.test_exactly_once import every_running_job_sampled, gauge_read_twice_since

INTERVAL = pendulum.datetime(2026, 11, 21, tz="UTC")
# The emulator's workspaceblobstore: an AzureBlob datastore, account "emulatorstore", container = its name.
BLOB = "wasbs://workspaceblobstore@emulatorstore.dfs.core.windows.net"


def run_chain(tmp_path: Path, dag_ids: list[str]) -> tuple[list[dict[str, Any]], dict[str, str], str]:
    """Run the DAGs one after another in a fresh process: the OpenLineage events it emitted, each DAG run's
    state, and what it printed."""
    events_file = tmp_path / "openlineage.jsonl"
    states_file = tmp_path / "states.txt"
    dags_folder = conftest.DAGS_FOLDER  # set by pytest_configure
    script = "\n".join(
        [
            "import importlib.util, sys, pendulum",
            f"sys.path.insert(0, {str(dags_folder)!r})",
            f"spec = importlib.util.spec_from_file_location('chain', {str(dags_folder / 'example_asset_chain.py')!r})",
            "module = importlib.util.module_from_spec(spec); spec.loader.exec_module(module)",
            f"for dag_id in {dag_ids!r}:",
            "    dag = next(d for d in vars(module).values() if getattr(d, 'dag_id', None) == dag_id)",
            f"    run = dag.test(logical_date=pendulum.parse({INTERVAL.isoformat()!r}))",
            # a file of its own: Airflow's log writers share stdout, so a printed line can land inside another
            f"    with open({str(states_file)!r}, 'a') as f: f.write(f'{{dag_id}} {{run.state}}\\n')",
        ]
    )
    env = {k: v for k, v in os.environ.items() if k != "AZUREML_CURRENT_CLOUD"}
    env.update(
        {
            "AIRFLOW__OPENLINEAGE__TRANSPORT": json.dumps(
                {"type": "file", "log_file_path": str(events_file), "append": True}
            ),
            "AIRFLOW__OPENLINEAGE__NAMESPACE": "azureml-tests",
        }
    )
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert events_file.exists(), done.stdout[-3000:] + done.stderr[-3000:]
    events = [json.loads(line) for line in events_file.read_text().splitlines() if line.strip()]
    return events, states(states_file), done.stdout


def states(states_file: Path) -> dict[str, str]:
    """``{dag_id: state}`` from the ``<dag_id> <state>`` lines the runner wrote (none if it wrote no file)."""
    lines = [line.split() for line in states_file.read_text().splitlines()] if states_file.exists() else []
    return {parts[0]: parts[1].rsplit(".", 1)[-1].lower() for parts in lines}


def xcom_by_map_index(event: dict[str, Any], task: str, key: str) -> Any:
    """The XCom ``key`` of the mapped task instance an OpenLineage event is about (the DAGs ran in a child
    process on this session's metadata DB)."""
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    facets = event["run"]["facets"]
    dag_id = facets["airflow"]["dag"]["dag_id"]
    run_id = facets["airflow"]["dagRun"]["run_id"]
    map_index = facets["airflow"]["taskInstance"]["map_index"]
    with create_session() as session:
        row = (
            session.query(XComModel)
            .filter_by(dag_id=dag_id, run_id=run_id, task_id=task, map_index=map_index, key=key)
            .one_or_none()
        )
    value = None if row is None else row.value
    return json.loads(value) if isinstance(value, str) else value


def task_events(events: list[dict[str, Any]], task: str, event_type: str) -> list[dict[str, Any]]:
    return [e for e in events if e["job"]["name"].endswith(f".{task}") and e["eventType"] == event_type]


@pytest.fixture
def chain_env(emulator: Emulator, azureml_conn: dict[str, Any], airflow_db: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("AZUREML_DATASTORE_ROOT", f"file://{emulator.datastore_path('')}")
    monkeypatch.setenv("AZUREML_POLL_SECONDS", "0.1")
    monkeypatch.setenv("AZUREML_RESUBMIT_BACKOFF_SECONDS", "0.1")
    return emulator


def test_invoke_and_command_job_lineage_on_complete(chain_env: Emulator, tmp_path: Path) -> None:
    emulator = chain_env
    preempted: list[str] = []

    def preempt_once(emu: Emulator, _job: str) -> None:  # Azure's own PreemptionError: evidence when read
        preempted.extend(emu.preempt_cluster("low-pri-cluster", form="failed"))

    chain = ["example_asset_etl", "example_asset_scoring", "example_asset_report"]
    # the chain is three `airflow dags test` processes: on a busy machine its scoring job runs minutes in
    # only once every running attempt's wait has read the gauge: the bill's figures come from those reads
    with when_running(emulator, preempt_once, timeout=900, ready=every_running_job_sampled):
        events, run_states, out = run_chain(tmp_path, chain)
    assert run_states == dict.fromkeys(chain, "success"), out[-3000:]
    assert preempted, "no job was preempted"

    completes = task_events(events, "score_partition", "COMPLETE")
    assert len(completes) == 2  # one per mapped task
    hook = AzureMLHook()
    total_preemptions = 0
    for event in completes:
        (dataset_in,) = event["inputs"]
        (dataset_out,) = event["outputs"]
        assert dataset_in["namespace"] == BLOB and dataset_out["namespace"] == BLOB
        assert dataset_in["name"].startswith("assets/input/20261121T0000/part-")
        assert dataset_out["name"] == dataset_in["name"].replace("/input/", "/output/")
        facet = event["run"]["facets"]["azureml_job"]
        names = facet["jobNames"]
        assert facet["jobName"] == names[-1] and emulator.job(names[-1]).status == "Completed"
        assert facet["resubmissions"] == len(names) - 1 == facet["preemptions"]
        assert set(names[:-1]) <= set(preempted)
        assert facet["studioUrl"] == hook.studio_job_url(names[-1])
        # the facet's cost is the task's own cost report (XCom azureml_cost), its headline figures
        report = xcom_by_map_index(event, "score_partition", "azureml_cost")
        assert report is not None and report["cost"] > 0 and report["preemptions"] == facet["preemptions"]
        expected = {
            "currency": "USD",
            "cost": report["cost"],
            "nodeHours": report["node_hours_total"],
            "evictedNodeHours": report["evicted_node_hours"],
            "lostNodeHours": report["lost_node_hours"],
            "dedicatedEquivalentCost": report["dedicated_equivalent"]["cost"],
            "savings": report["savings"],
            "savingsPct": report["savings_pct"],
            "costUnknown": None,  # every price known here
        }
        assert facet["cost"] == {k: v for k, v in expected.items() if v is not None}  # OpenLineage drops nulls
        assert event["run"]["facets"]["externalQuery"] == {
            **event["run"]["facets"]["externalQuery"],
            "externalQueryId": names[-1],
            "source": "azureml",
        }
        total_preemptions += facet["preemptions"]
    assert total_preemptions == len(preempted)

    (command,) = task_events(events, "summarize_predictions", "COMPLETE")
    assert sorted((d["namespace"], d["name"]) for d in command["inputs"]) == sorted(
        (BLOB, d["outputs"][0]["name"]) for d in completes
    )
    assert command["outputs"] == []
    facet = command["run"]["facets"]["azureml_job"]
    assert emulator.job(facet["jobName"]).job_type == "Command" and facet["preemptions"] == 0


def test_invoke_lineage_on_failure_counts_the_preemptions(chain_env: Emulator, tmp_path: Path) -> None:
    """Every job is preempted (Azure's PreemptionError) until each partition's budget (3 resubmissions) is spent."""
    emulator = chain_env
    preempted: list[str] = []

    def preempt_every_job(emu: Emulator, _job: str) -> None:
        # The nodes go at once; the service fails the jobs (PreemptionError) a while later: here once each
        # job's wait has read the evicted nodes twice over, however loaded the machine. The bill's evicted
        # and lost node-hours come from those reads (docs/cost.md), so the test waits for them, not on luck.
        at = time.time()
        lost = emu.call(
            lambda: emu.workspace.preempt_cluster("low-pri-cluster", "failed", hold_end=True, hold_nodes=True)
        )
        preempted.extend(lost)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not all(gauge_read_twice_since(emu, j, at) for j in lost):
            time.sleep(0.05)
        emu.call(lambda: emu.workspace.end_held_preemption("low-pri-cluster"))

    # each attempt preempted only once every running attempt's wait has read the gauge (its lost node-hours
    # come from those reads; an attempt preempted before any read bills none: docs/cost.md)
    with when_running(emulator, preempt_every_job, times=100, timeout=900, ready=every_running_job_sampled):
        events, run_states, out = run_chain(tmp_path, ["example_asset_etl", "example_asset_scoring"])
    assert run_states == {"example_asset_etl": "success", "example_asset_scoring": "failed"}, out[-3000:]
    failures = task_events(events, "score_partition", "FAIL")
    assert len(failures) == 2
    for event in failures:
        assert [d["namespace"] for d in event["inputs"]] == [BLOB]
        assert [d["namespace"] for d in event["outputs"]] == [BLOB]
        facet = event["run"]["facets"]["azureml_job"]
        assert len(facet["jobNames"]) == 4 and set(facet["jobNames"]) <= set(preempted)
        assert facet["preemptions"] == 4 and facet["resubmissions"] == 3
        assert facet["jobName"] == facet["jobNames"][-1]
        assert "preempted" in event["run"]["facets"]["errorMessage"]["message"]
        # the failed task's bill: four preempted attempts on the spot cluster, all of it lost work
        bill = facet["cost"]
        assert bill["currency"] == "USD" and bill["cost"] > 0 and bill["nodeHours"] > 0
        assert bill["evictedNodeHours"] > 0 and bill["lostNodeHours"] > 0
        assert bill["dedicatedEquivalentCost"] == 0 and bill["savings"] == -bill["cost"]
    assert not task_events(events, "score_partition", "COMPLETE")


def test_datastore_namespaces_follow_the_openlineage_spec() -> None:
    from azure.ai.ml.entities import AzureBlobDatastore, AzureDataLakeGen2Datastore, AzureFileDatastore
    from openlineage.client.naming.dataset import ABFSS, WASBS

    from airflow_azureml.openlineage import storage_namespace

    lake = AzureDataLakeGen2Datastore(name="lake", account_name="acct", filesystem="fs")
    blob = AzureBlobDatastore(name="blob", account_name="acct", container_name="box")
    assert storage_namespace(lake) == ABFSS(container="fs", service="acct", path="p").get_namespace()
    assert storage_namespace(blob) == WASBS(container="box", service_name="acct", object_key="k").get_namespace()
    china = AzureDataLakeGen2Datastore(
        name="lake", account_name="acct", filesystem="fs", endpoint="core.chinacloudapi.cn"
    )
    assert storage_namespace(china) == "abfss://fs@acct.dfs.core.chinacloudapi.cn"
    share = AzureFileDatastore(name="share", account_name="acct", file_share_name="files")
    assert storage_namespace(share) is None  # the spec names no file-share namespace


def test_datastores_resolve_through_the_connection(emulator: Emulator, azureml_conn: dict[str, Any]) -> None:
    from airflow_azureml.assets import parse_datastore_uri
    from airflow_azureml.openlineage import DatastoreResolver, dataset

    resolver = DatastoreResolver(AzureMLHook())
    first = dataset("azureml://datastores/workspaceblobstore/paths/scoring/input/part-000/", resolver)
    second = dataset("azureml://datastores/workspaceblobstore/paths/scoring/output", resolver)
    assert (first.namespace, first.name) == (BLOB, "scoring/input/part-000")
    assert (second.namespace, second.name) == (BLOB, "scoring/output")
    gets = [r for r in emulator.requests() if r["method"] == "GET" and "/datastores/" in r["path"]]
    assert len(gets) == 1  # one read per datastore
    # not resolvable: a datastore the workspace does not have, another workspace's datastore
    missing = dataset("azureml://datastores/nosuchstore/paths/x", resolver)
    assert (missing.namespace, missing.name) == ("azureml://datastores/nosuchstore", "x")
    other = "azureml://subscriptions/s/resourcegroups/rg/workspaces/other/datastores/workspaceblobstore/paths/x"
    assert resolver.namespace(parse_datastore_uri(other)) == other.rsplit("/paths/", 1)[0]
    assert dataset("azureml:heart-data:1", resolver) is None  # a data asset reference names no storage
    assert dataset(3, resolver) is None
    # the asset converter resolves too when Airflow hands it the hook (hook lineage), and cannot without it
    from airflow.sdk import Asset

    from airflow_azureml.openlineage import convert_asset_to_openlineage

    asset = Asset("azureml://datastores/workspaceblobstore/paths/scoring/output")
    assert convert_asset_to_openlineage(asset, AzureMLHook()).namespace == BLOB
    assert convert_asset_to_openlineage(asset, None).namespace == "azureml://datastores/workspaceblobstore"


def test_asset_converter_is_used_by_the_openlineage_provider() -> None:
    from airflow.providers.openlineage.utils.utils import translate_airflow_asset
    from airflow.sdk import Asset

    converted = translate_airflow_asset(Asset("azureml://datastores/ds/paths/scored/part-000/"), None)
    assert (converted.namespace, converted.name) == ("azureml://datastores/ds", "scored/part-000")


def test_operators_import_no_openlineage() -> None:
    """Lineage is computed only when the listener asks: the base install needs no OpenLineage."""
    code = (
        "import sys\n"
        "import airflow_azureml.operators.batch, airflow_azureml.operators.jobs, airflow_azureml.assets\n"
        "import airflow_azureml.openlineage  # importable without OpenLineage (the docs build imports it)\n"
        # Airflow itself reads every provider's get_provider_info; the lineage code is not imported
        "print('OL=' + ','.join(m for m in sys.modules if m.split('.')[0] == 'openlineage' or 'extractors' in m"
        "))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "OL=\n" in done.stdout, done.stdout[-2000:]
