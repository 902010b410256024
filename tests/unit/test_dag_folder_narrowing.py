"""The test harness's narrowing of the DAG folder (tests/conftest.py, ``show_only_loaded_dag_files``): Airflow's own
parse of the folder sees the loaded file alone, and every test starts with the whole folder again."""

from __future__ import annotations

from typing import Any

from tests import conftest


def parsed_dag_ids() -> set[str]:
    try:
        from airflow.dag_processing.dagbag import DagBag
    except ImportError:  # Airflow 3.1 keeps the DAG bag in airflow.models
        from airflow.models.dagbag import DagBag  # type: ignore[no-redef]
    bag: Any = DagBag(dag_folder=str(conftest.DAGS_FOLDER))  # AIRFLOW__CORE__LOAD_EXAMPLES is False here
    return set(bag.dag_ids)


def test_the_folder_parse_sees_only_the_loaded_file() -> None:
    conftest.show_only_loaded_dag_files("low_priority_batch_scoring.py")
    assert parsed_dag_ids() == {"low_priority_batch_scoring"}
    conftest.show_only_loaded_dag_files("example_asset_chain.py")  # a second file of the same test joins it
    assert {"low_priority_batch_scoring", "example_asset_etl", "example_asset_scoring"} <= parsed_dag_ids()
    assert "azureml_capacity_teardown" not in parsed_dag_ids()


def test_each_test_starts_with_the_whole_folder() -> None:
    original = (conftest.REPO / "dags" / ".airflowignore").read_text()
    assert (conftest.DAGS_FOLDER / ".airflowignore").read_text() == original
    assert {"low_priority_batch_scoring", "example_asset_etl", "azureml_capacity_teardown"} <= parsed_dag_ids()
