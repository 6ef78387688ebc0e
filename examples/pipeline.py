"""A change pipeline from Python: a table:// topic, a capture of an application table, the
application's own transaction, the pipeline's status. Run by tests/integration/test_doc_examples.py.
"""

from __future__ import annotations

import asyncpg

from procbus.capture import Captures
from procbus.pipeline import Pipelines, PipelineStatus
from procbus.topics import Topics, TopicSettings


# --8<-- [start:pipeline]
async def capture_accounts(pool: asyncpg.Pool) -> PipelineStatus:
    await Topics(pool).create(
        "bank", TopicSettings(endpoint="table://bank", group_transactions=True, batch_size=500)
    )
    await Captures(pool).create("public.accounts", "bank")  # key=["id"] to name it
    async with pool.acquire() as connection, connection.transaction():  # the application's own
        await connection.execute("UPDATE accounts SET balance = balance - 10 WHERE id = 1")
        await connection.execute("UPDATE accounts SET balance = balance + 10 WHERE id = 2")
    return await Pipelines(pool).status("bank")  # position, lag, batches applied, last error


# --8<-- [end:pipeline]
