"""The emulator's behaviour switches, each shown with the real MLClient as Azure would show it.

Every switch is documented in docs/emulator.md ("Behaviours") with its default and its source.
"""

from __future__ import annotations

import contextlib
import json
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import requests

from airflow_azureml.emulator import Emulator
from airflow_azureml.emulator.models import PREEMPTION_ERROR_MESSAGE
from airflow_azureml.emulator.scoring.data import write_heart_csvs
from airflow_azureml.hooks.azure_ml import AzureMLHook
from tests.integration.test_emulator_sdk import (
    DEPLOYMENT,
    ENDPOINT,
    input_ids,
    invoke,
    prediction_ids,
    setup_workspace,
    wait_status,
    wait_terminal,
)

CLUSTER = "low-pri-cluster"


def until(predicate: Callable[[], Any], what: str, timeout: float = 30) -> Any:
    """Poll ``predicate`` until it returns something truthy (no timing assertions, only a deadline)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.01)
    raise AssertionError(f"never saw {what}")


def compute_props(ml: Any, emulator: Emulator) -> Any:
    """The AmlCompute properties as the SDK's REST client reads them (node counts, allocation state)."""
    compute = ml.compute._operation.get(
        resource_group_name=emulator.resource_group, workspace_name=emulator.workspace_name, compute_name=CLUSTER
    )
    return compute.properties.properties


def status_of(ml: Any, name: str) -> str:
    status = ml.jobs.get(name).status
    return str(getattr(status, "value", status))


def control(emulator: Emulator, method: str, path: str, body: Any = None) -> Any:
    """The authenticated control API, with the emulator's control token (emulator.json ``control_token``)."""
    token = json.loads((emulator.data_dir / "emulator.json").read_text())["control_token"]
    response = requests.request(
        method,
        f"{emulator.base_url}{path}",
        json=body,
        headers={"Authorization": f"Bearer {token}"},
        verify=emulator.ca_cert,
        timeout=10,
    )
    response.raise_for_status()
    return response.json()


def scoring_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str, source: str) -> str:
    folder = tmp_path / "scoring_modules"
    folder.mkdir(exist_ok=True)
    (folder / f"{name}.py").write_text(textwrap.dedent(source))
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.delitem(sys.modules, name, raising=False)
    return name


FAILS_ON_BAD_FILES = """
    from airflow_azureml.emulator.scoring import heart

    def init():
        heart.init()

    def run(mini_batch):
        if any("bad" in path for path in mini_batch):
            raise ValueError("cannot score a bad file")
        return heart.run(mini_batch)
"""


def deploy_model(ml: Any, emulator: Emulator, module: str, **settings: Any) -> None:
    """Bind a model served by ``module`` to the seed deployment, with deployment ``settings`` changed."""
    emulator.register_model("custom-model", "1", module)
    deployment = ml.batch_deployments.get(name=DEPLOYMENT, endpoint_name=ENDPOINT)
    deployment.model = "azureml:custom-model:1"
    # a model the emulator serves with ``module`` (as an MLflow model: no scoring script of the deployment's own;
    # the seed ships one, which would run instead: tests/integration/test_code_deployment.py)
    deployment.code_configuration = None
    deployment.environment = None
    for key, value in settings.items():
        setattr(deployment.settings if hasattr(deployment, "settings") else deployment, key, value)
    ml.batch_deployments.begin_create_or_update(deployment).result()


# ---------------------------------------------------------------- 1. gauges
def test_preempted_node_count_is_a_gauge(emulator: Emulator, azureml_conn: dict[str, Any]) -> None:
    ml = setup_workspace(AzureMLHook())
    write_heart_csvs(emulator.datastore_path("inputs/gauge"), files=60, rows_per_file=3)
    name = invoke(ml, "inputs/gauge", "job-gauge")
    wait_status(emulator, name, "Running")
    # The read "during" must be answered before the evicted node is released: a busy machine can take longer
    # than the release, and such a read proves nothing, so the eviction runs again with the release doubled.
    # The job takes no new work meanwhile (held), so that it is still running for another eviction.
    emulator.hold_cluster(CLUSTER)
    release = 0.3
    while True:
        emulator.set_behaviour(preempted_node_release_seconds=release)
        until(lambda: compute_props(ml, emulator).allocation_state == "Steady", "Steady with the job's nodes up")
        before = compute_props(ml, emulator)
        assert before.node_state_counts.preempted_node_count == 0 and before.current_node_count == 2
        evicted = time.monotonic()
        assert emulator.evict_nodes(CLUSTER, 1) == 1
        during = compute_props(ml, emulator)
        if time.monotonic() - evicted < release:
            break
        assert release < 60, "never read the compute within the release of an evicted node"
        until(lambda: compute_props(ml, emulator).node_state_counts.preempted_node_count == 0, "the node released")
        release *= 2
    emulator.hold_cluster(CLUSTER, held=False)
    assert during.node_state_counts.preempted_node_count == 1
    assert during.allocation_state == "Resizing"
    assert during.current_node_count == 2  # the evicted node is still counted until it is deallocated
    after = until(
        lambda: (p := compute_props(ml, emulator)).node_state_counts.preempted_node_count == 0 and p,
        "the preempted node released",
    )
    assert after.current_node_count <= 2
    until(lambda: compute_props(ml, emulator).allocation_state == "Steady", "Steady again")
    assert wait_terminal(ml, name) == "Completed"
    assert sorted(prediction_ids(emulator, name)) == sorted(input_ids(emulator.datastore_path("inputs/gauge")))


