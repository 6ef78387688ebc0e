"""Start a StackCheck the way a Temporal user would: the client, the workflow, its input model.

    python -m procbus.starter.start_stack_check [CHECK_ID]

Uses PROCBUS_TEMPORAL_ADDRESS / PROCBUS_TASK_QUEUE, or the running `procbus dev` stack.
"""

from __future__ import annotations

import asyncio
import os
import sys
import uuid

from procbus.stack import StackCheckInput, StackCheckResult
from procbus.starter.scripts import connect
from procbus.workflows import StackCheck


async def main(check_id: str) -> StackCheckResult:
    client, services = await connect()
    return await client.execute_workflow(
        StackCheck.run,
        StackCheckInput(check_id=check_id, message="hello from a starter script"),
        id=f"stack-check-{check_id}",  # the same check ID never starts a second run
        task_queue=services.task_queue,
    )


if __name__ == "__main__":
    result = asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else uuid.uuid4().hex[:8]))
    print(result.model_dump_json(indent=2), flush=True)
    os._exit(0)  # skip interpreter shutdown, which can abort after a client (sdk-python #300)
