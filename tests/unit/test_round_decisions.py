"""What a delivery round decides (procbus.delivery.decisions), pure: what it claims, which
entries failed and how, and when the topic stops."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from hypothesis import given
from hypothesis import strategies as st

from procbus.delivery.clients import Outcome, Sent
from procbus.delivery.decisions import (
    ROUND_BATCHES,
    claim_plan,
    delivered,
    failures,
    topic_stops,
)
from procbus.topics.models import MAX_BATCH_SIZE, Claim, EncodedBatch, Entry, Topic

NOW = datetime(2026, 12, 1, tzinfo=UTC)
WEBHOOK = "https://hooks.example.com/orders"
PIPELINE = "table://lake"


def topic_of(endpoint: str = WEBHOOK, batch_size: int = 100, grouped: bool = False) -> Topic:
    return Topic(
        name="orders", endpoint=endpoint, batch_size=batch_size, group_transactions=grouped
    )


@given(st.integers(1, MAX_BATCH_SIZE), st.booleans(), st.booleans(), st.booleans())
def test_a_claim_never_exceeds_its_round_bound(
    batch_size: int, grouped: bool, batching: bool, takes_entries: bool
) -> None:
    plan = claim_plan(
        topic_of(batch_size=batch_size, grouped=grouped),
        batching=batching,
        takes_entries=takes_entries,
    )
    assert plan.batches == (ROUND_BATCHES if batching else 1)
    assert plan.limit == batch_size * plan.batches <= MAX_BATCH_SIZE * ROUND_BATCHES
    assert plan.encoded == (batching and not takes_entries) and plan.grouped == grouped


outcomes = st.builds(
    Sent,
    st.sampled_from(list(Outcome)),
    st.none() | st.text(min_size=1, max_size=10),
    st.none() | st.floats(min_value=0, max_value=1e4),
)
sends = st.dictionaries(st.integers(1, 40), outcomes, max_size=20)


def claim_of(results: dict[int, Sent], attempts: int, encoded: bool) -> Claim:
    ids = sorted(results)
    if encoded:
        batch = EncodedBatch(id="batch_1", body="[]", entry_ids=ids, attempts=[attempts] * len(ids))
        return Claim(topic="orders", id=uuid.uuid4(), entries=[], encoded=[batch])
    entries = [Entry(n, None, "event", {}, 2, f"msg_{n}", NOW, attempts) for n in ids]
    return Claim(topic="orders", id=uuid.uuid4(), entries=entries)


@given(sends, st.integers(0, 1000), st.booleans())
def test_each_entry_sent_is_delivered_failed_or_left_untouched_by_its_outcome(
    results: dict[int, Sent], attempts: int, encoded: bool
) -> None:
    failed = failures(claim_of(results, attempts, encoded), results)
    by_id = {failure.id: failure for failure in failed}
    assert len(by_id) == len(failed)
    assert set(delivered(results)) == {
        n for n, sent in results.items() if sent.outcome is Outcome.ACK
    }
    for entry_id, sent in results.items():
        if sent.outcome in (Outcome.ACK, Outcome.GONE):  # a 410 leaves the entry as it was
            assert entry_id not in by_id
            continue
        failure = by_id[entry_id]
        assert failure.permanent == (sent.outcome is Outcome.REJECTED)
        assert (failure.attempts, failure.retry_after_seconds) == (
            attempts,
            sent.retry_after_seconds,
        )
        assert failure.error == (sent.error or "failed")


@given(sends, st.sampled_from([WEBHOOK, PIPELINE]), st.none() | st.just("a batch failed"))
def test_a_410_or_a_refusal_stops_the_topic_and_a_pipeline_is_stopped_by_its_settlement(
    results: dict[int, Sent], endpoint: str, stopped: str | None
) -> None:
    stop = topic_stops(topic_of(endpoint), results, stopped)
    said: dict[Outcome, str | None] = {}  # what the first send of each outcome said
    for sent in results.values():
        said.setdefault(sent.outcome, sent.error)
    gone, refused = said.get(Outcome.GONE), said.get(Outcome.REJECTED)
    if gone is None and refused is None:
        assert stop.disable == [] and stop.why == stopped
    if gone is not None:  # the 410 first
        assert stop.disable[0] == f"the endpoint answered {gone}"
    if endpoint == PIPELINE:  # its settlement stopped it at the batch, or it goes on
        assert not any(reason.startswith("stopped: ") for reason in stop.disable)
        assert stop.why == (stopped or gone)
    elif refused is not None:  # the refusal last: the reason the topic shows
        assert stop.disable[-1] == f"stopped: {refused}" and stop.why == refused
