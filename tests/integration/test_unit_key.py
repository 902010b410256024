"""The default unit-of-work key (issue 18 §4): what the deployment runs, and the run's data interval.

A clear after a model update scores again (the old model's completed job is not this work); a clear
without one finds the finished checkpoint; a fixed input path such as ``latest/`` is new work in each
data interval. The invoke DAG runs in ``dag.test()`` with the real SDK against the emulator.
"""

from __future__ import annotations

import pendulum

from airflow_azureml.emulator import Emulator
from airflow_azureml.hooks import AzureMLHook
from tests.conftest import load_dag, xcom_value
from tests.integration import test_exactly_once as exactly_once
from tests.integration.test_exactly_once import clear_and_rerun

workspace = exactly_once.workspace  # the fixtures: a workspace with the example's data, a case of the invoke DAG
run_case = exactly_once.run_case


def new_model_version(emulator: Emulator) -> None:
    """A person registers version 2 of the deployment's model and points the deployment at it."""
    emulator.register_model("heart-classifier", "2", scoring_module="airflow_azureml.emulator.scoring.heart")
    ml = AzureMLHook().get_conn()
    deployment = ml.batch_deployments.get(name="classifier-xgboost", endpoint_name="heart-classifier-batch")
    deployment.model = "azureml:heart-classifier:2"
    ml.batch_deployments.begin_create_or_update(deployment).result()


def test_a_clear_after_a_model_update_scores_again(workspace: Emulator, run_case) -> None:
    run, failures = run_case()
    assert str(run.state) == "success", failures
    first = xcom_value(run, "invoke")["job_name"]
    again, failures = run_case(dag_run=run)  # cleared, same model: the finished checkpoint, no new job
    assert str(again.state) == "success", failures
    assert [j.name for j in workspace.jobs()] == [first]
    new_model_version(workspace)
    cleared, failures = run_case(dag_run=run)
    assert str(cleared.state) == "success", failures
    jobs = sorted(workspace.jobs(), key=lambda j: j.created)
    assert len(jobs) == 2 and jobs[0].name == first, [j.name for j in jobs]
    assert xcom_value(cleared, "invoke")["job_name"] == jobs[1].name
    assert jobs[1].status == "Completed"


def test_a_fixed_input_path_is_new_work_in_each_interval(workspace: Emulator, run_case) -> None:
    """An input path with no date in it (``in/20261101`` for every run, as ``latest/`` would be): two
    intervals, two jobs; the first interval run again, none."""
    fixed = {"inputs": {"heart_dataset": f"azureml://datastores/workspaceblobstore/paths/{exactly_once.INPUT}/"}}
    run, failures = run_case(fixed)
    assert str(run.state) == "success", failures
    dag = load_dag("azureml_operator_cases.py", "azureml_invoke_case")
    next_day = dag.test(logical_date=pendulum.datetime(2026, 11, 2, tz="UTC"))
    assert str(next_day.state) == "success"
    assert len(workspace.jobs()) == 2
    rerun = clear_and_rerun(load_dag("azureml_operator_cases.py", "azureml_invoke_case"), run)
    assert str(rerun.state) == "success"
    assert len(workspace.jobs()) == 2
