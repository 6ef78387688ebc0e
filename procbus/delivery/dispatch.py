"""One delivery round of a topic: claim a batch, send it keeping each key's order, settle.

A key's entries go one after the other, and a key stops at its first failure (the entries
behind it stay queued, untouched); other keys and unkeyed entries go at the same time. With a
batching endpoint the whole claim is one message, acknowledged or failed as a whole. Nothing is
sent after the claim's deadline: whatever is left goes back to the queue as it was.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import UTC, datetime

from pydantic import BaseModel

from procbus.delivery.clients import EndpointClient, Outcome, Sent, batch_message, message
from procbus.topics.models import Entry, Failure, Topic
from procbus.topics.queue import Topics

# Sends of one topic in flight at once (different keys).
SEND_CONCURRENCY = 16
# Stop starting sends this long before the claim runs out.
CLAIM_MARGIN_SECONDS = 5.0


class Round(BaseModel):
    claimed: int = 0
    delivered: int = 0
    failed: int = 0
    dead_lettered: int = 0
    gone: str | None = None  # the endpoint's 410 answer, when it gave one


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


async def dispatch(
    client: EndpointClient,
    topic: str,
    entries: list[Entry],
    *,
    stop_at: float,
    clock: Callable[[], float],
    concurrency: int = SEND_CONCURRENCY,
    batch_id: str | None = None,
) -> dict[int, Sent]:
    """What became of each entry sent; entries not sent are absent."""
    if not entries:
        return {}
    if client.batch:
        sent = await client.send(batch_message(topic, entries, datetime.now(UTC), batch_id))
        return {entry.id: sent for entry in entries}
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
    topics: Topics, topic: Topic, client: EndpointClient, *, claim_seconds: float
) -> Round:
    """Claim up to a batch of due entries (a grouped topic: its next batch), send them, settle
    the claim."""
    if topic.group_transactions:
        claim = await topics.claim_batch(topic, seconds=claim_seconds)
    else:
        claim = await topics.claim(topic.name, topic.batch_size, seconds=claim_seconds)
    if not claim.entries:
        return Round()
    loop = asyncio.get_running_loop()
    results = await dispatch(
        client,
        topic.name,
        claim.entries,
        stop_at=loop.time() + claim_seconds - CLAIM_MARGIN_SECONDS,
        clock=loop.time,
        batch_id=claim.batch_id,
    )
    by_id = {entry.id: entry for entry in claim.entries}
    delivered = [entry_id for entry_id, sent in results.items() if sent.outcome is Outcome.ACK]
    # A 410 is no failure of the entry: it waits, untouched, until the topic is enabled again.
    failed = [
        Failure(
            id=entry_id,
            error=sent.error or "failed",
            attempts=by_id[entry_id].attempts,
            retry_after_seconds=sent.retry_after_seconds,
        )
        for entry_id, sent in results.items()
        if sent.outcome is Outcome.FAILED
    ]
    settled = await topics.settle(claim, delivered, failed)
    gone = next((sent.error for sent in results.values() if sent.outcome is Outcome.GONE), None)
    if gone is not None:
        await topics.disable(topic.name, f"the endpoint answered {gone}")
    return Round(
        claimed=len(claim.entries),
        delivered=settled.delivered,
        failed=settled.failed,
        dead_lettered=len(settled.dead_lettered),
        gone=gone,
    )
