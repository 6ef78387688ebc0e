"""Scene 7: persistent topics. A webhook endpoint down and back (every event once, in order per
key, signed), one key failing while the others go on, a dead letter and its redrive."""

from __future__ import annotations

from standardwebhooks.webhooks import Webhook

from procbus.delivery import ensure_delivery
from procbus.errors import ProcbusError
from procbus.starter.receiver import WebhookReceiver
from procbus.starter.scenes.context import Demo, Scene
from procbus.starter.scenes.report import DemoTopics
from procbus.topics import Event, Topics, TopicSettings


async def run(demo: Demo) -> None:
    name = f"demo-orders-{demo.run_id}"
    demo.heading("Persistent topics: a webhook endpoint down and back, a failing key, a redrive")
    receiver = WebhookReceiver()  # not listening yet: the endpoint is down
    topics = Topics(demo.pool)
    _, secret = await topics.create(
        name, TopicSettings(endpoint=receiver.url, retry_sleep_seconds=0.2, max_retries=3)
    )
    await ensure_delivery(demo.client, name, demo.task_queue)
    try:
        published = [
            await topics.publish(
                name,
                Event(payload={"order": n % 3, "step": n // 3}, key=f"order-{n % 3}"),
            )
            for n in range(6)
        ]
        down = await demo.topic_until(topics, name, lambda stats: stats.blocked_keys == 3)
        demo.say(
            f"   endpoint down: {down.depth} events wait, {down.retried} failed attempts so "
            f"far, {down.blocked_keys} keys held back"
        )
        receiver.up()
        await demo.topic_until(topics, name, lambda stats: stats.depth == 0)
        for accepted in receiver.accepted:
            Webhook(secret).verify(accepted.body, accepted.headers)
        ids = [accepted.headers["webhook-id"] for accepted in receiver.accepted]
        once = sorted(ids) == sorted(item.webhook_id for item in published)
        events = receiver.events()
        in_order = all(
            [e["data"]["step"] for e in events if e["key"] == f"order-{k}"] == [0, 1]
            for k in range(3)
        )
        demo.say(
            f"   endpoint back: all {len(events)} delivered, each once (by webhook-id), in "
            f"order per key, {len(receiver.accepted)} signatures verified"
        )
        receiver.failing = {"order-bad"}
        bad = await topics.publish(name, Event(payload={"order": "bad"}, key="order-bad"))
        for n in range(3):
            await topics.publish(name, Event(payload={"order": 10 + n}, key=f"order-{10 + n}"))
        failing = await demo.topic_until(topics, name, lambda stats: stats.dead_letters == 1)
        meanwhile = len(receiver.events()) - len(events)
        [dead] = await topics.dead_letters(name)
        demo.say(
            f"   order-bad fails; the {meanwhile} events of other keys went meanwhile; after "
            f"{dead.attempts} attempts it is dead letter {dead.id} ({failing.dead_letters} "
            "kept, nothing dropped)"
        )
        receiver.failing = set()
        await topics.redrive(name, [dead.id])
        await demo.topic_until(topics, name, lambda stats: stats.depth == 0)
        redriven = receiver.accepted[-1].headers["webhook-id"] == bad.webhook_id
        demo.say(f"   redriven: delivered with its original webhook-id ({bad.webhook_id})")
        if not (once and in_order and redriven and meanwhile == 3):
            raise ProcbusError("demo: the topic scene did not deliver as it should")
        demo.report.topics = DemoTopics(
            topic=name,
            published=len(published) + 4,
            failed_attempts_while_down=down.retried,
            delivered_once_each=once,
            key_order_kept=in_order,
            signatures_verified=len(receiver.accepted),
            delivered_while_a_key_failed=meanwhile,
            dead_letter_id=dead.id,
            redriven_with_its_webhook_id=redriven,
        )
    finally:
        receiver.down()
        await topics.delete(name, force=True)  # its delivery workflow ends with it


SCENE = Scene("topics", "Persistent topics", run)
