"""Scene 9: Kafka. A grouped topic to a Kafka-protocol broker of the demo's own: a transaction of
six events goes as one Kafka transaction, which a read_committed consumer reads back whole. The
topic is made and read as examples/kafka.py does."""

from __future__ import annotations

import asyncio
import contextlib

from examples.kafka import create_ledger_topic, read_back
from procbus.delivery import delivery_workflow_id, ensure_delivery
from procbus.errors import ProcbusError
from procbus.hooks import transaction
from procbus.stack import KafkaBroker
from procbus.starter.scenes.context import Demo, Scene
from procbus.starter.scenes.report import DemoKafka
from procbus.topics import Topics


async def run(demo: Demo) -> None:
    name = f"demo-kafka-{demo.run_id}"  # the Kafka topic's name too
    demo.heading(
        "Kafka: a grouped topic's batch is one Kafka transaction, read back by a "
        "read_committed consumer"
    )
    with KafkaBroker(demo.settings.state_dir.resolve() / "kafka") as broker:
        # As `procbus topic create` does: the cluster is asked first (?create=1 makes the Kafka
        # topic).
        await create_ledger_topic(demo.pool, name, broker.bootstrap)
        topics = Topics(demo.pool)
        try:
            async with demo.pool.acquire() as connection, transaction(connection) as tx:
                for step in range(6):  # one transfer: three accounts, two entries each
                    await tx.publish(name, {"step": step, "moved": 10}, key=f"acct-{step % 3}")
            await ensure_delivery(demo.client, name, demo.task_queue)
            await demo.topic_until(topics, name, lambda stats: stats.depth == 0)
            read = await asyncio.to_thread(read_back, broker.bootstrap, name, 6)
            batch_ids = {message.headers.get("procbus-batch-id") for message in read}
            order: dict[str, list[int]] = {}
            for message in read:
                order.setdefault(message.key or "", []).append(message.value["data"]["step"])
            in_order = all(steps == sorted(steps) for steps in order.values())
            demo.say(
                f"   {broker.bootstrap} (a Kafka-protocol broker of the demo's own): a "
                f"transaction of 6 events went as one Kafka transaction (batch-id "
                f"{batch_ids.pop() if len(batch_ids) == 1 else batch_ids}); a read_committed "
                f"consumer read {len(read)}, each account's in order: {in_order}"
            )
            if len(read) != 6 or not in_order:
                raise ProcbusError("demo: the Kafka transaction was not read back whole")
            demo.report.kafka = DemoKafka(
                topic=name,
                kafka_topic=name,
                broker=broker.bootstrap,
                transaction_events=6,
                seen_by_read_committed=len(read),
                one_batch_id=len({m.headers.get("procbus-batch-id") for m in read}) == 1,
                keys_in_order=in_order,
            )
        finally:
            await topics.delete(name, force=True)  # its delivery workflow ends with it
            # Ended before the broker stops, so its producer never calls a broker gone.
            with contextlib.suppress(Exception):
                async with asyncio.timeout(15):
                    await demo.client.get_workflow_handle(delivery_workflow_id(name)).result()


SCENE = Scene("kafka", "Kafka", run)
