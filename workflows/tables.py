"""The table procedures: CreateTable, DeleteTable (the namespace procedures are in
procbus.workflows.namespaces: the sandbox imports a procedure's module afresh for every run, and
each procedure class it defines costs that run time, so a module holds few).

Both run as the start's verified principal (Procedure.authenticates): DeleteTable's preflight
refuses one that may not write the table; CreateTable's creator gets admin and write on it.

Each is a `Procedure`: steps with their undo, so a failure anywhere leaves the catalog, the
warehouse and the descriptor cache as they were (or, past DeleteTable's pivot, as after).

Locks (docs/concepts/locks.md), held from before the first step until after the last compensation:
IX on the namespace, X on the table. Every catalog write carries the table lock's fencing token.
"""

from __future__ import annotations

from collections.abc import Sequence

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from procbus.activities import TableActivities
    from procbus.bus import EvictDescriptor, PutDescriptor
    from procbus.core import table_resource
    from procbus.lakehouse import CreateTableInput, DeleteTableInput, TableDescriptor, TableResult
    from procbus.lakehouse.models import EventStep, TableStep, creator_grants

from procbus.engine import Procedure, checked

# workflow.patched ID of CreateTable's evict_cache_after_undo (docs/how-to/upgrading.md).
CREATE_TABLE_EVICTS_AFTER_UNDO = "procbus-create-table-evicts-after-undo"


@workflow.defn(name="CreateTable")
class CreateTable(Procedure[CreateTableInput, TableResult]):
    """Create a table in its folder, the catalog and every worker's cache; its creator is admin."""

    authenticates = True  # its creator gets admin and write on the table

    @workflow.run
    async def run(self, request: CreateTableInput) -> TableResult:
        return await self.execute(request)

    def target(self, request: CreateTableInput) -> str:
        return request.table

    def validate(self, request: CreateTableInput) -> None:
        checked(request.check)

    def locks(self, request: CreateTableInput) -> Sequence[tuple[str, str]]:
        table = checked(request.check)
        return [(table_resource(table.namespace, table.name), "X")]

    async def steps(self, request: CreateTableInput) -> TableResult:
        procedure_id = workflow.info().workflow_id
        planned = TableStep(
            procedure_id=procedure_id,
            table=checked(request.check, procedure_id, self.procedure_run),
        )
        table = await self.step("preflight", TableActivities.preflight_create_table, planned)
        fence = self.fence(table_resource(table.namespace, table.name))
        # The operator may do everything already: no grants of its own to keep.
        grants = [] if self.authentication.operator else creator_grants(table, self.principal)
        step = TableStep(procedure_id=procedure_id, table=table, fence=fence, grants=grants)
        await self.step(
            "create_layout",
            TableActivities.create_layout,
            step,
            undo=TableActivities.remove_layout,
            summary=f"create the folder {table.location}",
        )
        # A worker that rebuilds its caches while the table is in the catalog reads it there,
        # and no later undo would tell it: evict it once add_to_catalog is undone (its grants
        # stay unused, as after a DeleteTable, until a table of that name is made again).
        if workflow.patched(CREATE_TABLE_EVICTS_AFTER_UNDO):
            self.broadcast_on_rollback(
                "evict_cache_after_undo", EvictDescriptor(qualified_name=table.qualified_name)
            )
        await self.step(
            "add_to_catalog",
            TableActivities.add_to_catalog,
            step,
            undo=TableActivities.remove_added_table,
            summary=f"add {table.qualified_name} to the catalog",
        )
        # Every worker's descriptor cache, through the bus (one phase).
        await self.broadcast(
            "refresh_cache",
            PutDescriptor(table=table, new_table=True, grants=grants),
            undo=EvictDescriptor(qualified_name=table.qualified_name),
        )
        await self.step(
            "record_event",
            TableActivities.record_event,
            EventStep(
                procedure_id=procedure_id,
                procedure_run=self.procedure_run,
                event_type="TableCreated",
                namespace=table.namespace,
                table=table.name,
                payload={"columns": [c.model_dump() for c in table.columns]},
                fence=fence,
            ),
            undo=TableActivities.remove_event,
            summary="record TableCreated for delivery",
        )
        return TableResult(table=table)


# workflow.patched ID of DeleteTable's evict_cache_again step (docs/how-to/upgrading.md).
DELETE_TABLE_EVICTS_AFTER_REMOVAL = "procbus-delete-table-evicts-after-removal"


@workflow.defn(name="DeleteTable")
class DeleteTable(Procedure[DeleteTableInput, TableResult]):
    """Delete a table from every worker's cache and the catalog, then its data."""

    authenticates = True  # deleting a table's data is writing it

    @workflow.run
    async def run(self, request: DeleteTableInput) -> TableResult:
        return await self.execute(request)

    def target(self, request: DeleteTableInput) -> str:
        return request.table

    def validate(self, request: DeleteTableInput) -> None:
        checked(request.check)

    def locks(self, request: DeleteTableInput) -> Sequence[tuple[str, str]]:
        return [(table_resource(*checked(request.check)), "X")]

    async def steps(self, request: DeleteTableInput) -> TableResult:
        procedure_id = workflow.info().workflow_id
        namespace, name = checked(request.check)
        wanted = TableStep(
            procedure_id=procedure_id,
            table=TableDescriptor(namespace=namespace, name=name, columns=[]),
            principal=self.principal,
        )
        table = await self.step("preflight", TableActivities.preflight_delete_table, wanted)
        fence = self.fence(table_resource(namespace, name))
        step = TableStep(procedure_id=procedure_id, table=table, fence=fence)
        await self.broadcast(
            "evict_cache",
            EvictDescriptor(qualified_name=table.qualified_name),
            undo=PutDescriptor(table=table),
        )
        await self.step(
            "remove_from_catalog",
            TableActivities.remove_from_catalog,
            step,
            undo=TableActivities.restore_to_catalog,
            pivot=True,
            summary=f"remove {table.qualified_name} from the catalog (point of no return)",
        )
        # A worker that rebuilt its caches between the first eviction and the removal (its
        # heartbeat had lapsed) read the table back from the catalog: evict it once more, now
        # that no rebuild can. Runs begun before this step existed go on without it.
        if workflow.patched(DELETE_TABLE_EVICTS_AFTER_REMOVAL):
            await self.broadcast(
                "evict_cache_again", EvictDescriptor(qualified_name=table.qualified_name)
            )
        await self.step(
            "delete_data",
            TableActivities.delete_data,
            step,
            summary=f"delete the folder {table.location}",
        )
        await self.step(
            "record_event",
            TableActivities.record_event,
            EventStep(
                procedure_id=procedure_id,
                procedure_run=self.procedure_run,
                event_type="TableDeleted",
                namespace=table.namespace,
                table=table.name,
                fence=fence,
            ),
            summary="record TableDeleted for delivery",
        )
        return TableResult(table=table)
