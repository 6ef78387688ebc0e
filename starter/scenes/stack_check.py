"""Scene 1: a StackCheck workflow whose activity writes a row to PostgreSQL and reads it back."""

from __future__ import annotations

from procbus.stack import StackCheckInput
from procbus.starter.scenes.context import Demo, Scene
from procbus.workflows import StackCheck


async def run(demo: Demo) -> None:
    workflow_id = f"demo-stack-check-{demo.run_id}"
    demo.heading(f"StackCheck {workflow_id}: a worker writes to PostgreSQL, reads back")
    result = await demo.client.execute_workflow(
        StackCheck.run,
        StackCheckInput(check_id=workflow_id, message="hello from procbus demo"),
        id=workflow_id,
        task_queue=demo.task_queue,
        static_summary="procbus demo: stack check",
    )
    demo.say(
        f"   row {result.row_id} written by {result.worker} at {result.written_at:%X} and "
        f"read back ({result.total_checks} checks in the database)"
    )
    demo.report.stack_check_workflow_id = workflow_id
    demo.report.stack_check_url = demo.url(workflow_id)
    demo.report.stack_check = result
    demo.show_in_ui(workflow_id)


SCENE = Scene("stack-check", "StackCheck", run)
