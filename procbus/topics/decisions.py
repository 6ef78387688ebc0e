"""What consuming a topic decides, apart from the SQL that applies it (procrastinate's retry.py):
when an entry that failed is tried again, what becomes of one refused, past max_retries or past
its TTL, when a table:// topic stops instead, which batches are kept, and how far a grouped
topic's claim reads. Pure: no I/O, no clock (the caller gives the database's time), no
randomness but the jitter handed in (procbus.topics.consuming applies what these return)."""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any

from procbus.batching import Event as BatchEvent
from procbus.core import EndpointKind
from procbus.topics.models import ClaimedBatch, Failure, Topic, TopicSettings

# Retries wait at most this long between attempts, jitter aside.
MAX_BACKOFF_SECONDS = 3600.0
JITTER = 0.2
# A grouped topic reads its batches' worth of events and this many more at first.
WINDOW_SLACK = 100
# A grouped look that holds nothing that can go is read again this many times as far.
LOOK_GROWTH = 4


# ---- retries, dead letters, stops ----


def stops_instead_of_dead_lettering(topic: TopicSettings) -> bool:
    """A table:// topic (a change pipeline) applies its batches in order: one it refuses, or
    one past its retries or TTL, stops the topic instead, for no later batch to apply over the
    gap it would leave. Only an operator gives such a batch up (Topics.skip_stopped_batch)."""
    return topic.endpoint.startswith(f"{EndpointKind.TABLE.value}://")


def stopped_reason(topic: str, why: str, error: str, batch_id: str | None) -> str:
    """Why a table:// topic stopped at a batch, and the operator's two ways on."""
    give_up = (
        f", or give the batch up: `procbus pipeline skip {topic} --batch {batch_id} --reason TEXT`"
        if batch_id is not None
        else ""
    )
    return (
        f"a batch {why}, kept first in the queue with the batches behind it: {error}; fix the "
        f"cause, then `procbus topic enable {topic}`{give_up}"
    )


def jitter() -> float:
    """A retry delay's random factor, around 1, so that retries do not arrive in step."""
    return random.uniform(1 - JITTER, 1 + JITTER)


def retry_delay(topic: TopicSettings, failure: Failure, spread: float) -> float:
    """Seconds until an entry's next attempt: the endpoint's Retry-After when it gave one (at
    most MAX_BACKOFF_SECONDS), else retry_sleep doubled per attempt made, capped, times
    `spread` (a `jitter()`)."""
    if failure.retry_after_seconds is not None:
        return min(max(failure.retry_after_seconds, 0.0), MAX_BACKOFF_SECONDS)
    try:
        doubled = math.ldexp(topic.retry_sleep_seconds, max(failure.attempts, 0))
    except OverflowError:  # past 2**1023 (1024 attempts and more): far past the cap
        doubled = math.inf
    return min(doubled, MAX_BACKOFF_SECONDS) * spread


def retry_delays(
    topic: TopicSettings,
    failed: Sequence[Failure],
    *,
    whole_batch: bool,
    spread: Callable[[], float] = jitter,
) -> list[float]:
    """Each failed entry's delay, in order. A kept batch (`whole_batch`) is retried whole: on
    its first entry's delay (where that is 0, a Retry-After of 0, each entry's own)."""
    shared = retry_delay(topic, failed[0], spread()) if whole_batch and failed else None
    return [shared or retry_delay(topic, failure, spread()) for failure in failed]


class Fate(StrEnum):
    """What becomes of an entry after a failed attempt."""

    RETRY = "retry"  # due again after its delay
    REFUSED = "refused"  # the endpoint can never take it as it is
    EXHAUSTED = "exhausted"  # failed max_retries + 1 times
    EXPIRED = "expired"  # older than the topic's TTL


def fate(topic: TopicSettings, attempts: int, age_seconds: float, refused: bool) -> Fate:
    """An entry's fate, given its attempts so far (this one counted), its age and whether the
    endpoint refused it; the first that applies of REFUSED, EXHAUSTED, EXPIRED, else RETRY."""
    if refused:
        return Fate.REFUSED
    if attempts > topic.max_retries:
        return Fate.EXHAUSTED
    if age_seconds > topic.ttl_seconds:
        return Fate.EXPIRED
    return Fate.RETRY


def why_given_up(topic: TopicSettings, given_up: Fate) -> str:
    """Why an entry past its retries or TTL is given up (a dead letter's reason)."""
    if given_up is Fate.EXHAUSTED:
        return f"failed {topic.max_retries + 1} times (max_retries)"
    return f"older than the topic's TTL of {topic.ttl_seconds:g} s"


@dataclass(frozen=True, slots=True)
class Tried:
    """An entry after a failed attempt was recorded: its attempts, this one counted."""

    id: int
    attempts: int
    age_seconds: float


@dataclass(frozen=True, slots=True)
class AfterFailures:
    """What a settlement does with the entries that failed, besides retrying them."""

    # Entries out of the queue: (their IDs, the reason), in the order they go.
    dead_letters: list[tuple[list[int], str]] = field(default_factory=list)
    # Why a table:// topic stops (then nothing is dead-lettered)...
    stopped: str | None = None
    # ...and the failed entries, due again as soon as an operator enables it.
    retry_now: list[int] = field(default_factory=list)


