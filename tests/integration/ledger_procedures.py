"""Procedures written with the engine for its own tests: entries in a ledger table, undone by
erasing them. Children, slow steps and failing steps are chosen by the input."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy

with workflow.unsafe.imports_passed_through():
    from tests.integration.ledger_steps import (
        LEDGER_TABLE,
        Entry,
        LedgerActivities,
        LedgerInput,
        LedgerResult,
    )

from procbus.engine.procedure import Procedure

__all__ = [
    "LEDGER_TABLE",
    "Entry",
    "Ledger",
    "LedgerActivities",
    "LedgerInput",
    "LedgerResult",
    "RollForwardLedger",
    "ShortHistoryLedger",
]


@workflow.defn(name="Ledger")
class Ledger(Procedure[LedgerInput, LedgerResult]):
    # Test speed: the engine's attempts and non-retryable types, a fifth of its waits.
    step_retry = dataclasses.replace(
        Procedure.step_retry,
        initial_interval=timedelta(milliseconds=100),
        maximum_interval=timedelta(seconds=1),
    )
    compensation_retry = dataclasses.replace(
        Procedure.compensation_retry,
        initial_interval=timedelta(milliseconds=100),
        maximum_interval=timedelta(seconds=2),
    )

    @workflow.run
    async def run(self, request: LedgerInput) -> LedgerResult:
        return await self.execute(request)

    def target(self, request: LedgerInput) -> str:
        return "ledger"

    def locks(self, request: LedgerInput) -> list[tuple[str, str]]:
        return [tuple(lock.rsplit(":", 1)) for lock in request.locks]  # type: ignore[misc]

    async def steps(self, request: LedgerInput) -> LedgerResult:
        written = []
        fence = self.fence(request.fenced_resource) if request.fenced_resource else None
        if request.children_first:
            await self._run_children(request)
        for entry in request.entries:
            written.append(
                await self.step(
                    f"write_{entry.key}",
                    LedgerActivities.write,
                    entry.model_copy(update={"fence": fence}),
                    undo=None if self.status.pivot_step else LedgerActivities.erase,
                    pivot=entry.pivot,
                    step_timeout=timedelta(seconds=max(30.0, entry.seconds * 3)),
                    # Heartbeats carry cancellation to a running step within a second or so.
                    heartbeat_timeout=timedelta(seconds=2),
                )
            )
        if not request.children_first:
            await self._run_children(request)
        return LedgerResult(written=written)

    async def _run_children(self, request: LedgerInput) -> None:
        if request.children:
            await self.run_children(
                [
                    (request.child_type, child_id, child)
                    for child_id, child in zip(request.child_ids, request.children, strict=True)
                ]
            )


@workflow.defn(name="ShortHistoryLedger")
class ShortHistoryLedger(Ledger):
    """Continues as new every few steps, to test that the undo stack travels along."""

    max_history_events = 40

    @workflow.run
    async def run(self, request: LedgerInput) -> LedgerResult:
        return await self.execute(request)


@workflow.defn(name="RollForwardLedger")
class RollForwardLedger(Ledger):
    """Past its pivot: one try per attempt, a tenth of a second apart at first, STUCK after
    every four failed attempts; continues as new every few steps."""

    max_history_events = 40
    roll_forward_attempts = 4
    roll_forward_first_wait = timedelta(milliseconds=100)
    step_retry = RetryPolicy(maximum_attempts=1)

    @workflow.run
    async def run(self, request: LedgerInput) -> LedgerResult:
        return await self.execute(request)
