"""An event's fields given one by one (tx.publish, publish_in_transaction) are checked without a
model in the common case: the checks must take exactly what Event takes, and refuse the rest
with Event's own findings."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from procbus.errors import InvalidRequest
from procbus.topics.models import (
    MAX_EVENT_KEY_LENGTH,
    MAX_EVENT_TYPE_LENGTH,
    MAX_TXN_ID_LENGTH,
    Event,
    checked_event_fields,
)


def near(limit: int) -> st.SearchStrategy[str]:
    """Strings around a length limit, where a hand-written check would go wrong."""
    return st.integers(min_value=0, max_value=limit + 2).map(lambda length: "x" * length)


ANY_VALUE = st.one_of(st.none(), st.booleans(), st.integers(-2, 3), st.text(max_size=5))
TYPES = st.one_of(near(MAX_EVENT_TYPE_LENGTH), st.text(max_size=3), ANY_VALUE)
KEYS = st.one_of(st.none(), near(MAX_EVENT_KEY_LENGTH), ANY_VALUE)
TXN_IDS = st.one_of(st.none(), near(MAX_TXN_ID_LENGTH), ANY_VALUE)
LAST = st.one_of(st.booleans(), ANY_VALUE)
SIZES = st.one_of(st.none(), st.integers(-3, 10**6), ANY_VALUE)


@given(TYPES, KEYS, TXN_IDS, LAST, SIZES)
def test_the_checks_take_what_event_takes_and_refuse_the_rest(
    type_: Any, key: Any, txn_id: Any, last_in_txn: Any, txn_size: Any
) -> None:
    fields = {
        "type": type_,
        "key": key,
        "txn_id": txn_id,
        "last_in_txn": last_in_txn,
        "txn_size": txn_size,
    }
    try:
        event = Event(payload=None, **fields)
    except ValidationError:
        with pytest.raises(InvalidRequest, match="^bad event: "):
            checked_event_fields(**fields)
        return
    assert checked_event_fields(**fields) == (
        event.type,
        event.key,
        event.txn_id,
        event.last_in_txn,
        event.txn_size,
    )


def test_a_refusal_names_each_bad_field() -> None:
    with pytest.raises(InvalidRequest) as refused:
        checked_event_fields("", "k" * (MAX_EVENT_KEY_LENGTH + 1), None, False, 0)
    assert str(refused.value) == (
        "bad event: type: String should have at least 1 character; "
        "key: String should have at most 1000 characters; "
        "txn_size: Input should be greater than 0"
    )
