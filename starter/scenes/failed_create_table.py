"""Scene 3: CreateTable on a worker whose bus member refuses step 3's broadcast: every member is
sent abort, each step is undone, and nothing is left behind."""

from __future__ import annotations

import contextlib

from temporalio.client import WorkflowFailureError

from procbus.core import parse_faults
from procbus.errors import ProcbusError
from procbus.lakehouse import Catalog, CreateTableInput, DescriptorCache, warehouse
from procbus.lakehouse.cache import AccessCache
from procbus.procedures import ProcedureState, procedure_status
from procbus.starter.scenes.context import Demo, Scene, expected_activity_failures
from procbus.starter.scenes.report import DemoProcedure
from procbus.worker import build_worker
from procbus.worker.main import bus_member
from procbus.workflows import CreateTable

# The drill: refresh_cache (step 3 of CreateTable) fails on a worker with this fault injected.
# It is a broadcast: the drill's own bus member refuses it, so every member is sent abort.
DRILL_FAULT = "CreateTable.refresh_cache.apply:fail_before"


async def run(demo: Demo) -> None:
    namespace = demo.namespace
    table = f"{namespace}.returns"
    demo.heading(f"CreateTable {table} on a worker where step 3 (refresh_cache) fails")
    drill_queue = f"{demo.task_queue}-demo-drill-{demo.run_id}"
    procedure_id = f"demo-create-table-rollback-{demo.run_id}"
    faults = parse_faults(DRILL_FAULT)
    with expected_activity_failures():
        async with (
            build_worker(
                demo.client,
                demo.pool,
                drill_queue,
                warehouse_root=demo.settings.warehouse_root,
                faults=faults,
                auth=demo.auth,
            ),
            bus_member(
                demo.client,
                demo.pool,
                drill_queue,
                tables=DescriptorCache(),
                access=AccessCache(),
                member_id=f"demo-{demo.run_id}-drill",
                faults=faults,
            ) as drill_member,
        ):
            # Expected to fail: the status below says how it ended.
            with contextlib.suppress(WorkflowFailureError):
                await demo.client.execute_workflow(
                    CreateTable.run,
                    CreateTableInput(table=table, columns="id:bigint,reason:string"),
                    id=procedure_id,
                    task_queue=drill_queue,
                    static_summary=f"procbus demo: CreateTable {table}, rolled back",
                )
            status = await procedure_status(demo.client, procedure_id)
    demo.say(f"   {procedure_id}: {status.state.value}")
    demo.show_steps(status)
    residue = await _residue(demo, "returns", procedure_id)
    for member in [*demo.members, drill_member]:
        if member.tables.get(table) is not None:
            residue.append(f"cache entry on {member.member_id}")
    if status.state is not ProcedureState.ROLLED_BACK or residue:
        raise ProcbusError(f"demo: rollback of {procedure_id} left {residue or status.state}")
    demo.say("   no residue: not in the catalog, no folder, no event, in no worker's cache")
    demo.report.failed_create_table = DemoProcedure(
        procedure_id=procedure_id, url=demo.url(procedure_id), status=status
    )
    demo.report.residue_after_rollback = residue
    demo.show_in_ui(procedure_id)


async def _residue(demo: Demo, table: str, procedure_id: str) -> list[str]:
    """What the rolled-back CreateTable of `table` left: a catalog row, a folder, an event."""
    catalog = Catalog(demo.pool)
    found = []
    if await catalog.get_table(demo.namespace, table) is not None:
        found.append("catalog row")
    if warehouse.table_folder(demo.settings.warehouse_root, demo.namespace, table).exists():
        found.append("warehouse folder")
    if any(event["procedure_id"] == procedure_id for event in await catalog.list_events()):
        found.append("event")
    return found


SCENE = Scene("failed-create-table", "CreateTable rolled back", run, needs=("create-table",))
