"""ETL -> scoring -> report, chained by Airflow Assets on ``azureml://`` datastore URIs.

1. ``example_asset_etl`` (triggered by hand; give it a schedule to run it daily) writes the interval's
   records as partition folders on the datastore and emits the input Asset, with the partitions in the
   event's extra.
2. ``example_asset_scoring`` is scheduled on that Asset. It scores each partition with a mapped invoke
   task whose outputs are rendered at run time, so they are emitted through the ``AssetAlias``
   ``azureml-scored-partitions``: one Asset per scored partition folder.
   Once every partition scored, ``announce_interval`` emits one event of ``SCORED_INTERVAL`` that
   lists them: mapped tasks end one by one, and a consumer scheduled on the alias would run on the
   first partition alone.
   The scoring DAG also runs ``@daily`` (``AssetOrTimeSchedule``), so that a backfill can re-score intervals:
   a backfilled run scores the partitions the ETL announced for its own interval, and one for an interval the
   ETL never wrote skips every task (nothing reaches Azure). The ``@daily`` runs themselves skip every task:
   the ETL's event already triggers the scoring of each interval.
3. ``example_asset_report`` is scheduled on ``SCORED_INTERVAL``: it summarises the interval's scored
   partitions in an Azure ML command job whose inputs are those folders, and counts the rows scored.
4. Where Airflow lets a task key its asset events (3.3, ``compat.has_partitioned_assets``),
   ``announce_interval`` also emits ``SCORED_PARTITIONS`` with one partition key per scored interval and
   partition (``2026-11-01T00:00:00|part-000``, ``airflow_azureml.assets.partition_key``), and
   ``example_asset_partition_report`` (a ``PartitionedAssetTimetable``) gets one run per key. On 3.1 and 3.2
   neither exists, and the first ``announce_interval`` of a process logs so.

The same file runs against Azure and the emulator: see ``low_priority_batch_scoring.py`` for the
connection and ``AZUREML_DATASTORE_ROOT``.
"""

from __future__ import annotations

import os
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import example_partitions
import pendulum
from airflow.sdk import DAG, Asset, AssetAlias, task

from airflow_azureml import compat
from airflow_azureml.assets import datastore_uri, parse_datastore_uri, partition_key, split_partition_key
from airflow_azureml.operators import (
    AzureMLCreateBatchDeploymentOperator,
    AzureMLCreateComputeClusterOperator,
    AzureMLInvokeBatchEndpointOperator,
    AzureMLRegisterModelOperator,
    AzureMLSubmitCommandJobOperator,
)

CONFIG = Path(__file__).parent / "azureml"
PREFIX = "assets"
POLL_SECONDS = float(os.environ.get("AZUREML_POLL_SECONDS", "30"))
MAX_POLL_SECONDS = max(POLL_SECONDS, float(os.environ.get("AZUREML_MAX_POLL_SECONDS", "300")))
RESUBMIT_BACKOFF = float(os.environ.get("AZUREML_RESUBMIT_BACKOFF_SECONDS", "60"))
# When each partition must be scored by (docs/operators.md, "A deadline for the work"): an ISO-8601 time with
# its offset (a backfill applies no "+6h"-style offset: its intervals are old by design). Unset: no deadline.
DEADLINE = os.environ.get("AZUREML_DEADLINE") or None
START = pendulum.datetime(2026, 11, 1, tz="UTC")
# The same names, cluster and pool as low_priority_batch_scoring.py: one place each (the YAML, the pool).
CLUSTER = example_partitions.config_name(CONFIG / "low-pri-cluster.yml")
ENDPOINT = example_partitions.config_name(CONFIG / "endpoint.yml")
DEPLOYMENT = example_partitions.config_name(CONFIG / "deployment.yml")
INFRA_POOL = os.environ.get("AZUREML_INFRA_POOL", "azureml_infrastructure")

# [START howto_assets_uris]
RECORDS = Asset(datastore_uri(example_partitions.DATASTORE, f"{PREFIX}/input"))
SCORED = AssetAlias("azureml-scored-partitions")
SCORED_INTERVAL = Asset(datastore_uri(example_partitions.DATASTORE, f"{PREFIX}/output"))
# [END howto_assets_uris]
# [START howto_assets_partitioned]
# One event per scored (interval, partition), keyed, on an Asset of its own: Airflow queues a keyed event for
# partition-aware DAGs only (AssetManager._queue_dagruns), so on SCORED_INTERVAL it would starve the report.
PARTITIONED = compat.has_partitioned_assets()
SCORED_PARTITIONS = Asset(name="azureml-scored-interval-partitions")
# [END howto_assets_partitioned]


def _events(context: dict[str, Any], key: Any, whole_run: bool) -> list[Any]:
    """The asset events that triggered this run. In a run nothing triggered (``dag.test()``, a manual run):
    the latest event, or with ``whole_run`` every event of the latest run that emitted one."""
    events = list(context["triggering_asset_events"].get(key, ()))
    if events:
        return events
    recent = list(context["inlet_events"][key][-50:])
    if not recent:
        return []
    if not whole_run:
        return recent[-1:]
    last = recent[-1]
    return [e for e in recent if (e.source_dag_id, e.source_run_id) == (last.source_dag_id, last.source_run_id)]


