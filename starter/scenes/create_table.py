"""Scene 2: CreateNamespace, then CreateTable with its five steps: the demo's table, which the
scenes in its namespace use."""

from __future__ import annotations

from procbus.errors import ProcbusError
from procbus.lakehouse import CreateNamespaceInput, CreateTableInput
from procbus.procedures import ProcedureState, procedure_status
from procbus.starter.scenes.context import Demo, Scene
from procbus.starter.scenes.report import DemoProcedure
from procbus.workflows import CreateNamespace, CreateTable


async def run(demo: Demo) -> None:
    namespace = demo.namespace
    demo.heading(f"CreateNamespace {namespace}, then CreateTable {namespace}.orders")
    await demo.client.execute_workflow(
        CreateNamespace.run,
        CreateNamespaceInput(namespace=namespace),
        id=f"demo-create-namespace-{demo.run_id}",
        task_queue=demo.task_queue,
        static_summary=f"procbus demo: namespace {namespace}",
    )
    procedure_id = f"demo-create-table-{demo.run_id}"
    await demo.client.execute_workflow(
        CreateTable.run,
        CreateTableInput(
            table=f"{namespace}.orders",
            columns="id:bigint,amount:decimal(12,2),dt:date",
            partition_by=["dt"],
        ),
        id=procedure_id,
        task_queue=demo.task_queue,
        static_summary=f"procbus demo: CreateTable {namespace}.orders",
    )
    status = await procedure_status(demo.client, procedure_id)
    demo.say(f"   {procedure_id}: {status.state.value}")
    demo.show_steps(status)
    if status.state is not ProcedureState.SUCCEEDED:
        raise ProcbusError(f"demo: {procedure_id} ended {status.state.value}")
    demo.report.create_table = DemoProcedure(
        procedure_id=procedure_id, url=demo.url(procedure_id), status=status
    )
    demo.show_in_ui(procedure_id)


SCENE = Scene("create-table", "CreateTable that succeeds", run)
