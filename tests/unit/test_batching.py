"""Transaction-grouped batch assembly (procbus.batching), pure: examples, then properties over
random queues."""

from __future__ import annotations

from collections import defaultdict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from procbus.batching import (
    Event,
    assemble_batch,
    assemble_batches,
    whole_transaction_batches,
)


def queue_of(notation: str) -> list[Event]:
    """Geode's notation: `A` an event of entry A outside a transaction, `T1-A` one in
    transaction 1, `T1-A*` its last event. IDs are `notation@position`."""
    events = []
    for position, token in enumerate(notation.split()):
        last = token.endswith("*")
        token = token.rstrip("*")
        txn, _, key = token.rpartition("-")
        events.append(
            Event(
                id=f"{token}{'*' if last else ''}@{position}",
                key=key,
                txn_id=txn or None,
                last_in_txn=last,
            )
        )
    return events


def names(batch: list[Event]) -> str:
    return " ".join(event.id.split("@")[0] for event in batch)


def drain(
    queue: list[Event], max_size: int, *, give_up_when_stuck: bool = True
) -> list[list[Event]]:
    """Batches until the queue is empty; when nothing can go, the waiting transactions are
    declared overdue (what the store does after its wait)."""
    batches, overdue = [], set()
    while queue:
        batch = assemble_batch(queue, max_size, overdue=overdue)
        if not batch:
            assert give_up_when_stuck, "the assembly stalled"
            overdue |= {event.txn_id for event in queue if event.txn_id is not None}
            continue
        sent = {event.id for event in batch}
        queue = [event for event in queue if event.id not in sent]
        batches.append(batch)
    return batches


def test_the_worked_example_of_the_geode_proposal_keeping_each_key_in_order() -> None:
    queue = queue_of("A T0-X T0-Y T0-Z* T1-A T1-B A T2-A T1-C T2-B D E T2-C T2-D* T1-D*")
    batch = assemble_batch(queue, 10)
    # Geode appends T1-D* T2-C T2-D*: that sends T1-D ahead of the D and T2-D queued before it.
    # Here the earlier events of key D come first; E stays for the next batch.
    assert names(batch) == "A T0-X T0-Y T0-Z* T1-A T1-B A T2-A T1-C T2-B D T2-C T2-D* T1-D*"
    assert names(assemble_batch(queue_of("E"), 10)) == "E"


def test_geode_order_when_keys_do_not_meet() -> None:
    queue = queue_of("A T1-B T2-C T1-D D2 T2-E* T1-F* G")
    # Cut at 3; T1 first appeared first, so its missing events come first, then T2's.
    assert names(assemble_batch(queue, 3)) == "A T1-B T2-C T1-D T1-F* T2-E*"


def test_without_grouping_the_first_events() -> None:
    queue = queue_of("T1-A T1-B T1-C*")
    assert names(assemble_batch(queue, 2, group_transactions=False)) == "T1-A T1-B"


def test_mixed_plain_and_transactional_events() -> None:
    queue = queue_of("A B T1-C T1-D* E")
    assert names(assemble_batch(queue, 3)) == "A B T1-C T1-D*"
    assert names(assemble_batch(queue, 2)) == "A B"


def test_interleaved_transactions_come_whole() -> None:
    queue = queue_of("T1-A T2-B T1-C T2-D T1-E* T2-F* G")
    assert names(assemble_batch(queue, 1)) == "T1-A T1-C T1-E*"
    assert names(assemble_batch(queue, 2)) == "T1-A T2-B T1-C T1-E* T2-D T2-F*"


def test_a_transaction_larger_than_the_batch_goes_whole() -> None:
    queue = queue_of(" ".join(f"T1-K{i}" for i in range(50)) + " T1-L* M")
    batch = assemble_batch(queue, 10)
    assert len(batch) == 51
    assert batch[-1].last_in_txn


def test_a_missing_last_event_holds_its_transaction_and_its_keys_not_the_others() -> None:
    queue = queue_of("T1-A B T1-C A D")
    # T1 has no last event: it waits, and so does the later A behind it; B and D go.
    assert names(assemble_batch(queue, 10)) == "B D"
    # Once waited for long enough, T1 goes as it is.
    assert names(assemble_batch(queue, 10, overdue={"T1"})) == "T1-A B T1-C A D"


