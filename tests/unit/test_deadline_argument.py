"""The job operators' ``deadline`` argument: its grammar, its checks before any API call, its resolution
against the run, the DAG's deadline alert, and the fail-fast check before a unit's first submit."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta, timezone
from typing import Any
from unittest import mock

import pendulum
import pytest

from airflow_azureml import lifecycle
from airflow_azureml.exceptions import AirflowFailException, AzureMLConfigError
from airflow_azureml.lifecycle import Limits, ResubmissionState
from airflow_azureml.operators.job_settings import parse_deadline, resolve_deadline
from airflow_azureml.spot_policy import SpotHistory

END = pendulum.datetime(2026, 11, 2, tz="UTC")  # the data interval's end
LOGICAL = pendulum.datetime(2026, 11, 1, tz="UTC")
CONTEXT = {"data_interval_end": END, "logical_date": LOGICAL}


# ------------------------------------------------------------------ grammar
@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("+6h", timedelta(hours=6)),
        ("+90m", timedelta(minutes=90)),
        ("+45s", timedelta(seconds=45)),
        ("+1d12h", timedelta(days=1, hours=12)),
        ("+1h30m", timedelta(hours=1, minutes=30)),
        ("+1.5h", timedelta(hours=1.5)),
        (" +6h ", timedelta(hours=6)),  # a rendered template's stray spaces
        (timedelta(hours=2), timedelta(hours=2)),
        ("2026-11-02T06:00:00+00:00", datetime(2026, 11, 2, 6, tzinfo=timezone.utc)),
        ("2026-11-02T06:00:00Z", datetime(2026, 11, 2, 6, tzinfo=timezone.utc)),
        ("2026-11-02 07:00:00+01:00", datetime(2026, 11, 2, 6, tzinfo=timezone.utc)),  # str() of a pendulum time
        (datetime(2026, 11, 2, 6, tzinfo=timezone.utc), datetime(2026, 11, 2, 6, tzinfo=timezone.utc)),
        (pendulum.datetime(2026, 11, 2, 6, tz="Europe/Paris"), pendulum.datetime(2026, 11, 2, 6, tz="Europe/Paris")),
        (None, None),
        ("", None),  # a template that rendered to nothing: no deadline, as max_queue_time
    ],
)
def test_parse(value: Any, expected: Any) -> None:
    assert parse_deadline(value) == expected


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("-6h", "negative"),
        ("+0h", "after"),
        (timedelta(hours=-1), "negative"),
        (timedelta(0), "after"),
        (datetime(2026, 11, 2, 6), "naive"),
        ("2026-11-02T06:00:00", "naive"),
        ("2026-11-02", "naive"),  # a date is midnight, whose?
        ("PT6H", "'+6h'"),
        ("6h", "'+6h'"),
        ("+6x", "'+6h'"),
        ("+", "'+6h'"),
        ("+6h30", "'+6h'"),
        ("+30m6h", "'+6h'"),  # units in order: d, h, m, s
        ("tomorrow", "'+6h'"),
        (6, "'+6h'"),
        (True, "'+6h'"),
        ("+99999999d", "too far"),
    ],
)
def test_bad_values_are_config_errors(value: Any, says: str) -> None:
    with pytest.raises(AzureMLConfigError, match="deadline") as raised:
        parse_deadline(value)
    assert says in str(raised.value)


# ------------------------------------------------------------------ resolution
def resolve(value: Any, context: dict[str, Any] = CONTEXT, dag: Any = None) -> float | None:
    return resolve_deadline(parse_deadline(value), context, dag, logging.getLogger("test"))[0]


def test_an_offset_counts_from_the_data_interval_end() -> None:
    assert resolve("+6h") == END.add(hours=6).timestamp()


def test_without_a_data_interval_an_offset_counts_from_the_logical_date() -> None:
    assert resolve("+6h", {"data_interval_end": None, "logical_date": LOGICAL}) == LOGICAL.add(hours=6).timestamp()


def test_an_offset_with_nothing_to_count_from_is_a_config_error() -> None:
    with pytest.raises(AzureMLConfigError, match="absolute"):
        resolve("+6h", {"data_interval_end": None, "logical_date": None})


def test_an_absolute_deadline_is_itself() -> None:
    assert resolve("2026-11-02T06:00:00+00:00", {}) == datetime(2026, 11, 2, 6, tzinfo=timezone.utc).timestamp()


def test_no_deadline_is_none() -> None:
    assert resolve(None) is None


# ------------------------------------------------------------------ the DAG's deadline alert
class DagRunLogicalDateDeadline:  # the SDK's reference classes, by name (Airflow 3.1+)
    pass


class DagRunQueuedAtDeadline:
    pass


class FixedDatetimeDeadline:
    def __init__(self, when: datetime) -> None:
        self._datetime = when


class Alert:
    def __init__(self, reference: Any, interval: Any) -> None:
        self.reference = reference
        self.interval = interval


class Dag:
    def __init__(self, *alerts: Alert) -> None:
        self.deadline = list(alerts)


def test_a_dag_alert_on_the_logical_date_is_used_when_the_operator_has_none() -> None:
    dag = Dag(Alert(DagRunLogicalDateDeadline(), timedelta(hours=30)))
    assert resolve(None, dag=dag) == LOGICAL.add(hours=30).timestamp()


def test_the_operators_own_deadline_wins_over_the_dags() -> None:
    dag = Dag(Alert(DagRunLogicalDateDeadline(), timedelta(hours=30)))
    assert resolve("+1h", dag=dag) == END.add(hours=1).timestamp()


def test_the_earliest_resolvable_alert_is_used() -> None:
    fixed = datetime(2026, 11, 1, 12, tzinfo=timezone.utc)
    dag = Dag(
        Alert(DagRunLogicalDateDeadline(), timedelta(hours=30)),
        Alert(FixedDatetimeDeadline(fixed), timedelta(hours=1)),
        Alert(DagRunQueuedAtDeadline(), timedelta(minutes=1)),  # not known to a task: left out
    )
    assert resolve(None, dag=dag) == (fixed + timedelta(hours=1)).timestamp()


def test_an_alert_that_cannot_be_resolved_is_ignored_with_one_info_log(caplog: pytest.LogCaptureFixture) -> None:
    dag = Dag(Alert(DagRunQueuedAtDeadline(), timedelta(hours=1)), Alert(DagRunLogicalDateDeadline(), object()))
    with caplog.at_level(logging.INFO):
        assert resolve(None, dag=dag) is None
    infos = [r for r in caplog.records if r.levelno == logging.INFO]
    assert len(infos) == 1 and "deadline alert" in infos[0].getMessage()


async def missed(**kwargs: Any) -> None:
    """A deadline alert's callback (never called here)."""