def test_gauge_switch_off_keeps_the_legacy_counter(emulator: Emulator, azureml_conn: dict[str, Any]) -> None:
    ml = setup_workspace(AzureMLHook())
    control(emulator, "POST", "/_emulator/behaviour", {"preempted_gauge": False})
    write_heart_csvs(emulator.datastore_path("inputs/counter"), files=30, rows_per_file=3)
    name = invoke(ml, "inputs/counter", "job-counter")
    wait_status(emulator, name, "Running")
    until(lambda: emulator.evict_nodes(CLUSTER, 1), "a node to evict")
    assert wait_terminal(ml, name) == "Completed"
    assert compute_props(ml, emulator).node_state_counts.preempted_node_count == 1


# ------------------------------------------------ 2. cancel and preemption
def run_history(ml: Any, name: str) -> Any:
    return ml.jobs._runs_operations.get_run_details(name)


def test_user_cancel_on_low_priority_looks_like_azure(emulator: Emulator, azureml_conn: dict[str, Any]) -> None:
    ml = setup_workspace(AzureMLHook())
    write_heart_csvs(emulator.datastore_path("inputs/cancel"), files=40, rows_per_file=3)
    name = invoke(ml, "inputs/cancel", "job-user-cancel")
    wait_status(emulator, name, "Running")
    ml.jobs.begin_cancel(name).result()
    assert wait_terminal(ml, name) == "Canceled"
    details = run_history(ml, name)
    assert details.error is None
    assert not details.warnings
    assert "azureml.cancelRequested" not in (details.properties or {})
    assert compute_props(ml, emulator).node_state_counts.preempted_node_count == 0


def test_capacity_lost_cancel_is_told_apart_only_by_node_counts(
    emulator: Emulator, azureml_conn: dict[str, Any]
) -> None:
    ml = setup_workspace(AzureMLHook())
    # CancelRequested long enough that every poller sees it; evicted nodes kept until the end (the evidence)
    emulator.set_behaviour(cancel_requested_seconds=1.0, preempted_node_release_seconds=30)
    write_heart_csvs(emulator.datastore_path("inputs/lost"), files=40, rows_per_file=3)
    user = invoke(ml, "inputs/lost", "job-cancel-user")
    wait_status(emulator, user, "Running")
    ml.jobs.begin_cancel(user)
    user_seen = poll_statuses(ml, user)
    lost = invoke(ml, "inputs/lost", "job-cancel-lost")
    wait_status(emulator, lost, "Running")
    until(lambda: compute_props(ml, emulator).current_node_count == 2, "the job's nodes")
    assert emulator.preempt_cluster(CLUSTER, form="canceled") == [lost]
    lost_seen = poll_statuses(ml, lost)
    # what a poller sees after Running is the same for both: CancelRequested, then Canceled
    after_running = ([s for s in user_seen if s != "Running"], [s for s in lost_seen if s != "Running"])
    assert after_running == (["CancelRequested", "Canceled"], ["CancelRequested", "Canceled"]), (user_seen, lost_seen)
    user_details, lost_details = run_history(ml, user), run_history(ml, lost)
    assert (user_details.error, lost_details.error) == (None, None)
    assert user_details.warnings == lost_details.warnings == []
    assert sorted(user_details.properties) == sorted(lost_details.properties)
    assert ml.jobs.get(user).properties.keys() == ml.jobs.get(lost).properties.keys()
    assert compute_props(ml, emulator).node_state_counts.preempted_node_count == 2  # the only evidence


