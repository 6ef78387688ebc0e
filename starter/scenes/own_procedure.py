"""Scene 13: your own procedure. RefreshCaches from examples/user_procedures.py on a worker of the
user's own (Temporal's Worker with ProcbusPlugin, as `procbus worker --workflows` runs it too),
started with JSON; then once more with a step that refuses, which rolls it back."""

from __future__ import annotations

import asyncio

from temporalio.client import WorkflowFailureError
from temporalio.worker import Worker

from procbus.errors import ConfigError, ProcbusError
from procbus.plugin import ProcbusPlugin
from procbus.procedures import ProcedureState, procedure_status
from procbus.starter.scenes.context import Demo, Scene, expected_activity_failures
from procbus.starter.scenes.report import DemoOwnProcedure
from procbus.worker.extensions import load_user_procedures
from procbus.worker.main import WORKFLOWS

# A user's module, imported from the working folder as `procbus worker --workflows` does (make
# demo runs from the project's folder).
USER_PROCEDURES = "examples.user_procedures"


async def run(demo: Demo) -> None:
    module = USER_PROCEDURES
    demo.heading(f"Your own procedure: RefreshCaches from {module} on a worker of your own")
    try:
        user = load_user_procedures([module], WORKFLOWS)
    except ConfigError as error:
        raise ProcbusError(
            f"demo: the own-procedure scene runs {module} from procbus's project folder; run "
            f"the demo there, as `make demo` does ({error})"
        ) from None
    task_queue = f"demo-own-{demo.run_id}"
    settings = demo.settings.model_copy(update={"worker_id": f"demo-{demo.run_id}-own"})
    plugin = ProcbusPlugin(settings, pool=demo.pool, auth=demo.auth, outbox_relay=False)
    notes = demo.settings.state_dir.resolve() / f"demo-notes-{demo.run_id}"
    orders = demo.settings.state_dir.resolve() / f"demo-orders-{demo.run_id}.csv"
    await asyncio.to_thread(
        orders.write_text, "id,amount\n" + "".join(f"{n},{n % 7}\n" for n in range(500))
    )
    procedure_id, refused_id = f"demo-refresh-{demo.run_id}", f"demo-refused-{demo.run_id}"
    async with Worker(
        demo.client,
        task_queue=task_queue,
        workflows=user.workflows,
        activities=user.activities,
        plugins=[plugin],
    ):
        async with asyncio.timeout(60):
            await plugin.ready.wait()
            # JSON in, as the `temporal` CLI would send it.
            done = await demo.client.execute_workflow(
                "RefreshCaches",
                {"table": "orders", "notes": str(notes), "count_rows_of": str(orders)},
                id=procedure_id,
                task_queue=task_queue,
            )
            with expected_activity_failures():
                try:
                    await demo.client.execute_workflow(
                        "RefreshCaches",
                        {"table": "customers", "notes": str(notes), "refuse": True},
                        id=refused_id,
                        task_queue=task_queue,
                    )
                    raise ProcbusError("demo: a refused RefreshCaches succeeded")
                except WorkflowFailureError:
                    pass
            # Queries: answered while the worker that runs the procedure is up.
            status = await procedure_status(demo.client, procedure_id)
            refused = await procedure_status(demo.client, refused_id)
    kept = await asyncio.to_thread(notes.read_text)
    notes_left = [line.split(" ", 1)[1] for line in kept.splitlines()]
    demo.say(
        f"   {procedure_id}: {status.state.value}, a lock, a step, a Spark job step that "
        f"counted {done['rows']} rows, and a broadcast that reached {len(done['members'])} "
        "workers"
    )
    demo.say(f"   {refused_id}: {refused.state.value}, its note undone (notes kept: {notes_left})")
    if status.state is not ProcedureState.SUCCEEDED or notes_left != ["orders"]:
        raise ProcbusError(f"demo: the user's procedure ended {status.state}, {notes_left}")
    demo.report.own_procedure = DemoOwnProcedure(
        module=module,
        task_queue=task_queue,
        procedure_id=procedure_id,
        state=status.state,
        broadcast_reached=done["members"],
        refused_id=refused_id,
        refused_state=refused.state,
        notes_after_rollback=notes_left,
        rows_counted=done["rows"],
    )
    demo.show_in_ui(refused_id)


SCENE = Scene("own-procedure", "Your own procedure", run)
