"""Capacity sizing and the delete operator's busy rules (pure: no Azure, no Airflow API)."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from airflow_azureml.capacity import (
    busy_reasons,
    capacity_pool_name,
    check_if_busy,
    check_pool_name,
    check_queue_ahead,
    jobs_on_cluster,
    node_counts,
    pool_slots,
)
from airflow_azureml.exceptions import AzureMLConfigError
from airflow_azureml.operators import AzureMLDeleteComputeOperator, AzureMLSyncCapacityPoolOperator

REPO = Path(__file__).resolve().parents[2]
CONFIG = REPO / "dags" / "azureml"


@pytest.mark.parametrize(
    ("max_instances", "instance_count", "slots"),
    [(4, 1, 4), (4, 2, 2), (5, 2, 2), (2, 2, 1), (60, 4, 15)],
)
def test_slots_are_the_jobs_that_fit_at_once(max_instances: int, instance_count: int, slots: int) -> None:
    assert pool_slots(max_instances, instance_count) == slots


def test_a_job_larger_than_the_cluster_is_a_config_error() -> None:
    with pytest.raises(AzureMLConfigError, match=r"instance_count 3 can never run on cluster 'c'.*at most 2"):
        pool_slots(2, 3, cluster="cluster 'c'")


@pytest.mark.parametrize("bad", [0, -1, True, "2", 1.5, None])
def test_counts_must_be_positive_integers(bad: Any) -> None:
    with pytest.raises(AzureMLConfigError, match="positive integer"):
        pool_slots(bad, 1)
    with pytest.raises(AzureMLConfigError, match="positive integer"):
        pool_slots(4, bad)


def test_pool_names() -> None:
    assert capacity_pool_name("low-pri-cluster") == "azureml_capacity_low-pri-cluster"
    assert check_pool_name("azureml_capacity_low-pri-cluster") == "azureml_capacity_low-pri-cluster"
    for bad in ("", "a b", "a/b", "x" * 257, None, 3):
        with pytest.raises(AzureMLConfigError, match="pool_name"):
            check_pool_name(bad)


def test_example_yaml_sizes_the_pool() -> None:
    """The cluster YAML the example creates (max_instances 2) and its deployment (instance_count 2): 1 job."""
    op = AzureMLSyncCapacityPoolOperator(
        task_id="pool", compute=str(CONFIG / "low-pri-cluster.yml"), deployment=str(CONFIG / "deployment.yml")
    )
    assert op.sizing() == ("low-pri-cluster", 2, 2)
    op = AzureMLSyncCapacityPoolOperator(task_id="pool", compute=str(CONFIG / "low-pri-cluster.yml"))
    assert op.sizing() == ("low-pri-cluster", 2, 1)  # no deployment, no instance_count: Azure's default, 1
    op = AzureMLSyncCapacityPoolOperator(
        task_id="pool", compute=str(CONFIG / "low-pri-cluster.yml"), deployment=str(CONFIG / "deployment.yml"),
        instance_count="1",  # a rendered template overrides the deployment's
    )  # fmt: skip
    assert op.sizing() == ("low-pri-cluster", 2, 1)
    assert AzureMLSyncCapacityPoolOperator(task_id="pool", compute="azureml:spot").sizing() == ("spot", 0, 1)


def test_deployment_on_another_cluster_is_refused() -> None:
    op = AzureMLSyncCapacityPoolOperator(
        task_id="pool", compute=str(CONFIG / "low-pri-cluster.yml"), deployment=str(CONFIG / "deployment-dedicated.yml")
    )
    with pytest.raises(AzureMLConfigError, match="sized for the wrong cluster"):
        op.sizing()


def assert_refused_before_any_call(op: AzureMLSyncCapacityPoolOperator, match: str) -> None:
    """``execute`` raises ``AzureMLConfigError`` before it touches Azure (the hook) or Airflow (the pools hook)."""
    with (
        mock.patch.object(AzureMLSyncCapacityPoolOperator, "hook", new_callable=mock.PropertyMock) as hook,
        mock.patch("airflow_azureml.hooks.airflow_pools.AirflowPoolsHook") as pools,
        pytest.raises(AzureMLConfigError, match=match),
    ):
        op.execute({})
    hook.assert_not_called()
    pools.assert_not_called()


def test_bad_sizing_fails_before_any_call() -> None:
    op = AzureMLSyncCapacityPoolOperator(task_id="pool", compute=str(CONFIG / "low-pri-cluster.yml"), instance_count=3)
    assert_refused_before_any_call(op, "can never run")


def test_queue_ahead_is_a_small_whole_number_checked_before_any_call() -> None:
    assert [check_queue_ahead(v) for v in (0, 1, "2", " 3 ", 8)] == [0, 1, 2, 3, 8]
    for bad in (-1, 9, 1.5, True, "one", None, "1.0", "\u00b2", "\u0663"):  # "²" and Arabic-Indic 3 are no count
        with pytest.raises(AzureMLConfigError, match="queue_ahead must be a whole number from 0 to 8"):
            check_queue_ahead(bad)
    with pytest.raises(AzureMLConfigError, match="queue_ahead"):
        AzureMLSyncCapacityPoolOperator(task_id="pool", compute="azureml:spot", queue_ahead=-1)
    templated = AzureMLSyncCapacityPoolOperator(task_id="pool", compute="azureml:spot", queue_ahead="{{ x }}")
    templated.queue_ahead = "many"  # rendered to something that is no count: refused before any call
    assert_refused_before_any_call(templated, "queue_ahead")


def test_template_fields_rendered_later_are_checked_when_the_task_runs() -> None:
    """A Jinja template (``{{ }}`` or ``{% %}``) or another task's XComArg is its value only once rendered."""
    from airflow.providers.standard.operators.empty import EmptyOperator
    from airflow.sdk import DAG

    with DAG("capacity_templates", schedule=None):
        upstream = EmptyOperator(task_id="upstream")
        for index, later in enumerate([upstream.output, "{% if true %}1{% endif %}", "{{ var.value.ahead }}"]):
            op = AzureMLSyncCapacityPoolOperator(task_id=f"pool{index}", compute="azureml:spot", queue_ahead=later)
            assert op.queue_ahead is later
            assert AzureMLDeleteComputeOperator(task_id=f"delete{index}", name="c1", if_busy=later).if_busy is later


