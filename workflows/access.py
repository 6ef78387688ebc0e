"""ChangeAccess: grant or revoke a permission on a table, or on a namespace as a whole
('sales.*': every table in it, now and later), on every worker, all or none.

A two-phase broadcast around the catalog write: every live worker stages the change; only if
all staged does the catalog take it (the point of no return); then every worker commits it,
resent until each has committed or dropped out. A worker that failed to stage makes all abort,
and the catalog is never touched. Locks: IX on the namespace, X on the table (for a grant on a
namespace: X on the namespace), so changes to one table's or namespace's ACL (and its deletion)
are applied everywhere in one order, and a change on a namespace waits for those on its tables.
"""

from __future__ import annotations

from collections.abc import Sequence

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from procbus.activities import TableActivities
    from procbus.bus import ChangeAccessOperation
    from procbus.core import grant_resource
    from procbus.lakehouse import ChangeAccessInput
    from procbus.lakehouse.models import AccessResult, AccessStep

from procbus.engine import Procedure, checked


@workflow.defn(name="ChangeAccess")
class ChangeAccess(Procedure[ChangeAccessInput, AccessResult]):
    """Grant or revoke one permission on a table or namespace, on every worker at once."""

    # Only an admin of the table or its namespace (or the operator) may grant or revoke.
    authenticates = True

    @workflow.run
    async def run(self, request: ChangeAccessInput) -> AccessResult:
        return await self.execute(request)

    def target(self, request: ChangeAccessInput) -> str:
        return request.table

    def validate(self, request: ChangeAccessInput) -> None:
        checked(request.check)

    def locks(self, request: ChangeAccessInput) -> Sequence[tuple[str, str]]:
        entry = checked(request.check)
        return [(grant_resource(entry.namespace, entry.table), "X")]

    async def steps(self, request: ChangeAccessInput) -> AccessResult:
        procedure_id = workflow.info().workflow_id
        entry = checked(request.check)
        step = AccessStep(
            procedure_id=procedure_id,
            action=request.action,
            entry=entry,
            fence=self.fence(grant_resource(entry.namespace, entry.table)),
            requested_by=self.principal,
        )
        await self.step("preflight", TableActivities.preflight_change_access, step)
        operation = ChangeAccessOperation(action=request.action, entry=entry)
        await self.prepare_broadcast("stage_on_workers", operation)
        await self.step(
            "record_in_catalog",
            TableActivities.record_access_change,
            step,
            pivot=True,
            summary=f"{request.action} {entry} in the catalog (point of no return)",
        )
        committed = await self.commit_broadcast("commit_on_workers", "stage_on_workers", operation)
        return AccessResult(action=request.action, entry=entry, members=committed.members)
