"""Scene 10: the notification bus. A grant, then a revoke, of write on the demo's table reaches
every worker two-phase (as examples/access.py starts it); a DeleteTable signed as the principal
is then refused."""

from __future__ import annotations

import contextlib
from typing import Literal

from temporalio.client import WorkflowFailureError

from examples.access import change_write
from procbus.errors import ProcbusError
from procbus.lakehouse import ChangeAccessInput, DeleteTableInput
from procbus.procedures import ProcedureState, procedure_status
from procbus.starter.scenes.context import Demo, Scene, expected_activity_failures
from procbus.starter.scenes.report import DemoAccess
from procbus.temporal import Signer, signed_client
from procbus.workflows import DeleteTable

ACTIONS: tuple[Literal["grant", "revoke"], ...] = ("grant", "revoke")


async def run(demo: Demo) -> None:
    table = f"{demo.namespace}.orders"
    demo.heading(f"Notification bus: grant, then revoke, write on {table} on every worker")
    outcomes: dict[str, dict[str, str]] = {}
    ids = {}
    for action in ACTIONS:
        procedure_id = ids[action] = f"demo-acl-{action}-{demo.run_id}"
        reached = await change_write(demo.client, procedure_id, action, table, demo.task_queue)
        outcomes[action] = {member: outcome.value for member, outcome in reached.items()}
        entry = ChangeAccessInput(
            action=action, principal="etl", table=table, permission="write"
        ).check()
        holding = [m for m in demo.members if m.access.allows(entry)]
        if len(holding) != (len(demo.members) if action == "grant" else 0):
            raise ProcbusError(f"demo: {action} reached {len(holding)} workers' caches")
        demo.say(
            f"   {procedure_id}: "
            + ", ".join(f"{member} {outcome}" for member, outcome in outcomes[action].items())
        )
    left = {
        member.member_id: sum(1 for e in member.access.entries() if e.principal == "etl")
        for member in demo.members
    }
    if any(left.values()) or not outcomes["revoke"]:
        raise ProcbusError(f"demo: the revoke left grants on the workers: {left}")
    demo.say(
        f"   on all {len(left)} workers of this demo the revoke took effect (prepared "
        "everywhere first; had one failed, all would have aborted)"
    )
    refused_id = f"demo-acl-refused-delete-{demo.run_id}"
    assert demo.auth.key is not None  # dev_worker_auth always gives one
    as_etl = signed_client(demo.client, Signer(demo.auth.key, "etl"))
    with expected_activity_failures(), contextlib.suppress(WorkflowFailureError):
        await as_etl.execute_workflow(
            DeleteTable.run,
            DeleteTableInput(table=table),
            id=refused_id,
            task_queue=demo.task_queue,
            static_summary=f"procbus demo: DeleteTable {table} as etl, refused",
        )
    refused = await procedure_status(demo.client, refused_id)
    if refused.state is not ProcedureState.ROLLED_BACK or "AccessDenied" not in (
        refused.error or ""
    ):
        raise ProcbusError(f"demo: etl's DeleteTable after the revoke: {refused.state}")
    demo.say(f"   DeleteTable {table} as etl now: {refused.state.value} ({refused.error})")
    demo.report.access = DemoAccess(
        grant_id=ids["grant"],
        revoke_id=ids["revoke"],
        granted=outcomes["grant"],
        revoked=outcomes["revoke"],
        grants_left_on_workers=left,
        refused_delete_error=refused.error or "",
    )
    demo.show_in_ui(ids["revoke"])


SCENE = Scene("bus", "Notification bus", run, needs=("create-table",))
