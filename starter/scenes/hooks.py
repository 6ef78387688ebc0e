"""Scene 4: post-commit hooks and the durable outbox: a committed transaction's hook runs and its
workflow starts; a rolled-back one's hook is cancelled, with no workflow and no outbox row."""

from __future__ import annotations

import contextlib

from temporalio.service import RPCError

from procbus.db import load_queries
from procbus.errors import ProcbusError
from procbus.hooks import OutboxRelay, TransactionAborted, transaction
from procbus.stack import StackCheckInput
from procbus.starter.scenes.context import Demo, Scene
from procbus.starter.scenes.report import DemoHooks
from procbus.workflows import StackCheck


class DemoRollback(Exception):
    """Raised inside the scene's second transaction to roll it back."""


async def notify(check_id: str) -> str:
    return f"notified the team about {check_id}"


async def run(demo: Demo) -> None:
    demo.heading("Post-commit hooks and the durable outbox")
    relay = OutboxRelay(demo.client, demo.pool, demo.task_queue)
    committed_id = f"demo-outbox-committed-{demo.run_id}"
    rolled_back_id = f"demo-outbox-rolled-back-{demo.run_id}"
    insert_check = load_queries("procbus.stack")["insert_stack_check"]
    async with demo.pool.acquire() as connection:
        async with transaction(connection, relay=relay) as tx:
            await connection.execute(insert_check, committed_id, "committed", "demo")
            notified = tx.post_commit(notify, committed_id)
            started = await tx.start_workflow(
                StackCheck,
                StackCheckInput(check_id=committed_id),
                id=committed_id,
                task_queue=demo.task_queue,
            )
        hook_result = await notified
        run_id = await started
        demo.say(f"   committed: hook ran ({hook_result}); workflow {committed_id} started")
        await demo.client.get_workflow_handle(committed_id).result()

        with contextlib.suppress(DemoRollback):
            async with transaction(connection, relay=relay) as tx:
                await connection.execute(insert_check, rolled_back_id, "rolled back", "demo")
                cancelled = tx.post_commit(notify, rolled_back_id)
                await tx.start_workflow(
                    StackCheck,
                    StackCheckInput(check_id=rolled_back_id),
                    id=rolled_back_id,
                    task_queue=demo.task_queue,
                )
                raise DemoRollback("the order failed validation")
    try:
        await cancelled
        raise ProcbusError("demo: a hook of a rolled-back transaction ran")
    except TransactionAborted as aborted:
        reason = str(aborted)
    rows = await demo.pool.fetchval(
        load_queries("procbus.starter")["outbox_rows_of"], rolled_back_id
    )
    try:
        await demo.client.get_workflow_handle(rolled_back_id).describe()
        started_anyway = True
    except RPCError:
        started_anyway = False
    if rows or started_anyway:
        raise ProcbusError("demo: the rolled-back transaction left an outbox row or a run")
    demo.say(f"   rolled back: hook cancelled ({reason}); no workflow, no outbox row")
    demo.report.hooks = DemoHooks(
        committed_hook_result=hook_result,
        committed_workflow_id=committed_id,
        committed_workflow_run_id=run_id,
        rolled_back_hook_error=reason,
        rolled_back_workflow_started=started_anyway,
        outbox_rows_of_rolled_back=rows,
    )
    demo.show_in_ui(committed_id)


SCENE = Scene("hooks", "Post-commit hooks and the outbox", run)