def test_the_sdks_own_alert_resolves() -> None:
    deadline = pytest.importorskip("airflow.sdk.definitions.deadline")
    from airflow.sdk import DAG

    try:
        from airflow.sdk.definitions.callback import AsyncCallback
    except ImportError:  # Airflow 3.1 keeps it beside DeadlineAlert
        AsyncCallback = deadline.AsyncCallback

    alert = deadline.DeadlineAlert(
        reference=deadline.DeadlineReference.DAGRUN_LOGICAL_DATE,
        interval=timedelta(hours=3),
        callback=AsyncCallback(missed),
    )
    dag = DAG("with_alert", schedule=None, start_date=LOGICAL, deadline=alert)
    assert resolve(None, dag=dag) == LOGICAL.add(hours=3).timestamp()


# ------------------------------------------------------------------ the operators
def batch(**kwargs: Any) -> Any:
    from airflow_azureml.operators import AzureMLInvokeBatchEndpointOperator

    base = {"task_id": "t", "endpoint_name": "ep", "inputs": {"d": "azureml://datastores/ws/paths/in/"}}
    return AzureMLInvokeBatchEndpointOperator(**{**base, **kwargs})


def command(**kwargs: Any) -> Any:
    from airflow_azureml.operators import AzureMLSubmitCommandJobOperator

    base = {"task_id": "t", "command": "echo", "environment": "azureml:env@latest", "compute": "cpu"}
    return AzureMLSubmitCommandJobOperator(**{**base, **kwargs})


