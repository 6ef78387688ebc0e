"""Fault injection for tests and drills: the worker interceptor that applies the PROCBUS_FAULTS
rules (procbus.core.faults) to every procedure step that runs on it."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError
from temporalio.worker import (
    ActivityInboundInterceptor,
    ExecuteActivityInput,
    Interceptor,
)

from procbus.core import Fault, FaultKind, step_of
from procbus.errors import ErrorType


class FaultInterceptor(Interceptor):
    """A worker interceptor applying the rules to every procedure step that runs on it."""

    def __init__(self, faults: list[Fault]) -> None:
        self.faults = faults
        # How often each rule fired per procedure; counts live in this worker process.
        self.fired: dict[tuple[str, Fault], int] = defaultdict(int)

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _FaultActivityInbound(next, self)

    def matching(self, workflow_type: str | None, activity_id: str) -> list[Fault]:
        try:
            step = step_of(activity_id)
        except ValueError:  # not a step: the lease keeper, a local activity of the engine
            return []
        return [
            fault
            for fault in self.faults
            if fault.procedure == workflow_type
            and fault.step == step.step
            and fault.undo == step.undo
        ]

    def should_fail(self, workflow_id: str, fault: Fault) -> bool:
        key = (workflow_id, fault)
        if fault.times is not None and self.fired[key] >= fault.times:
            return False
        self.fired[key] += 1
        return True


def _injected(fault: Fault, message: str) -> ApplicationError:
    # An always-failing action must not be retried into success; counted faults and undo
    # faults go through the retry policy like a real transient failure.
    permanent = fault.times is None and not fault.undo
    return ApplicationError(message, type=str(ErrorType.INJECTED_FAULT), non_retryable=permanent)


def _first_send(activity_id: str) -> bool:
    return step_of(activity_id).attempt == 1


class _FaultActivityInbound(ActivityInboundInterceptor):
    def __init__(self, next: ActivityInboundInterceptor, owner: FaultInterceptor) -> None:
        super().__init__(next)
        self.owner = owner

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        info = activity.info()
        faults = self.owner.matching(info.workflow_type, info.activity_id)
        where = f"{info.workflow_type}.{info.activity_id}"
        # Asked only of a step's ID (a lease keeper's is none): matching found none else.
        first = bool(faults) and info.attempt == 1 and _first_send(info.activity_id)
        for fault in faults:
            if fault.kind is FaultKind.DELAY or (fault.kind is FaultKind.DELAY_FIRST and first):
                await asyncio.sleep(fault.seconds)
            elif fault.kind is FaultKind.FAIL_BEFORE and self.owner.should_fail(
                info.workflow_id or "", fault
            ):
                raise _injected(fault, f"injected fault before {where}")
        result = await super().execute_activity(input)
        for fault in faults:
            if fault.kind is FaultKind.FAIL_AFTER and self.owner.should_fail(
                info.workflow_id or "", fault
            ):
                raise _injected(fault, f"injected fault after {where}")
        return result