def test_capacity_lost_job_can_outlive_its_nodes_for_a_while(emulator: Emulator, azureml_conn: dict[str, Any]) -> None:
    ml = setup_workspace(AzureMLHook())
    write_heart_csvs(emulator.datastore_path("inputs/later"), files=40, rows_per_file=3)
    # The reads after the preemption must be answered before the service's cancel (0.5 s later): a busy
    # machine can take longer, and such reads prove nothing, so the case runs again with the delay doubled.
    delay, case = 0.5, 0
    while True:
        emulator.set_behaviour(capacity_cancel_after_seconds=delay, preempted_node_release_seconds=5)
        name = invoke(ml, "inputs/later", f"job-lost-later-{case}")
        wait_status(emulator, name, "Running")
        until(
            lambda: (
                (p := compute_props(ml, emulator)).current_node_count == 2
                and p.node_state_counts.preempted_node_count == 0
            ),
            "the job's nodes",
        )
        preempted = time.monotonic()
        assert emulator.preempt_cluster(CLUSTER, form="canceled") == [name]
        status, props = status_of(ml, name), compute_props(ml, emulator)
        if time.monotonic() - preempted < delay:
            break
        assert delay < 60, "never read the job within the delay of its cancel"
        assert wait_terminal(ml, name) == "Canceled"
        delay, case = delay * 2, case + 1
    assert status == "Running"  # its nodes are gone, the service has not ended it yet
    assert props.node_state_counts.preempted_node_count == 2
    assert wait_terminal(ml, name) == "Canceled"


def test_preemption_failure_text_is_azures(emulator: Emulator, azureml_conn: dict[str, Any]) -> None:
    ml = setup_workspace(AzureMLHook())
    write_heart_csvs(emulator.datastore_path("inputs/pf"), files=40, rows_per_file=3)
    name = invoke(ml, "inputs/pf", "job-preempt-failed")
    wait_status(emulator, name, "Running")
    emulator.preempt_cluster(CLUSTER, form="failed")
    assert wait_terminal(ml, name) == "Failed"
    assert run_history(ml, name).error.error.message == PREEMPTION_ERROR_MESSAGE


# ---------------------------------------------------- 5. faults after commit
def _job_count(emulator: Emulator) -> int:
    return len(emulator.jobs())


@pytest.mark.parametrize("kind", ["drop", "status"])
def test_invoke_response_lost_after_commit(emulator: Emulator, azureml_conn: dict[str, Any], kind: str) -> None:
    from azure.core.exceptions import HttpResponseError

    ml = setup_workspace(AzureMLHook())
    write_heart_csvs(emulator.datastore_path("inputs/lost-response"), files=2, rows_per_file=3)
    emulator.add_fault(kind=kind, status=500, when="after", route="invoke")
    with pytest.raises(HttpResponseError) as excinfo:  # the SDK retries; the service answers 409 for the name
        invoke(ml, "inputs/lost-response", "job-lost-response")
    assert excinfo.value.status_code == 409
    assert [j.name for j in emulator.jobs()] == ["job-lost-response"]  # the work was done, exactly once
    posts = [r for r in emulator.requests() if r["method"] == "POST" and r["path"].endswith("/jobs")]
    assert posts[0].get("fault") == f"{kind}-after"
    assert wait_terminal(ml, "job-lost-response") == "Completed"


def test_invoke_without_a_name_after_lost_response_duplicates(emulator: Emulator, azureml_conn: dict[str, Any]) -> None:
    """The SDK's own retry of a lost invoke creates a second job unless the caller fixed the name (#31166)."""
    from azure.ai.ml import Input

    ml = setup_workspace(AzureMLHook())
    write_heart_csvs(emulator.datastore_path("inputs/noname"), files=1, rows_per_file=3)
    emulator.add_fault(kind="drop", when="after", route="invoke")
    ml.batch_endpoints.invoke(
        endpoint_name=ENDPOINT,
        deployment_name=DEPLOYMENT,
        inputs={
            "heart_dataset": Input(
                type="uri_folder", path="azureml://datastores/workspaceblobstore/paths/inputs/noname/"
            )
        },
    )
    assert _job_count(emulator) == 2


@pytest.mark.parametrize("kind", ["drop", "status"])
def test_command_job_put_lost_after_commit(emulator: Emulator, azureml_conn: dict[str, Any], kind: str) -> None:
    ml = setup_workspace(AzureMLHook())
    emulator.add_fault(kind=kind, status=503, when="after", route="job_put")
    job = ml.jobs.create_or_update(command_job("cmd-lost"))  # PUT is idempotent: the retry returns the job
    assert job.name == "cmd-lost"
    puts = [r for r in emulator.requests() if r["method"] == "PUT" and r["path"].endswith("/jobs/cmd-lost")]
    assert puts[0].get("fault") == f"{kind}-after" and puts[-1]["status"] == 200
    assert [j.name for j in emulator.jobs()] == ["cmd-lost"]


@pytest.mark.parametrize("kind", ["drop", "status"])
def test_compute_put_lost_after_commit(emulator: Emulator, azureml_conn: dict[str, Any], kind: str) -> None:
    from azure.ai.ml.entities import AmlCompute

    ml = AzureMLHook().get_conn()
    emulator.add_fault(kind=kind, status=503, when="after", route="compute_put")
    ml.compute.begin_create_or_update(
        AmlCompute(name="spot", size="STANDARD_DS3_V2", tier="low_priority", max_instances=1)
    ).result()
    puts = [r for r in emulator.requests() if r["method"] == "PUT" and r["path"].endswith("/computes/spot")]
    assert puts[0].get("fault") == f"{kind}-after"
    assert ml.compute.get("spot").tier == "low_priority"


