"""Topic spans: a publish in the application's transaction and a delivery round that sent it,
each a span under its caller's, through the process's tracer provider (set in a process of its
own: tests/integration/topic_traces_probe.py)."""

from __future__ import annotations

import json
import sys

from tests.integration.webhook_receiver import WebhookReceiver
from tests.services import run_command


async def test_a_publish_and_the_round_that_delivered_it_are_spans(database_url: str) -> None:
    receiver = WebhookReceiver()
    await receiver.start()
    try:
        code, out, err = await run_command(
            sys.executable, "-m", "tests.integration.topic_traces_probe",
            database_url, receiver.url, timeout=120,
        )  # fmt: skip
        assert code == 0, out + err
        [event] = receiver.accepted_events()
        assert event["data"] == {"id": 42}
        webhook_id = receiver.accepted[0].headers["webhook-id"]
    finally:
        await receiver.stop()
    spans = {span["name"]: span for span in json.loads(out)}
    publish, application = spans["procbus.topic.publish"], spans["app.mark_paid"]
    assert publish["parent"] == application["id"]  # under the application's own span
    assert publish["attributes"]["procbus.topic"] == "orders"
    assert publish["attributes"]["procbus.event_type"] == "OrderPaid"
    assert publish["attributes"]["procbus.webhook_id"] == webhook_id
    delivery = spans["procbus.topic.delivery"]
    assert delivery["attributes"]["procbus.topic"] == "orders"
    sent = delivery["attributes"]
    assert (sent["procbus.claimed"], sent["procbus.delivered"], sent["procbus.failed"]) == (1, 1, 0)
