"""Scene 6: bad input from the real `temporal` CLI: a CreateTable with a misspelled field fails at
once as InvalidProcedureInput, naming the fields, instead of hanging."""

from __future__ import annotations

import asyncio

from temporalio.client import WorkflowFailureError
from temporalio.exceptions import ApplicationError

from procbus.errors import ProcbusError
from procbus.stack import run_temporal_cli, temporal_cli_environment
from procbus.starter.scenes.context import Demo, Scene
from procbus.starter.scenes.report import DemoBadInput


async def run(demo: Demo) -> None:
    workflow_id = f"demo-bad-input-{demo.run_id}"
    demo.heading("Bad input from the temporal CLI: CreateTable with a misspelled field")
    async with asyncio.timeout(60):
        code, _, _ = await run_temporal_cli(
            "workflow",
            "execute",
            "--task-queue",
            demo.task_queue,
            "--type",
            "CreateTable",
            "--workflow-id",
            workflow_id,
            "--input",
            '{"tabel": "sales.x", "columns": "id:int"}',
            env=temporal_cli_environment(
                demo.settings, demo.services.temporal_address, demo.services.namespace
            ),
        )
    try:
        await demo.client.get_workflow_handle(workflow_id).result()
        raise ProcbusError("demo: a CreateTable with a misspelled field succeeded")
    except WorkflowFailureError as failed:
        cause = failed.cause
    if not isinstance(cause, ApplicationError) or code == 0:
        raise ProcbusError(f"demo: bad input ended {cause!r}, temporal exit code {code}")
    demo.say(f"   `temporal workflow execute` exited {code}: FAILED at once, {cause.type}:")
    demo.say(f"   {cause.message}")
    demo.report.bad_input = DemoBadInput(
        workflow_id=workflow_id,
        temporal_cli_exit_code=code,
        error_type=str(cause.type),
        error=cause.message,
    )


SCENE = Scene("bad-input", "Bad input", run)
