"""One delivery round of a topic: claim a batch, send it keeping each key's order, settle.

A key's entries go one after the other, and a key stops at its first failure (the entries
behind it stay queued, untouched); other keys and unkeyed entries go at the same time. A
batching endpoint gets the claim's batches one message at a time, each acknowledged or failed
as a whole; when it takes only the bodies (a webhook, AMQP), PostgreSQL builds them from the
stored payloads (Topics.claim_encoded) and the worker decodes no event. Nothing is started
after the round's deadline: whatever is left stays in the queue as it was.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from typing import Protocol

from pydantic import BaseModel

from procbus.delivery.clients import (
    EndpointClient,
    Message,
    Outcome,
    Sent,
    batch_message,
    encoded_message,
    message,
)
from procbus.delivery.decisions import claim_plan, delivered, failures, topic_stops
from procbus.delivery.models import DELIVERY_POLL_FIRST_SECONDS
from procbus.topics import Claim, Entry, Failure, Settled, Topic

# Sends of one topic in flight at once (different keys).
SEND_CONCURRENCY = 16


def idle_waits(poll_max_seconds: float) -> Iterator[float]:
    """How long an idle delivery waits before each new look at its empty queue: soon at first
    (an event often follows another), then twice as long each time, up to `poll_max_seconds`."""
    wait = min(DELIVERY_POLL_FIRST_SECONDS, poll_max_seconds)
    while True:
        yield wait
        wait = min(wait * 2, poll_max_seconds)


class RoundQueue(Protocol):
    """What a round needs of a topic's queue (procbus.topics.Topics, an attempt's own)."""

    async def claim(self, topic: str, limit: int) -> Claim: ...

    async def claim_encoded(self, topic: str, batch_size: int, count: int = ...) -> Claim: ...

    async def claim_batches(
        self, topic: Topic, count: int = ..., *, encoded: bool = ...
    ) -> Claim: ...

    async def settle(
        self, claim: Claim, delivered: Sequence[int], failed: Sequence[Failure] = ...
    ) -> Settled: ...

    async def disable(self, name: str, reason: str) -> None: ...


class Round(BaseModel):
    claimed: int = 0
    delivered: int = 0
    failed: int = 0
    dead_lettered: int = 0
    gone: str | None = None  # why the topic was just disabled: a 410, or a batch it stopped at

    @classmethod
    def settled(cls, claim: Claim, settled: Settled, gone: str | None = None) -> Round:
        """The round that claimed `claim` and settled it so."""
        return cls(
            claimed=claim.size,
            delivered=settled.delivered,
            failed=settled.failed,
            dead_lettered=len(settled.dead_lettered),
            gone=gone,
        )


def _groups(entries: list[Entry]) -> list[list[Entry]]:
    """The entries as independent sequences: one per key (in queue order), one per unkeyed."""
    by_key: dict[str, list[Entry]] = {}
    groups: list[list[Entry]] = []
    for entry in entries:
        if entry.key is None:
            groups.append([entry])
        elif entry.key in by_key:
            by_key[entry.key].append(entry)
        else:
            by_key[entry.key] = [entry]
            groups.append(by_key[entry.key])
    return groups


async def _send_in_turn(
    client: EndpointClient,
    batches: Iterator[tuple[list[int], Message]],
    *,
    stop_at: float,
    clock: Callable[[], float],
) -> dict[int, Sent]:
    """Batches (their entries' IDs, and their message, made as it is taken from the iterator)
    one message at a time, in order, and nothing after a message that failed: a later batch may
    hold later events of its keys."""
    results: dict[int, Sent] = {}
    while clock() < stop_at:
        try:
            entry_ids, batch = next(batches)
        except StopIteration:
            break
        sent = await client.send(batch)
        results.update(dict.fromkeys(entry_ids, sent))
        if sent.outcome is not Outcome.ACK:
            break
    return results


async def dispatch(
    client: EndpointClient,
    topic: str,
    entries: list[Entry],
    *,
    stop_at: float,
    clock: Callable[[], float],
    concurrency: int = SEND_CONCURRENCY,
    batches: list[tuple[str | None, list[Entry]]] | None = None,
    batch_size: int | None = None,
    claim_id: str | None = None,
) -> dict[int, Sent]:
    """What became of each entry sent; entries not sent are absent.

    A batching endpoint gets `batches` (or the entries cut into `batch_size` pieces) one message
    at a time, in order (_send_in_turn)."""
    if not entries:
        return {}
    if client.batch:
        if batches is None:
            size = batch_size or len(entries)
            batches = [(None, entries[at : at + size]) for at in range(0, len(entries), size)]
        return await _send_in_turn(
            client,
            (
                (
                    [entry.id for entry in batch],
                    batch_message(
                        topic,
                        batch,
                        datetime.now(UTC),
                        batch_id,
                        claim_id=claim_id,
                        encode=not client.takes_entries,
                    ),
                )
                for batch_id, batch in batches
            ),
            stop_at=stop_at,
            clock=clock,
        )
    results: dict[int, Sent] = {}
    gate = asyncio.Semaphore(concurrency)

    async def send_in_order(group: list[Entry]) -> None:
        for entry in group:
            if clock() >= stop_at:
                return
            async with gate:
                sent = await client.send(message(topic, entry, datetime.now(UTC)))
            results[entry.id] = sent
            if sent.outcome is not Outcome.ACK:
                return  # the rest of this key waits behind it

    await asyncio.gather(*(send_in_order(group) for group in _groups(entries)))
    return results


async def deliver_round(
    topics: RoundQueue, topic: Topic, client: EndpointClient, *, round_seconds: float
) -> Round:
    """Claim due entries (up to ROUND_BATCHES batches for a batching endpoint, one batch
    otherwise; a grouped topic's next batches), send them, settle the claim; what becomes of
    them and of the topic is procbus.delivery.decisions'."""
    plan = claim_plan(topic, batching=client.batch, takes_entries=client.takes_entries)
    if plan.grouped:
        claim = await topics.claim_batches(topic, plan.batches, encoded=plan.encoded)
    elif plan.encoded:
        claim = await topics.claim_encoded(topic.name, plan.batch_size, plan.batches)
    else:
        claim = await topics.claim(topic.name, plan.limit)
    if claim.empty:
        return Round()
    results = await _send(client, topic, claim, round_seconds)
    acknowledged = delivered(results)
    if len(acknowledged) == len(results):  # the common round: no more passes over thousands
        return Round.settled(claim, await topics.settle(claim, acknowledged, []))
    settled = await topics.settle(claim, acknowledged, failures(claim, results))
    stop = topic_stops(topic, results, settled.stopped)
    for reason in stop.disable:
        await topics.disable(topic.name, reason)
    return Round.settled(claim, settled, stop.why)


async def _send(
    client: EndpointClient, topic: Topic, claim: Claim, round_seconds: float
) -> dict[int, Sent]:
    """Send what `claim` holds, for up to `round_seconds`: as its bodies, or its entries."""
    loop = asyncio.get_running_loop()
    stop_at = loop.time() + round_seconds
    claim_id = str(claim.id)
    if claim.encoded:
        return await _send_in_turn(
            client,
            (
                (batch.entry_ids, encoded_message(batch, datetime.now(UTC), claim_id))
                for batch in claim.encoded
            ),
            stop_at=stop_at,
            clock=loop.time,
        )
    by_id = {entry.id: entry for entry in claim.entries}
    return await dispatch(
        client,
        topic.name,
        claim.entries,
        stop_at=stop_at,
        clock=loop.time,
        batches=[
            (batch.id, [by_id[entry_id] for entry_id in batch.entry_ids]) for batch in claim.batches
        ]
        or None,
        batch_size=topic.batch_size,
        claim_id=claim_id,
    )
