"""The stack check: a worker writes a row to PostgreSQL and reads it back.

The smallest real round trip through every part of the stack: starter -> Temporal -> worker ->
PostgreSQL -> back. `procbus demo` runs it first.
"""

from __future__ import annotations

from datetime import datetime

import asyncpg
from pydantic import BaseModel, Field

from procbus.core import WorkflowInput
from procbus.db import load_queries


class StackCheckInput(WorkflowInput):
    """Input of the StackCheck workflow and of its activity."""

    check_id: str = Field(min_length=1, max_length=200, description="idempotency key of the row")
    message: str = Field(default="hello from procbus", max_length=1000)


class StackCheckResult(BaseModel):
    """What the worker wrote and then read back from PostgreSQL."""

    row_id: int
    check_id: str
    message: str
    worker: str
    written_at: datetime
    total_checks: int


async def record_stack_check(
    pool: asyncpg.Pool, request: StackCheckInput, worker: str
) -> StackCheckResult:
    """Write the check (once per check_id, so retries are harmless) and read it back."""
    queries = load_queries("procbus.stack")
    async with pool.acquire() as connection, connection.transaction():
        await connection.execute(
            queries["insert_stack_check"], request.check_id, request.message, worker
        )
        row = await connection.fetchrow(queries["get_stack_check"], request.check_id)
        total = await connection.fetchval(queries["count_stack_checks"])
    return StackCheckResult(
        row_id=row["id"],
        check_id=row["check_id"],
        message=row["message"],
        worker=row["worker"],
        written_at=row["written_at"],
        total_checks=total,
    )
