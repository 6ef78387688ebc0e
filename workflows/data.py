"""The table data procedures: LoadTable and CompactTable. Each runs one Spark job as a long,
heartbeating step, then commits its output in one catalog commit, the procedure's pivot.

Locks (docs/concepts/table-data.md):

    LoadTable      IX on the table: loads only add files, so they go on beside each other and
                   beside compactions; the catalog commit keeps every row once
    CompactTable   X on each partition it rewrites (IX on the table), or X on the table when
                   no partition is named: two rewrites of one partition never overlap

Before the pivot a failure, a cancel or an abort removes the job's files; after it, the replaced
files are deleted by roll-forward.
A compaction of a merge-on-read table whose swap finds files committed after its plan (a
change pipeline's) is refused, its output discarded, and it plans again: its fold would hide them.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError, CancelledError

with workflow.unsafe.imports_passed_through():
    from procbus.activities import SparkActivities
    from procbus.core import Fence, LockMode, table_resource
    from procbus.errors import ErrorType
    from procbus.lakehouse import CompactTableInput, DataResult, LoadTableInput, TableDescriptor
    from procbus.lakehouse.data import (
        CommitStep,
        CompactionPlan,
        CompactStep,
        LoadStep,
        SnapshotOperation,
        partition_resource,
        split_partition,
    )

from procbus.engine import Procedure, checked

# A compaction whose commit finds the table changed since its plan plans again, this often.
MAX_COMPACTION_PLANS = 5


def snapshot_conflict(error: ActivityError) -> bool:
    cause = error.cause
    return isinstance(cause, ApplicationError) and cause.type == ErrorType.SNAPSHOT_CONFLICT


async def commit_pivot(
    procedure: Procedure[Any, DataResult], name: str, commit: CommitStep, summary: str
) -> DataResult:
    """The commit step, the pivot. If it failed without a certain refusal, the commit may have
    happened with its answer lost: the job ledger says, and a found commit is the pivot passed
    (rolled forward), never rolled back under committed data."""
    try:
        result: DataResult = await procedure.step(
            name, SparkActivities.commit_job_output, commit, pivot=True, summary=summary
        )
        return result
    except ActivityError as failed:
        if isinstance(failed.cause, CancelledError) or snapshot_conflict(failed):
            raise
        error = failed
        try:
            found: DataResult = await procedure.step(
                f"{name}_found",
                SparkActivities.find_committed_output,
                commit,
                pivot=True,
                summary="its answer was lost: look the commit up in the job ledger",
            )
        except ActivityError:
            pass
        else:
            return found
    # Not committed: roll back for the commit's own failure, which the status names (raised
    # outside the handler, so it keeps its cause: the refusal's type and message).
    procedure.status.step_running = name
    raise error


def job_heartbeat_timeout(request: LoadTableInput | CompactTableInput) -> timedelta:
    return timedelta(seconds=request.job_heartbeat_timeout_seconds)


@workflow.defn(name="LoadTable")
class LoadTable(Procedure[LoadTableInput, DataResult]):
    """Append files' rows to a table, by a Spark job and one fenced commit."""

    authenticates = True  # its preflight refuses a principal that may not write the table

    @workflow.run
    async def run(self, request: LoadTableInput) -> DataResult:
        return await self.execute(request)

    def target(self, request: LoadTableInput) -> str:
        return request.table

    def validate(self, request: LoadTableInput) -> None:
        checked(request.check)

    def locks(self, request: LoadTableInput) -> Sequence[tuple[str, str]]:
        return [(table_resource(*checked(request.check)), "IX")]

    async def steps(self, request: LoadTableInput) -> DataResult:
        procedure_id = workflow.info().workflow_id
        namespace, name = checked(request.check)
        # An append beside other loads: fenced by its IX lock on the table.
        fence = self.fence(table_resource(namespace, name), LockMode.IX)
        wanted = LoadStep(
            procedure_id=procedure_id,
            job_key=self.own_key(":write"),
            table=TableDescriptor(namespace=namespace, name=name, columns=[]),
            source=request.source,
            format=request.format,
            principal=self.principal,
        )
        table = await self.step("preflight", SparkActivities.preflight_load_table, wanted)
        step = wanted.model_copy(update={"table": table})
        output = await self.spark_step(
            "write",
            SparkActivities.run_load_job,
            step,
            undo=SparkActivities.discard_job_output,
            summary=f"Spark: write {request.source} as Parquet, staged",
            heartbeat_timeout=job_heartbeat_timeout(request),
        )
        return await commit_pivot(
            self,
            "commit",
            CommitStep(
                procedure_id=procedure_id,
                table=table,
                operation=SnapshotOperation.LOAD,
                output=output,
                fences=[fence] if fence else [],
            ),
            f"commit {output.records} rows to {table.qualified_name} (point of no return)",
        )


