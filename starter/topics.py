"""`procbus topic ...`: persistent notification topics, their queues and dead letters."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
from collections.abc import AsyncIterator, Coroutine, Mapping
from typing import TYPE_CHECKING, Any

import typer

from procbus.starter.output import console, error_console, print_json

if TYPE_CHECKING:
    from procbus.core import Endpoint, KafkaCredentials
    from procbus.topics import Event, Published, Topic, Topics

JSON_OPTION = typer.Option(False, "--json", help="Print the result as JSON.")

topic_app = typer.Typer(
    help="Persistent topics: bounded queues, delivery with retries, dead letters.",
    no_args_is_help=True,
)


def _run(coroutine: Coroutine[Any, Any, None]) -> None:
    asyncio.run(coroutine)


@contextlib.asynccontextmanager
async def _topics() -> AsyncIterator[Topics]:
    """Topics on the configured (or running) stack's database."""
    from procbus.config import load_settings
    from procbus.core import parse_allowlist
    from procbus.db import create_pool
    from procbus.stack import resolve_database_url
    from procbus.topics import Topics

    settings = load_settings()
    allowlist = parse_allowlist(settings.endpoint_allowlist)
    pool = await create_pool(resolve_database_url(settings), min_size=1, max_size=2)
    try:
        yield Topics(
            pool,
            allowlist,
            send_now=functools.partial(_send_now, kafka_credentials=settings.kafka_credentials),
            check_endpoint=functools.partial(
                _check_endpoint, allowlist=allowlist, kafka_credentials=settings.kafka_credentials
            ),
        )
    finally:
        await pool.close()


async def _send_now(
    topics: Topics,
    topic: Topic,
    event: Event,
    timeout_seconds: float,
    *,
    kafka_credentials: Mapping[str, KafkaCredentials],
) -> Published:
    # The HTTP client (aiohttp, ~0.3 s to import) loads only for a synchronous topic's publish.
    from procbus.delivery import send_now

    return await send_now(
        topics, topic, event, timeout_seconds, kafka_credentials=kafka_credentials
    )


async def _check_endpoint(
    endpoint: Endpoint, *, allowlist: list[str], kafka_credentials: Mapping[str, KafkaCredentials]
) -> None:
    # The Kafka client loads only for a kafka:// endpoint.
    from procbus.delivery import endpoint_check

    await endpoint_check(allowlist, kafka_credentials)(endpoint)


async def _start_delivery(topic: str) -> str | None:
    """Start the topic's delivery workflow now; why not, if it could not be (a worker starts
    it within 15 s anyway)."""
    from procbus.delivery import ensure_delivery
    from procbus.starter.scripts import connect

    try:
        client, services = await connect()
        await ensure_delivery(client, topic, services.task_queue)
    except Exception as error:
        return str(error)
    return None


def _masked(url: str) -> str:
    """The URL with its password replaced by ***."""
    from procbus.core import masked

    return masked(url)


def _shown(topic: Topic) -> dict[str, object]:
    """A topic as the CLI shows it: its endpoint's password masked."""
    return topic.model_dump(mode="json") | {"endpoint": _masked(topic.endpoint)}


def _kind(topic: Topic) -> str:
    if topic.sync:
        return "sync"
    return "persistent, grouped" if topic.group_transactions else "persistent"


