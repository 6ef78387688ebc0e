"""Retention as activities, one per kind, for the `Retention` workflow its Schedule starts."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import asyncpg
from temporalio import activity
from temporalio.client import WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from procbus.retention import Cleanup, KindResult, RetentionRequest


async def procedure_open(procedure_id: str) -> bool:
    """Whether the procedure is still running; one Temporal no longer knows has closed."""
    try:
        description = await activity.client().get_workflow_handle(procedure_id).describe()
    except RPCError as error:
        if error.status is RPCStatusCode.NOT_FOUND:
            return False
        raise
    return description.status is WorkflowExecutionStatus.RUNNING


class RetentionActivities:
    """Retention's activities, one per kind, with the worker's retention ages as their floors."""

    def __init__(
        self, pool: asyncpg.Pool, warehouse_root: Path, floors: RetentionRequest | None = None
    ) -> None:
        self.pool = pool
        self.warehouse_root = warehouse_root
        # The worker's retention settings: anyone may start Retention, with any input, so an
        # input only lengthens these ages (a start with 0.001 s expired every snapshot at once).
        self.floors = floors or RetentionRequest()

    def _cleanup(self) -> Cleanup:
        # Every batch heartbeats its running count: a long backlog is progress, not a hang.
        return Cleanup(self.pool, self.warehouse_root, progress=activity.heartbeat)

    @activity.defn(name="expire_outbox_rows")
    async def expire_outbox_rows(self, request: RetentionRequest) -> KindResult:
        return await self._cleanup().outbox(request.at_least(self.floors))

    @activity.defn(name="expire_spark_jobs")
    async def expire_spark_jobs(self, request: RetentionRequest) -> KindResult:
        return await self._cleanup().spark_jobs(request.at_least(self.floors), procedure_open)

    @activity.defn(name="expire_snapshots")
    async def expire_snapshots(self, request: RetentionRequest) -> KindResult:
        return await self._cleanup().snapshots(request.at_least(self.floors))

    @activity.defn(name="expire_batch_fences")
    async def expire_batch_fences(self, request: RetentionRequest) -> KindResult:
        return await self._cleanup().batch_fences(request.at_least(self.floors))

    @activity.defn(name="expire_bus_members")
    async def expire_bus_members(self, request: RetentionRequest) -> KindResult:
        return await self._cleanup().bus_members(request.at_least(self.floors))

    def all(self) -> list[Callable[..., object]]:
        return [
            self.expire_outbox_rows,
            self.expire_spark_jobs,
            self.expire_snapshots,
            self.expire_batch_fences,
            self.expire_bus_members,
        ]