def _records_to_score(context: dict[str, Any]) -> list[Any]:
    """The ETL events a scoring run scores. A backfilled run scores its own interval: the ETL's latest event for
    it, or nothing (skipped). A run of the ``@daily`` part is skipped: it exists so that backfills can be made,
    and the ETL's event already triggers the scoring of each interval (scoring it twice would emit the scored
    assets twice and run the reports again). Any other run: ``_events``."""
    run_type = getattr(context["dag_run"], "run_type", None)
    run_type = str(getattr(run_type, "value", run_type))
    if run_type == "scheduled":
        raise compat.skip_exception()("a scheduled run scores nothing: the ETL's asset event triggers scoring")
    if run_type != "backfill":
        return _events(context, RECORDS, False)
    interval = example_partitions.interval_key(context["data_interval_start"])
    events = context["inlet_events"][RECORDS]
    announced = [e for e in events[-50:] if e.extra.get("interval") == interval]
    if not announced:  # an older interval than the ETL's last 50 runs: look at every event
        announced = [e for e in events if e.extra.get("interval") == interval]
    if not announced:
        raise compat.skip_exception()(f"the ETL announced no records for interval {interval}: nothing to score")
    return announced[-1:]


def _scored_key(output_uri: str) -> str:
    """The partition key of a scored folder ``.../output/<interval_key>/<partition>``."""
    place = parse_datastore_uri(output_uri)
    if place is None:
        raise ValueError(f"not a datastore URI: {output_uri!r}")
    interval, partition = place.path.split("/")[-2:]
    return partition_key(datetime.strptime(interval, "%Y%m%dT%H%M").replace(tzinfo=timezone.utc), partition)


with DAG(
    dag_id="example_asset_etl",
    # Triggered by hand here, so that the chain never starts by itself next to the other examples;
    # give it a schedule (e.g. "@daily") to score every interval.
    schedule=None,
    start_date=START,
    catchup=False,
    tags=["azureml", "assets", "example"],
    doc_md=__doc__,
) as etl_dag:

    @task(outlets=[RECORDS])
    def extract(
        data_interval_start: pendulum.DateTime | None = None, dag_run: Any = None, outlet_events: Any = None
    ) -> list[dict[str, Any]]:
        """Write the interval's partitions; the Asset event tells the scoring DAG which ones.

        A manual run without a logical date (the UI's Trigger button) has no data interval: it writes the
        minute it was triggered in (``example_partitions.interval_start``)."""
        start = example_partitions.interval_start(data_interval_start, dag_run)
        interval = example_partitions.interval_key(start)
        partitions = example_partitions.write_partitions(
            PREFIX, interval, int(start.timestamp()), partitions=2, files=2, rows=10
        )
        outlet_events[RECORDS].extra = {"interval": interval, "partitions": partitions}
        return partitions

    extract()