@topic_app.command("create")
def create(
    name: str,
    endpoint: str = typer.Option(
        ...,
        "--endpoint",
        help="http(s):// webhook, amqp(s):// URL, kafka://HOST:PORT/TOPIC, or table://NAMESPACE",
    ),
    sync: bool = typer.Option(False, "--sync", help="Deliver in the publishing call, no queue."),
    secret: str | None = typer.Option(
        None, "--secret", help="whsec_... signing secret; generated and printed once if not given"
    ),
    max_entries: int = typer.Option(100_000, "--max-entries", help="Entries queued at most."),
    max_bytes: int = typer.Option(256 * 1024 * 1024, "--max-bytes", help="Bytes queued at most."),
    max_retries: int = typer.Option(25, "--max-retries", help="Failures before a dead letter."),
    retry_sleep: float = typer.Option(
        1.0, "--retry-sleep", help="First retry's wait (s); doubles, with jitter."
    ),
    ttl: float = typer.Option(
        3 * 24 * 3600.0, "--ttl", help="Seconds an entry may wait before it is a dead letter."
    ),
    batch_size: int = typer.Option(100, "--batch-size", help="Entries per delivery round."),
    group_transactions: bool = typer.Option(
        False,
        "--group-transactions",
        help="Batches never hold part of a transaction (the endpoint takes batches: ?batch=1).",
    ),
    batch_seconds: float = typer.Option(
        0.0, "--batch-seconds", help="Grouped: a short batch waits until its oldest is this old."
    ),
    incomplete_wait: float = typer.Option(
        60.0,
        "--incomplete-wait",
        help="Grouped: seconds a transaction's missing events are waited for.",
    ),
    json_output: bool = JSON_OPTION,
) -> None:
    """Create a topic (persistent, or --sync) and start its delivery."""
    from procbus.topics.models import topic_settings

    settings = topic_settings(
        endpoint=endpoint,
        sync=sync,
        max_entries=max_entries,
        max_bytes=max_bytes,
        max_retries=max_retries,
        retry_sleep_seconds=retry_sleep,
        ttl_seconds=ttl,
        batch_size=batch_size,
        group_transactions=group_transactions,
        batch_seconds=batch_seconds,
        incomplete_wait_seconds=incomplete_wait,
    )

    async def run() -> None:
        async with _topics() as topics:
            topic, signing_secret = await topics.create(name, settings, secret)
        # A synchronous topic sends in the publishing call: it has no delivery to start.
        not_started = None if topic.sync else await _start_delivery(name)
        if json_output:
            print_json({"topic": _shown(topic), "secret": signing_secret})
        else:
            console.print(
                f"topic {name} created ({_kind(topic)}): delivers to {_masked(topic.endpoint)}",
                highlight=False,
            )
            if secret is None:
                console.print(f"signing secret (shown once): {signing_secret}", highlight=False)
        if not_started:
            error_console.print(
                f"delivery starts when a worker runs (not now: {not_started})", highlight=False
            )

    _run(run())


@topic_app.command("list")
def list_topics(json_output: bool = JSON_OPTION) -> None:
    """Every topic, its endpoint and state."""

    async def run() -> None:
        from rich.table import Table

        async with _topics() as topics:
            found = await topics.list_topics()
        if json_output:
            print_json([_shown(topic) for topic in found])
            return
        grid = Table("topic", "kind", "endpoint", "state", "delivered", "dead-lettered")
        for topic in found:
            state = "enabled" if topic.enabled else f"disabled: {topic.disabled_reason}"
            grid.add_row(
                topic.name,
                _kind(topic),
                _masked(topic.endpoint),
                state,
                str(topic.delivered),
                str(topic.dead_lettered),
            )
        console.print(grid)

    _run(run())


@topic_app.command("describe")
def describe(name: str, json_output: bool = JSON_OPTION) -> None:
    """A topic's settings (its secret is never shown again)."""

    async def run() -> None:
        async with _topics() as topics:
            topic = await topics.get(name)
        shown = _shown(topic)
        if json_output:
            print_json(shown)
            return
        for field, value in shown.items():
            console.print(f"{field:<24}{value}", highlight=False)

    _run(run())


@topic_app.command("stats")
def stats(name: str, json_output: bool = JSON_OPTION) -> None:
    """Depth, bytes, reservations, oldest entry, delivered, retried, dead letters, blocked keys."""

    async def run() -> None:
        async with _topics() as topics:
            found = await topics.stats(name)
        if json_output:
            print_json(found)
            return
        for field, value in found.model_dump().items():
            console.print(f"{field:<26}{value}", highlight=False)

    _run(run())


@topic_app.command("delete")
def delete(
    name: str,
    force: bool = typer.Option(False, "--force", help="Drop the undelivered entries too."),
    json_output: bool = JSON_OPTION,
) -> None:
    """Delete a topic (refused while entries wait, unless --force)."""

    async def run() -> None:
        async with _topics() as topics:
            dropped = await topics.delete(name, force=force)
        if json_output:
            print_json({"topic": name, "dropped_entries": dropped})
        else:
            console.print(f"topic {name} deleted ({dropped} undelivered entries dropped)")

    _run(run())