def test_the_pool_gets_capacity_plus_queue_ahead_slots() -> None:
    """max_instances 2 // instance_count 2 = 1 job, + queue_ahead 2 = 3 slots, written with a description
    that says so (Airflow's side mocked: tests/integration/test_capacity.py writes a real pool)."""
    op = AzureMLSyncCapacityPoolOperator(
        task_id="pool", compute=str(CONFIG / "low-pri-cluster.yml"), deployment=str(CONFIG / "deployment.yml"),
        queue_ahead="2",  # as rendered from a template
    )  # fmt: skip
    with mock.patch("airflow_azureml.hooks.airflow_pools.AirflowPoolsHook") as hook:
        pools = hook.return_value
        pools.get_pool.return_value = None
        pools.create_pool.return_value = {"name": "azureml_capacity_low-pri-cluster"}
        got = op.execute({})
    assert got == {
        "pool": "azureml_capacity_low-pri-cluster", "slots": 3, "cluster": "low-pri-cluster", "queue_ahead": 2,
        "written": True,
    }  # fmt: skip
    (call,) = pools.create_pool.call_args_list
    assert call.args[0] == "azureml_capacity_low-pri-cluster" and call.kwargs["slots"] == 3
    assert "max_instances 2 // instance_count 2 + queue_ahead 2" in call.kwargs["description"]


def test_if_busy_values() -> None:
    assert [check_if_busy(v) for v in ("skip", "wait", "delete")] == ["skip", "wait", "delete"]
    with pytest.raises(AzureMLConfigError, match="if_busy must be one of"):
        check_if_busy("force")
    assert AzureMLDeleteComputeOperator(task_id="d", name="c1").if_busy == "skip"  # the default keeps jobs alive
    with pytest.raises(AzureMLConfigError, match="if_busy"):
        AzureMLDeleteComputeOperator(task_id="d", name="c1", if_busy="never")


def test_templated_if_busy_is_checked_before_any_call() -> None:
    op = AzureMLDeleteComputeOperator(task_id="d", name="c1", if_busy="{{ params.if_busy }}")
    assert "if_busy" in op.template_fields
    op.if_busy = "kill"  # as rendered
    with (
        mock.patch.object(AzureMLDeleteComputeOperator, "hook", new_callable=mock.PropertyMock) as hook,
        pytest.raises(AzureMLConfigError, match="if_busy must be one of"),
    ):
        op.execute({})
    hook.assert_not_called()