@pytest.mark.parametrize("kind", ["drop", "status"])
def test_cancel_lost_after_commit(emulator: Emulator, azureml_conn: dict[str, Any], kind: str) -> None:
    from azure.core.exceptions import AzureError

    ml = setup_workspace(AzureMLHook())
    write_heart_csvs(emulator.datastore_path("inputs/c"), files=40, rows_per_file=3)
    name = invoke(ml, "inputs/c", "job-cancel-lost-response")
    wait_status(emulator, name, "Running")
    emulator.add_fault(kind=kind, status=500, when="after", route="cancel")
    with contextlib.suppress(AzureError):  # the caller may or may not see an error: the cancel happened
        ml.jobs.begin_cancel(name).result()
    assert wait_terminal(ml, name) == "Canceled"
    cancels = [r for r in emulator.requests() if r["path"].endswith(f"/jobs/{name}/cancel")]
    assert cancels[0].get("fault") == f"{kind}-after"


def test_after_commit_fault_from_the_control_api(emulator: Emulator, azureml_conn: dict[str, Any]) -> None:
    from azure.core.exceptions import HttpResponseError

    ml = setup_workspace(AzureMLHook())
    write_heart_csvs(emulator.datastore_path("inputs/ctl"), files=1, rows_per_file=3)
    control(
        emulator, "POST", "/_emulator/faults", {"kind": "status", "status": 503, "when": "after", "route": "invoke"}
    )
    with pytest.raises(HttpResponseError):
        invoke(ml, "inputs/ctl", "job-ctl")
    assert [j.name for j in emulator.jobs()] == ["job-ctl"]


# ------------------------------------------------- 6. requested name ignored
def test_deployment_can_ignore_the_requested_job_name(emulator: Emulator, azureml_conn: dict[str, Any]) -> None:
    from azure.core.exceptions import ResourceNotFoundError

    ml = setup_workspace(AzureMLHook())
    write_heart_csvs(emulator.datastore_path("inputs/rename"), files=1, rows_per_file=3)
    emulator.set_deployment_behaviour(ENDPOINT, DEPLOYMENT, ignore_job_name=True)
    first = invoke(ml, "inputs/rename", "wanted-name")
    second = invoke(ml, "inputs/rename", "wanted-name")  # no 409: the name was never used
    assert "wanted-name" not in (first, second) and first != second
    with pytest.raises(ResourceNotFoundError):
        ml.jobs.get("wanted-name")
    assert wait_terminal(ml, first) == "Completed"
    control(
        emulator,
        "POST",
        f"/_emulator/batchEndpoints/{ENDPOINT}/deployments/{DEPLOYMENT}/behaviour",
        {"ignore_job_name": False},
    )
    assert invoke(ml, "inputs/rename", "wanted-name") == "wanted-name"


# ---------------------------------------------------------- 7. immutable jobs
def command_job(name: str, command_line: str = "echo hello", tags: dict[str, str] | None = None) -> Any:
    from azure.ai.ml import command

    return command(
        name=name,
        command=command_line,
        environment="azureml:AzureML-sklearn-1.5@latest",
        compute=CLUSTER,
        display_name=name,
        experiment_name="behaviour",
        tags=tags or {},
    )


def test_command_job_put_is_immutable(emulator: Emulator, azureml_conn: dict[str, Any]) -> None:
    from azure.core.exceptions import HttpResponseError

    ml = setup_workspace(AzureMLHook())
    ml.jobs.create_or_update(command_job("cmd-immutable", tags={"a": "1"}))
    again = ml.jobs.create_or_update(command_job("cmd-immutable", tags={"a": "1"}))  # identical: the job
    assert again.name == "cmd-immutable"
    retagged = ml.jobs.create_or_update(command_job("cmd-immutable", tags={"a": "1", "b": "2"}))
    assert retagged.tags == {"a": "1", "b": "2"}  # tags are mutable
    with pytest.raises(HttpResponseError) as excinfo:
        ml.jobs.create_or_update(command_job("cmd-immutable", command_line="echo changed"))
    assert excinfo.value.status_code == 400
    assert "A job with this name already exists" in str(excinfo.value)
    assert "Only description, tags, displayName, properties, and isArchived can be updated" in str(excinfo.value)
    assert ml.jobs.get("cmd-immutable").command == "echo hello"