@topic_app.command("publish")
def publish(
    name: str,
    payload: str = typer.Option(..., "--payload", help="The event's data, as JSON."),
    key: str | None = typer.Option(None, "--key", help="Events of one key keep their order."),
    event_type: str = typer.Option("event", "--type", help="The event's type."),
    txn_id: str | None = typer.Option(
        None, "--txn", help="Grouped topics: the transaction the event belongs to."
    ),
    last_in_txn: bool = typer.Option(False, "--last", help="The transaction's last event."),
    timeout: float = typer.Option(
        10.0, "--timeout", help="Synchronous topics: seconds to wait for the endpoint."
    ),
    json_output: bool = JSON_OPTION,
) -> None:
    """Queue one event; on a --sync topic, send it now and say whether the endpoint took it
    (exit code 1 when it did not)."""
    from procbus.errors import InvalidRequest
    from procbus.topics.models import event_from_input

    try:
        data = json.loads(payload)
    except json.JSONDecodeError as error:
        raise InvalidRequest(f"--payload is not JSON: {error}") from None
    event = event_from_input(
        payload=data, key=key, type=event_type, txn_id=txn_id, last_in_txn=last_in_txn
    )

    async def run() -> None:
        async with _topics() as topics:
            published = await topics.publish(name, event, timeout_seconds=timeout)
        if json_output:
            print_json(published)
        elif published.delivery == "queued":
            console.print(f"queued as {published.id} ({published.webhook_id})", highlight=False)
        elif published.delivery == "ack":
            console.print(f"ACK: delivered ({published.webhook_id})", highlight=False)
        else:
            error_console.print(f"NACK: not delivered: {published.error}", highlight=False)
        if published.delivery == "nack":
            raise typer.Exit(1)

    _run(run())


@topic_app.command("dead-letters")
def dead_letters(name: str, json_output: bool = JSON_OPTION) -> None:
    """Entries that failed past max_retries or outlived their TTL, with their attempts."""

    async def run() -> None:
        from rich.table import Table

        from procbus.topics.models import DEAD_LETTER

        async with _topics() as topics:
            found = await topics.dead_letters(name)
        if json_output:
            print_json([DEAD_LETTER.dump_python(dead, mode="json") for dead in found])
            return
        grid = Table("id", "key", "type", "attempts", "last error", "reason")
        for dead in found:
            grid.add_row(
                str(dead.id),
                dead.key or "",
                dead.type,
                str(dead.attempts),
                dead.last_error or "",
                dead.reason,
            )
        console.print(grid)

    _run(run())


@topic_app.command("redrive")
def redrive(
    name: str,
    entry_id: list[int] = typer.Option([], "--id", help="A dead letter to redrive (repeatable)."),
    everything: bool = typer.Option(False, "--all", help="Redrive every dead letter."),
    json_output: bool = JSON_OPTION,
) -> None:
    """Put dead letters back in the queue, each with its original webhook ID."""
    from pydantic_core import to_jsonable_python

    from procbus.errors import InvalidRequest

    if bool(entry_id) == everything:
        raise InvalidRequest("say which dead letters: --id ID (repeatable) or --all")

    async def run() -> None:
        async with _topics() as topics:
            published = await topics.redrive(name, None if everything else entry_id)
        if json_output:
            print_json([to_jsonable_python(item) for item in published])
        else:
            console.print(f"{len(published)} dead letters back in the queue of {name}")

    _run(run())


@topic_app.command("enable")
def enable(name: str, json_output: bool = JSON_OPTION) -> None:
    """Resume a stopped topic (its endpoint answered 410 Gone or was refused, or a pipeline
    stopped at a batch: it is sent again first)."""

    async def run() -> None:
        async with _topics() as topics:
            topic = await topics.enable(name)
        if json_output:
            print_json(topic)
        else:
            console.print(f"topic {name} enabled: delivery resumes")

    _run(run())


@topic_app.command("rotate-secret")
def rotate_secret(name: str, json_output: bool = JSON_OPTION) -> None:
    """A new signing secret; the old one keeps signing beside it for a day."""

    async def run() -> None:
        async with _topics() as topics:
            secret = await topics.rotate_secret(name)
        if json_output:
            print_json({"topic": name, "secret": secret})
        else:
            console.print(f"new signing secret (shown once): {secret}", highlight=False)
            console.print("the old one signs too for 24 h: switch your receiver meanwhile")

    _run(run())
