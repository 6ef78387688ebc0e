"""A grant from a starter script, the same as `procbus acl grant`: ChangeAccess, a two-phase
broadcast to every worker around the catalog write. Run by tests/integration/test_doc_examples.py.
"""

from __future__ import annotations

from temporalio.client import Client

# --8<-- [start:grant]
from procbus.core.outcomes import MemberOutcome
from procbus.lakehouse.models import ChangeAccessInput
from procbus.workflows.access import ChangeAccess


async def grant_write(client: Client, task_queue: str = "procbus") -> dict[str, MemberOutcome]:
    result = await client.execute_workflow(
        ChangeAccess.run,
        ChangeAccessInput(
            action="grant", principal="etl", table="sales.orders", permission="write"
        ),
        id="grant-etl-sales-orders",
        task_queue=task_queue,
    )
    return {m.member_id: m.outcome for m in result.members}  # {'w1': 'committed', ...}


# --8<-- [end:grant]
