"""The Spark job ledger in PostgreSQL: one row per job, keyed by its business key (procedure ID +
step), with one attempt token per attempt, and the fenced catalog commit.

Temporal cannot promise that two attempts of one activity never run at once, so each attempt
takes a new token, which fences out every earlier one: only the current attempt may stage its
output or commit it. The commit, in one PostgreSQL transaction, checks the attempt's token and
the lock fence, swaps the table's snapshot by compare-and-set, and records the snapshot in the
job's row: a commit retried after an unknown outcome finds it there, and commits nothing twice.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from enum import StrEnum

import asyncpg
from pydantic import BaseModel

from procbus.core import Fence
from procbus.db import load_queries
from procbus.errors import AttemptFencedOut
from procbus.lakehouse import Catalog, TableDescriptor
from procbus.lakehouse.data import DataFile, SnapshotOperation
from procbus.locks import check_fence

QUERIES = "procbus.spark"


class JobState(StrEnum):
    RUNNING = "running"  # the current attempt's Spark job runs
    STAGED = "staged"  # its output is written, not yet committed
    COMMITTED = "committed"
    FAILED = "failed"
    CANCELLED = "cancelled"


class JobRecord(BaseModel):
    job_key: str
    procedure_id: str
    namespace: str
    table_name: str
    attempt: int
    attempt_token: str
    state: JobState
    snapshot_id: int | None
    error: str | None
    started_at: datetime
    updated_at: datetime


class Attempt(BaseModel):
    job_key: str
    attempt: int
    attempt_token: str


class Submission(BaseModel):
    attempt_token: str
    submission_id: str
    output: str


class JobLedger:
    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool
        self.queries = load_queries(QUERIES)
        self.catalog = Catalog(pool)

    async def get(self, job_key: str) -> JobRecord | None:
        row = await self.pool.fetchrow(self.queries["get_job"], job_key)
        return JobRecord.model_validate(dict(row)) if row else None

    async def begin_attempt(
        self, job_key: str, procedure_id: str, namespace: str, table: str, worker: str
    ) -> Attempt | JobRecord:
        """A new attempt (fencing out every earlier one), or the job's record if it committed
        already: its output is in the catalog and nothing is to run again."""
        token = uuid.uuid4().hex[:16]
        async with self.pool.acquire() as connection, connection.transaction():
            attempt = await connection.fetchval(
                self.queries["begin_attempt"], job_key, procedure_id, namespace, table, token
            )
            if attempt is not None:
                await connection.execute(
                    self.queries["insert_attempt"], job_key, attempt, token, worker
                )
                return Attempt(job_key=job_key, attempt=attempt, attempt_token=token)
        record = await self.get(job_key)
        if record is None:  # the insert found it committed, so it exists
            raise AttemptFencedOut(f"job {job_key!r} vanished from the ledger")
        return record

    async def is_current(self, job_key: str, attempt_token: str) -> bool:
        record = await self.get(job_key)
        return (
            record is not None
            and record.attempt_token == attempt_token
            and record.state in (JobState.RUNNING, JobState.STAGED)
        )

    async def set_state(
        self, job_key: str, attempt_token: str, state: JobState, error: str | None = None
    ) -> None:
        """Move the current attempt's job on; AttemptFencedOut if a newer attempt took over."""
        moved = await self.pool.fetchval(
            self.queries["set_state"], job_key, attempt_token, state.value, error
        )
        if moved is None:
            raise await self._fenced_out(job_key, attempt_token)

    async def give_up(self, job_key: str, state: JobState, error: str | None = None) -> None:
        """The job will not commit (its procedure rolls back): any attempt still running is
        fenced out. A committed job stays committed."""
        await self.pool.execute(self.queries["end_job"], job_key, state.value, error)

    async def set_submission(
        self, job_key: str, attempt_token: str, submission_id: str, output: str
    ) -> None:
        await self.pool.execute(
            self.queries["set_submission"], job_key, attempt_token, submission_id, output
        )

    async def current_submission(self, job_key: str) -> Submission | None:
        """The running attempt's submission on a cluster (a worker restarted reattaches it)."""
        row = await self.pool.fetchrow(self.queries["current_submission"], job_key)
        return Submission.model_validate(dict(row)) if row else None

    async def attempt_tokens(self, job_key: str) -> list[str]:
        rows = await self.pool.fetch(self.queries["attempt_tokens"], job_key)
        return [row["attempt_token"] for row in rows]

    async def _fenced_out(self, job_key: str, attempt_token: str) -> AttemptFencedOut:
        record = await self.get(job_key)
        if record is None:
            return AttemptFencedOut(f"job {job_key!r} is not in the ledger")
        if record.attempt_token != attempt_token:
            return AttemptFencedOut(
                f"job {job_key!r}: this attempt was replaced by attempt {record.attempt} "
                f"({record.attempt_token}); its output is discarded"
            )
        return AttemptFencedOut(f"job {job_key!r} is {record.state.value}; nothing more to do")

    async def commit(
        self,
        job_key: str,
        attempt_token: str,
        *,
        table: TableDescriptor,
        operation: SnapshotOperation,
        procedure_id: str,
        adds: list[DataFile],
        removes: Sequence[DataFile] = (),
        fences: Sequence[Fence] = (),
        based_on: int | None = None,
    ) -> int:
        """Make `adds` visible and `removes` invisible in one new snapshot; its ID.

        Idempotent: the same attempt committing again (its first outcome unknown) gets the
        snapshot it made. Refused with AttemptFencedOut for any other attempt, with
        StaleFencingToken if the lock was lost, with SnapshotConflict if a file to remove is
        no longer live (a concurrent commit replaced it) or, for a compaction planned on
        snapshot `based_on`, a merge-on-read table got a newer file meanwhile.
        """
        async with self.pool.acquire() as connection, connection.transaction():
            job = await connection.fetchrow(self.queries["lock_job"], job_key)
            if job is None:
                raise AttemptFencedOut(f"job {job_key!r} is not in the ledger")
            if job["attempt_token"] != attempt_token:
                raise await self._fenced_out(job_key, attempt_token)
            if job["state"] == JobState.COMMITTED:
                snapshot_id: int = job["snapshot_id"]
                return snapshot_id
            if job["state"] != JobState.STAGED:
                raise AttemptFencedOut(
                    f"job {job_key!r} is {job['state']}: only staged output can be committed"
                )
            for fence in fences:
                await check_fence(connection, fence)
            snapshot_id = await self.catalog.swap_snapshot(
                connection,
                table,
                operation,
                job_key,
                procedure_id,
                adds,
                removes,
                based_on,
            )
            await connection.execute(self.queries["mark_committed"], job_key, snapshot_id)
            return snapshot_id
