"""Trigger serialisation: a round trip, and no secret ever in the trigger row."""

from __future__ import annotations

import json

import pytest

from airflow_azureml.polling import PollingPolicy
from airflow_azureml.triggers.base import AzureMLBaseTrigger
from airflow_azureml.triggers.job import AzureMLJobTrigger

ALL_TRIGGERS = [
    AzureMLJobTrigger(job_name="job-1", azure_ml_conn_id="my_conn", polling={"interval": 5, "max_queue_time": 60}),
]


@pytest.mark.parametrize("trigger", ALL_TRIGGERS, ids=lambda t: type(t).__name__)
def test_round_trip(trigger: AzureMLBaseTrigger) -> None:
    classpath, kwargs = trigger.serialize()
    module, _, name = classpath.rpartition(".")
    cls = getattr(__import__(module, fromlist=[name]), name)
    clone = cls(**json.loads(json.dumps(kwargs)))
    assert clone.serialize() == (classpath, kwargs)
    assert clone.policy == trigger.policy


@pytest.mark.parametrize("trigger", ALL_TRIGGERS, ids=lambda t: type(t).__name__)
def test_only_declared_safe_fields_are_serialised(trigger: AzureMLBaseTrigger, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = "super-secret-value-123"
    monkeypatch.setenv(
        "AIRFLOW_CONN_MY_CONN",
        json.dumps({"conn_type": "azure_ml", "login": "app", "password": secret, "extra": {"tenant_id": "t"}}),
    )
    _, kwargs = trigger.serialize()
    assert set(kwargs) == {"azure_ml_conn_id", "polling", *type(trigger).serialized_fields}
    text = json.dumps(kwargs)
    assert secret not in text and "Bearer" not in text and "password" not in text


def test_a_trigger_that_declares_a_secret_field_is_refused() -> None:
    class Leaky(AzureMLBaseTrigger):
        serialized_fields = ("client_secret",)
        client_secret = "x"

        async def run(self):  # pragma: no cover - never run
            yield None

    with pytest.raises(TypeError, match="must not serialise"):
        Leaky(azure_ml_conn_id="c", polling=PollingPolicy()).serialize()
