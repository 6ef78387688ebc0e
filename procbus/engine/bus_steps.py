"""Broadcasts over the bus as a procedure's steps: one phase (with an undo broadcast), two phases
(prepare, then commit past the pivot), or a broadcast stacked to run only on rollback. Their
coordinator is `Broadcaster` (engine/broadcast.py)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from procbus.bus import BusMessage, Operation
    from procbus.core import BroadcastResult, check_step_name
    from procbus.procedures import Compensation

from procbus.engine.base import InputT, ResultT
from procbus.engine.broadcast import Broadcaster, BroadcastFailed, Phase, broadcast_failure
from procbus.engine.steps import Steps

# Where broadcast_on_rollback marks what it stacked, so a continued run does not stack it again.
ON_ROLLBACK_PREFIX = "on_rollback:"


class BusSteps(Steps[InputT, ResultT]):
    """Steps that broadcast an operation to every live worker and wait for all."""

    async def broadcast(
        self, name: str, operation: Operation, *, undo: Operation | None = None
    ) -> BroadcastResult:
        """Run a step that applies `operation` on every live worker and waits for all.

        A worker that fails it fails the step (the others are sent abort).

        Args:
            name: the step's name, unique in the procedure.
            operation: what every worker applies (procbus.bus.models).
            undo: broadcast the same way when the procedure rolls back, to put every worker back.
        """
        message = self._bus_message(name, operation)
        compensation = None
        if undo is not None:
            compensation = self._broadcast_undo(
                name, Phase.APPLY, self._bus_message(name, undo, undo=True)
            )
        return await self._bus_step(name, message, compensation, Broadcaster.one_phase)

    def broadcast_on_rollback(self, name: str, operation: Operation) -> None:
        """Send nothing now; broadcast `operation` if the procedure rolls back past this point.

        One phase, after the undos of every later step. For a cache that a worker may rebuild from
        what a later step writes: the broadcast runs once that write is undone, so no rebuild can
        read it back.

        Raises:
            ValueError: when `name` is a step's name already, or this comes after the pivot.
        """
        check_step_name(name)
        stacked = ON_ROLLBACK_PREFIX + name
        if stacked in self._kept.results:  # stacked in an earlier run, before continue-as-new
            return
        if name in self.status.steps_done or self.status.pivot_step is not None:
            raise ValueError(f"{name!r} is a step's name already, or comes after the pivot")
        message = self._bus_message(name, operation, undo=True)
        self._kept.compensations.append(self._broadcast_undo(name, Phase.APPLY, message))
        self._kept.results[stacked] = None  # not a step done: nothing ran

    async def prepare_broadcast(self, name: str, operation: Operation) -> BroadcastResult:
        """Stage `operation` on every live worker: the first phase of a two-phase broadcast.

        If one cannot, abort on all and fail the step. Rolling back aborts on all.
        """
        message = self._bus_message(name, operation)
        compensation = self._broadcast_undo(name, Phase.ABORT, message)
        return await self._bus_step(name, message, compensation, Broadcaster.prepare)

    async def commit_broadcast(
        self, name: str, prepared: str, operation: Operation
    ) -> BroadcastResult:
        """Commit what step `prepared` staged, on every live worker: the second phase.

        Until each has committed or dropped out. Only after the pivot, where the decision is kept.

        Raises:
            ValueError: when called before the pivot.
        """
        if self.status.pivot_step is None:
            raise ValueError(f"step {name!r} commits a broadcast before the pivot")
        message = self._bus_message(prepared, operation)
        return await self._bus_step(name, message, None, Broadcaster.commit)

    def _bus_message(self, step: str, operation: Operation, *, undo: bool = False) -> BusMessage:
        suffix = "/undo" if undo else ""
        return BusMessage(operation_id=self.own_key(f"/{step}{suffix}"), operation=operation)

    def _broadcast_undo(self, name: str, phase: Phase, message: BusMessage) -> Compensation:
        return Compensation(
            step=name, activity=f"bus:{phase.value}", arg=message.model_dump(mode="json")
        )

    def _broadcaster(self, step: str, message: BusMessage, *, undo: bool = False) -> Broadcaster:
        result = BroadcastResult(operation_id=message.operation_id)
        self.status.broadcasts[f"undo:{step}" if undo else step] = result
        return Broadcaster(
            step,
            message,
            answer_timeout=self._answer_timeout,
            max_sends=self.broadcast_max_sends,
            max_roll_forward_sends=self.broadcast_max_sends,
            undo=undo,
            sent=self._bus_sends,
            result=result,
            on_change=lambda _: self._show_details(),
        )

    async def _bus_step(
        self,
        name: str,
        message: BusMessage,
        compensation: Compensation | None,
        run: Callable[[Broadcaster], Awaitable[BroadcastResult]],
    ) -> BroadcastResult:
        check_step_name(name)
        if name in self._carried_steps:  # done in an earlier run, before continue-as-new
            self._carried_steps.discard(name)
            return BroadcastResult.model_validate(self._kept.results[name])
        self._begin_step(name, compensation)
        while True:
            try:
                result = await run(self._broadcaster(name, message))
                break
            except BroadcastFailed as failed:
                failure = broadcast_failure(failed.result, name)
                if self.status.pivot_step is None:
                    raise failure from None
                # A commit past the pivot: every member must get it, however long it takes.
                await self._before_rolling_forward_again(name, failure)
        self._rolled_forward()
        self._end_step(name, result)
        return result
