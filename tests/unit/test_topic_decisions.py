"""What consuming a topic decides (procbus.topics.decisions), pure: properties over random
policies, attempts and looks, then the texts an operator reads."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from procbus.topics.decisions import (
    JITTER,
    MAX_BACKOFF_SECONDS,
    AfterFailures,
    Fate,
    Tried,
    after_failures,
    batches_to_keep,
    fate,
    first_look,
    grouped_batch_id,
    jitter,
    next_look,
    read_look,
    retry_delay,
    retry_delays,
    waits_for_more,
)
from procbus.topics.models import MAX_BATCH_SIZE, MAX_RETRIES, ClaimedBatch, Failure, Topic

WEBHOOK = "https://hooks.example.com/orders"
PIPELINE = "table://lake"
NOW = datetime(2026, 12, 1, tzinfo=UTC)

attempts = st.integers(min_value=0, max_value=MAX_RETRIES)
spreads = st.floats(min_value=1 - JITTER, max_value=1 + JITTER)
retry_afters = st.none() | st.floats(min_value=-1e9, max_value=1e12, allow_nan=False)


@st.composite
def topics(draw: st.DrawFn, endpoint: st.SearchStrategy[str] | None = None) -> Topic:
    return Topic(
        name="orders",
        endpoint=draw(st.sampled_from([WEBHOOK, PIPELINE]) if endpoint is None else endpoint),
        max_retries=draw(st.integers(min_value=0, max_value=100)),
        retry_sleep_seconds=draw(st.floats(min_value=1e-6, max_value=1e5)),
        ttl_seconds=draw(st.floats(min_value=1e-3, max_value=1e9)),
        batch_size=draw(st.integers(min_value=1, max_value=MAX_BATCH_SIZE)),
        batch_seconds=draw(st.floats(min_value=0, max_value=1e4)),
    )


def failure(entry_id: int, tries: int = 0, **fields: Any) -> Failure:
    return Failure(id=entry_id, error=f"error of {entry_id}", attempts=tries, **fields)


# ---- retry delays ----


@given(topics(), attempts, spreads)
def test_a_retry_never_waits_longer_than_the_cap_jitter_aside(
    topic: Topic, tries: int, spread: float
) -> None:
    assert 0 < retry_delay(topic, failure(1, tries), 1.0) <= MAX_BACKOFF_SECONDS
    assert retry_delay(topic, failure(1, tries), spread) <= MAX_BACKOFF_SECONDS * (1 + JITTER)


@given(topics(), attempts, attempts, spreads)
def test_a_retry_never_waits_less_than_the_one_before(
    topic: Topic, first: int, second: int, spread: float
) -> None:
    earlier, later = sorted((first, second))
    assert retry_delay(topic, failure(1, earlier), spread) <= retry_delay(
        topic, failure(1, later), spread
    )


@given(topics(), attempts, spreads)
def test_the_first_retry_waits_the_retry_sleep_then_each_twice_as_long_up_to_the_cap(
    topic: Topic, tries: int, spread: float
) -> None:
    first = retry_delay(topic, failure(1, 0), spread)
    assert first == min(topic.retry_sleep_seconds, MAX_BACKOFF_SECONDS) * spread
    now, then = (
        retry_delay(topic, failure(1, tries), 1.0),
        retry_delay(topic, failure(1, tries + 1), 1.0),
    )
    assert then == min(now * 2, MAX_BACKOFF_SECONDS)


@given(topics(), attempts, spreads, st.floats(allow_nan=False))
def test_a_retry_after_is_honoured_within_zero_and_the_cap_without_jitter(
    topic: Topic, tries: int, spread: float, wait: float
) -> None:
    delay = retry_delay(topic, failure(1, tries, retry_after_seconds=wait), spread)
    assert delay == min(max(wait, 0.0), MAX_BACKOFF_SECONDS)


def test_jitter_stays_within_its_bounds() -> None:
    draws = [jitter() for _ in range(1000)]
    assert all(1 - JITTER <= draw <= 1 + JITTER for draw in draws) and len(set(draws)) > 1


@given(
    topics(),
    st.lists(st.tuples(attempts, retry_afters), min_size=1, max_size=20),
    st.booleans(),
    spreads,
)
def test_a_kept_batch_is_retried_whole_on_its_first_entrys_delay(
    topic: Topic, tried: list[tuple[int, float | None]], whole_batch: bool, spread: float
) -> None:
    failed = [failure(n, tries, retry_after_seconds=wait) for n, (tries, wait) in enumerate(tried)]
    delays = retry_delays(topic, failed, whole_batch=whole_batch, spread=lambda: spread)
    own = [retry_delay(topic, each, spread) for each in failed]
    assert len(delays) == len(failed)
    if whole_batch and own[0] > 0:
        assert delays == [own[0]] * len(failed)
    else:
        assert delays == own


# ---- fates: retried, dead-lettered, or the topic stops ----


@given(topics(), attempts, st.floats(min_value=0, max_value=1e10), st.booleans())
def test_an_entry_past_max_retries_or_its_ttl_or_refused_is_never_retried(
    topic: Topic, tries: int, age: float, refused: bool
) -> None:
    its = fate(topic, tries, age, refused)
    assert (its is Fate.RETRY) == (
        not refused and tries <= topic.max_retries and age <= topic.ttl_seconds
    )
    if refused:
        assert its is Fate.REFUSED
    elif tries > topic.max_retries:
        assert its is Fate.EXHAUSTED


entries_tried = st.lists(
    st.tuples(
        st.integers(min_value=0, max_value=120),
        st.floats(min_value=0, max_value=1e10),
        st.booleans(),
    ),
    min_size=1,
    max_size=20,
)


def settle_failures(
    topic: Topic, drawn: list[tuple[int, float, bool]], batches: list[ClaimedBatch] | None = None
) -> tuple[list[Failure], list[Tried], AfterFailures]:
    failed = [failure(n, tries, permanent=refused) for n, (tries, _, refused) in enumerate(drawn)]
    tried = [Tried(n, tries + 1, age) for n, (tries, age, _) in enumerate(drawn)]
    return failed, tried, after_failures(topic, failed, tried, batches or [])


@given(topics(st.just(WEBHOOK)), entries_tried)
def test_every_entry_given_up_is_dead_lettered_once_and_none_retried_is(
    topic: Topic, drawn: list[tuple[int, float, bool]]
) -> None:
    failed, tried, after = settle_failures(topic, drawn)
    dead = [entry_id for ids, _ in after.dead_letters for entry_id in ids]
    given_up = [
        entry.id
        for entry, one in zip(tried, failed, strict=True)
        if fate(topic, entry.attempts, entry.age_seconds, one.permanent) is not Fate.RETRY
    ]
    assert sorted(dead) == sorted(given_up) and len(set(dead)) == len(dead)
    assert after.stopped is None and after.retry_now == []
    reasons = [reason for _, reason in after.dead_letters]
    assert len(set(reasons)) == len(reasons)  # one statement per kind


@given(topics(st.just(WEBHOOK)), entries_tried)
def test_an_entry_past_max_retries_is_dead_lettered_saying_so(
    topic: Topic, drawn: list[tuple[int, float, bool]]
) -> None:
    _, tried, after = settle_failures(topic, drawn)
    reason_of = {entry_id: reason for ids, reason in after.dead_letters for entry_id in ids}
    for entry, (_, _, refused) in zip(tried, drawn, strict=True):
        if entry.attempts > topic.max_retries and not refused:
            assert reason_of[entry.id] == f"failed {topic.max_retries + 1} times (max_retries)"


@given(topics(st.just(PIPELINE)), entries_tried)
def test_a_pipeline_dead_letters_nothing_and_stops_at_a_batch_it_gives_up(
    topic: Topic, drawn: list[tuple[int, float, bool]]
) -> None:
    batch = ClaimedBatch(id="batch_1", entry_ids=list(range(len(drawn))))
    failed, tried, after = settle_failures(topic, drawn, [batch])
    gives_up = any(
        fate(topic, entry.attempts, entry.age_seconds, one.permanent) is not Fate.RETRY
        for entry, one in zip(tried, failed, strict=True)
    )
    assert after.dead_letters == []
    assert (after.stopped is not None) == gives_up
    if after.stopped is not None:
        assert after.retry_now == sorted(one.id for one in failed)
        assert "procbus pipeline skip orders --batch batch_1" in after.stopped


@given(
    st.lists(
        st.tuples(st.lists(st.integers(0, 50), min_size=1, max_size=5, unique=True), st.booleans()),
        max_size=8,
    ),
    st.sets(st.integers(0, 50)),
)
def test_only_fresh_batches_that_failed_are_kept(
    drawn: list[tuple[list[int], bool]], failed_ids: set[int]
) -> None:
    batches = [
        ClaimedBatch(id=f"batch_{n}", entry_ids=ids, fresh=fresh)
        for n, (ids, fresh) in enumerate(drawn)
    ]
    assembled, kept = batches_to_keep(batches, [failure(n) for n in failed_ids])
    assert assembled == [batch.id for batch in batches if batch.fresh]
    assert kept == [b.id for b in batches if b.fresh and b.entry_ids[0] in failed_ids]


# ---- how far a grouped claim reads ----


@given(topics(), st.integers(min_value=1, max_value=8), st.integers(min_value=0, max_value=10**7))
def test_a_look_grows_until_it_reads_the_whole_queue_and_no_further(
    topic: Topic, count: int, queued: int
) -> None:
    limit, looks = first_look(topic, count), 1
    assert limit >= topic.batch_size * count  # one look can hold the batches asked for
    while (further := next_look(limit, min(limit, queued), found=False)) is not None:
        assert further > limit
        limit, looks = further, looks + 1
    assert queued < limit and looks <= 12
    assert next_look(limit, min(limit, queued), found=True) is None


@given(topics(), st.integers(min_value=1, max_value=20_000), st.floats(0, 1e5))
def test_a_short_batch_waits_for_more_only_within_its_batch_time(
    topic: Topic, looked: int, oldest_age: float
) -> None:
    waits = waits_for_more(topic, looked, oldest_age)
    if looked >= topic.batch_size or oldest_age >= topic.batch_seconds:
        assert not waits
    else:
        assert waits


@given(st.text(min_size=1, max_size=20), st.lists(st.integers(1, 2**62), min_size=1, max_size=50))
def test_a_grouped_batch_has_the_same_id_on_every_retry(topic: str, ids: list[int]) -> None:
    made = grouped_batch_id(topic, ids)
    assert made == grouped_batch_id(topic, list(ids)) and len(made) == len("batch_") + 32
    assert made != grouped_batch_id(topic + "x", ids)


look_rows = st.lists(
    st.tuples(
        st.sampled_from([None, "t1", "t2", "t3"]),  # transaction
        st.booleans(),  # its last event
        st.none() | st.integers(1, 4),  # its size, where known
        st.integers(0, 600),  # age in seconds
        st.booleans(),  # blocked
    ),
    max_size=30,
)


@given(look_rows, st.floats(min_value=0, max_value=600))
def test_only_incomplete_transactions_waited_for_long_enough_are_overdue(
    drawn: list[tuple[str | None, bool, int | None, int, bool]], wait: float
) -> None:
    rows: list[dict[str, Any]] = [
        {
            "id": n,
            "key": None,
            "txn_id": txn,
            "txn_last": last,
            "txn_size": size,
            "created_at": NOW - timedelta(seconds=age),
            "blocked": blocked,
            "in_window": 1,
        }
        for n, (txn, last, size, age, blocked) in enumerate(drawn)
    ]
    window, overdue, in_window = read_look(rows, NOW, wait)
    assert (
        [event.id for event in window]
        == [str(n) for n in range(len(rows))]
        == [str(row["id"]) for row in rows]
    )
    assert in_window == len(rows)
    for txn in {row["txn_id"] for row in rows} - {None}:
        of_txn = [row for row in rows if row["txn_id"] == txn]
        lasts = [row for row in of_txn if row["txn_last"]]
        complete = bool(lasts) and (
            lasts[-1]["txn_size"] is None or len(of_txn) >= lasts[-1]["txn_size"]
        )
        oldest_age = max((NOW - row["created_at"]).total_seconds() for row in of_txn)
        assert (txn in overdue) == (not complete and oldest_age >= wait)


# ---- what an operator reads ----


def test_a_pipeline_that_stops_says_why_and_how_to_go_on() -> None:
    topic = Topic(name="orders", endpoint=PIPELINE, max_retries=2, ttl_seconds=60)
    batch = ClaimedBatch(id="batch_9", entry_ids=[7, 8])
    refused = after_failures(
        topic, [failure(7, permanent=True)], [Tried(7, 1, 1.0)], [batch]
    ).stopped
    assert refused == (
        "a batch cannot be applied as it is, kept first in the queue with the batches behind "
        "it: error of 7; fix the cause, then `procbus topic enable orders`, or give the batch "
        "up: `procbus pipeline skip orders --batch batch_9 --reason TEXT`"
    )
    exhausted = after_failures(topic, [failure(7, 2)], [Tried(7, 3, 1.0)]).stopped
    assert exhausted is not None and exhausted.startswith("a batch failed 3 times (max_retries),")
    old = after_failures(topic, [failure(7)], [Tried(7, 1, 61.0)]).stopped
    assert old is not None and old.startswith("a batch is older than the topic's TTL of 60 s,")


def test_a_webhook_dead_letters_each_kind_with_its_reason() -> None:
    topic = Topic(name="orders", endpoint=WEBHOOK, max_retries=2, ttl_seconds=60)
    failed = [failure(1, permanent=True), failure(2, 2), failure(3), failure(4)]
    tried = [Tried(1, 1, 1.0), Tried(2, 3, 1.0), Tried(3, 1, 61.0), Tried(4, 1, 1.0)]
    assert after_failures(topic, failed, tried).dead_letters == [
        ([1], "error of 1"),
        ([2], "failed 3 times (max_retries)"),
        ([3], "older than the topic's TTL of 60 s"),
    ]