def compute_doc(**counts: int) -> dict[str, Any]:
    return {"properties": {"properties": {"nodeStateCounts": counts}}}


def job(name: str, status: str, compute: str | None = None, **batch: str) -> dict[str, Any]:
    props: dict[str, Any] = {"status": status, "computeId": compute}
    if batch:
        props["tags"] = {"azureml.deploymentname": batch["deployment"]}
        props["properties"] = {"azureml.endpointname": batch["endpoint"]}
    return {"name": name, "properties": props}


WS = "/subscriptions/s/resourceGroups/r/providers/Microsoft.MachineLearningServices/workspaces/w"


def test_jobs_on_the_cluster_by_compute_id_or_by_deployment() -> None:
    jobs = [
        job("running", "Running", f"{WS}/computes/Low-Pri-Cluster"),  # ARM names are not case-sensitive
        job("queued", "Queued", f"{WS}/computes/low-pri-cluster"),
        job("done", "Completed", f"{WS}/computes/low-pri-cluster"),
        job("other", "Running", f"{WS}/computes/dedicated-pool"),
        job("batch", "Preparing", None, endpoint="ep", deployment="spot"),  # Azure leaves computeId null
        job("batch-dedicated", "Running", None, endpoint="ep", deployment="dedicated"),
        job("unknown-deployment", "Running", None, endpoint="ep", deployment="gone"),
    ]
    computes = {("ep", "spot"): "azureml:low-pri-cluster", ("ep", "dedicated"): f"{WS}/computes/dedicated-pool"}
    found = jobs_on_cluster(jobs, "low-pri-cluster", lambda e, d: computes.get((e, d)))
    assert found == [("running", "Running"), ("queued", "Queued"), ("batch", "Preparing")]


def test_busy_reasons() -> None:
    assert node_counts(compute_doc(runningNodeCount=2, idleNodeCount=1)) == {"runningNodeCount": 2, "idleNodeCount": 1}
    assert node_counts({"properties": {}}) == {}
    assert busy_reasons(node_counts(compute_doc(idleNodeCount=2)), []) == []  # idle nodes run no job
    assert busy_reasons({"runningNodeCount": 2}, []) == [
        "2 node(s) running jobs and 0 being prepared (nodeStateCounts)"
    ]
    assert busy_reasons({"preparingNodeCount": 1}, []) != []
    reasons = busy_reasons({}, [("j1", "Queued")])  # a queued job holds no node: only the LIST shows it
    assert reasons == ["1 job(s) not ended on it: j1 (Queued)"]


@pytest.mark.parametrize(
    ("conn", "base"),
    [
        ({"conn_type": "http", "host": "http://airflow-api:8080/"}, "http://airflow-api:8080"),
        ({"conn_type": "http", "host": "airflow-api", "port": 8080, "schema": "https"}, "https://airflow-api:8080"),
        ({"conn_type": "generic", "host": "airflow-api"}, "http://airflow-api"),
    ],
)
def test_the_api_connection(monkeypatch: pytest.MonkeyPatch, conn: dict[str, Any], base: str) -> None:
    import json

    from airflow_azureml.hooks.airflow_pools import AirflowPoolsHook

    monkeypatch.setenv("AIRFLOW_CONN_AIRFLOW_API", json.dumps({**conn, "login": "u", "password": "p"}))
    assert AirflowPoolsHook().base_url() == (base, "u", "p", True)


def test_a_missing_or_hostless_api_connection_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    from airflow_azureml.hooks.airflow_pools import AirflowPoolsHook

    monkeypatch.delenv("AIRFLOW_CONN_NO_SUCH_API", raising=False)
    with pytest.raises(AzureMLConfigError, match=r"'no_such_api'.*is not defined"):
        AirflowPoolsHook("no_such_api").base_url()
    monkeypatch.setenv("AIRFLOW_CONN_AIRFLOW_API", json.dumps({"conn_type": "http", "login": "u"}))
    with pytest.raises(AzureMLConfigError, match="has no host"):
        AirflowPoolsHook().base_url()
