"""Scene 8: grouped batches. A batch grows past its size to keep a transaction whole; then a
--sync topic, which sends in the publishing call: ACK, and NACK once the endpoint is down."""

from __future__ import annotations

import contextlib

from procbus.delivery import ensure_delivery, send_now
from procbus.errors import ProcbusError
from procbus.hooks import transaction
from procbus.starter.receiver import WebhookReceiver
from procbus.starter.scenes.context import Demo, Scene
from procbus.starter.scenes.report import DemoGroupedBatches
from procbus.topics import Event, Topics, TopicSettings


async def run(demo: Demo) -> None:
    name = f"demo-ledger-{demo.run_id}"
    demo.heading("Grouped batches: a batch grows past its size to keep a transaction whole")
    receiver = WebhookReceiver()
    receiver.up()
    topics = Topics(demo.pool)
    batch_size = 3
    await topics.create(
        name,
        TopicSettings(
            endpoint=receiver.url + "?batch=1", group_transactions=True, batch_size=batch_size
        ),
    )
    direct = f"demo-direct-{demo.run_id}"
    try:
        async with demo.pool.acquire() as connection, transaction(connection) as tx:
            for account in range(5):  # one transfer touching five accounts
                await tx.publish(name, {"account": account, "moved": 10}, key=f"acct-{account}")
        await ensure_delivery(demo.client, name, demo.task_queue)
        await demo.topic_until(topics, name, lambda stats: stats.depth == 0)
        [batch] = receiver.accepted
        events = batch.events
        txn = events[-1].get("transaction") or {}
        whole = txn.get("last") is True and txn.get("size") == len(events)
        batch_id = batch.headers["procbus-batch-id"]
        demo.say(
            f"   a transaction of 5 events, batch size {batch_size}: one batch of "
            f"{len(events)} events, the transaction whole (batch-id {batch_id})"
        )
        topics = Topics(demo.pool, send_now=send_now)  # it sends a --sync topic's events
        await topics.create(direct, TopicSettings(endpoint=receiver.url, sync=True))
        ack = await topics.publish(direct, Event(payload={"note": "sent now"}))
        receiver.down()
        nack = await topics.publish(direct, Event(payload={"note": "lost"}), timeout_seconds=2)
        demo.say(
            f"   a --sync topic sends in the call: {ack.delivery.upper()}; endpoint down: "
            f"{nack.delivery.upper()} ({nack.error}), nothing queued"
        )
        if not (whole and len(events) == 5 and ack.delivery == "ack"):
            raise ProcbusError("demo: the grouped batch did not arrive whole")
        demo.report.grouped = DemoGroupedBatches(
            topic=name,
            batch_size=batch_size,
            batch_events=len(events),
            transaction_whole=whole,
            batch_id=batch_id,
            sync_ack=ack.delivery,
            sync_nack_error=nack.error,
        )
    finally:
        receiver.down()
        await topics.delete(name, force=True)
        with contextlib.suppress(ProcbusError):
            await topics.delete(direct, force=True)


SCENE = Scene("grouped", "Grouped batches", run)