@workflow.defn(name="CompactTable")
class CompactTable(Procedure[CompactTableInput, DataResult]):
    """Rewrite a table's small files into fewer, larger ones: a Spark job, one fenced commit."""

    authenticates = True  # each plan refuses a principal that may not write the table

    @workflow.run
    async def run(self, request: CompactTableInput) -> DataResult:
        return await self.execute(request)

    def target(self, request: CompactTableInput) -> str:
        return request.table

    def validate(self, request: CompactTableInput) -> None:
        checked(request.check)

    def locks(self, request: CompactTableInput) -> Sequence[tuple[str, str]]:
        namespace, name = checked(request.check)
        if not request.partitions:
            return [(table_resource(namespace, name), "X")]
        return [
            (partition_resource(namespace, name, split_partition(spec)), "X")
            for spec in request.partitions
        ]

    def _fences(self, request: CompactTableInput) -> list[Fence]:
        """The fences the commit carries: one per lock the compaction took."""
        fences = [self.fence(resource) for resource, _ in self.locks(request)]
        return [fence for fence in fences if fence is not None]

    async def steps(self, request: CompactTableInput) -> DataResult:
        procedure_id = workflow.info().workflow_id
        namespace, name = checked(request.check)
        fences = self._fences(request)
        for round_ in range(1, MAX_COMPACTION_PLANS + 1):
            # Round 1 keeps the names it always had; a re-plan's steps and job are its own.
            suffix = "" if round_ == 1 else f"_{round_}"
            wanted = CompactStep(
                procedure_id=procedure_id,
                job_key=self.own_key(f":rewrite{suffix}"),
                table=TableDescriptor(namespace=namespace, name=name, columns=[]),
                principal=self.principal,
                plan=CompactionPlan(
                    partitions=request.partitions, target_file_size=request.target_file_size
                ),
            )
            step = await self.step(
                f"plan{suffix}",
                SparkActivities.plan_compaction,
                wanted,
                summary=f"find the small files of {request.table}",
            )
            table, inputs = step.table, step.plan.inputs
            if not inputs:
                return DataResult(
                    table=table.qualified_name,
                    snapshot_id=None,
                    message="nothing to compact: no partition has two files below the target size",
                )
            output = await self.spark_step(
                f"rewrite{suffix}",
                SparkActivities.run_compaction_job,
                step,
                undo=SparkActivities.discard_job_output,
                summary=f"Spark: rewrite {len(inputs)} small files of {table.qualified_name}",
                heartbeat_timeout=job_heartbeat_timeout(request),
            )
            commit = CommitStep(
                procedure_id=procedure_id,
                table=table,
                operation=SnapshotOperation.COMPACT,
                output=output,
                removes=inputs,
                fences=fences,
                based_on=step.plan.snapshot_id,
            )
            try:
                result = await commit_pivot(
                    self,
                    f"swap{suffix}",
                    commit,
                    f"swap {len(inputs)} files for {len(output.files)} (point of no return)",
                )
            except ActivityError as error:
                if not snapshot_conflict(error) or round_ == MAX_COMPACTION_PLANS:
                    raise
                # A commit landed after the plan: this output is stale, so plan again.
                await self.step(
                    f"discard{suffix or '_1'}",
                    SparkActivities.discard_job_output,
                    step,
                    summary="discard the stale rewrite: the table changed after its plan",
                )
                continue
            await self.step(
                "delete_replaced",
                SparkActivities.delete_replaced_files,
                commit,
                summary=f"delete the {len(inputs)} replaced files",
            )
            return result
        raise AssertionError("unreachable: the last round returns or raises")
