"""The outbox sweep as an activity, for the `OutboxSweep` workflow its Temporal Schedule starts."""

from __future__ import annotations

import asyncpg
from temporalio import activity

from procbus.hooks import OutboxRelay
from procbus.hooks.outbox import SweepRequest, SweepResult


class OutboxActivities:
    """The outbox sweep's activity, with the pool and task queue it relays for."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        task_queue: str,
        allowed_workflow_types: frozenset[str] | None = None,
    ) -> None:
        self.pool = pool
        self.task_queue = task_queue
        self.allowed_workflow_types = allowed_workflow_types

    @activity.defn(name="sweep_outbox")
    async def sweep_outbox(self, request: SweepRequest) -> SweepResult:
        relay = OutboxRelay(
            activity.client(),
            self.pool,
            self.task_queue,
            allowed_workflow_types=self.allowed_workflow_types,
        )
        performed = 0
        while performed < request.limit:
            done = await relay.sweep(min(100, request.limit - performed))
            if done == 0:
                break
            performed += done
            activity.heartbeat(performed)
        return SweepResult(performed=performed, pending=await relay.pending())
