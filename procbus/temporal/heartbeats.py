"""Heartbeats for every activity that has a heartbeat timeout: a procedure's steps and undos
(procbus.engine) heartbeat while they run, so a step whose worker died or was cut off is tried
again on another worker once its heartbeat timeout passes, not after its whole step timeout.

The activity's own heartbeats (a Spark job's progress) go through as they are; in between, the
last details it sent are sent again, so what the Temporal UI shows is never erased.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
from typing import Any

from temporalio import activity
from temporalio.worker import (
    ActivityInboundInterceptor,
    ActivityOutboundInterceptor,
    ExecuteActivityInput,
    Interceptor,
)


class StepHeartbeats(Interceptor):
    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _HeartbeatingInbound(next)


class _LastDetails(ActivityOutboundInterceptor):
    """Keeps the details of the activity's own last heartbeat."""

    details: tuple[Any, ...] = ()

    def heartbeat(self, *details: Any) -> None:
        self.details = details
        super().heartbeat(*details)


class _HeartbeatingInbound(ActivityInboundInterceptor):
    _outbound: _LastDetails | None = None

    def init(self, outbound: ActivityOutboundInterceptor) -> None:
        self._outbound = _LastDetails(outbound)
        super().init(self._outbound)

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        timeout = activity.info().heartbeat_timeout
        # A synchronous activity runs in a thread of its own: it heartbeats itself, or not.
        if not timeout or self._outbound is None or not inspect.iscoroutinefunction(input.fn):
            return await super().execute_activity(input)
        beating = asyncio.create_task(self._beat(self._outbound, timeout.total_seconds() / 3))
        try:
            return await super().execute_activity(input)
        finally:
            beating.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await beating

    @staticmethod
    async def _beat(outbound: _LastDetails, every_seconds: float) -> None:
        while True:
            await asyncio.sleep(every_seconds)
            outbound.heartbeat(*outbound.details)