# -------------------------------------------------------------- 8. stalls
def test_stalled_job_goes_not_responding_then_completes(emulator: Emulator, azureml_conn: dict[str, Any]) -> None:
    ml = setup_workspace(AzureMLHook())
    emulator.set_behaviour(stall_seconds=0.5)
    write_heart_csvs(emulator.datastore_path("inputs/stall"), files=6, rows_per_file=3)
    name = invoke(ml, "inputs/stall", "job-stall")
    until(lambda: status_of(ml, name) == "NotResponding", "NotResponding")
    assert wait_terminal(ml, name) == "Completed"
    assert sorted(prediction_ids(emulator, name)) == sorted(input_ids(emulator.datastore_path("inputs/stall")))


def test_one_job_stalled_from_the_control_api(emulator: Emulator, azureml_conn: dict[str, Any]) -> None:
    ml = setup_workspace(AzureMLHook())
    emulator.hold_cluster(CLUSTER)  # the job's end (0.2 s after it runs) waits until the stall was read
    job = ml.jobs.create_or_update(command_job("cmd-stall"))
    until(lambda: status_of(ml, job.name) == "Running", "Running")
    # the read must be answered within the stall (0.5 s): a later one proves nothing, so stall again, longer
    seconds = 0.5
    while True:
        asked = time.monotonic()
        control(emulator, "POST", "/_emulator/jobs/cmd-stall/stall", {"seconds": seconds})
        status = status_of(ml, job.name)
        if time.monotonic() - asked < seconds:
            break
        assert seconds < 60, "never read the job within its stall"
        until(lambda: status_of(ml, job.name) == "Running", "Running again")
        seconds *= 2
    emulator.hold_cluster(CLUSTER, held=False)
    assert status == "NotResponding"
    assert wait_terminal(ml, job.name) == "Completed"


# ----------------------------------------------------- 9. deleted computes
def test_deleting_a_compute_fails_its_jobs_and_logs_who(emulator: Emulator, azureml_conn: dict[str, Any]) -> None:
    ml = setup_workspace(AzureMLHook())
    write_heart_csvs(emulator.datastore_path("inputs/del"), files=40, rows_per_file=3)
    name = invoke(ml, "inputs/del", "job-deleted-compute")
    wait_status(emulator, name, "Running")
    ml.compute.begin_delete(CLUSTER).result()
    assert wait_terminal(ml, name) == "Failed"
    deletes = [r for r in emulator.requests() if r["method"] == "DELETE" and r["path"].endswith(f"/computes/{CLUSTER}")]
    assert len(deletes) == 1
    assert deletes[0]["client_id"] == emulator.client_id and deletes[0]["oid"] == emulator.client_id
    assert deletes[0]["t"] > 0 and deletes[0]["status"] == 202


# ----------------------------------------------------- 10. error_threshold
def write_with_bad_files(emulator: Emulator, folder: str, bad: int) -> Path:
    path = emulator.datastore_path(folder)
    write_heart_csvs(path, files=6, rows_per_file=4)
    for index in range(bad):
        write_heart_csvs(path / f"bad{index}", files=1, rows_per_file=4, seed=index + 10, id_prefix=f"bad{index}-")
    return path


