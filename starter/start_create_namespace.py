"""Start a CreateNamespace procedure from Python and wait for it.

python -m procbus.starter.start_create_namespace NAMESPACE [PROCEDURE_ID]
"""

from __future__ import annotations

import asyncio
import os
import sys
import uuid

from temporalio.common import WorkflowIDConflictPolicy

from procbus.lakehouse import CreateNamespaceInput, NamespaceResult
from procbus.starter.scripts import connect
from procbus.workflows import CreateNamespace


async def main(target: str, procedure_id: str) -> NamespaceResult:
    client, services = await connect()
    return await client.execute_workflow(
        CreateNamespace.run,
        CreateNamespaceInput(namespace=target),
        id=procedure_id,  # the procedure ID: the same ID never starts a second run
        task_queue=services.task_queue,
        id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
    )


if __name__ == "__main__":
    target = sys.argv[1]
    procedure_id = (
        sys.argv[2] if len(sys.argv) > 2 else f"CreateNamespace-{target}-{uuid.uuid4().hex[:8]}"
    )
    print(asyncio.run(main(target, procedure_id)).model_dump_json(indent=2), flush=True)
    os._exit(0)  # skip interpreter shutdown, which can abort after a client (sdk-python #300)