@pytest.mark.parametrize("make", [batch, command])
def test_deadline_is_templated(make: Any) -> None:
    assert "deadline" in make().template_fields


def test_a_templated_deadline_renders_then_parses() -> None:
    from airflow.sdk import DAG

    with DAG("d", schedule=None, start_date=LOGICAL):
        op = batch(deadline="{{ data_interval_end.add(hours=6) }}")
    op.render_template_fields({"data_interval_end": END, "logical_date": LOGICAL})
    assert parse_deadline(op.deadline) == END.add(hours=6)


@pytest.mark.parametrize("make", [batch, command])
def test_a_bad_deadline_fails_before_any_api_call(make: Any) -> None:
    op = make(deadline="-6h")
    hook = mock.MagicMock()
    op.__dict__["hook"] = hook
    with pytest.raises(AzureMLConfigError, match="negative"):
        op.execute({"data_interval_end": END, "logical_date": LOGICAL, "ti": mock.MagicMock()})
    assert hook.mock_calls == []


# ------------------------------------------------------------------ said at once, before the first submit
T0 = 1_800_000_000.0


def test_a_deadline_is_checked_before_the_units_first_job() -> None:
    limits = Limits(deadline=T0)
    first = lifecycle.before_submit(ResubmissionState(key="k"), limits, decided=False)
    assert first == (lifecycle.CheckDeadline(),)
    fallback = lifecycle.before_submit(ResubmissionState(key="k"), Limits(deadline=T0, fallback="fb"), decided=False)
    assert fallback == (lifecycle.CheckDeadline(), lifecycle.CheckFallback(), lifecycle.AskSpotPolicy())
    later = ResubmissionState(key="k", job_names=["a"])
    assert lifecycle.before_submit(later, limits, decided=False) == ()


def cluster(
    history: SpotHistory, deadline: float | None, *, has_fallback: bool = True, fail_infeasible: bool | None = None
) -> Any:
    from airflow_azureml.operators.job_spot import SpotCluster

    store = mock.MagicMock()
    store.load.return_value = (history, {})
    hook = mock.MagicMock()
    hook.spot_history_store.return_value = store
    return SpotCluster(
        hook,
        "target",
        has_fallback=has_fallback,
        fallback_after=None,
        manual_prices={},
        remember=lambda state: None,
        log=logging.getLogger("test"),
        deadline=deadline,
        fail_infeasible=fail_infeasible,
    )


TWO_HOURS = SpotHistory().record_completion(run_hours=2 + 5 / 60, now=T0)  # two hours of work seen here


