"""The `Broadcast` workflow: one bus operation to every live member on its own, outside any
procedure (`procbus workers inspect`, drills, benchmarks). The coordinator is the engine's
`Broadcaster` (procbus/engine/broadcast.py)."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from procbus.bus import BroadcastInput, BusMessage
    from procbus.core import BROADCAST, BroadcastResult
    from procbus.engine import Broadcaster, BroadcastFailed, broadcast_failure


@workflow.defn(name=BROADCAST)
class Broadcast:
    """One operation to every live member, one phase or two; the result names each member's
    outcome. Its progress is the `broadcast_status` query and the UI's current details."""

    def __init__(self) -> None:
        self.result: BroadcastResult | None = None

    @workflow.run
    async def run(self, request: BroadcastInput) -> BroadcastResult:
        message = BusMessage(operation_id=workflow.info().workflow_id, operation=request.operation)
        broadcaster = Broadcaster(
            "broadcast",
            message,
            answer_timeout=timedelta(seconds=request.answer_timeout_seconds),
            max_sends=request.max_sends,
            max_roll_forward_sends=request.max_sends,
            on_change=self._show,
        )
        self.result = broadcaster.result
        try:
            if request.two_phase:
                await broadcaster.prepare()
                return await broadcaster.commit()
            return await broadcaster.one_phase()
        except BroadcastFailed as failed:
            raise broadcast_failure(failed.result, "broadcast") from None

    def _show(self, result: BroadcastResult) -> None:
        workflow.set_current_details(f"**{result.operation_id}** — {result.summary()}")

    # Not "status": that name is the procedures' query, and a broadcast is not a procedure.
    @workflow.query(name="broadcast_status")
    def status(self) -> BroadcastResult | None:
        return self.result
