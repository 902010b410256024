"""``AZUREML_DATASTORE_ROOT`` of the example DAGs: Azure's ``abfs://container@account...`` form (no network)."""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest


def conn_id(path: object) -> str | None:
    """The path's connection id: an attribute from Airflow 3.2 (universal-pathlib 0.3), a storage option in 3.1."""
    if hasattr(path, "conn_id"):
        return path.conn_id  # type: ignore[attr-defined]
    return path.storage_options.get("conn_id")  # type: ignore[attr-defined]


def container(path: object) -> str:
    """The container the filesystem is given: the first part of ``path.path`` (on Airflow 3.1 the
    ``bucket`` property shows the URL's netloc, ``conn_id@container``, while ``path`` is right)."""
    return path.path.split("/", 1)[0]  # type: ignore[attr-defined]


@pytest.fixture
def ep() -> ModuleType:
    """The DAGs' shared module, importable as Airflow makes it (tests/conftest.py puts the DAG folder on the path)."""
    import example_partitions

    return example_partitions


def test_airflow_alone_reads_the_container_as_a_connection_id() -> None:
    """Why the root is parsed: ObjectStoragePath takes ``container@`` as a conn id and drops the account."""
    from airflow.sdk import ObjectStoragePath

    naive = ObjectStoragePath("abfs://data@myaccount.dfs.core.windows.net/scoring")
    assert conn_id(naive) == "data"
    assert "myaccount" not in str(naive)  # the account is gone


def test_the_azure_form_names_container_path_and_the_storage_connection(
    ep: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AZUREML_DATASTORE_ROOT", "abfs://data@myaccount.dfs.core.windows.net/blobstore/")
    monkeypatch.setenv("AZUREML_STORAGE_CONN_ID", "my_adls")
    path = ep.storage("scoring/input/x")
    assert conn_id(path) == "my_adls"
    assert path.protocol == "abfs"
    assert container(path) == "data"
    assert path.key == "blobstore/scoring/input/x"


def test_abfss_and_no_prefix(ep: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AZUREML_DATASTORE_ROOT", "abfss://data@myaccount.dfs.core.windows.net")
    monkeypatch.setenv("AZUREML_STORAGE_CONN_ID", "my_adls")
    path = ep.storage("a/b")
    assert (path.protocol, container(path), path.key, conn_id(path)) == ("abfss", "data", "a/b", "my_adls")


def test_the_azure_form_without_a_storage_connection_is_a_clear_error(
    ep: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AZUREML_DATASTORE_ROOT", "abfs://data@myaccount.dfs.core.windows.net")
    monkeypatch.delenv("AZUREML_STORAGE_CONN_ID", raising=False)
    with pytest.raises(ValueError, match="AZUREML_STORAGE_CONN_ID") as err:
        ep.storage("a")
    assert "myaccount" in str(err.value)


def test_airflow_s_own_form_and_local_folders_pass_through(
    ep: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("AZUREML_DATASTORE_ROOT", "abfs://my_adls@data/blobstore")
    monkeypatch.delenv("AZUREML_STORAGE_CONN_ID", raising=False)
    path = ep.storage("a")
    assert (conn_id(path), container(path), path.key) == ("my_adls", "data", "blobstore/a")

    monkeypatch.setenv("AZUREML_DATASTORE_ROOT", f"file://{tmp_path}")
    local = ep.storage("a/b.txt")
    assert conn_id(local) is None and local.path == f"{tmp_path}/a/b.txt"


def test_no_root_fails_before_anything_is_written(
    ep: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A forgotten AZUREML_DATASTORE_ROOT must not send the data to the worker's own disk, where no Azure ML
    job reads it: there is no default, and extract fails before it writes a file."""
    monkeypatch.delenv("AZUREML_DATASTORE_ROOT", raising=False)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match=r"AZUREML_DATASTORE_ROOT is not set.*Nothing was written"):
        ep.write_partitions("scoring", "20261128T0000", 1, partitions=2, files=1, rows=2)
    assert list(tmp_path.iterdir()) == []
    monkeypatch.setenv("AZUREML_DATASTORE_ROOT", "  ")
    with pytest.raises(ValueError, match="AZUREML_DATASTORE_ROOT is not set"):
        ep.storage("scoring/input")


def test_an_intervals_layout_is_fixed_once_written(
    ep: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Partitions are checkpoints and job identities: a changed param must not re-partition (and so score
    again) an interval already written; it applies to new intervals."""
    monkeypatch.setenv("AZUREML_DATASTORE_ROOT", f"file://{tmp_path}")
    first = ep.write_partitions("scoring", "20261128T0000", 1, partitions=2, files=1, rows=3)
    again = ep.write_partitions("scoring", "20261128T0000", 1, partitions=5, files=4, rows=9)
    assert again == first and len(first) == 2
    assert "keeps the layout it was first written with" in capsys.readouterr().out
    assert len((tmp_path / "scoring/input/20261128T0000/part-000/records-000.csv").read_text().splitlines()) == 4
    assert not (tmp_path / "scoring/input/20261128T0000/part-000/records-001.csv").exists()
    assert len(ep.write_partitions("scoring", "20261129T0000", 1, partitions=5, files=4, rows=9)) == 5  # new: new


def test_an_interval_written_before_layouts_were_recorded_keeps_its_partitions(
    ep: ModuleType, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("AZUREML_DATASTORE_ROOT", f"file://{tmp_path}")
    ep.write_partitions("scoring", "20261128T0000", 1, partitions=3, files=1, rows=2)
    (tmp_path / "scoring/layouts/20261128T0000.json").unlink()  # as an older version left it
    assert len(ep.write_partitions("scoring", "20261128T0000", 1, partitions=6, files=1, rows=2)) == 3


def test_names_come_from_the_yaml_that_creates_them(ep: ModuleType, tmp_path: Path) -> None:
    from tests.conftest import REPO

    assert ep.config_name(REPO / "dags/azureml/endpoint.yml") == "heart-classifier-batch"
    (tmp_path / "x.yml").write_text("description: no name\n")
    with pytest.raises(ValueError, match="has no 'name'"):
        ep.config_name(tmp_path / "x.yml")
