"""What a delivery round decides, apart from the calls that apply it (dispatch.deliver_round):
what it claims, which entries failed and how, and whether the topic stops. Pure: the round's
claim and what the endpoint answered in, decisions out."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from procbus.delivery.clients import Outcome, Sent
from procbus.topics import Claim, Failure, TopicSettings
from procbus.topics.decisions import stops_instead_of_dead_lettering

# A batching endpoint gets up to this many batches per claim, one after the other: the claim's
# and the settlement's round trips are shared by them (8 against 4: 17-20% more events/s in
# batches of 100, 5% in batches of 500).
ROUND_BATCHES = 8


@dataclass(frozen=True, slots=True)
class ClaimPlan:
    """What a round claims: `batches` of the topic's batch_size at most (a grouped topic's
    batch may be longer, to hold a transaction whole), as the topic's next batches
    (`grouped`), and as bodies PostgreSQL builds (`encoded`) for an endpoint that takes only
    those."""

    batches: int
    batch_size: int
    grouped: bool
    encoded: bool

    @property
    def limit(self) -> int:
        """The entries an ungrouped claim takes at most."""
        return self.batch_size * self.batches


def claim_plan(topic: TopicSettings, *, batching: bool, takes_entries: bool) -> ClaimPlan:
    """ROUND_BATCHES batches for a batching endpoint, one otherwise; as bodies when the endpoint
    reads no entries."""
    return ClaimPlan(
        batches=ROUND_BATCHES if batching else 1,
        batch_size=topic.batch_size,
        grouped=topic.group_transactions,
        encoded=batching and not takes_entries,
    )


def delivered(results: Mapping[int, Sent]) -> list[int]:
    """The entries the endpoint took."""
    return [entry_id for entry_id, sent in results.items() if sent.outcome is Outcome.ACK]


def failures(claim: Claim, results: Mapping[int, Sent]) -> list[Failure]:
    """The entries the endpoint did not take, with their attempts before this one; a refused
    one is `permanent`. A 410 is no failure of the entry: it waits, untouched, until the topic
    is enabled again."""
    attempts = {entry.id: entry.attempts for entry in claim.entries} | {
        entry_id: count
        for batch in claim.encoded
        for entry_id, count in zip(batch.entry_ids, batch.attempts, strict=True)
    }
    return [
        Failure(
            id=entry_id,
            error=sent.error or "failed",
            attempts=attempts[entry_id],
            retry_after_seconds=sent.retry_after_seconds,
            permanent=sent.outcome is Outcome.REJECTED,
        )
        for entry_id, sent in results.items()
        if sent.outcome in (Outcome.FAILED, Outcome.REJECTED)
    ]


@dataclass(frozen=True, slots=True)
class Stop:
    """Whether a round stops its topic: the reasons to disable it with, in order, and why the
    round says it stopped (None: it goes on)."""

    disable: list[str]
    why: str | None


def topic_stops(topic: TopicSettings, results: Mapping[int, Sent], stopped: str | None) -> Stop:
    """A 410 disables the topic. A table:// topic's batch refused, or past its retries or TTL,
    stopped it with the batch kept (`stopped`: the settlement disabled it); elsewhere a refused
    entry is dead-lettered, and the topic stops so that nothing behind it goes first."""
    disable: list[str] = []
    gone = next((sent.error for sent in results.values() if sent.outcome is Outcome.GONE), None)
    if gone is not None:
        disable.append(f"the endpoint answered {gone}")
    why = stopped or gone
    rejected = next(
        (sent.error for sent in results.values() if sent.outcome is Outcome.REJECTED), None
    )
    if rejected is not None and not stops_instead_of_dead_lettering(topic):
        why = rejected
        disable.append(f"stopped: {rejected}")
    return Stop(disable=disable, why=why)
