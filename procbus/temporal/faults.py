"""Fault injection for tests and drills: PROCBUS_FAULTS makes named steps fail or wait.

    PROCBUS_FAULTS="CreateTable.add_to_catalog:fail_after,CreateTable.create_layout:delay=5"

Each rule is `<ProcedureType>.<step>[.undo]:<fault>` with the fault one of
- `fail_before[=N]`: fail before the action runs (the first N times; always without N),
- `fail_after[=N]`: run the action, then fail as if the worker died before reporting,
- `delay=S`: wait S seconds before the action,
- `delay_first=S`: the same on the first attempt only (a resend or retry is not delayed).
`.undo` targets the step's compensation instead of its action. A broadcast step's phase on
the members of this process is `<step>.apply|prepare|commit|abort`, e.g.
`ChangeAccess.stage_on_workers.prepare:fail_before` or `CreateTable.refresh_cache.apply:delay=8`.
Off unless set.
"""

from __future__ import annotations

import asyncio
import re
from collections import defaultdict
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError
from temporalio.worker import (
    ActivityInboundInterceptor,
    ExecuteActivityInput,
    Interceptor,
)

from procbus.errors import ErrorType
from procbus.procedures.ids import step_of

_RULE = re.compile(
    r"^(?P<procedure>[A-Za-z_][A-Za-z0-9_]*)\."
    r"(?P<step>[A-Za-z_][A-Za-z0-9_]*(\.(apply|prepare|commit|abort))?)(?P<undo>\.undo)?"
    r":(?P<kind>fail_before|fail_after|delay_first|delay)(=(?P<value>[0-9]+(\.[0-9]+)?))?$"
)


class FaultKind(StrEnum):
    FAIL_BEFORE = "fail_before"  # the action never runs
    FAIL_AFTER = "fail_after"  # the action ran, its result is lost
    DELAY = "delay"  # the action starts late
    DELAY_FIRST = "delay_first"  # its first attempt starts late, the next ones on time


@dataclass(frozen=True)
class Fault:
    procedure: str
    step: str
    undo: bool
    kind: FaultKind
    times: int | None = None  # fail only this many times; None: always
    seconds: float = 0.0


def parse_faults(text: str | None) -> list[Fault]:
    """Rules from the PROCBUS_FAULTS syntax; ValueError naming the bad rule."""
    faults = []
    for rule in (text or "").split(","):
        rule = rule.strip()
        if not rule:
            continue
        match = _RULE.match(rule)
        if match is None:
            raise ValueError(
                f"bad fault rule {rule!r}: expected <Procedure>.<step>[.undo]:"
                "fail_before[=N]|fail_after[=N]|delay=SECONDS|delay_first=SECONDS"
            )
        kind = FaultKind(match["kind"])
        value = match["value"]
        if kind in (FaultKind.DELAY, FaultKind.DELAY_FIRST):
            if value is None:
                raise ValueError(f"bad fault rule {rule!r}: delay needs seconds, e.g. delay=5")
            faults.append(
                Fault(
                    match["procedure"],
                    match["step"],
                    bool(match["undo"]),
                    kind,
                    seconds=float(value),
                )
            )
        else:
            if value is not None and not value.isdigit():
                raise ValueError(f"bad fault rule {rule!r}: a count must be a whole number")
            faults.append(
                Fault(
                    match["procedure"],
                    match["step"],
                    bool(match["undo"]),
                    kind,
                    times=int(value) if value else None,
                )
            )
    return faults


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
        first = info.attempt == 1 and _first_send(info.activity_id)
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
