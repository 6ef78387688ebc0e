"""Activities of the table data procedures (LoadTable, CompactTable): Spark jobs run as long,
heartbeating activities, and their fenced commits.

A job activity heartbeats the job's progress (the Temporal UI shows it as the pending
activity's details, `procbus ... --wait` as a progress bar); when its procedure is cancelled the
Spark job is cancelled and waited for, and the attempt's files are removed. Its output stays in
the attempt's staging folder; the commit step makes it visible by one catalog commit.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TypeVar

import asyncpg
from temporalio import activity

from procbus.auth import WorkerAuth
from procbus.bus import default_member_id
from procbus.core import LOAD_FOLDER
from procbus.errors import AttemptFencedOut, InvalidRequest, ProcbusError
from procbus.lakehouse import Catalog, DataResult, TableDescriptor
from procbus.lakehouse.cache import AccessCache
from procbus.lakehouse.data import (
    CommitStep,
    CompactStep,
    DataFile,
    LoadStep,
    SparkJobStep,
    StagedOutput,
    parse_partition,
    partition_matches,
)
from procbus.lakehouse.warehouse import owned_table_folder
from procbus.spark import (
    JobHandle,
    JobPhase,
    JobProgress,
    LocalBackend,
    SparkBackend,
    spark_session,
    staging,
    watch,
)
from procbus.spark.backends import SparkJob, reporting_while
from procbus.spark.ledger import JobLedger, JobRecord, JobState
from procbus.spark.sources import allowed_source, stage_input
from procbus.spark.specs import CompactJob, LoadJob

# A compaction rewrites a partition's files smaller than this share of the target size.
SMALL_FILE_SHARE = 0.75
# Under the warehouse: where a worker loads inputs from unless PROCBUS_LOAD_ROOTS says more.
INCOMING = LOAD_FOLDER

T = TypeVar("T")


class SparkActivities:
    """The activities of LoadTable and CompactTable: their Spark jobs and fenced commits."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        warehouse_root: Path,
        spark_master: str = "local[*]",
        *,
        worker_id: str | None = None,
        progress_every_seconds: float = 2.0,
        backend: SparkBackend | None = None,
        spark_rest_url: str | None = None,
        spark_web_url: str | None = None,
        load_roots: Sequence[Path] | None = None,
        access: AccessCache | None = None,
        auth: WorkerAuth | None = None,
    ) -> None:
        self.catalog = Catalog(pool)
        # Who may write a table: this worker's ACL cache (kept by the bus) and its operator.
        self.access = access or AccessCache()
        self.auth = auth or WorkerAuth()
        self.ledger = JobLedger(pool)
        self.warehouse_root = warehouse_root
        self.load_roots = (
            list(load_roots) if load_roots is not None else [warehouse_root / INCOMING]
        )
        self.spark_master = spark_master
        self.worker_id = worker_id or default_member_id()
        self.progress_every_seconds = progress_every_seconds
        self._backend = backend
        self.spark_rest_url = spark_rest_url
        self.spark_web_url = spark_web_url
        self._backend_lock = asyncio.Lock()

    async def backend(self) -> SparkBackend:
        """The Spark backend, started on first use (a Spark session takes seconds to start):
        jobs on a standalone cluster for a spark:// master, else in this worker's session."""
        async with self._backend_lock:
            if self._backend is None:
                if self.spark_master.startswith("spark://"):
                    # httpx loads for a cluster only: ~0.05 s of CPU off every worker start.
                    from procbus.spark.standalone import StandaloneBackend

                    self._backend = StandaloneBackend(
                        self.spark_master,
                        self.ledger,
                        rest_url=self.spark_rest_url,
                        web_url=self.spark_web_url,
                    )
                else:
                    session = await asyncio.to_thread(
                        spark_session, self.spark_master, self.warehouse_root
                    )
                    self._backend = LocalBackend(session)
            return self._backend

    def _folder(self, table: TableDescriptor) -> Path:
        """The table's own folder under the warehouse: every file a step writes or removes is
        in it, whatever folder the step's input names (OutsideTableFolder otherwise)."""
        return owned_table_folder(self.warehouse_root, table.namespace, table.name, table.location)

    # ---- preflight and plans ----

    async def _table(self, table: TableDescriptor) -> TableDescriptor:
        found = await self.catalog.get_table(table.namespace, table.name)
        if found is None:
            raise InvalidRequest(f"table {table.qualified_name} does not exist")
        return found

    @activity.defn(name="preflight_load_table")
    async def preflight_load_table(self, step: LoadStep) -> TableDescriptor:
        table = await self._table(step.table)
        self.auth.require_write(self.access, step.principal, table)
        # Checked before it is touched: a refused path is never read, nor said to exist.
        source = await asyncio.to_thread(allowed_source, step.source, self.load_roots)
        if not await asyncio.to_thread(source.exists):
            raise InvalidRequest(f"the source {step.source} does not exist on this worker")
        return table

    @activity.defn(name="plan_compaction")
    async def plan_compaction(self, step: CompactStep) -> CompactStep:
        """The files to rewrite: per partition in scope, its files below SMALL_FILE_SHARE of
        the target size, when it has at least two of them, and every file some rows of which
        a change apply deleted (its rewrite drops them, and its deletes with it)."""
        table = await self._table(step.table)
        self.auth.require_write(self.access, step.principal, table)
        left_out = await self.catalog.columns_left_out(table)
        if left_out:
            raise InvalidRequest(
                f"table {table.qualified_name} has column(s) of types procbus has none for, "
                f"added by another engine: {', '.join(left_out)}; a compaction by procbus "
                "would lose their values, so nothing was compacted: compact it with an engine "
                "that knows them (Spark with Iceberg's runtime: CALL "
                "procbus.system.rewrite_data_files(...))"
            )
        scopes = [parse_partition(table, spec) for spec in step.plan.partitions]
        current = await self.catalog.table_files(table.namespace, table.name)
        by_partition: dict[tuple[tuple[str, str], ...], list[DataFile]] = {}
        for file in current.files:
            if scopes and not any(partition_matches(file.partition, scope) for scope in scopes):
                continue
            if file.deletes or file.bytes < step.plan.target_file_size * SMALL_FILE_SHARE:
                by_partition.setdefault(tuple(sorted(file.partition.items())), []).append(file)
        inputs = [
            file
            for files in by_partition.values()
            if len(files) > 1 or any(file.deletes for file in files)
            for file in files
        ]
        plan = step.plan.model_copy(update={"inputs": inputs, "snapshot_id": current.snapshot_id})
        return step.model_copy(update={"table": table, "plan": plan})

    # ---- the jobs ----

    @activity.defn(name="run_load_job")
    async def run_load_job(self, step: LoadStep) -> StagedOutput:
        # Again: a link swapped since the preflight must not lead Spark out of the roots.
        source = await asyncio.to_thread(allowed_source, step.source, self.load_roots)
        folder = self._folder(step.table)

        def job(output: Path, attempt_token: str) -> SparkJob:
            # Spark reads a copy made following no link: never what a swap put there since.
            copy = stage_input(
                source, self.load_roots, staging.input_folder(folder, attempt_token), step.source
            )
            return LoadJob(
                table=step.table, source=str(copy), format=step.format, output=str(output)
            )

        return await self._run_job(step, job)

    @activity.defn(name="run_compaction_job")
    async def run_compaction_job(self, step: CompactStep) -> StagedOutput:
        def job(output: Path, attempt_token: str) -> SparkJob:
            return CompactJob(
                table=step.table,
                inputs=step.plan.inputs,
                target_file_size=step.plan.target_file_size,
                output=str(output),
            )

        return await self._run_job(step, job)

    async def _run_job(
        self, step: SparkJobStep, make_job: Callable[[Path, str], SparkJob]
    ) -> StagedOutput:
        """Run the step's job (or find the run of it still going here), as a new attempt that
        fences out the earlier ones; `make_job` gets the attempt's output folder and token,
        and may do blocking work (off the event loop)."""
        submitted = JobProgress(job_key=step.job_key, phase=JobPhase.SUBMITTED)
        activity.heartbeat(submitted.model_dump(mode="json"))  # seen at once in the UI
        folder = self._folder(step.table)
        backend = await self._heartbeating(self.backend(), submitted)
        handle = await backend.reattach(step.job_key)
        if handle is not None and not await self.ledger.is_current(
            step.job_key, handle.attempt_token
        ):
            await backend.cancel(handle)  # a run that a newer attempt fenced out
            handle = None
        if handle is None:
            begun = await self.ledger.begin_attempt(
                step.job_key,
                step.procedure_id,
                step.table.namespace,
                step.table.name,
                self.worker_id,
            )
            if isinstance(begun, JobRecord):  # committed already: nothing runs again
                return StagedOutput(
                    job_key=step.job_key, attempt_token=begun.attempt_token, files=[]
                )
            token = begun.attempt_token
            # Earlier attempts are fenced out now; what a dead one left is removed.
            for earlier in await self.ledger.attempt_tokens(step.job_key):
                if earlier != token:
                    await asyncio.to_thread(staging.discard_attempt, folder, earlier)
            try:
                job = await self._heartbeating(
                    asyncio.to_thread(make_job, staging.staging_folder(folder, token), token),
                    submitted,
                )
            except ProcbusError as error:
                await self._abandon(step, folder, token, JobState.FAILED, str(error))
                raise
            handle = await backend.submit(step.job_key, job, token)
        return await self._finish(backend, handle, step, folder)

    async def _heartbeating(self, starting: Awaitable[T], progress: JobProgress) -> T:
        """`starting`'s result, heartbeating `progress` meanwhile (see `reporting_while`)."""
        return await reporting_while(
            starting,
            lambda: activity.heartbeat(progress.model_dump(mode="json")),
            self.progress_every_seconds,
        )

    async def _finish(
        self, backend: SparkBackend, handle: JobHandle, step: SparkJobStep, folder: Path
    ) -> StagedOutput:
        token = handle.attempt_token
        last = JobProgress(job_key=step.job_key, phase=JobPhase.SUBMITTED)

        def report(progress: JobProgress) -> None:
            nonlocal last
            last = progress
            activity.heartbeat(progress.model_dump(mode="json"))

        try:
            await watch(backend, handle, report, every_seconds=self.progress_every_seconds)
        except asyncio.CancelledError:
            await self._abandon(step, folder, token, JobState.CANCELLED, "cancelled")
            raise
        except ProcbusError as error:
            await self._abandon(step, folder, token, JobState.FAILED, str(error))
            raise
        await asyncio.to_thread(staging.remove_input, folder, token)  # read: no longer needed
        files = await asyncio.to_thread(staging.collect_output, folder, token)
        try:
            await self.ledger.set_state(step.job_key, token, JobState.STAGED)
        except AttemptFencedOut:
            await asyncio.to_thread(staging.discard_attempt, folder, token)
            raise
        output = StagedOutput(job_key=step.job_key, attempt_token=token, files=files)
        report(
            last.model_copy(
                update={
                    "records_written": output.records,
                    "bytes_written": sum(file.bytes for file in files),
                }
            )
        )
        return output

    async def _abandon(
        self, step: SparkJobStep, folder: Path, token: str, state: JobState, error: str
    ) -> None:
        """A failed or cancelled attempt: marked in the ledger, its files removed."""
        with contextlib.suppress(AttemptFencedOut):
            await self.ledger.set_state(step.job_key, token, state, error)
        await asyncio.to_thread(staging.discard_attempt, folder, token)

    @activity.defn(name="discard_job_output")
    async def discard_job_output(self, step: SparkJobStep) -> None:
        """Undo of a job step: the job, if it still runs here, is cancelled; every attempt's
        files are removed, and the ledger fences out any attempt still running elsewhere."""
        folder = self._folder(step.table)  # refused before anything is cancelled or removed
        backend = await self.backend()
        # First the run itself (found through the ledger while it still says running), then
        # the ledger, so an attempt still alive elsewhere can no longer stage or commit.
        handle = await backend.reattach(step.job_key)
        if handle is not None:
            await backend.cancel(handle)
        await self.ledger.give_up(step.job_key, JobState.CANCELLED, "its procedure rolled back")
        record = await self.ledger.get(step.job_key)
        if record is not None and record.state is JobState.COMMITTED:
            return  # past the commit the output is the table's: never removed by an undo
        for token in await self.ledger.attempt_tokens(step.job_key):
            await asyncio.to_thread(staging.discard_attempt, folder, token)

    # ---- the commit ----

    @activity.defn(name="commit_job_output")
    async def commit_job_output(self, step: CommitStep) -> DataResult:
        """Make the staged output visible in one catalog commit (the procedure's pivot).

        A retry after an unknown outcome looks the job up first: committed by this attempt, it
        returns that snapshot and touches no file. Refused for certain (a zombie attempt, a
        lost lock, a conflict), this attempt's files are removed.
        """
        output = step.output
        folder = self._folder(step.table)
        record = await self.ledger.get(output.job_key)
        if record is not None and record.state is JobState.COMMITTED:
            if record.attempt_token != output.attempt_token:
                raise AttemptFencedOut(
                    f"job {output.job_key!r} was committed by another attempt "
                    f"({record.attempt_token})"
                )
            return self._result(step, record.snapshot_id)
        await asyncio.to_thread(staging.publish_files, folder, output.attempt_token, output.files)
        try:
            snapshot_id = await self.ledger.commit(
                output.job_key,
                output.attempt_token,
                table=step.table,
                operation=step.operation,
                procedure_id=step.procedure_id,
                adds=output.files,
                removes=step.removes,
                fences=step.fences,
                based_on=step.based_on,
            )
        except ProcbusError:
            # Refused for certain: nothing was committed, and this attempt never will be.
            await asyncio.to_thread(staging.discard_attempt, folder, output.attempt_token)
            raise
        await asyncio.to_thread(staging.remove_staging, folder, output.attempt_token)
        return self._result(step, snapshot_id)

    @activity.defn(name="find_committed_output")
    async def find_committed_output(self, step: CommitStep) -> DataResult:
        """After a commit step failed without a certain answer: the job ledger says whether
        this attempt committed (the answer was lost). Its result if so; AttemptFencedOut if not,
        and nothing changes."""
        output = step.output
        record = await self.ledger.get(output.job_key)
        if (
            record is None
            or record.state is not JobState.COMMITTED
            or record.attempt_token != output.attempt_token
        ):
            said = "not in the ledger" if record is None else record.state.value
            raise AttemptFencedOut(f"job {output.job_key!r} did not commit ({said})")
        folder = self._folder(step.table)
        await asyncio.to_thread(staging.remove_staging, folder, output.attempt_token)
        result = self._result(step, record.snapshot_id)
        result.message = (
            f"committed as snapshot {record.snapshot_id}; the commit's answer was lost, and "
            "the job ledger showed the commit: rolled forward"
        )
        return result

    @staticmethod
    def _result(step: CommitStep, snapshot_id: int | None) -> DataResult:
        return DataResult(
            table=step.table.qualified_name,
            snapshot_id=snapshot_id,
            files_added=len(step.output.files),
            files_removed=len(step.removes),
            records=step.output.records,
        )

    @activity.defn(name="delete_replaced_files")
    async def delete_replaced_files(self, step: CommitStep) -> int:
        """After a compaction's commit: its input files are no longer in the current snapshot,
        but the snapshots before it still list them (time travel reads them), so they stay until
        those snapshots expire (Retention deletes them then). What this deletes is only what no
        snapshot the table keeps lists (a table dropped meanwhile; never a forged step's live
        file); roll-forward: retried until done."""
        folder = self._folder(step.table)  # refused before anything is looked up or removed
        paths = [file.path for file in step.removes]
        live = await self.catalog.live_among(step.table.namespace, step.table.name, paths)
        gone = [path for path in paths if path not in live]
        return await asyncio.to_thread(staging.delete_files, folder, gone)

    def all(self) -> list[Callable[..., object]]:
        return [
            self.preflight_load_table,
            self.plan_compaction,
            self.run_load_job,
            self.run_compaction_job,
            self.discard_job_output,
            self.commit_job_output,
            self.find_committed_output,
            self.delete_replaced_files,
        ]