def test_a_count_short_of_the_transaction_waits_for_the_rest() -> None:
    queue = [
        Event(id="1", key="a", txn_id="t", last_in_txn=False),
        Event(id="2", key="b", txn_id="t", last_in_txn=True, txn_size=3),
        Event(id="3", key="c"),
    ]
    assert [event.id for event in assemble_batch(queue, 10)] == ["3"]
    queue.append(Event(id="4", key="d", txn_id="t"))
    assert [event.id for event in assemble_batch(queue, 10)] == ["1", "2", "3", "4"]


def test_an_event_that_is_not_ready_holds_its_key_and_its_transaction() -> None:
    queue = [
        Event(id="1", key="a", ready=False),
        Event(id="2", key="b", txn_id="t"),
        Event(id="3", key="a", txn_id="t", last_in_txn=True),
        Event(id="4", key="c"),
    ]
    assert [event.id for event in assemble_batch(queue, 10)] == ["4"]


def test_per_key_order_pulls_an_earlier_event_of_the_key_and_its_transaction() -> None:
    queue = queue_of("T1-A T2-B B2 T2-C* T1-B*")
    # T1-B* needs T2-B first (key B); then T2, now in the batch, is completed after T1.
    assert names(assemble_batch(queue, 1)) == "T1-A T2-B T1-B* T2-C*"


def test_an_empty_queue_gives_an_empty_batch() -> None:
    assert assemble_batch([], 10) == []
    with pytest.raises(ValueError, match="max_size"):
        assemble_batch([], 0)


# ---- properties over random queues ----


@st.composite
def queues(draw: st.DrawFn) -> list[Event]:
    """Queues of plain events and interleaved transactions over a few keys; some transactions
    never get their last event (their producer died)."""
    keys = st.sampled_from(["a", "b", "c", "d", "e", None])
    steps = draw(st.lists(st.tuples(st.integers(0, 5), keys), max_size=60))
    open_txns: dict[int, int] = {}
    events: list[Event] = []
    next_txn = 0
    for number, (action, key) in enumerate(steps):
        if action == 0 or (action in (4, 5) and not open_txns):
            events.append(Event(id=f"e{number}", key=key))
        elif action == 1:
            open_txns[next_txn] = 0
            next_txn += 1
            continue
        else:
            txn = sorted(open_txns)[action % len(open_txns)] if open_txns else None
            if txn is None:
                events.append(Event(id=f"e{number}", key=key))
                continue
            open_txns[txn] += 1
            last = action == 5
            events.append(
                Event(
                    id=f"e{number}",
                    key=key,
                    txn_id=f"t{txn}",
                    last_in_txn=last,
                    txn_size=open_txns[txn] if last and draw(st.booleans()) else None,
                )
            )
            if last:
                del open_txns[txn]
    return events


def with_held(queue: list[Event], held: set[int]) -> list[Event]:
    """The queue with the events at these places not ready."""
    return [
        Event(e.id, e.key, e.txn_id, e.last_in_txn, e.txn_size, ready=index not in held)
        for index, e in enumerate(queue)
    ]


@settings(max_examples=300, deadline=None)
@given(queue=queues(), max_size=st.integers(1, 12))
def test_draining_sends_every_event_once_keeps_key_order_and_whole_transactions(
    queue: list[Event], max_size: int
) -> None:
    batches = drain(queue, max_size)
    sent = [event for batch in batches for event in batch]
    assert sorted(event.id for event in sent) == sorted(event.id for event in queue)
    assert len({event.id for event in sent}) == len(sent)

    position = {event.id: index for index, event in enumerate(queue)}
    by_key: dict[str, list[int]] = defaultdict(list)
    for event in sent:
        if event.key is not None:
            by_key[event.key].append(position[event.id])
    for key, order in by_key.items():
        assert order == sorted(order), f"key {key} out of order"

    complete = {event.txn_id for event in queue if event.last_in_txn}
    batch_of = {event.id: number for number, batch in enumerate(batches) for event in batch}
    for txn in complete:
        assert len({batch_of[e.id] for e in queue if e.txn_id == txn}) == 1, f"{txn} was split"


@settings(max_examples=300, deadline=None)
@given(queue=queues(), max_size=st.integers(1, 12))
def test_one_batch_is_deterministic_and_holds_no_part_of_a_complete_transaction(
    queue: list[Event], max_size: int
) -> None:
    batch = assemble_batch(queue, max_size)
    assert batch == assemble_batch(list(queue), max_size)
    members = defaultdict(set)
    for event in queue:
        if event.txn_id is not None:
            members[event.txn_id].add(event.id)
    ids = {event.id for event in batch}
    for event in batch:
        if event.txn_id is not None:
            assert members[event.txn_id] <= ids


