"""The job runner: what happens to a job between its creation and its end.

A batch job's input files are cut into mini-batches, which run on ``instance_count`` nodes x
``max_concurrency_per_instance`` workers with the deployment's scoring script (its uploaded code) or the
model's built-in one; an evicted node's in-flight mini-batches go back in the queue (finished ones are
kept), failed ones are retried and counted against the error threshold, and the rows are written to the
output file. A command job takes a node, runs for ``Timing.command_job`` and ends; a synthetic job
follows its fixed timeline. A whole-cluster preemption (``emulator.nodes``) ends a job from outside.
``JobRunner`` is that part of ``Workspace``.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import Any

from airflow_azureml.emulator.azure_rules import check_output_file_name
from airflow_azureml.emulator.batch_endpoints import BatchSettings
from airflow_azureml.emulator.models import NO_RESULT_MESSAGE, RUNNER_FAILED_MESSAGE, Compute, Job, Node
from airflow_azureml.emulator.registry import model_name_from_asset, version_key
from airflow_azureml.emulator.scoring.script import ScriptScorer

MLFLOW_DRIVER = Path(__file__).parent / "scoring" / "_mlflow_driver.py"
# Microsoft Learn, "Deploy MLflow models in batch deployments", "File's types support": what a no-code
# MLflow deployment reads. The image types are documented but not emulated (docs/emulator.md).
MLFLOW_TABULAR = (".csv", ".parquet", ".pqt")
MLFLOW_IMAGES = (".png", ".jpg", ".jpeg", ".tiff", ".bmp", ".gif")


def check_mlflow_input_files(files: list[str]) -> None:
    """Azure: "any unsupported file that may be present in the input data will make the job to fail", with the
    documented message; raised here, it ends the job Failed."""
    for path in files:
        suffix = Path(path).suffix.lower()
        if suffix in MLFLOW_TABULAR:
            continue
        if suffix in MLFLOW_IMAGES:
            raise RuntimeError(
                f"Error processing input file: {Path(path).name!r}. The emulator does not score image files "
                "with MLflow models (Azure does): use a scoring script."
            )
        kind = suffix.lstrip(".") or Path(path).name
        raise RuntimeError(f"Error processing input file: {Path(path).name!r}. File type {kind!r} is not supported.")


log = logging.getLogger(__name__)


class _JobEnded(Exception):
    pass


class JobRunner:
    """The part of ``Workspace`` (emulator.workspace) that runs jobs to their end."""

    async def _run_batch(self, job: Job, settings: BatchSettings, input_dir: Path) -> None:
        """Run the job to an end, whatever happens inside: a runner failure ends it Failed, as in Azure."""
        workers: dict[asyncio.Task[None], Node] = {}
        try:
            await self._batch_body(job, settings, input_dir, workers)
        except (_JobEnded, asyncio.CancelledError):
            return
        except Exception as exc:  # scoring module import/init, output writing, anything else in the runner
            log.warning("batch job %s failed in the runner: %s", job.name, exc)
            detail = f"{type(exc).__name__}: {exc}"
            self._end_job(
                job, "Failed", error={"code": "UserError", "message": RUNNER_FAILED_MESSAGE.format(detail=detail)}
            )
        finally:
            for task in list(workers):
                task.cancel()
            script = self.scripts.pop(job.name, None)
            if script is not None:
                script.close()
            self._release(self.computes.get(job.compute), job)

    async def _batch_body(
        self, job: Job, settings: BatchSettings, input_dir: Path, workers: dict[asyncio.Task[None], Node]
    ) -> None:
        files = sorted(str(p) for p in input_dir.rglob("*") if p.is_file())
        batches = [files[i : i + settings.mini_batch_size] for i in range(0, len(files), settings.mini_batch_size)]
        job.mini_batches_total = len(batches)
        results: dict[int, list[str]] = {}
        failures: dict[int, str] = {}
        attempts: dict[int, int] = {}
        queue: list[int] = list(range(len(batches)))
        in_flight: dict[asyncio.Task[None], int] = {}
        await asyncio.sleep(self.timing.tick)
        if job.status == "CancelRequested":  # cancelled before it queued: the cancel ends it, as in Azure
            return
        job.set_status("Queued")
        if self.computes.get(job.compute) is None:
            self._end_job(job, "Failed", error={"code": "UserError", "message": "Compute not found"})
            return
        scorer: Any = None

        async def work(node: Node, index: int) -> None:
            attempts[index] = attempts.get(index, 0) + 1
            job.mini_batch_attempts += 1
            try:
                await asyncio.sleep(self.timing.mini_batch)
                rows = await asyncio.wait_for(asyncio.to_thread(scorer.run, batches[index]), timeout=settings.timeout)
                results[index] = rows
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the scoring script failed this mini-batch
                if attempts[index] <= settings.max_retries:
                    queue.append(index)
                else:
                    failures[index] = f"{type(exc).__name__}: {exc}"

        while len(results) + len(failures) < len(batches):
            compute = self.computes.get(job.compute)
            if compute is None:
                raise _JobEnded()
            mine = [n for n in compute.nodes if n.job_name == job.name]
            missing = settings.instance_count - len(mine)
            if missing > 0 and job.status != "CancelRequested":  # a job being canceled takes no new nodes
                for node in self._allocate(compute, job, missing):
                    self._spawn(self._start_node(compute, node))
                mine = [n for n in compute.nodes if n.job_name == job.name]
            self._want_nodes(job, compute, settings.instance_count - len(mine))
            ready = [n for n in mine if n.state in ("idle", "running")]
            if ready and job.status == "Queued":
                self._now_running(job)
            if ready and scorer is None:
                # init() runs on the nodes of a Running job (loading an MLflow model takes seconds): an
                # import error or a raising init() fails the job
                scorer = await self._load_scorer(job, settings, files)
                continue  # the nodes may have gone while init() ran: look at them again before any work
            # evicted nodes: put their unfinished mini-batches back in the queue
            for task, node in list(workers.items()):
                if (node not in compute.nodes or node.state == "preempted") and not task.done():
                    task.cancel()
            for task in [t for t in workers if t.done()]:
                index = in_flight.pop(task)
                node = workers.pop(task)
                if task.cancelled() and index not in results:
                    queue.insert(0, index)
                if node in compute.nodes and node.state == "running" and not any(w is node for w in workers.values()):
                    node.state = "idle"
                    self._billed(compute)
            failed_files = sum(len(batches[i]) for i in failures)
            if failures and self._over_threshold(settings, failed_files):
                self._fail_batch(job, settings, failures, failed_files, len(files))
                return
            if job.status == "Running" and not self._held(job):  # a NotResponding (or held) job takes no new work
                for node in ready:
                    busy = sum(1 for n in workers.values() if n is node)
                    while queue and busy < settings.max_concurrency:
                        index = queue.pop(0)
                        task = asyncio.get_running_loop().create_task(work(node, index))
                        workers[task] = node
                        in_flight[task] = index
                        node.state = "running"
                        self._billed(compute)
                        busy += 1
            job.mini_batches_done = len(results)
            await asyncio.sleep(self.timing.tick)
        failed_files = sum(len(batches[i]) for i in failures)
        if failures and self._over_threshold(settings, failed_files):  # the last mini-batches to end failed
            self._fail_batch(job, settings, failures, failed_files, len(files))
            return
        await self._while_stalled(job)
        if job.status == "CancelRequested":
            return  # the cancel ends it (_finish_cancel), not the last mini-batch
        job.set_status("Finalizing")
        if failures and not results:
            self._end_job(job, "Failed", error={"code": "UserError", "message": NO_RESULT_MESSAGE})
            return
        rows = [row for index in range(len(batches)) if index in results for row in results[index]]
        job.rows_scored = len(rows)
        if settings.output_action == "append_row":
            self._write_output(job, settings.output_file_name, rows)
        self._end_job(job, "Completed")

    def _over_threshold(self, settings: BatchSettings, failed_files: int) -> bool:
        if not self.behaviour.honour_error_threshold:
            return True  # legacy: the first mini-batch that fails after its retries fails the job
        return settings.error_threshold >= 0 and failed_files > settings.error_threshold

    def _fail_batch(
        self, job: Job, settings: BatchSettings, failures: dict[int, str], failed_files: int, total: int
    ) -> None:
        first = min(failures)
        if self.behaviour.honour_error_threshold:
            detail = (
                f"The error threshold {settings.error_threshold} was exceeded: {failed_files} of {total} "
                f"file(s) failed. First failure: mini-batch {first}: {failures[first]}"
            )
        else:
            detail = (
                f"{len(failures)} mini-batch(es) failed after {settings.max_retries} retries; "
                f"first: mini-batch {first}: {failures[first]}"
            )
        self._end_job(
            job, "Failed", error={"code": "UserError", "message": RUNNER_FAILED_MESSAGE.format(detail=detail)}
        )

    async def _load_scorer(self, job: Job, settings: BatchSettings, files: list[str]) -> Any:
        """The deployment's own scoring script (its uploaded code) if it has one; else, for a registered
        MLflow model, the scoring script Azure generates for it (``scoring._mlflow_driver``); else the
        model's built-in module (the emulator's demo model)."""
        dep = self.deployments.get((job.endpoint or "", job.deployment or ""))
        code = ((dep.body if dep else {}).get("properties") or {}).get("codeConfiguration") or {}
        folder = self.codes.folder(code.get("codeId") or "") if code.get("codeId") else None
        model = self._model_of(job)
        versions = self.models.get(model) or {}
        asset = str((((dep.body if dep else {}).get("properties") or {}).get("model") or {}).get("assetId") or "")
        named = asset.rsplit("/versions/", 1)[-1] if "/versions/" in asset else None
        chosen = named if named in versions else (max(versions, key=version_key) if versions else None)
        uri = versions[chosen]["modelUri"] if chosen else ""
        model_dir = self.resolve_uri(uri) if uri else self.data_dir / "models" / model
        script_name = str(code.get("scoringScript") or "")
        if folder is None:
            if not (model_dir / "MLmodel").is_file():
                return await asyncio.to_thread(self.scoring.load, model)
            check_mlflow_input_files(files)  # an unsupported file fails the job (docs/emulator.md)
            folder, script_name = MLFLOW_DRIVER.parent, MLFLOW_DRIVER.name
        model_dir.mkdir(parents=True, exist_ok=True)
        script = ScriptScorer(
            folder,
            script_name,
            model_dir=model_dir,
            work_dir=self.data_dir / "job-runs" / job.name,
            timeout=settings.timeout,
            # an MLflow model's process (Azure's generated script or the deployment's own) is forked from a
            # template that has imported MLflow once (emulator.scoring.forks): a fresh process per job still
            forks=self.fork_server() if (model_dir / "MLmodel").is_file() else None,
        )
        self.scripts[job.name] = script
        await asyncio.to_thread(script.start)
        return script

    def _model_of(self, job: Job) -> str:
        dep = self.deployments.get((job.endpoint or "", job.deployment or ""))
        asset = (((dep.body if dep else {}).get("properties") or {}).get("model") or {}).get("assetId") or ""
        return model_name_from_asset(asset) or "heart-classifier"

    def _write_output(self, job: Job, file_name: str, rows: list[str]) -> None:
        folder = self.resolve_uri(job.output_uri or "")
        check_output_file_name(file_name)  # checked when written; again here so that nothing lands elsewhere
        target = (folder / file_name).resolve()
        if target.parent != folder:
            raise RuntimeError(f"The output file {file_name!r} is not inside the output folder")
        tmp = folder / f".{file_name}.{job.name}.tmp"
        try:
            folder.mkdir(parents=True, exist_ok=True)
            tmp.write_text("".join(r if r.endswith("\n") else r + "\n" for r in rows))
            tmp.replace(target)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise RuntimeError(f"Cannot write the output file {file_name!r}: {exc.strerror or exc}") from None

    async def _run_command(self, job: Job, compute: Compute) -> None:
        try:
            await asyncio.sleep(self.timing.tick)
            job.set_status("Queued")
            nodes: list[Node] = []
            if compute.compute_type == "AmlCompute":
                while not nodes:
                    nodes = self._allocate(compute, job, 1)
                    self._want_nodes(job, compute, 1 - len(nodes))
                    if not nodes:
                        await asyncio.sleep(self.timing.tick)
                await asyncio.sleep(self.timing.node_startup)
                for node in nodes:
                    node.state = "running"
                self._billed(compute)
            self._now_running(job)
            await asyncio.sleep(self.timing.command_job)
            await self._while_stalled(job)
            if compute.compute_type == "AmlCompute" and not any(n.job_name == job.name for n in compute.nodes):
                return  # preempted: the preemption already ended the job
            if job.status == "CancelRequested":
                return  # the cancel ends it
            self._end_job(job, "Completed")
        except asyncio.CancelledError:
            return
        finally:
            self._release(self.computes.get(job.compute), job)

    async def _run_synthetic(self, job: Job, queue_seconds: float, duration: float) -> None:
        job.set_status("Queued")
        await asyncio.sleep(queue_seconds)
        job.set_status("Running")
        await asyncio.sleep(duration)
        self._end_job(job, "Completed")
