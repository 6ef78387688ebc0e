"""A grant from a starter script, the same as `procbus acl grant` (and a revoke, as `procbus acl
revoke`): ChangeAccess, a two-phase broadcast to every worker around the catalog write. Run by
tests/integration/test_doc_examples.py and by the demo's bus scene."""

from __future__ import annotations

# --8<-- [start:grant]
from typing import Literal

from temporalio.client import Client

from procbus.core import MemberOutcome
from procbus.lakehouse import ChangeAccessInput
from procbus.workflows import ChangeAccess


async def change_write(
    client: Client,
    procedure_id: str,  # the procedure's ID: `procbus proc status ID` reads it
    action: Literal["grant", "revoke"] = "grant",
    table: str = "sales.orders",
    task_queue: str = "procbus",
) -> dict[str, MemberOutcome]:
    result = await client.execute_workflow(
        ChangeAccess.run,
        ChangeAccessInput(action=action, principal="etl", table=table, permission="write"),
        id=procedure_id,
        task_queue=task_queue,
    )
    return {m.member_id: m.outcome for m in result.members}  # {'w1': 'committed', ...}


# --8<-- [end:grant]