@settings(max_examples=400, deadline=None)
@given(
    queue=queues(),
    max_size=st.integers(1, 12),
    count=st.integers(1, 6),
    held=st.sets(st.integers(0, 59), max_size=4),
    overdue=st.sets(st.sampled_from([f"t{n}" for n in range(8)]), max_size=2),
)
def test_several_batches_in_one_pass_are_the_batches_one_at_a_time(
    queue: list[Event], max_size: int, count: int, held: set[int], overdue: set[str]
) -> None:
    # Some events are not ready (behind a batch being retried): they hold back what needs them.
    queue = with_held(queue, held)
    one_at_a_time, left = [], list(queue)
    while len(one_at_a_time) < count:
        batch = assemble_batch(left, max_size, overdue=overdue)
        if one_at_a_time and not batch:
            break
        one_at_a_time.append(batch)
        sent = {event.id for event in batch}
        left = [event for event in left if event.id not in sent]
    assert assemble_batches(queue, max_size, count, overdue=overdue) == one_at_a_time


# ---- the common case in one pass (what a pipeline's claim meets nearly always) ----


@st.composite
def side_by_side(draw: st.DrawFn) -> list[Event]:
    """Queues of lone events and whole transactions, each transaction's events side by side
    (its last at the end of its run, its count given or not), over a few keys."""
    keys = st.sampled_from(["a", "b", "c", None])
    events: list[Event] = []
    for number, length in enumerate(draw(st.lists(st.integers(0, 6), max_size=25))):
        if length == 0:
            events.append(Event(id=f"e{len(events)}", key=draw(keys)))
            continue
        counted = draw(st.booleans())
        for place in range(length):
            last = place == length - 1
            events.append(
                Event(
                    id=f"e{len(events)}",
                    key=draw(keys),
                    txn_id=f"t{number}",
                    last_in_txn=last,
                    txn_size=length if last and counted else None,
                )
            )
    return events


def columns(queue: list[Event]) -> list[tuple[str | None, bool, int | None, bool]]:
    return [(e.txn_id, e.last_in_txn, e.txn_size, e.ready) for e in queue]


@settings(max_examples=300, deadline=None)
@given(queue=side_by_side(), max_size=st.integers(1, 12), count=st.integers(1, 6))
def test_whole_transactions_side_by_side_are_cut_as_the_assembly_cuts_them(
    queue: list[Event], max_size: int, count: int
) -> None:
    ranges = whole_transaction_batches(columns(queue), max_size, count)
    assert ranges is not None, "the common case was not recognised"
    assert [[queue[p] for p in batch] for batch in ranges] == assemble_batches(
        queue, max_size, count
    )


@settings(max_examples=400, deadline=None)
@given(
    queue=queues(),
    max_size=st.integers(1, 12),
    count=st.integers(1, 6),
    held=st.sets(st.integers(0, 59), max_size=2),
)
def test_the_one_pass_cut_answers_only_what_the_assembly_would(
    queue: list[Event], max_size: int, count: int, held: set[int]
) -> None:
    # Interleaved, unfinished and held transactions: the one pass gives up (None), or agrees.
    queue = with_held(queue, held)
    ranges = whole_transaction_batches(columns(queue), max_size, count)
    if ranges is not None:
        assert [[queue[p] for p in batch] for batch in ranges] == assemble_batches(
            queue, max_size, count
        )


@pytest.mark.parametrize(
    ("notation", "why"),
    [
        ("T1-A T2-B T1-C* T2-D*", "interleaved"),
        ("T1-A T1-B", "its last event missing"),
        ("T1-A* T1-B", "an event after its last"),
        ("T1-A A T1-B*", "a lone event inside it"),
    ],
)
def test_the_one_pass_cut_leaves_other_queues_to_the_assembly(notation: str, why: str) -> None:
    assert whole_transaction_batches(columns(queue_of(notation)), 2, 3) is None, why


def test_the_one_pass_cut_leaves_a_held_event_and_a_short_count_to_the_assembly() -> None:
    held = [Event("x", "a", "t1", True, None, ready=False)]
    short = [Event("x", "a", "t1", False), Event("y", "b", "t1", True, 3)]
    assert whole_transaction_batches(columns(held), 5, 1) is None
    assert whole_transaction_batches(columns(short), 5, 1) is None
