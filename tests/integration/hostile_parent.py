"""A workflow that is no procedure, as anyone who can run a worker in the namespace may write:
it starts a procedure as its child, claiming to hand it locks that another holder holds."""

from __future__ import annotations

from pydantic import BaseModel
from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from procbus.core.fences import LockGrant
    from tests.integration.ledger_steps import Entry, LedgerInput, LedgerResult


class HostileRequest(BaseModel):
    child_id: str
    grants: list[LockGrant]
    # Who it says its own ancestors are (after itself, which Temporal makes the child's parent).
    claimed_ancestors: list[str] = []


@workflow.defn(name="HostileParent")
class HostileParent:
    @workflow.run
    async def run(self, request: HostileRequest) -> LedgerResult:
        child = LedgerInput(
            entries=[Entry(key="forged", entry="written beside the lock's holder")],
            locks=["sales/orders:X"],
            fenced_resource="sales/orders",
            inherited_locks=request.grants,
            lock_family=[workflow.info().workflow_id, *request.claimed_ancestors],
        )
        result: LedgerResult = await workflow.execute_child_workflow(
            "Ledger", child, id=request.child_id, result_type=LedgerResult
        )
        return result
