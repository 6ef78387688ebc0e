"""Commits a transaction with a durable workflow start, then dies by SIGKILL before the relay.

python -m tests.integration.commit_then_die DATABASE_URL WORKFLOW_ID TASK_QUEUE
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys

import asyncpg

from procbus.hooks import transaction


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


async def main(database_url: str, workflow_id: str, task_queue: str) -> None:
    connection = await asyncpg.connect(database_url)
    async with transaction(connection) as tx:
        tx.post_commit(die)  # registered first, so it runs before the relay would
        await tx.start_workflow(
            "StackCheck", {"check_id": workflow_id}, id=workflow_id, task_queue=task_queue
        )


if __name__ == "__main__":
    asyncio.run(main(*sys.argv[1:4]))