def test_error_threshold_default_ignores_failed_files(
    emulator: Emulator, azureml_conn: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ml = setup_workspace(AzureMLHook())
    deploy_model(
        ml, emulator, scoring_module(tmp_path, monkeypatch, "fails_on_bad", FAILS_ON_BAD_FILES), mini_batch_size=1
    )
    path = write_with_bad_files(emulator, "inputs/thr-default", bad=2)
    name = invoke(ml, "inputs/thr-default", "job-thr-default")
    assert wait_terminal(ml, name) == "Completed"
    good = input_ids(path)  # top-level files only: the bad ones are in sub-folders
    assert sorted(prediction_ids(emulator, name)) == sorted(good)


def test_error_threshold_n_fails_once_more_than_n_files_failed(
    emulator: Emulator, azureml_conn: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ml = setup_workspace(AzureMLHook())
    deploy_model(
        ml,
        emulator,
        scoring_module(tmp_path, monkeypatch, "fails_on_bad_n", FAILS_ON_BAD_FILES),
        error_threshold=1,
        mini_batch_size=1,
    )
    write_with_bad_files(emulator, "inputs/thr-one", bad=1)
    within = invoke(ml, "inputs/thr-one", "job-thr-within")
    assert wait_terminal(ml, within) == "Completed"  # 1 failed file is not more than 1
    write_with_bad_files(emulator, "inputs/thr-two", bad=2)
    over = invoke(ml, "inputs/thr-two", "job-thr-over")
    assert wait_terminal(ml, over) == "Failed"
    assert "error threshold" in run_history(ml, over).error.error.message
    assert not emulator.datastore_path(f"azureml/{over}/score/predictions.csv").exists()


# ----------------------------------------------------- 11. a job always ends
@pytest.mark.parametrize(
    ("source", "detail"),
    [
        ("import no_such_package_for_scoring\n", "No module named 'no_such_package_for_scoring'"),
        (
            "def init():\n    raise RuntimeError('model file missing')\n\ndef run(b):\n    return []\n",
            "model file missing",
        ),
    ],
    ids=["import-fails", "init-raises"],
)
def test_scoring_script_failure_fails_the_job(
    emulator: Emulator,
    azureml_conn: dict[str, Any],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    source: str,
    detail: str,
) -> None:
    ml = setup_workspace(AzureMLHook())
    module = scoring_module(tmp_path, monkeypatch, f"broken_{abs(hash(source)) % 10_000}", source)
    deploy_model(ml, emulator, module)
    write_heart_csvs(emulator.datastore_path("inputs/broken"), files=2, rows_per_file=3)
    name = invoke(ml, "inputs/broken", "job-broken")
    assert wait_terminal(ml, name) == "Failed"
    message = run_history(ml, name).error.error.message
    assert "Execution failed. User process" in message and detail in message


def test_output_that_cannot_be_written_fails_the_job(emulator: Emulator, azureml_conn: dict[str, Any]) -> None:
    ml = setup_workspace(AzureMLHook())
    write_heart_csvs(emulator.datastore_path("inputs/out"), files=2, rows_per_file=3)
    emulator.datastore_path("azureml/job-unwritable/score/predictions.csv").mkdir(parents=True)  # a folder in the way
    assert wait_terminal(ml, invoke(ml, "inputs/out", "job-unwritable")) == "Failed"
    assert "predictions.csv" in run_history(ml, "job-unwritable").error.error.message


def test_bad_deployment_setting_is_refused_when_written(emulator: Emulator, azureml_conn: dict[str, Any]) -> None:
    from azure.core.exceptions import HttpResponseError

    ml = setup_workspace(AzureMLHook())
    deployment = ml.batch_deployments.get(name=DEPLOYMENT, endpoint_name=ENDPOINT)
    deployment.error_threshold = -5
    with pytest.raises(HttpResponseError) as excinfo:
        ml.batch_deployments.begin_create_or_update(deployment).result()
    assert excinfo.value.status_code == 400 and "errorThreshold" in str(excinfo.value)


def test_refused_invoke_leaves_no_job(emulator: Emulator, azureml_conn: dict[str, Any]) -> None:
    from azure.ai.ml import Input
    from azure.core.exceptions import HttpResponseError

    ml = setup_workspace(AzureMLHook())
    write_heart_csvs(emulator.datastore_path("inputs/refused"), files=1, rows_per_file=3)
    with pytest.raises(HttpResponseError) as excinfo:
        ml.batch_endpoints.invoke(
            endpoint_name=ENDPOINT,
            deployment_name=DEPLOYMENT,
            inputs={
                "heart_dataset": Input(
                    type="uri_folder", path="azureml://datastores/workspaceblobstore/paths/inputs/refused/"
                )
            },
            job_name="job-refused",
            params_override=[{"mini_batch_size": 0}],
        )
    assert excinfo.value.status_code == 400
    assert emulator.jobs() == []


# ------------------------------------------------------ tags and properties
def test_list_jobs_filters_by_tag_and_invoke_properties(emulator: Emulator, azureml_conn: dict[str, Any]) -> None:
    from azure.ai.ml import Input

    from airflow_azureml.naming import UNIT_TAG

    ml = setup_workspace(AzureMLHook())
    ml.jobs.create_or_update(command_job("cmd-tagged", tags={UNIT_TAG: "unit-1"}))
    ml.jobs.create_or_update(command_job("cmd-untagged"))
    assert [j.name for j in ml.jobs.list(tag=UNIT_TAG)] == ["cmd-tagged"]
    write_heart_csvs(emulator.datastore_path("inputs/props"), files=1, rows_per_file=3)
    ml.batch_endpoints.invoke(
        endpoint_name=ENDPOINT,
        deployment_name=DEPLOYMENT,
        inputs={
            "heart_dataset": Input(
                type="uri_folder", path="azureml://datastores/workspaceblobstore/paths/inputs/props/"
            )
        },
        job_name="job-props",
        # invoke has no tags; its run properties go in params_override (experiment_name= would replace them)
        params_override=[{"properties": {UNIT_TAG: "unit-2", "experimentName": "exp-props"}}],
    )
    job = ml.jobs.get("job-props")
    assert job.properties[UNIT_TAG] == "unit-2" and job.experiment_name == "exp-props"
    assert [j.name for j in ml.jobs.list(properties=f"{UNIT_TAG}=unit-2")] == ["job-props"]
    # Azure tags batch jobs itself (azureml.batchrun ...): a tag search finds them
    assert [j.name for j in ml.jobs.list(tag="azureml.batchrun")] == ["job-props"]


def test_behaviour_api_lists_every_switch(emulator: Emulator) -> None:
    switches = control(emulator, "GET", "/_emulator/behaviour")
    assert switches == emulator.behaviour()
    for key in (
        "preempted_gauge",
        "preempted_node_release_seconds",
        "capacity_cancel_message",
        "capacity_cancel_after_seconds",
        "cancel_requested_seconds",
        "honour_repeatability_id",
        "immutable_jobs",
        "stall_seconds",
        "honour_error_threshold",
        "validate_deployments",
    ):
        assert key in switches
    with pytest.raises(requests.HTTPError):
        control(emulator, "POST", "/_emulator/behaviour", {"no_such_switch": True})


# ------------------------------------------------------- refused before any job
def post_invoke(emulator: Emulator, props: dict[str, Any]) -> requests.Response:
    """The invoke POST exactly as the SDK sends it, with an azure-identity token for the data plane."""
    from tests.integration.test_emulator_protocol import ml_token

    return requests.post(
        f"{emulator.base_url}/inference/batch/{ENDPOINT}/jobs",
        json={"properties": props},
        headers={"Authorization": f"Bearer {ml_token(emulator)}", "azureml-model-deployment": DEPLOYMENT},
        verify=emulator.ca_cert,
        timeout=30,
    )


def arm(emulator: Emulator, method: str, suffix: str, body: Any = None) -> requests.Response:
    """An ARM call on the workspace with an azure-identity token for ARM's audience."""
    from tests.integration.test_emulator_protocol import token, ws_url

    return requests.request(
        method,
        ws_url(emulator, suffix),
        params={"api-version": "2024-10-01"},
        json=body,
        headers={"Authorization": f"Bearer {token(emulator, f'{emulator.base_url}/.default')}"},
        verify=emulator.ca_cert,
        timeout=30,
    )


BAD_FILE_NAMES = ["../../../../x.csv", "/tmp/pwned.csv", "a/b.csv", "a\\b.csv", "..", "x\n.csv", "x" * 256]


@pytest.mark.parametrize("file_name", BAD_FILE_NAMES, ids=range(len(BAD_FILE_NAMES)))
def test_deployment_output_file_name_must_be_a_plain_name(
    emulator: Emulator, azureml_conn: dict[str, Any], file_name: str
) -> None:
    from azure.core.exceptions import HttpResponseError

    ml = setup_workspace(AzureMLHook())
    deployment = ml.batch_deployments.get(name=DEPLOYMENT, endpoint_name=ENDPOINT)
    deployment.output_file_name = file_name
    with pytest.raises(HttpResponseError) as excinfo:
        ml.batch_deployments.begin_create_or_update(deployment).result()
    assert excinfo.value.status_code == 400 and "outputFileName" in str(excinfo.value)
    assert ml.batch_deployments.get(name=DEPLOYMENT, endpoint_name=ENDPOINT).output_file_name != file_name


def test_invoke_output_file_name_override_is_checked_and_leaves_no_job(
    emulator: Emulator, azureml_conn: dict[str, Any], tmp_path: Path
) -> None:
    ml = setup_workspace(AzureMLHook())
    write_heart_csvs(emulator.datastore_path("inputs/fname"), files=1, rows_per_file=3)
    inputs = {
        "heart_dataset": {
            "jobInputType": "uri_folder",
            "uri": "azureml://datastores/workspaceblobstore/paths/inputs/fname/",
        }
    }
    for index, file_name in enumerate(["../../../../x.csv", str(tmp_path / "pwned.csv")]):
        response = post_invoke(emulator, {"name": f"fname-{index}", "inputData": inputs, "outputFileName": file_name})
        assert response.status_code == 400, response.text
        assert (
            response.json()["error"]["code"] == "UserError" and "outputFileName" in response.json()["error"]["message"]
        )
    # a deployment stored while validation was off is refused at invoke, before a job exists
    emulator.set_behaviour(validate_deployments=False)
    deployment = ml.batch_deployments.get(name=DEPLOYMENT, endpoint_name=ENDPOINT)
    deployment.output_file_name = str(tmp_path / "pwned.csv")
    ml.batch_deployments.begin_create_or_update(deployment).result()
    response = post_invoke(emulator, {"name": "fname-stored", "inputData": inputs})
    assert response.status_code == 400, response.text
    assert emulator.jobs() == []
    assert not (tmp_path / "pwned.csv").exists()


@pytest.mark.parametrize(
    ("output_uri", "status"),
    [
        ("azureml://datastores/../paths/x/", 400),
        ("https://example.com/x/", 400),
        ("azureml://datastores/workspaceblobstore/paths/../../x/", 400),
        ("azureml://datastores/nosuchstore/paths/x/", 404),
    ],
    ids=["dotdot-datastore", "not-azureml", "climbs-out", "unknown-datastore"],
)
def test_invoke_with_a_bad_output_leaves_no_job(
    emulator: Emulator, azureml_conn: dict[str, Any], output_uri: str, status: int
) -> None:
    setup_workspace(AzureMLHook())
    write_heart_csvs(emulator.datastore_path("inputs/badout"), files=1, rows_per_file=3)
    inputs = {
        "heart_dataset": {
            "jobInputType": "uri_folder",
            "uri": "azureml://datastores/workspaceblobstore/paths/inputs/badout/",
        }
    }
    outputs = {"score": {"jobOutputType": "uri_folder", "uri": output_uri}}
    response = post_invoke(emulator, {"name": "job-badout", "inputData": inputs, "outputData": outputs})
    assert response.status_code == status, response.text
    assert response.json()["error"]["code"] == "UserError"
    assert emulator.jobs() == []
    assert sorted(p.name for p in (emulator.data_dir / "datastores").iterdir()) == ["workspaceblobstore"]


def test_invoke_into_an_unknown_input_datastore_creates_nothing(
    emulator: Emulator, azureml_conn: dict[str, Any]
) -> None:
    setup_workspace(AzureMLHook())
    inputs = {"heart_dataset": {"jobInputType": "uri_folder", "uri": "azureml://datastores/nosuchstore/paths/in/"}}
    response = post_invoke(emulator, {"name": "job-noinput", "inputData": inputs})
    assert response.status_code == 404, response.text
    assert emulator.jobs() == []
    assert not (emulator.data_dir / "datastores" / "nosuchstore").exists()


def test_output_into_a_registered_datastore_folder_works(emulator: Emulator, azureml_conn: dict[str, Any]) -> None:
    ml = setup_workspace(AzureMLHook())
    write_heart_csvs(emulator.datastore_path("inputs/otherds"), files=1, rows_per_file=3)
    (emulator.data_dir / "datastores" / "otherstore").mkdir()
    inputs = {
        "heart_dataset": {
            "jobInputType": "uri_folder",
            "uri": "azureml://datastores/workspaceblobstore/paths/inputs/otherds/",
        }
    }
    outputs = {"score": {"jobOutputType": "uri_folder", "uri": "azureml://datastores/otherstore/paths/out/"}}
    response = post_invoke(emulator, {"name": "job-otherds", "inputData": inputs, "outputData": outputs})
    assert response.status_code == 201, response.text  # batch_endpoint.invoke: Azure answers 201
    assert wait_terminal(ml, "job-otherds") == "Completed"
    assert (emulator.data_dir / "datastores" / "otherstore" / "out" / "predictions.csv").is_file()


@pytest.mark.parametrize(
    "job_name", ["bad name/with..slash", "-leading-dash", "_leading_underscore", "dots.in.name", "x" * 256, "ünï"]
)
def test_invoke_refuses_a_job_name_azure_refuses(
    emulator: Emulator, azureml_conn: dict[str, Any], job_name: str
) -> None:
    setup_workspace(AzureMLHook())
    write_heart_csvs(emulator.datastore_path("inputs/jobname"), files=1, rows_per_file=3)
    inputs = {
        "heart_dataset": {
            "jobInputType": "uri_folder",
            "uri": "azureml://datastores/workspaceblobstore/paths/inputs/jobname/",
        }
    }
    response = post_invoke(emulator, {"name": job_name, "inputData": inputs})
    assert response.status_code == 400, response.text
    assert response.json()["error"]["code"] == "UserError"
    assert emulator.jobs() == []


def test_pipeline_component_deployment_ignores_the_job_name_by_default(
    emulator: Emulator, azureml_conn: dict[str, Any]
) -> None:
    ml = setup_workspace(AzureMLHook())
    write_heart_csvs(emulator.datastore_path("inputs/pcd"), files=1, rows_per_file=3)
    suffix = f"/batchEndpoints/{ENDPOINT}/deployments/{DEPLOYMENT}"
    body = arm(emulator, "GET", suffix).json()
    body["properties"]["deploymentConfiguration"] = {
        "deploymentConfigurationType": "PipelineComponent",
        "componentId": {"referenceType": "Id", "assetId": "azureml:score_pipeline:1"},
    }
    put = arm(emulator, "PUT", suffix, {k: body[k] for k in ("location", "properties") if k in body})
    assert put.status_code in (200, 201), put.text
    name = invoke(ml, "inputs/pcd", "wanted-pcd")
    assert name != "wanted-pcd"  # issue 32763: the service chose its own name
    assert wait_terminal(ml, name) == "Completed"
    emulator.set_deployment_behaviour(ENDPOINT, DEPLOYMENT, ignore_job_name=False)  # the explicit switch wins
    assert invoke(ml, "inputs/pcd", "wanted-pcd") == "wanted-pcd"


def poll_statuses(ml: Any, name: str, timeout: float = 60) -> list[str]:
    """The distinct statuses a poller sees, in order, until the job ends."""
    seen: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = status_of(ml, name)
        if not seen or seen[-1] != status:
            seen.append(status)
        if status in ("Completed", "Failed", "Canceled"):
            return seen
    raise AssertionError(f"job {name} did not end; saw {seen}")
