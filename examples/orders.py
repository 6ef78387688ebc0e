"""Post-commit hooks and a durable call: an order row, a receipt sent only after the commit, and
the access grant it pays for started exactly once. Run by tests/integration/test_doc_examples.py.
"""

from __future__ import annotations

import asyncpg
from temporalio.client import Client

from examples.grant_access import GrantAccess, GrantAccessInput
from procbus.hooks import OutboxRelay, transaction

receipts: list[str] = []


async def send_receipt(order_id: str) -> str:
    receipts.append(order_id)  # your mail service goes here
    return f"receipt for {order_id} sent"


# --8<-- [start:place_order]
async def place_order(pool: asyncpg.Pool, client: Client, task_queue: str, order_id: str) -> str:
    relay = OutboxRelay(client, pool, task_queue)  # optional: perform durable calls at once
    async with pool.acquire() as conn:
        async with transaction(conn, relay=relay) as tx:
            await conn.execute('INSERT INTO "orders" ("id") VALUES ($1)', order_id)
            emailed = tx.post_commit(send_receipt, order_id)  # in-process hook -> Future
            await tx.start_workflow(  # durable: an outbox row in this same transaction
                GrantAccess,
                GrantAccessInput(user=order_id, table="sales.orders"),
                id=f"grant-{order_id}",
            )
        return await emailed  # the hook ran after the commit; its result


# --8<-- [end:place_order]