def after_failures(
    topic: Topic,
    failed: Sequence[Failure],
    tried: Sequence[Tried],
    batches: Sequence[ClaimedBatch] = (),
) -> AfterFailures:
    """The refused entries, those past max_retries and those past the TTL (`tried`, as the
    attempt left them) go to the dead letters, each kind with its reason; on a table:// topic
    (stops_instead_of_dead_lettering) none does: the topic stops at the batch instead."""
    refused = [failure for failure in failed if failure.permanent]
    refused_ids = {failure.id for failure in refused}
    fates = [
        (entry.id, fate(topic, entry.attempts, entry.age_seconds, entry.id in refused_ids))
        for entry in tried
    ]
    exhausted = [entry_id for entry_id, its in fates if its is Fate.EXHAUSTED]
    expired = [entry_id for entry_id, its in fates if its is Fate.EXPIRED]
    if not (refused or exhausted or expired):
        return AfterFailures()
    if stops_instead_of_dead_lettering(topic):
        if refused:
            why = "cannot be applied as it is"
        elif exhausted:
            why = why_given_up(topic, Fate.EXHAUSTED)
        else:
            why = f"is {why_given_up(topic, Fate.EXPIRED)}"
        failed_ids = {failure.id for failure in failed}
        batch_id = next((batch.id for batch in batches if batch.entry_ids[0] in failed_ids), None)
        return AfterFailures(
            stopped=stopped_reason(topic.name, why, failed[0].error, batch_id),
            retry_now=sorted(failed_ids),
        )
    groups = (
        (sorted(refused_ids), refused[0].error if refused else ""),
        (exhausted, why_given_up(topic, Fate.EXHAUSTED)),
        (expired, why_given_up(topic, Fate.EXPIRED)),
    )
    return AfterFailures(dead_letters=[(ids, reason) for ids, reason in groups if ids])


def batches_to_keep(
    batches: Sequence[ClaimedBatch], failed: Sequence[Failure]
) -> tuple[list[str], list[str]]:
    """The batches a claim assembled, and those of them kept to be resent exactly: those that
    failed (whole: their first entry says). One never sent is no batch: its entries are
    assembled again with what blocks them then."""
    fresh = [batch for batch in batches if batch.fresh]
    failed_ids = {failure.id for failure in failed}
    return (
        [batch.id for batch in fresh],
        [batch.id for batch in fresh if batch.entry_ids[0] in failed_ids],
    )


# ---- how far a grouped topic's claim reads ----


def first_look(topic: TopicSettings, count: int) -> int:
    """The events a grouped claim of `count` batches reads first."""
    return topic.batch_size * count + WINDOW_SLACK


def waits_for_more(topic: TopicSettings, looked: int, oldest_age_seconds: float) -> bool:
    """Whether a short batch (fewer events than batch_size) waits for more, up to the topic's
    batch time counted from its oldest event."""
    return looked < topic.batch_size and oldest_age_seconds < topic.batch_seconds


def next_look(limit: int, in_window: int, found: bool) -> int | None:
    """How far the next look reads, when this one (up to `limit` events, `in_window` of them
    the queue's) found nothing that can go and did not read the whole queue: everything read
    waits on what lies beyond it. None: the claim takes what it found."""
    if found or in_window < limit:
        return None
    return limit * LOOK_GROWTH


def grouped_batch_id(topic: str, entry_ids: Sequence[int]) -> str:
    """A grouped batch's ID, from its topic and entries: the same on every retry."""
    digest = hashlib.sha256(f"{topic}:{list(entry_ids)}".encode()).hexdigest()
    return f"batch_{digest[:32]}"


def read_look(
    view: Sequence[Mapping[str, Any]], now: datetime, wait_seconds: float
) -> tuple[list[BatchEvent], set[str], int]:
    """A grouped look's rows in one pass (each field read of a row costs): the events as the
    assembly sees them; the overdue transactions, incomplete (their last event, or one of their
    counted events, is not among the rows) with an event older than `wait_seconds`; and how
    many rows lie in the look's window."""
    window: list[BatchEvent] = []
    seen: dict[str, int] = {}
    size: dict[str, int | None] = {}
    oldest: dict[str, datetime] = {}
    in_window = 0
    for row in view:
        txn_id, last, txn_size = row["txn_id"], row["txn_last"], row["txn_size"]
        # Positional: a third of the keyword call's time, once per event.
        window.append(
            BatchEvent(str(row["id"]), row["key"], txn_id, last, txn_size, not row["blocked"])
        )
        in_window += row["in_window"]
        if txn_id is not None:
            seen[txn_id] = seen.get(txn_id, 0) + 1
            if last:
                size[txn_id] = txn_size
            created_at: datetime = row["created_at"]
            if txn_id not in oldest or created_at < oldest[txn_id]:
                oldest[txn_id] = created_at
    complete = {txn_id for txn_id, count in size.items() if count is None or seen[txn_id] >= count}
    overdue = {
        txn_id
        for txn_id, created_at in oldest.items()
        if txn_id not in complete and (now - created_at).total_seconds() >= wait_seconds
    }
    return window, overdue, in_window
