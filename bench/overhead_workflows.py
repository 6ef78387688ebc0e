"""Both sides of bench/procedure_overhead.py: a 5-step procedure, a plain 5-activity workflow."""

from __future__ import annotations

from datetime import timedelta

from pydantic import BaseModel
from temporalio import activity, workflow

with workflow.unsafe.imports_passed_through():
    from procbus.procedures import ProcedureInput

from procbus.engine.procedure import Procedure

STEPS = 5


class NoOp(BaseModel):
    step: int


@activity.defn(name="bench_noop")
async def noop(request: NoOp) -> None:
    return None


@activity.defn(name="bench_undo_noop")
async def undo_noop(request: NoOp) -> None:
    return None


class PlainInput(BaseModel):
    pass


@workflow.defn(name="BenchPlain")
class Plain:
    @workflow.run
    async def run(self, request: PlainInput) -> None:
        for step in range(STEPS):
            await workflow.execute_activity(
                noop, NoOp(step=step), start_to_close_timeout=timedelta(seconds=30)
            )


@workflow.defn(name="BenchProcedure")
class FiveSteps(Procedure[ProcedureInput, None]):
    @workflow.run
    async def run(self, request: ProcedureInput) -> None:
        return await self.execute(request)

    def target(self, request: ProcedureInput) -> str:
        return "bench"

    async def steps(self, request: ProcedureInput) -> None:
        for step in range(STEPS):
            await self.step(f"step_{step}", noop, NoOp(step=step), undo=undo_noop)


class LockedInput(ProcedureInput):
    table: str  # each procedure its own table: the locks cost, not the waiting, is measured


@workflow.defn(name="BenchLockedProcedure")
class LockedFiveSteps(Procedure[LockedInput, None]):
    """FiveSteps with the locks of a table write: IX on the namespace, X on the table."""

    @workflow.run
    async def run(self, request: LockedInput) -> None:
        return await self.execute(request)

    def target(self, request: LockedInput) -> str:
        return request.table

    def locks(self, request: LockedInput) -> list[tuple[str, str]]:
        return [(f"bench/{request.table}", "X")]

    async def steps(self, request: LockedInput) -> None:
        for step in range(STEPS):
            await self.step(f"step_{step}", noop, NoOp(step=step), undo=undo_noop)


@workflow.defn(name="BenchUnlockedProcedure")
class UnlockedFiveSteps(LockedFiveSteps):
    """The same procedure and input, without its locks."""

    @workflow.run
    async def run(self, request: LockedInput) -> None:
        return await self.execute(request)

    def locks(self, request: LockedInput) -> list[tuple[str, str]]:
        return []
