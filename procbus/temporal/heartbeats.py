"""Heartbeats for a procedure's steps and undos: each async activity with a heartbeat timeout
that does not heartbeat itself is heartbeaten while it runs, so a step whose worker died or was
cut off is tried again on another worker once its heartbeat timeout passes, not after its whole
step timeout.

An activity that heartbeats itself (the lock keeper, a topic's delivery, a Spark job's
progress) keeps its own judgement of when it is alive: the first heartbeat it sends ends the
interceptor's, so a keeper hung on a database it cannot reach still stops heartbeating and is
replaced.
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


class _OwnHeartbeats(ActivityOutboundInterceptor):
    """Notes whether the activity has heartbeaten by itself."""

    heartbeaten = False

    def heartbeat(self, *details: Any) -> None:
        self.heartbeaten = True
        super().heartbeat(*details)

    def beat(self) -> None:
        """A heartbeat of the interceptor's, without details."""
        super().heartbeat()


class _HeartbeatingInbound(ActivityInboundInterceptor):
    _outbound: _OwnHeartbeats | None = None

    def init(self, outbound: ActivityOutboundInterceptor) -> None:
        self._outbound = _OwnHeartbeats(outbound)
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
    async def _beat(outbound: _OwnHeartbeats, every_seconds: float) -> None:
        while True:
            await asyncio.sleep(every_seconds)
            if outbound.heartbeaten:
                return  # it keeps its own heartbeat
            outbound.beat()