@pytest.mark.parametrize("has_fallback", [True, False])
def test_a_deadline_nothing_can_meet_is_said_at_once_with_its_numbers(
    has_fallback: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """A warning, never a failure: the work estimate is the cluster's history (other units' jobs too), and
    Airflow's own deadline alerts notify without stopping a run."""
    spot = cluster(TWO_HOURS, deadline=T0 + 3600, has_fallback=has_fallback)
    with mock.patch("time.time", return_value=T0), caplog.at_level(logging.INFO):
        spot.check_deadline(ResubmissionState(key="k"))
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    on = "even on dedicated compute" if has_fallback else "even on spot with no preemption (no fallback)"
    for part in (f"cannot be met {on}", "now", "work estimate 1.99 h", "fastest finish"):
        assert part in warning
    assert ("goes to the fallback" if has_fallback else "runs on spot") in warning


@pytest.mark.parametrize("has_fallback", [True, False])
def test_on_infeasible_deadline_fail_raises_with_its_numbers_and_nothing_else_does(
    has_fallback: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """``on_infeasible_deadline="fail"``: a deadline nothing meets, or one already past, fails the task (no retry),
    saying why and how to change it; one that fits and unknown work still do not."""
    from airflow_azureml.exceptions import AzureMLDeadlineError

    for deadline, says in ((T0 + 3600, "cannot be met"), (T0 - 60, "has passed")):
        spot = cluster(TWO_HOURS, deadline=deadline, has_fallback=has_fallback, fail_infeasible=True)
        with mock.patch("time.time", return_value=T0), pytest.raises(AzureMLDeadlineError) as raised:
            spot.check_deadline(ResubmissionState(key="k"))
        message = str(raised.value)
        assert says in message and "No job was sent" in message, message
        instead = "to finish on the fallback" if has_fallback else "to run on spot anyway"
        instead = "to run it without the deadline" if says == "has passed" else instead
        assert f"on_infeasible_deadline='fallback' {instead}" in message, message
        assert isinstance(raised.value, AirflowFailException)
    spot = cluster(TWO_HOURS, deadline=T0 + 3600, has_fallback=has_fallback, fail_infeasible=True)
    with mock.patch("time.time", return_value=T0), pytest.raises(AzureMLDeadlineError) as raised:
        spot.check_deadline(ResubmissionState(key="k"))
    for part in ("work estimate 1.99 h", "fastest finish"):
        assert part in str(raised.value)
    for history, deadline in ((TWO_HOURS, T0 + 10 * 3600), (SpotHistory(), T0 + 60)):
        with mock.patch("time.time", return_value=T0), caplog.at_level(logging.INFO):
            cluster(history, deadline, has_fallback=has_fallback, fail_infeasible=True).check_deadline(
                ResubmissionState(key="k")
            )


def test_on_infeasible_deadline_renders_from_params_then_decides() -> None:
    """Templated (the example DAG takes it from the run's params); empty is the default, as for ``deadline``."""
    from airflow.sdk import DAG

    for given, fails in (("fail", True), ("fallback", None), ("", None)):
        with DAG("d", schedule=None, start_date=LOGICAL):
            op = batch(endpoint_name="scoring-ep", deadline="+6h", on_infeasible_deadline="{{ params.infeasible }}")
        assert "on_infeasible_deadline" in op.template_fields
        op.render_template_fields({"params": {"infeasible": given}, "data_interval_end": END, "logical_date": LOGICAL})
        op.validate()
        op.__dict__["hook"] = mock.MagicMock()
        op._context, op._fresh_start = {"ti": mock.MagicMock(try_number=1)}, True
        assert op._spot().fail_infeasible is fails, given


def test_fail_applies_to_a_first_tries_start_only() -> None:
    """A retry, a clear (a later try) or a resume from a deferral may follow a job sent before that no record
    shows yet: failing there would leave it unwatched, so the deadline is a warning there (fail_infeasible False)."""
    op = batch(endpoint_name="scoring-ep", deadline="+6h", on_infeasible_deadline="fail")
    op.__dict__["hook"] = mock.MagicMock()
    for try_number, fresh, fails in ((1, True, True), (2, True, False), (1, False, False), (3, False, False)):
        op._context, op._fresh_start = {"ti": mock.MagicMock(try_number=try_number)}, fresh
        assert op._spot().fail_infeasible is fails, (try_number, fresh)


def test_where_fail_does_not_apply_the_warning_says_why(caplog: pytest.LogCaptureFixture) -> None:
    spot = cluster(TWO_HOURS, deadline=T0 + 3600, fail_infeasible=False)
    with mock.patch("time.time", return_value=T0), caplog.at_level(logging.INFO):
        spot.check_deadline(ResubmissionState(key="k"))  # no exception
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "goes to the fallback" in warning and "applies to a first try's start only" in warning, warning


@pytest.mark.parametrize("make", [batch, command])
def test_on_infeasible_deadline_is_checked_before_any_api_call(make: Any) -> None:
    op = make(deadline="+6h", on_infeasible_deadline="stop")
    hook = mock.MagicMock()
    op.__dict__["hook"] = hook
    with pytest.raises(AzureMLConfigError, match="on_infeasible_deadline must be 'fallback' or 'fail'"):
        op.execute({"data_interval_end": END, "logical_date": LOGICAL, "ti": mock.MagicMock()})
    assert hook.mock_calls == []


def test_a_deadline_already_past_is_missed_and_not_applied(caplog: pytest.LogCaptureFixture) -> None:
    """A clear of an old run, or a catch-up after downtime: dedicated nodes would only be late at a higher price."""
    from airflow_azureml import spot_policy

    spot = cluster(TWO_HOURS, deadline=T0 - 60)
    with mock.patch("time.time", return_value=T0), caplog.at_level(logging.INFO):
        spot.check_deadline(ResubmissionState(key="k"))
    assert any("has passed" in r.getMessage() and r.levelno == logging.WARNING for r in caplog.records)
    inputs = spot_policy.PolicyInputs(spot_price=0.2, dedicated_price=1.0, history=TWO_HOURS, deadline=T0 - 60, now=T0)
    assert spot_policy.decide(inputs).rule != spot_policy.RULE_DEADLINE


def test_no_deadline_check_while_an_earlier_tries_submit_is_unresolved() -> None:
    """Its job may be running: the check waits until the submitter has looked for it (and only informs)."""
    pending = ResubmissionState(key="k")
    pending.submitting = {"n": 0, "at": T0 - 60}
    assert lifecycle.before_submit(pending, Limits(deadline=T0 + 60), decided=False) == ()


def test_a_backfill_run_applies_no_relative_deadline(caplog: pytest.LogCaptureFixture) -> None:
    run = mock.MagicMock(run_type="backfill")
    context = {"data_interval_end": END, "logical_date": LOGICAL, "dag_run": run}
    log = logging.getLogger("test")
    with caplog.at_level(logging.INFO):
        assert resolve_deadline(timedelta(hours=6), context, None, log) == (None, "")
    assert any("backfill" in r.getMessage() for r in caplog.records)
    absolute = datetime(2027, 1, 1, tzinfo=timezone.utc)
    assert resolve_deadline(absolute, context, None, log)[0] == absolute.timestamp()


def test_an_offset_on_a_run_without_a_logical_date_counts_from_run_after() -> None:
    """Asset-triggered and some manual runs have no data interval or logical date; run_after is always set."""
    run = mock.MagicMock(run_type="asset_triggered", run_after=END)
    at, source = resolve_deadline(timedelta(hours=6), {"dag_run": run}, None, logging.getLogger("test"))
    assert at == (END + timedelta(hours=6)).timestamp() and "run_after" in source


def test_a_deadline_that_fits_is_logged(caplog: pytest.LogCaptureFixture) -> None:
    spot = cluster(TWO_HOURS, deadline=T0 + 10 * 3600)
    with mock.patch("time.time", return_value=T0), caplog.at_level(logging.INFO):
        spot.check_deadline(ResubmissionState(key="k"))
    assert any("slack" in r.getMessage() for r in caplog.records)


def test_unknown_work_does_not_fail_but_says_it_cannot_check(caplog: pytest.LogCaptureFixture) -> None:
    spot = cluster(SpotHistory(), deadline=T0 + 60)
    with mock.patch("time.time", return_value=T0), caplog.at_level(logging.INFO):
        spot.check_deadline(ResubmissionState(key="k"))
    assert any("cannot be checked" in r.getMessage() for r in caplog.records)
