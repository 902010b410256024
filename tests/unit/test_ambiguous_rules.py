"""The rules of source document 003 that read two ways (docs/instance_types.md).

The emulator takes the strict reading. The provider refuses only what both readings refuse (what the
lenient reading refuses), before any API call; for input between the two readings it logs a warning
that names the rule, gives both readings and says that Azure ML may refuse it. One table, one row per
(rule, input): ``refuse``, ``warn`` or ``accept``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import pytest

from airflow_azureml.exceptions import AzureMLConfigError
from airflow_azureml.instance_types import (
    AMBIGUOUS_RULES,
    InstanceType,
    check_mlflow_minimum,
    check_resources_fit,
    validate_instance_types,
)

LOGGER = "airflow_azureml.instance_types"
# limits: 4 cores, 16Gi, 1 GPU (the example DAG's gpusmall)
GPU_TYPE = InstanceType(
    name="gpusmall",
    requests={"cpu": "2", "memory": "8Gi"},
    limits={"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": 1},
)


def _resources(requests: dict[str, Any], limits: dict[str, Any] | None = None) -> Callable[[], None]:
    section: dict[str, Any] = {"requests": requests}
    if limits is not None:
        section["limits"] = limits
    return lambda: check_resources_fit(section, GPU_TYPE)


def _mlflow(cpu: str, memory: str) -> Callable[[], None]:
    return lambda: check_mlflow_minimum({"requests": {"cpu": cpu, "memory": memory}})


def _mlflow_type(cpu: str, memory: str) -> Callable[[], None]:
    itype = InstanceType(name="big", requests={"cpu": cpu, "memory": memory}, limits={"cpu": "8", "memory": "32Gi"})
    return lambda: check_mlflow_minimum(itype)


def _selector(selector: dict[str, str], extension: dict[str, str]) -> Callable[[], None]:
    itype = InstanceType(
        name="sel", node_selector=selector, requests={"cpu": "1", "memory": "1Gi"}, limits={"cpu": "1", "memory": "1Gi"}
    )
    return lambda: validate_instance_types([itype], extension)


REQ = {"cpu": "1", "memory": "1Gi"}
CASES: list[tuple[str, str, Callable[[], None], str]] = [
    # (rule, case, call, outcome)
    # "4 GB" for MLflow deployments: 4G (lenient) or 4Gi (strict)
    ("mlflow-memory", "4Gi", _mlflow("2", "4Gi"), "accept"),
    ("mlflow-memory", "4097Mi", _mlflow("2", "4097Mi"), "accept"),
    ("mlflow-memory", "4G", _mlflow("2", "4G"), "warn"),
    ("mlflow-memory", "4095Mi (above 4G, below 4Gi)", _mlflow("2", "4095Mi"), "warn"),
    ("mlflow-memory", "3999M", _mlflow("2", "3999M"), "refuse"),
    ("mlflow-memory", "3.5Gi", _mlflow("2", "3.5Gi"), "refuse"),
    ("mlflow-memory", "instance type with 4G requested", _mlflow_type("2", "4G"), "warn"),
    ("mlflow-memory", "instance type with 4Gi requested", _mlflow_type("2", "4Gi"), "accept"),
    # "at least 2 CPU cores": one reading (>= 2000m)
    ("mlflow-cpu", "2", _mlflow("2", "8Gi"), "accept"),
    ("mlflow-cpu", "2000m", _mlflow("2000m", "8Gi"), "accept"),
    ("mlflow-cpu", "1999m", _mlflow("1999m", "8Gi"), "refuse"),
    # "memory may not be under 1 MB": 1M (lenient) or 1Mi (strict)
    ("request-memory-minimum", "1Mi", _resources({"cpu": "1", "memory": "1Mi"}), "accept"),
    ("request-memory-minimum", "1M", _resources({"cpu": "1", "memory": "1M"}), "warn"),
    ("request-memory-minimum", "1000Ki (above 1M, below 1Mi)", _resources({"cpu": "1", "memory": "1000Ki"}), "warn"),
    ("request-memory-minimum", "999k", _resources({"cpu": "1", "memory": "999k"}), "refuse"),
    # "under the instance type's limits": not above (lenient) or strictly below (strict)
    ("under-instance-type-limits", "below", _resources(REQ, {"cpu": "3", "memory": "12Gi"}), "accept"),
    ("under-instance-type-limits", "cpu limit equal", _resources(REQ, {"cpu": "4", "memory": "12Gi"}), "warn"),
    ("under-instance-type-limits", "cpu limit 4000m", _resources(REQ, {"cpu": "4000m", "memory": "1Gi"}), "warn"),
    ("under-instance-type-limits", "memory limit equal", _resources(REQ, {"cpu": "3", "memory": "16Gi"}), "warn"),
    ("under-instance-type-limits", "cpu request equal", _resources({"cpu": "4", "memory": "1Gi"}), "warn"),
    ("under-instance-type-limits", "memory request equal", _resources({"cpu": "1", "memory": "16Gi"}), "warn"),
    ("under-instance-type-limits", "cpu limit above", _resources(REQ, {"cpu": "4001m", "memory": "1Gi"}), "refuse"),
    ("under-instance-type-limits", "memory request above", _resources({"cpu": "1", "memory": "17Gi"}), "refuse"),
    # GPUs are whole devices: one reading ("not above"), see docs/instance_types.md
    (
        "under-instance-type-limits",
        "GPU count equal",
        _resources(REQ, {"cpu": "3", "memory": "12Gi", "nvidia.com/gpu": 1}),
        "accept",
    ),
    (
        "under-instance-type-limits",
        "GPU count above",
        _resources(REQ, {"cpu": "3", "memory": "12Gi", "nvidia.com/gpu": 2}),
        "refuse",
    ),
    # nodeSelector "a subset of the extension's": compatible (lenient) or key=value subset (strict)
    ("node-selector-subset", "same pair", _selector({"pool": "gpu"}, {"pool": "gpu", "zone": "1"}), "accept"),
    ("node-selector-subset", "no extension selector", _selector({"pool": "gpu"}, {}), "accept"),
    ("node-selector-subset", "an extra key", _selector({"pool": "gpu", "disk": "ssd"}, {"pool": "gpu"}), "warn"),
    ("node-selector-subset", "another value", _selector({"pool": "cpu"}, {"pool": "gpu"}), "refuse"),
    # rules with one reading only: both refuse
    (
        "requests-within-limits",
        "request above its own limit",
        _resources({"cpu": "2", "memory": "1Gi"}, {"cpu": "1"}),
        "refuse",
    ),
    ("zero", "cpu 0m", _resources({"cpu": "0m", "memory": "1Gi"}), "refuse"),
    ("zero", "cpu 0.0", _resources({"cpu": "0.0", "memory": "1Gi"}), "refuse"),
    ("zero", "memory 0Gi", _resources({"cpu": "1", "memory": "0Gi"}), "refuse"),
]


@pytest.mark.parametrize(("rule", "case", "call", "outcome"), CASES, ids=[f"{c[0]}: {c[1]}" for c in CASES])
def test_refuse_warn_or_accept(
    rule: str, case: str, call: Callable[[], None], outcome: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    if outcome == "refuse":
        with pytest.raises(AzureMLConfigError):
            call()
        return
    call()
    warnings = [r for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING]
    if outcome == "accept":
        assert warnings == [], [r.getMessage() for r in warnings]
        return
    assert warnings, f"{rule}: {case} should warn"
    message = warnings[0].getMessage()
    ambiguous = AMBIGUOUS_RULES[rule]
    assert rule in message  # names the rule
    assert ambiguous.lenient in message and ambiguous.strict in message  # gives both readings
    assert "Azure ML may refuse" in message


def test_every_ambiguous_rule_has_a_gap_case_and_its_source() -> None:
    warned = {rule for rule, _, _, outcome in CASES if outcome == "warn"}
    assert warned == set(AMBIGUOUS_RULES)
    for name, rule in AMBIGUOUS_RULES.items():
        assert rule.name == name and rule.source and rule.lenient and rule.strict