with DAG(
    dag_id="example_asset_scoring",
    # the ETL's events, and @daily so that `airflow backfill create` can re-score intervals (it backfills
    # periodic timetables only); the @daily runs and a backfilled day the ETL wrote nothing for skip every task
    schedule=compat.asset_or_time_schedule([RECORDS], "@daily"),
    start_date=START,
    catchup=False,
    max_active_runs=1,
    tags=["azureml", "assets", "example"],
    doc_md=__doc__,
) as scoring_dag:
    create_cluster = AzureMLCreateComputeClusterOperator(
        task_id="create_low_priority_cluster", compute=str(CONFIG / "low-pri-cluster.yml"), pool=INFRA_POOL
    )
    create_deployment = AzureMLCreateBatchDeploymentOperator(
        task_id="create_batch_deployment", deployment=str(CONFIG / "deployment.yml"), pool=INFRA_POOL
    )

    @task
    def publish_model() -> str:
        """The committed MLflow model (azureml/model/), copied to where azureml/model.yml registers it from."""
        return example_partitions.publish_model(
            str(CONFIG / "model"), example_partitions.config_datastore_path(CONFIG / "model.yml")
        )

    register_model = AzureMLRegisterModelOperator(
        task_id="register_model", model=str(CONFIG / "model.yml"), pool=INFRA_POOL
    )

    @task(inlets=[RECORDS])
    def plan(**context: Any) -> list[dict[str, Any]]:
        """One invoke per partition the ETL announced; the job identity is the partition (exactly once)."""
        partitions = [p for event in _records_to_score(context) for p in event.extra.get("partitions", [])]
        return [
            {
                "inputs": {"heart_dataset": example_partitions.datastore_uri(p["input"])},
                "outputs": {"score": example_partitions.datastore_uri(p["output"])},
                "job_identity": p["input"],
            }
            for p in partitions
        ]

    # [START howto_assets_invoke_outlets]
    score = AzureMLInvokeBatchEndpointOperator.partial(
        task_id="score_partition",
        endpoint_name=ENDPOINT,
        deployment_name=DEPLOYMENT,
        resubmit_backoff=RESUBMIT_BACKOFF,
        polling={"interval": POLL_SECONDS, "max_interval": MAX_POLL_SECONDS},
        outlets=[SCORED],  # one asset event per rendered output, emitted when the job completed
        deadline=DEADLINE,
        map_index_template="{{ task.job_identity }}",
    ).expand_kwargs(planned := plan())
    # [END howto_assets_invoke_outlets]

    # all_success: never on part of an interval
    @task(outlets=[SCORED_INTERVAL, SCORED_PARTITIONS] if PARTITIONED else [SCORED_INTERVAL])
    def announce_interval(planned: list[dict[str, Any]], outlet_events: Any = None) -> list[str]:
        """One event for the whole interval, once every partition's job completed: what consumers schedule on.
        On Airflow 3.3 also one keyed event per scored partition of the interval (``SCORED_PARTITIONS``)."""
        outputs = sorted(kwargs["outputs"]["score"].rstrip("/") for kwargs in planned)
        outlet_events[SCORED_INTERVAL].extra = {"outputs": outputs}
        if PARTITIONED:
            # [START howto_assets_add_partitions]
            by_key = {_scored_key(uri): uri for uri in outputs}
            outlet_events[SCORED_PARTITIONS].add_partitions(sorted(by_key))  # one event per key
            outlet_events[SCORED_PARTITIONS].extra = {"outputs": by_key}  # each keyed event carries it
            # [END howto_assets_add_partitions]
        else:
            compat.warn_missing("partitioned_assets")
        return outputs

    published = publish_model()
    planned >> [published, create_cluster]  # a skipped plan (nothing to score) skips the Azure set-up too
    published >> register_model >> create_deployment
    create_cluster >> create_deployment >> score >> announce_interval(planned)


with DAG(
    dag_id="example_asset_report",
    schedule=[SCORED_INTERVAL],
    start_date=START,
    catchup=False,
    tags=["azureml", "assets", "example"],
    doc_md=__doc__,
) as report_dag:

    @task(inlets=[SCORED_INTERVAL])
    def scored_partitions(**context: Any) -> dict[str, str]:
        """The interval's scored partition folders, as command-job inputs (``part_000``: ``azureml://...``)."""
        uris = sorted({uri for event in _events(context, SCORED_INTERVAL, False) for uri in event.extra["outputs"]})
        return {f"part_{i:03d}": uri for i, uri in enumerate(uris)}

    partitions = scored_partitions()
    summarize = AzureMLSubmitCommandJobOperator(
        task_id="summarize_predictions",
        # Azure ML mounts each input and names its path in AZURE_ML_INPUT_<name>
        command="python -c \"import os; print(sorted(k for k in os.environ if k.startswith('AZURE_ML_INPUT_')))\"",
        environment="azureml:AzureML-sklearn-1.5@latest",
        compute=CLUSTER,
        inputs=partitions,
        polling={"interval": POLL_SECONDS, "max_interval": MAX_POLL_SECONDS},
    )

    @task
    def count_rows(inputs: dict[str, str]) -> dict[str, Any]:
        """Rows scored per partition, read from the datastore."""
        rows = {}
        for uri in inputs.values():
            place = parse_datastore_uri(uri)
            predictions = example_partitions.storage(place.path) / "predictions.csv" if place else None
            rows[uri] = len(predictions.read_text().splitlines()) if predictions and predictions.exists() else 0
        print(rows)
        return {"partitions": len(rows), "rows_scored": sum(rows.values()), "rows": rows}

    count_rows(partitions)


if PARTITIONED:
    from airflow.sdk import PartitionedAssetTimetable

    with DAG(
        dag_id="example_asset_partition_report",
        # IdentityMapper (the default): one run per key, i.e. per scored (interval, partition)
        schedule=PartitionedAssetTimetable(assets=SCORED_PARTITIONS),
        start_date=START,
        catchup=False,
        tags=["azureml", "assets", "example"],
        doc_md=__doc__,
    ) as partition_report_dag:

        @task
        def partition_rows(dag_run: Any = None) -> dict[str, Any]:
            """The rows scored in this run's partition: its key names the interval and the partition folder."""
            key = dag_run.partition_key
            start, partition = split_partition_key(key)
            folder = f"{PREFIX}/output/{example_partitions.interval_key(start)}/{partition}"
            predictions = example_partitions.storage(folder) / "predictions.csv"
            rows = len(predictions.read_text().splitlines()) if predictions.exists() else 0
            print(f"partition {key}: {rows} rows scored in {datastore_uri(example_partitions.DATASTORE, folder)}")
            return {"partition_key": key, "output": datastore_uri(example_partitions.DATASTORE, folder), "rows": rows}

        partition_rows()
