"""Start a DeleteTable procedure from Python and wait for it.

python -m procbus.starter.start_delete_table NAMESPACE.TABLE [PROCEDURE_ID]
"""

from __future__ import annotations

import asyncio
import os
import sys
import uuid

from temporalio.common import WorkflowIDConflictPolicy

from procbus.lakehouse import DeleteTableInput, TableResult
from procbus.starter.scripts import connect
from procbus.workflows import DeleteTable


async def main(target: str, procedure_id: str) -> TableResult:
    client, services = await connect()
    return await client.execute_workflow(
        DeleteTable.run,
        DeleteTableInput(table=target),
        id=procedure_id,  # the procedure ID: the same ID never starts a second run
        task_queue=services.task_queue,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
    )


if __name__ == "__main__":
    target = sys.argv[1]
    procedure_id = (
        sys.argv[2] if len(sys.argv) > 2 else f"DeleteTable-{target}-{uuid.uuid4().hex[:8]}"
    )
    print(asyncio.run(main(target, procedure_id)).model_dump_json(indent=2), flush=True)
    os._exit(0)  # skip interpreter shutdown, which can abort after a client (sdk-python #300)
