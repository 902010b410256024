"""Score each data interval's heart-disease records on a low-priority (spot) Azure ML cluster.

Steps:
1. setup: register the example's MLflow model (a scikit-learn classifier, ``dags/azureml/model/``,
   copied to the datastore first), create the low-priority cluster, a dedicated cluster with
   ``min_instances: 0`` (no cost until used), the batch deployment on spot (the MLflow model with no
   scoring script) and its fallback, the same model on the dedicated cluster (all idempotent, from
   the az ml CLI YAML in ``dags/azureml/``, as the Azure docs show them);
2. extract: write the interval's input as K partition folders of CSV files on the datastore;
3. plan + score: one mapped invoke task per *unverified* partition. Partitions are the
   checkpoints: a partition is finished only once its job completed and the report verified
   its output, and each job's identity derives from the partition (and its redo number), so a
   retry, a clear or a backfill reattaches to or reuses the job instead of paying for a second
   one. Whole-cluster preemptions are resubmitted by the operator at once; the work moves to the
   fallback deployment when spot is expected to cost more, after ``fallback_after`` preemptions,
   or when a job waits for spot capacity longer than ``max_queue_seconds``;
4. report: check rows in = rows scored, each row exactly once, and checkpoint the partitions
   that pass. With Azure's default ``error_threshold: -1`` a job completes even when files
   failed, so a partition whose output lacks rows is rejected and redone by the next run,
   as new work into a new folder.

The interval is the run's data interval. A run triggered without a logical date (``airflow dags
trigger``, the UI's Trigger button) has none in Airflow 3; it scores the minute it was triggered in
(``example_partitions.interval_start``; docs/azure.md: what a manual run scores). To score a given
day, use ``airflow dags test <dag> <date>`` or a backfill.

No teardown deletes the cluster: with ``max_active_runs=2`` another run's jobs may be running
on it, and deleting a compute fails the jobs on it. With ``min_instances: 0`` an idle cluster
has no nodes and costs nothing (it scales down after ``idle_time_before_scale_down``), so it is
kept. Delete it yourself (``AzureMLDeleteComputeOperator`` or ``az ml compute delete``) once no
run uses it.

The same file runs against Azure and against the local emulator; only the ``azure_ml_default``
connection and the environment below differ (docs/azure.md: running it on a workspace).

Environment (read by the DAG processor and the workers alike):

- ``AZUREML_DATASTORE_ROOT``: where the workspace's ``workspaceblobstore`` container is reachable
  with ``ObjectStoragePath``: a mounted folder (``file:///mnt/blobstore``), or Azure's ADLS Gen2 URI
  ``abfs://container@account.dfs.core.windows.net`` together with ``AZUREML_STORAGE_CONN_ID``, an
  Airflow connection (type ``adls`` or ``wasb``) for that storage account; ``abfs`` needs
  ``pip install "airflow-azureml[azure-storage]"``. Required: without it, ``extract`` fails before it
  writes anything (a default would put the data on the worker's own disk, where no job reads it).
- ``AZUREML_RETRY_DELAY_SECONDS``: a failed task's first retry (default 120), doubling to 30 min.
- ``AZUREML_INFRA_POOL``: the pool of one slot the infrastructure tasks share (default
  ``azureml_infrastructure``; create it once: docs/azure.md, step 4).
- ``AZUREML_POLL_SECONDS``: first poll interval of a job's wait (default 30; it backs off to
  ``AZUREML_MAX_POLL_SECONDS``, default 300, never below the first interval).
- ``AZUREML_RESUBMIT_BACKOFF_SECONDS``: back-off of a loop of preemptions: from the third
  preemption of one partition on, doubling (default 60). The first two are resubmitted at once.
- ``AZUREML_EVIDENCE_WAIT_SECONDS``: how long a preemption seen only near a job's end waits for a person's
  cancel to show in the Activity Log before it is resubmitted (default 900: such events show minutes late).
- ``AZUREML_DEFERRABLE``: ``true`` (default) waits in the triggerer, ``false`` in the worker.
- ``AZUREML_CAPACITY_POOL_CONN_ID``: an Airflow connection to this Airflow's REST API (docs/backfills.md). Set,
  ``sync_capacity_pool`` sizes the pool ``azureml_capacity_<cluster>`` from the cluster and deployment YAML
  (``max_instances // instance_count`` jobs, plus ``AZUREML_CAPACITY_QUEUE_AHEAD``) and the scoring tasks run in
  it, so a backfill's extra jobs wait in Airflow, not in Azure's queue. Unset (default), the scoring tasks run in
  ``default_pool``.
- ``AZUREML_CAPACITY_QUEUE_AHEAD``: jobs the capacity pool lets wait in Azure's queue beyond the cluster's capacity
  (0-8, default 0; 1 keeps a backfill of short jobs from idling the nodes through Airflow's turn: docs/backfills.md).
  A bad value is an ``AzureMLConfigError`` about ``queue_ahead`` when this file is parsed (only with the pool).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import example_partitions
import pendulum
from airflow.sdk import DAG, Asset, Param, task

from airflow_azureml.operators import (
    AzureMLCreateBatchDeploymentOperator,
    AzureMLCreateComputeClusterOperator,
    AzureMLInvokeBatchEndpointOperator,
    AzureMLRegisterModelOperator,
    AzureMLSyncCapacityPoolOperator,
)

CONFIG = Path(__file__).parent / "azureml"
# Names are defined once, in the az ml CLI YAML that creates them.
CLUSTER = example_partitions.config_name(CONFIG / "low-pri-cluster.yml")
ENDPOINT = example_partitions.config_name(CONFIG / "endpoint.yml")
DEPLOYMENT = example_partitions.config_name(CONFIG / "deployment.yml")
FALLBACK_DEPLOYMENT = example_partitions.config_name(CONFIG / "deployment-dedicated.yml")  # dedicated compute
# The datastore folder the MLflow model (azureml/model/) is copied to and registered from (azureml/model.yml).
MODEL_FOLDER = example_partitions.config_datastore_path(CONFIG / "model.yml")
PREFIX = "scoring"
# The infrastructure tasks (clusters, model version, endpoint, deployments) of every run and DAG run in this pool of one
# slot, so that two runs, a backfill or another DAG never write the same endpoint at once. Create it once:
# ``airflow pools set azureml_infrastructure 1 "Azure ML infrastructure writes, one at a time"``.
INFRA_POOL = os.environ.get("AZUREML_INFRA_POOL", "azureml_infrastructure")
# One event per verified interval (every row in scored exactly once): what downstream DAGs schedule on.
VERIFIED = Asset(example_partitions.datastore_uri(f"{PREFIX}/reports"))
# A failed task's first retry after this long, doubling up to 30 min: longer than Azure's throttling waits.
RETRY_DELAY = float(os.environ.get("AZUREML_RETRY_DELAY_SECONDS", "120"))
POLL_SECONDS = float(os.environ.get("AZUREML_POLL_SECONDS", "30"))
MAX_POLL_SECONDS = max(POLL_SECONDS, float(os.environ.get("AZUREML_MAX_POLL_SECONDS", "300")))
RESUBMIT_BACKOFF = float(os.environ.get("AZUREML_RESUBMIT_BACKOFF_SECONDS", "60"))
EVIDENCE_WAIT = float(os.environ.get("AZUREML_EVIDENCE_WAIT_SECONDS", "900"))
# Waiting in the triggerer frees the worker slot for the hours a batch job can take.
DEFERRABLE = os.environ.get("AZUREML_DEFERRABLE", "true").lower() == "true"
# The scoring tasks' pool: as many slots as jobs fit on the spot cluster at once (docs/backfills.md).
CAPACITY_CONN_ID = os.environ.get("AZUREML_CAPACITY_POOL_CONN_ID", "")
CAPACITY_POOL = f"azureml_capacity_{CLUSTER}" if CAPACITY_CONN_ID else "default_pool"
# Jobs the pool lets wait in Azure's queue beyond the cluster's capacity, so that freed nodes start the next job at
# once: 1 for backfills of many jobs much shorter than max_queue_seconds (docs/backfills.md). Default 0. One value for
# the whole deployment (every run's sync writes the pool); checked by AzureMLSyncCapacityPoolOperator.
CAPACITY_QUEUE_AHEAD = os.environ.get("AZUREML_CAPACITY_QUEUE_AHEAD", "0")
# When each partition must be scored by (docs/operators.md, "A deadline for the work"): e.g. "+6h" after the
# data interval's end, or an ISO-8601 time with its offset. Unset: no deadline. The default of the run's
# ``deadline`` param, which a manual run's conf may set.
DEADLINE = os.environ.get("AZUREML_DEADLINE") or None


with DAG(
    dag_id="low_priority_batch_scoring",
    schedule="@daily",
    start_date=pendulum.datetime(2026, 11, 1, tz="UTC"),
    catchup=False,
    max_active_runs=2,
    # a run still going after 20 h is stuck: fail it before the next day's run piles up behind it
    dagrun_timeout=pendulum.duration(hours=20),
    default_args=example_partitions.retry_args(RETRY_DELAY),
    params={
        "partitions": Param(4, type="integer", minimum=1, maximum=64),
        "files_per_partition": Param(6, type="integer", minimum=1),
        "rows_per_file": Param(25, type="integer", minimum=1),
        # Give up on a job that waits this long for spot capacity (it is cancelled on the last try).
        "max_queue_seconds": Param(6 * 3600, type="number", exclusiveMinimum=0),
        # When each partition must be scored by (AZUREML_DEADLINE by default; null or empty: none), and what a deadline
        # that not even the dedicated fallback can meet does: "fallback" finishes as early as it can, "fail"
        # fails the partition before any job is sent.
        "deadline": Param(DEADLINE, type=["null", "string"]),
        "on_infeasible_deadline": Param("fallback", type="string", enum=["fallback", "fail"]),
    },
    tags=["azureml", "low-priority", "example"],
    doc_md=__doc__,
) as dag:
    # [START howto_operator_create_compute_cluster]
    create_cluster = AzureMLCreateComputeClusterOperator(
        task_id="create_low_priority_cluster", compute=str(CONFIG / "low-pri-cluster.yml"), pool=INFRA_POOL
    )
    # [END howto_operator_create_compute_cluster]
    create_dedicated = AzureMLCreateComputeClusterOperator(
        task_id="create_dedicated_cluster", compute=str(CONFIG / "dedicated-pool.yml"), pool=INFRA_POOL
    )

    @task
    def publish_model() -> str:
        """Copy the committed MLflow model (azureml/model/) to the datastore folder it is registered from."""
        return example_partitions.publish_model(str(CONFIG / "model"), MODEL_FOLDER)

    # [START howto_operator_register_model]
    register_model = AzureMLRegisterModelOperator(
        task_id="register_model", model=str(CONFIG / "model.yml"), pool=INFRA_POOL
    )
    # [END howto_operator_register_model]
    # [START howto_operator_create_batch_deployment]
    create_deployment = AzureMLCreateBatchDeploymentOperator(
        task_id="create_batch_deployment", deployment=str(CONFIG / "deployment.yml"), pool=INFRA_POOL
    )
    # [END howto_operator_create_batch_deployment]
    # [START howto_operator_create_fallback_deployment]
    create_fallback = AzureMLCreateBatchDeploymentOperator(
        task_id="create_fallback_deployment",
        deployment=str(CONFIG / "deployment-dedicated.yml"),
        set_default=False,  # the endpoint's default stays the spot deployment
        pool=INFRA_POOL,
    )
    # [END howto_operator_create_fallback_deployment]

    @task
    def extract(
        params: dict[str, Any], data_interval_start: pendulum.DateTime | None = None, dag_run: Any = None
    ) -> list[dict[str, Any]]:
        """Write the interval's records as partition folders on the datastore (idempotent).

        A run with no data interval (a manual trigger without a logical date) works on the minute it was
        triggered in (``example_partitions.interval_start``)."""
        start = example_partitions.interval_start(data_interval_start, dag_run)
        return example_partitions.write_partitions(
            PREFIX,
            example_partitions.interval_key(start),
            int(start.timestamp()),
            params["partitions"],
            params["files_per_partition"],
            params["rows_per_file"],
        )

    @task
    def plan(partitions: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The checkpoint: only partitions without verified predictions for this interval are scored."""
        return example_partitions.pending(partitions)

    # [START howto_operator_invoke_batch_endpoint]
    score = AzureMLInvokeBatchEndpointOperator.partial(
        task_id="score_partition",
        endpoint_name=ENDPOINT,
        deployment_name=DEPLOYMENT,
        fallback_deployment=FALLBACK_DEPLOYMENT,
        fallback_after=2,
        max_resubmits=3,
        resubmit_backoff=RESUBMIT_BACKOFF,
        evidence_wait=EVIDENCE_WAIT,
        deferrable=DEFERRABLE,
        polling={"interval": POLL_SECONDS, "max_interval": MAX_POLL_SECONDS},
        max_queue_time="{{ params.max_queue_seconds }}",
        deadline="{{ params.deadline or '' }}",
        on_infeasible_deadline="{{ params.on_infeasible_deadline }}",
        map_index_template="{{ task.job_identity }}",
        pool=CAPACITY_POOL,
    ).expand_kwargs(planned := plan(extracted := extract()))
    # [END howto_operator_invoke_batch_endpoint]
    if CAPACITY_CONN_ID:
        # [START howto_operator_sync_capacity_pool]
        sync_capacity = AzureMLSyncCapacityPoolOperator(
            task_id="sync_capacity_pool",
            pool_name=CAPACITY_POOL,
            compute=str(CONFIG / "low-pri-cluster.yml"),  # max_instances
            deployment=str(CONFIG / "deployment.yml"),  # resources.instance_count of one job
            queue_ahead=CAPACITY_QUEUE_AHEAD,  # jobs that may wait in Azure's queue for the nodes the next job frees
            airflow_conn_id=CAPACITY_CONN_ID,
            pool=INFRA_POOL,
        )
        # [END howto_operator_sync_capacity_pool]
        create_cluster >> sync_capacity >> score

    @task(trigger_rule="none_failed", outlets=[VERIFIED])
    def report(
        partitions: list[dict[str, Any]],
        planned: list[dict[str, Any]],
        results: list[dict[str, Any]] | None,
        data_interval_start: pendulum.DateTime | None = None,
        dag_run: Any = None,
        ti: Any = None,
        outlet_events: Any = None,
    ) -> dict[str, Any]:
        """Rows in must equal rows scored, each row exactly once; verified partitions become checkpoints.

        Only a wholly verified interval emits the ``VERIFIED`` asset event; a failed check fails this task
        at once (``ExactlyOnceCheckError``: the same outputs would fail it again) with what is wrong and how it
        is redone. A report whose worker died is retried: it only reads outputs and rewrites checkpoints
        and report.json.
        Adds the run's bill: each scoring task's cost report (XCom ``azureml_cost``), combined per
        cluster without counting time twice (``airflow_azureml.cost.run_bill``).
        """
        # By index: iterating the mapped task's lazy XCom sequence reads one item past its end,
        # which Airflow's API client logs as an error ("XCom not found ... offset=N").
        results = [results[i] for i in range(len(results))] if results is not None else None
        costs = [
            ti.xcom_pull(task_ids="score_partition", key="azureml_cost", map_indexes=i)
            for i in range(len(results or []))
        ]
        interval = example_partitions.interval_key(example_partitions.interval_start(data_interval_start, dag_run))
        summary = example_partitions.report(PREFIX, interval, partitions, results, planned, costs)
        outlet_events[VERIFIED].extra = {
            "interval": interval,
            "rows_scored": summary["rows_scored"],
            "predictions": summary["predictions"],
        }
        return summary

    report(extracted, planned, score.output)
    # One deployment write at a time: both write the endpoint too.
    publish_model() >> register_model >> create_deployment
    create_cluster >> create_deployment
    [create_deployment, create_dedicated] >> create_fallback >> extracted
