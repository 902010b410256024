"""The unit journal's record, and the carrier rule that finds a job Azure kept no unit property of."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from airflow_azureml.blob_records import StoreUnavailable
from airflow_azureml.operators.job_chain import data_place, job_places
from airflow_azureml.unit_journal import JournalRecord, UnitJournal, journal_url


class FakeBlob:
    """The ``EtagBlob`` surface the journal uses, in memory; ``fail`` makes every call raise it."""

    where = "https://acct.blob.core.windows.net/c/units/x.json"

    def __init__(self, record: Any = None, fail: Exception | None = None) -> None:
        self.record = record
        self.fail = fail
        self.writes = 0

    def read(self) -> Any:
        if self.fail:
            raise self.fail
        return json.loads(json.dumps(self.record))

    def update(self, change: Callable[[Any], Any]) -> bool:
        if self.fail:
            raise self.fail
        self.record = json.loads(json.dumps(change(self.read())))
        self.writes += 1
        return True


def test_journal_url_quotes_the_key_under_units() -> None:
    url = journal_url("https://a.blob.core.windows.net/hist/", "azure ml", "k/1")
    assert url == "https://a.blob.core.windows.net/hist/units/azure%20ml__k%2F1.json"


def test_a_submit_is_journaled_before_and_after() -> None:
    blob = FakeBlob()
    journal = UnitJournal(blob, "key-a")  # type: ignore[arg-type]
    journal.submitting(0, 100.0)
    assert journal.load() == JournalRecord({}, {"n": 0, "at": 100.0})
    journal.submitted(0, "job-0")
    journal.submitting(1, 200.0)
    record = journal.load()
    assert record.jobs == {0: "job-0"} and record.submitting == {"n": 1, "at": 200.0}
    journal.submitted(1, None)  # refused: nothing created, nothing pending
    assert journal.load() == JournalRecord({0: "job-0"}, None)
    assert journal.load().names() == ["job-0"]


def test_a_late_answer_of_an_older_submit_keeps_the_newer_pending_one() -> None:
    journal = UnitJournal(FakeBlob(), "k")  # type: ignore[arg-type]
    journal.submitting(2, 5.0)
    journal.submitted(1, "job-1")
    assert journal.load() == JournalRecord({1: "job-1"}, {"n": 2, "at": 5.0})


@pytest.mark.parametrize(
    "stored",
    [
        None,
        [],
        {"key": "another", "jobs": {"0": "j"}},
        {"key": "k", "jobs": {"x": "j", "1": "", "2": 3}, "submitting": {"n": "1", "at": 2}},
    ],
    ids=["none", "not-a-dict", "another-key", "malformed"],
)
def test_a_record_of_another_unit_or_malformed_knows_nothing(stored: Any) -> None:
    assert JournalRecord.from_blob(stored, "k") == JournalRecord()


def test_an_unavailable_store_is_logged_and_never_raised(caplog: pytest.LogCaptureFixture) -> None:
    blob = FakeBlob(fail=StoreUnavailable("Azure Storage refused this identity (403)"))
    journal = UnitJournal(blob, "k")  # type: ignore[arg-type]
    journal.submitting(0, 1.0)
    assert journal.load() == JournalRecord() and not journal.available
    assert "relies on Azure's LIST alone" in caplog.text


def test_another_storage_error_is_logged_and_the_journal_not_used_again(caplog: pytest.LogCaptureFixture) -> None:
    blob = FakeBlob(fail=OSError("reset"))
    journal = UnitJournal(blob, "k")  # type: ignore[arg-type]
    assert journal.load() == JournalRecord()
    assert not journal.available and "Could not read the unit journal" in caplog.text
    blob.fail = None
    journal.submitting(0, 1.0)  # each failing call may spend Storage's retries: one is enough
    assert blob.writes == 0


# ---------------------------------------------------------------- data places and the batch job's carrier
@pytest.mark.parametrize(
    ("uri", "place"),
    [
        ("azureml://datastores/ws/paths/in/2026/", "azureml://datastores/ws/paths/in/2026"),
        (
            "azureml://subscriptions/s/resourcegroups/RG/workspaces/w/datastores/ws/paths/in/2026",
            "azureml://datastores/ws/paths/in/2026",
        ),
        (None, ""),
    ],
)
def test_data_place_reads_the_long_and_short_forms_alike(uri: Any, place: str) -> None:
    assert data_place(uri) == place


def _arm_job(
    inputs: dict[str, str],
    outputs: dict[str, str] | None = None,
    endpoint: str = "heart-ep",
    deployment: str = "spot",
    experiment: str = "nightly",
) -> dict[str, Any]:
    return {
        "name": "batchjob-1",
        "properties": {
            "jobType": "Pipeline",
            "experimentName": experiment,
            "properties": {"azureml.endpointname": endpoint},
            "tags": {"azureml.deploymentname": deployment},
            "inputs": {k: {"jobInputType": "uri_folder", "uri": v} for k, v in inputs.items()},
            "outputs": {k: {"jobOutputType": "uri_folder", "uri": v} for k, v in (outputs or {}).items()},
        },
    }


def _operator(**kwargs: Any) -> Any:
    from airflow_azureml.operators import AzureMLInvokeBatchEndpointOperator

    base: dict[str, Any] = {
        "task_id": "score",
        "endpoint_name": "heart-ep",
        "deployment_name": "spot",
        "fallback_deployment": "dedicated",
        "experiment_name": "nightly",
        "inputs": {"d": "azureml://datastores/ws/paths/in/20261101/"},
        "outputs": {"score": "azureml://datastores/ws/paths/out/20261101/"},
    }
    return AzureMLInvokeBatchEndpointOperator(**{**base, **kwargs})


OURS_IN = {"d": "azureml://subscriptions/s/resourcegroups/rg/workspaces/w/datastores/ws/paths/in/20261101"}
OURS_OUT = {"score": "azureml://datastores/ws/paths/out/20261101"}


def test_job_places_reads_either_side() -> None:
    job = _arm_job(OURS_IN, OURS_OUT)
    assert job_places(job, "inputs") == {"azureml://datastores/ws/paths/in/20261101"}
    assert job_places(job, "outputs") == {"azureml://datastores/ws/paths/out/20261101"}


@pytest.mark.parametrize("deployment", ["spot", "dedicated"])
def test_the_units_job_carries_it_on_either_deployment(deployment: str) -> None:
    assert _operator().carries_unit(_arm_job(OURS_IN, OURS_OUT, deployment=deployment))


@pytest.mark.parametrize(
    "job",
    [
        _arm_job({"d": "azureml://datastores/ws/paths/in/20261102/"}, OURS_OUT),  # another partition
        _arm_job(OURS_IN, {"score": "azureml://datastores/ws/paths/out/20261102/"}),  # another output
        _arm_job(OURS_IN, {}),  # Azure's default output: not the one asked for
        _arm_job({}, OURS_OUT),  # no inputs at all
        _arm_job({**OURS_IN, "e": "azureml://datastores/ws/paths/extra/"}, OURS_OUT),  # more inputs than ours
        _arm_job(OURS_IN, OURS_OUT, endpoint="other-ep"),
        _arm_job(OURS_IN, OURS_OUT, deployment="blue"),
        _arm_job(OURS_IN, OURS_OUT, experiment="adhoc"),
        {"name": "x"},
    ],
    ids=[
        "input",
        "output",
        "default-output",
        "no-inputs",
        "more-inputs",
        "endpoint",
        "deployment",
        "experiment",
        "empty",
    ],
)
def test_a_job_of_other_work_does_not_carry_the_unit(job: dict[str, Any]) -> None:
    assert not _operator().carries_unit(job)


def test_without_a_deployment_any_deployment_of_the_endpoint_carries_it() -> None:
    op = _operator(deployment_name=None, fallback_deployment=None)
    assert op.carries_unit(_arm_job(OURS_IN, OURS_OUT, deployment="whatever-is-default"))


def test_with_a_job_identity_only_the_output_path_tells_units_apart() -> None:
    # job_identity may tell apart units of the same work (e.g. one per DAG run): the work cannot, unless
    # each unit writes to its own output path (dags/: one output folder per attempt)
    assert not _operator(job_identity="{{ run_id }}", outputs=None).carries_unit(_arm_job(OURS_IN, {}))
    op = _operator(job_identity="part-1#redo-1", outputs={"score": "azureml://datastores/ws/paths/out/redo-1/"})
    assert op.carries_unit(_arm_job(OURS_IN, {"score": "azureml://datastores/ws/paths/out/redo-1"}))
    assert not op.carries_unit(_arm_job(OURS_IN, OURS_OUT))  # the first attempt's job: another unit


def test_without_outputs_only_azures_default_outputs_carry_the_unit() -> None:
    op = _operator(outputs=None)
    default = {"score": "azureml://datastores/workspaceblobstore/paths/azureml/batchjob-1/score/"}
    assert op.carries_unit(_arm_job(OURS_IN, default))
    assert op.carries_unit(_arm_job(OURS_IN, {}))
    assert not op.carries_unit(_arm_job(OURS_IN, OURS_OUT))  # another unit asked for its own output path


def test_a_job_without_the_deployment_tag_does_not_carry_a_unit_with_one() -> None:
    job = _arm_job(OURS_IN, OURS_OUT)
    del job["properties"]["tags"]
    assert not _operator(fallback_deployment=None).carries_unit(job)
