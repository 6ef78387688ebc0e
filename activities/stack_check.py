from __future__ import annotations

import asyncpg
from temporalio import activity

from procbus.stack import StackCheckInput, StackCheckResult, record_stack_check


class StackCheckActivities:
    """The activity of StackCheck: a worker writes a row to PostgreSQL and reads it back."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool

    @activity.defn(name="record_stack_check")
    async def record_stack_check(self, request: StackCheckInput) -> StackCheckResult:
        return await record_stack_check(self.pool, request, activity.client().identity)
