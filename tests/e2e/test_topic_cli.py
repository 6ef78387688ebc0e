"""`procbus topic ...` as a user runs it, on a `procbus dev` stack, delivering to a real HTTP
receiver: create, publish, stats, dead letters, redrive, bad input."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import asyncpg
import pytest
from standardwebhooks.webhooks import Webhook

from procbus.delivery.kafka import read_committed
from procbus.stack.kafka import KafkaBroker
from procbus.starter.receiver import WebhookReceiver
from procbus.topics import Topics
from tests.e2e.conftest import DevStack, procbus


@pytest.fixture
def receiver() -> Iterator[WebhookReceiver]:
    started = WebhookReceiver()
    started.up()
    yield started
    started.down()


def ok(stack: DevStack, *args: str) -> str:
    result = procbus(stack.env, *args)
    assert result.returncode == 0, (args, result.stdout, result.stderr)
    return result.stdout


def wait_for(condition: object, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


def test_topics_from_the_cli(dev_stack: DevStack, receiver: WebhookReceiver) -> None:
    dev_stack.start()
    created = json.loads(
        ok(
            dev_stack,
            "topic",
            "create",
            "orders",
            "--endpoint",
            receiver.url,
            "--max-retries",
            "0",
            "--retry-sleep",
            "0.1",
            "--json",
        )
    )
    secret = created["secret"]
    assert created["topic"]["endpoint"] == receiver.url
    for args, says in [
        (["topic", "create", "orders", "--endpoint", receiver.url], "exists already"),
        (
            ["topic", "create", "t2", "--endpoint", receiver.url, "--max-entries", "0"],
            "max_entries",
        ),
        (["topic", "create", "t3", "--endpoint", "http://169.254.169.254/x"], "link-local"),
        (["topic", "create", "t4", "--endpoint", receiver.url, "--secret", "abc"], "whsec_"),
        (["topic", "publish", "nothing", "--payload", "1"], "no topic named 'nothing'"),
        (["topic", "publish", "orders", "--payload", "{not json"], "--payload is not JSON"),
        (
            ["topic", "publish", "orders", "--payload", "1", "--type", ""],
            "bad event: type: String should have at least 1 character",
        ),
        (["topic", "redrive", "orders"], "--id ID (repeatable) or --all"),
    ]:
        result = procbus(dev_stack.env, *args)
        assert result.returncode == 1, (args, result.stdout, result.stderr)
        assert says in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert [t["name"] for t in json.loads(ok(dev_stack, "topic", "list", "--json"))] == ["orders"]

    receiver.failing = {"bad"}
    for number, key in enumerate(["a", "bad", "a", "b"]):
        ok(
            dev_stack,
            "topic",
            "publish",
            "orders",
            "--payload",
            json.dumps({"n": number}),
            "--key",
            key,
        )
    wait_for(lambda: len(receiver.accepted) == 3)
    for accepted in receiver.accepted:
        Webhook(secret).verify(accepted.body, accepted.headers)
    assert [e["data"]["n"] for e in receiver.events() if e["key"] == "a"] == [0, 2]

    def stats() -> dict[str, object]:
        loaded: dict[str, object] = json.loads(ok(dev_stack, "topic", "stats", "orders", "--json"))
        return loaded

    async def dead_letters(pool: asyncpg.Pool) -> bool:
        return (await Topics(pool).stats("orders")).dead_letters == 1

    dev_stack.wait_in_database(dead_letters, timeout=30)  # what `topic stats` says, in-process
    assert stats()["dead_letters"] == 1
    [dead] = json.loads(ok(dev_stack, "topic", "dead-letters", "orders", "--json"))
    assert (dead["key"], dead["attempts"], dead["payload"]) == ("bad", 1, {"n": 1})
    receiver.failing = set()
    ok(dev_stack, "topic", "redrive", "orders", "--id", str(dead["id"]))
    wait_for(lambda: len(receiver.accepted) == 4)
    assert receiver.accepted[-1].event["data"] == {"n": 1}
    assert receiver.accepted[-1].headers["webhook-id"] == dead["webhook_id"]

    async def settled(pool: asyncpg.Pool) -> bool:
        found = await Topics(pool).stats("orders")
        return found.depth == 0 and found.delivered == 4

    dev_stack.wait_in_database(settled, timeout=30)
    final = stats()
    assert (final["depth"], final["delivered"]) == (0, 4)
    assert (final["dead_lettered"], final["dead_letters"], final["enabled"]) == (1, 0, True)
    rotated = json.loads(ok(dev_stack, "topic", "rotate-secret", "orders", "--json"))["secret"]
    time.sleep(1.5)  # the delivery reads the topic's secrets again every second
    ok(dev_stack, "topic", "publish", "orders", "--payload", "5")
    wait_for(lambda: len(receiver.accepted) == 5)
    last = receiver.accepted[-1]
    assert len(last.headers["webhook-signature"].split()) == 2  # the new secret and the old one
    Webhook(rotated).verify(last.body, last.headers)
    Webhook(secret).verify(last.body, last.headers)
    ok(dev_stack, "topic", "delete", "orders")
    assert json.loads(ok(dev_stack, "topic", "list", "--json")) == []

    # An endpoint's password is never shown back.
    broker = "amqp://procbus:hunter2pw@127.0.0.1:9/?routing_key=events"
    for args in (
        ["topic", "create", "broker", "--endpoint", broker, "--json"],
        ["topic", "list"],
        ["topic", "list", "--json"],
        ["topic", "describe", "broker"],
        ["topic", "stats", "broker", "--json"],
    ):
        shown = ok(dev_stack, *args)
        assert "hunter2pw" not in shown and "procbus:***@127.0.0.1" in shown, (args, shown)
    ok(dev_stack, "topic", "delete", "broker", "--force")

    # A synchronous topic: the publishing call sends, and says what the endpoint answered.
    ok(dev_stack, "topic", "create", "direct", "--endpoint", receiver.url, "--sync")
    said = ok(dev_stack, "topic", "publish", "direct", "--payload", '{"n": 6}')
    assert said.startswith("ACK") and receiver.accepted[-1].event["data"] == {"n": 6}
    receiver.down()
    refused = procbus(
        dev_stack.env, "topic", "publish", "direct", "--payload", "7", "--timeout", "2"
    )
    assert refused.returncode == 1 and refused.stderr.startswith("NACK"), refused.stderr
    receiver.up()
    direct = json.loads(ok(dev_stack, "topic", "stats", "direct", "--json"))
    assert (direct["delivered"], direct["nacked"], direct["depth"]) == (1, 1, 0)

    # A grouped topic: a transaction published over two calls arrives whole, in one batch.
    grouped_url = receiver.url + "?batch=1"
    ok(dev_stack, "topic", "create", "ledger", "--endpoint", grouped_url, "--group-transactions")
    sent = len(receiver.accepted)
    for number, last in [(8, []), (9, ["--last"])]:
        ok(dev_stack, "topic", "publish", "ledger", "--payload", str(number), "--txn", "t1", *last)
    wait_for(lambda: len(receiver.accepted) == sent + 1)
    batch = receiver.accepted[-1]
    assert [event["data"] for event in batch.events] == [8, 9]
    assert batch.headers["procbus-batch-id"].startswith("batch_")

    # Kafka: the cluster is asked at create; a grouped transaction is one Kafka transaction.
    with KafkaBroker(dev_stack.state_dir / "kafka") as kafka:
        missing = procbus(
            dev_stack.env, "topic", "create", "k1", "--endpoint", f"kafka://{kafka.bootstrap}/nope"
        )
        assert missing.returncode == 1 and "add ?create=1" in missing.stderr, missing.stderr
        assert len(missing.stderr.strip().splitlines()) == 1, missing.stderr
        endpoint = f"kafka://{kafka.bootstrap}/cli-ledger?create=1"
        ok(dev_stack, "topic", "create", "k2", "--endpoint", endpoint, "--group-transactions")
        for number, last in [(10, []), (11, ["--last"])]:
            ok(dev_stack, "topic", "publish", "k2", "--payload", str(number), "--txn", "t2", *last)
        read = read_committed(kafka.bootstrap, "cli-ledger", 2, timeout_seconds=30)
        assert [record.value["data"] for record in read] == [10, 11]
        assert read[0].headers["procbus-batch-id"] == read[1].headers["procbus-batch-id"]
        ok(dev_stack, "topic", "delete", "k2")
