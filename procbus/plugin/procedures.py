"""The procedure engine's own activities (beside the lock activities): a parent reads what a
finished child procedure did from the child's history, never from a signal anyone could send."""

from __future__ import annotations

from collections.abc import Callable

from temporalio import activity

from procbus.procedures import ChildCompensations, ChildUndoRequest
from procbus.procedures.history import child_undo_stack
from procbus.procedures.models import CHILD_UNDO_STACK_ACTIVITY


class ProcedureActivities:
    @activity.defn(name=CHILD_UNDO_STACK_ACTIVITY)
    async def child_undo_stack(self, request: ChildUndoRequest) -> ChildCompensations:
        # The parent is the workflow running this activity: no input can name another one.
        return await child_undo_stack(activity.client(), activity.info().workflow_id, request)

    def all(self) -> list[Callable[..., object]]:
        return [self.child_undo_stack]
