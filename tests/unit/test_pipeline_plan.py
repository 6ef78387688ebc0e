"""The change pipeline's checks of a batch against its lake tables (pure): what fits, what does
not, the changes planned, and their reduction to the rows to add and the keys to delete."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from procbus.capture import SourceColumn
from procbus.core.endpoints import parse_endpoint
from procbus.lakehouse.models import TableDescriptor
from procbus.lakehouse.schemas import Column, parse_columns
from procbus.pipeline.apply import ChangeMisfit, _all_fit, _fits_as, plan_batch, value_fits
from procbus.pipeline.rows import ChangeColumns, reduce_changes
from procbus.pipeline.schema import lake_type
from procbus.topics import Entry

ACCOUNTS = TableDescriptor(
    namespace="bank",
    name="accounts",
    columns=parse_columns("id:bigint,owner:string,balance:bigint"),
)


def change(
    entry_id: int, op: str, key: int, row: dict[str, Any] | None, table: str = "accounts"
) -> Entry:
    return Entry(
        id=entry_id,
        key=f'public.{table}/{{"id": {key}}}',
        type="change",
        payload={"op": op, "schema": "public", "table": table, "key": {"id": key}, "row": row},
        bytes=1,
        webhook_id=f"msg_{entry_id}",
        created_at=datetime.now(UTC),
        attempts=0,
    )


def plan(*entries: Entry, tables: dict[str, TableDescriptor | None] | None = None) -> Any:
    return plan_batch(
        parse_endpoint("table://bank"),
        entries,
        tables if tables is not None else {"accounts": ACCOUNTS},
    )


def test_a_batch_becomes_lines_in_batch_order_with_the_deleted_flag() -> None:
    planned = plan(
        change(7, "insert", 1, {"id": 1, "owner": "ada", "balance": 5}),
        change(9, "update", 1, {"id": 1, "owner": "ada", "balance": 6}),
        change(12, "delete", 1, None),
    )
    part = planned["accounts"].changes
    assert part.deleted == [False, False, True]
    assert part.values == {
        "id": [1, 1, 1],
        "owner": ["ada", "ada", None],
        "balance": [5, 6, None],
    }
    assert planned["accounts"].keys == ["id"]
    # Key 1 changed three times and was deleted last: no row to add, its live row goes.
    rows, keys = reduce_changes(ACCOUNTS, ["id"], planned["accounts"].changes)
    assert (rows.num_rows, keys.to_pylist()) == (0, [{"id": 1}])


def test_each_key_keeps_its_newest_image_in_commit_order() -> None:
    planned = plan(
        change(1, "insert", 1, {"id": 1, "owner": "ada", "balance": 5}),
        change(2, "insert", 2, {"id": 2, "owner": "bob", "balance": 7}),
        change(3, "update", 1, {"id": 1, "owner": "ada", "balance": 6}),
        change(4, "delete", 2, None),
        change(5, "insert", 2, {"id": 2, "owner": "bea", "balance": 9}),
    )
    rows, keys = reduce_changes(ACCOUNTS, ["id"], planned["accounts"].changes)
    assert sorted(rows.to_pylist(), key=lambda row: row["id"]) == [
        {"id": 1, "owner": "ada", "balance": 6},
        {"id": 2, "owner": "bea", "balance": 9},
    ]
    assert sorted(keys.column("id").to_pylist()) == [1, 2]
    assert rows.schema.field("balance").type == keys.schema.field("id").type  # int64 both


@pytest.mark.parametrize(
    ("entry", "tables", "says"),
    [
        (change(1, "insert", 1, {"id": 1, "owner": "a"}), None, "missing column.s. balance"),
        (
            change(1, "insert", 1, {"id": 1, "owner": "a", "balance": 1, "x": 2}),
            None,
            "unknown column.s. x",
        ),
        (
            change(1, "insert", 1, {"id": 1, "owner": "a", "balance": "lots"}),
            None,
            "balance = 'lots' does not fit .* bigint",
        ),
        (
            change(1, "insert", 1, {"id": 1, "owner": "a", "balance": 2**63}),
            None,
            "does not fit",
        ),
        (
            change(1, "insert", 1, {"id": 1, "owner": "a", "balance": 1}, "loans"),
            None,
            "bank.loans does not exist",
        ),
        (
            change(1, "insert", 1, {"id": 1, "owner": "a", "balance": 1}),
            {"accounts": ACCOUNTS.model_copy(update={"partition_by": ["owner"]})},
            "is partitioned",
        ),
        (
            change(1, "insert", 1, {"id": 1, "owner": "a", "balance": 1}),
            {"accounts": ACCOUNTS.model_copy(update={"key_columns": ["owner"]})},
            "merged by key",
        ),
    ],
)
def test_what_does_not_fit_is_named(
    entry: Entry, tables: dict[str, TableDescriptor | None] | None, says: str
) -> None:
    with pytest.raises(ChangeMisfit, match=says):
        plan(entry, tables=tables)


def test_one_lake_table_takes_one_source_table() -> None:
    accounts = change(1, "insert", 1, {"id": 1, "owner": "a", "balance": 1})
    other = change(2, "insert", 1, {"id": 1, "owner": "a", "balance": 1}, "old_accounts")
    with pytest.raises(ChangeMisfit, match="public.accounts and public.old_accounts would both go"):
        plan_batch(
            parse_endpoint("table://bank.accounts"), (accounts, other), {"accounts": ACCOUNTS}
        )


def test_rows_from_before_a_column_was_added_read_null_for_it() -> None:
    planned = plan_batch(
        parse_endpoint("table://bank"),
        (
            change(1, "insert", 1, {"id": 1, "owner": "a", "balance": 1}),
            change(2, "insert", 2, {"id": 2, "owner": "b", "balance": 2, "note": "hi"}),
        ),
        {"accounts": ACCOUNTS},
        {"accounts": [Column(name="note", type="string")]},
    )
    part = planned["accounts"]
    assert part.columns == ["id", "owner", "balance", "note"]
    assert [column.name for column in part.added_columns] == ["note"]
    assert part.changes.values["note"] == [None, "hi"]


@pytest.mark.parametrize(
    ("base", "full", "expected"),
    [
        ("integer", "integer", "int"),
        ("bigint", "bigint", "bigint"),
        ("character varying", "character varying(20)", "string"),
        ("numeric", "numeric(10,2)", "decimal(10,2)"),
        ("numeric", "numeric", None),
        ("timestamp with time zone", "timestamp with time zone", "timestamp"),
        ("jsonb", "jsonb", None),
        ("integer[]", "integer[]", None),
    ],
)
def test_a_source_column_type_maps_to_a_lake_type_or_to_none(
    base: str, full: str, expected: str | None
) -> None:
    column = SourceColumn(name="c", base_type=base, type=full, not_null=False, has_default=False)
    assert lake_type(column) == expected


def test_an_event_that_is_no_change_is_refused() -> None:
    plain = replace(change(1, "insert", 1, None), type="OrderPaid", payload={"a": 1})
    with pytest.raises(ChangeMisfit, match="event 1 is not a captured change"):
        plan(plain)


@pytest.mark.parametrize(
    "payload",
    [
        {"op": "insert"},
        {"op": "insert", "schema": "public", "table": "accounts", "row": {"id": 1}},
        {"op": "upsert", "schema": "public", "table": "accounts", "key": {"id": 1}},
        {"op": "insert", "schema": "public", "table": 7, "key": {"id": 1}},
        {"op": "delete", "schema": "public", "table": "accounts", "key": [1]},
    ],
)
def test_a_change_missing_its_fields_is_refused_with_the_reason(payload: dict[str, Any]) -> None:
    """A row any application may write to the queue: refused (the pipeline stops with why), not
    a KeyError that would retry the batch for ever."""
    forged = replace(change(1, "insert", 1, None), payload=payload)
    for endpoint in ("table://bank", "table://bank.accounts"):
        with pytest.raises(ChangeMisfit, match="event 1 is not a captured change .*key object"):
            plan_batch(parse_endpoint(endpoint), (forged,), {"accounts": ACCOUNTS})


def test_an_insert_without_its_row_is_refused_with_the_reason() -> None:
    """An insert or update lacking its "row" field altogether (not a null row): refused, not a
    KeyError that would retry the batch for ever."""
    for op in ("insert", "update"):
        payload = {"op": op, "schema": "public", "table": "accounts", "key": {"id": 1}}
        forged = replace(change(1, op, 1, None), payload=payload)
        with pytest.raises(ChangeMisfit, match="change 1 of public.accounts has no row"):
            plan(forged)


@given(st.integers(min_value=-(2**70), max_value=2**70))
def test_integers_fit_exactly_their_range(value: int) -> None:
    assert value_fits("int", value) == (-(2**31) <= value < 2**31)
    assert value_fits("bigint", value) == (-(2**63) <= value < 2**63)
    assert value_fits("double", value)


def test_types_and_nulls() -> None:
    assert value_fits("bigint", None) and not value_fits("bigint", True)
    assert value_fits("boolean", False) and not value_fits("boolean", 0)
    assert value_fits("timestamp", "2026-11-24T05:30:00.5+01:00")
    assert not value_fits("timestamp", "yesterday")
    assert value_fits("decimal(10,2)", 12.5) and not value_fits("decimal(10,2)", "12.5")
    assert value_fits("string", "x") and not value_fits("string", 1)


@given(
    st.sampled_from(["int", "bigint", "string", "date", "double", "boolean"]),
    st.one_of(
        # Mostly one kind, as a column holds: its bounds and its nulls are what is checked.
        st.lists(st.one_of(st.none(), st.integers(-(2**70), 2**70)), max_size=8),
        st.lists(st.one_of(st.none(), st.text(max_size=3)), max_size=8),
        st.lists(
            st.one_of(
                st.none(),
                st.booleans(),
                st.integers(-(2**70), 2**70),
                st.floats(allow_nan=False),
                st.text(max_size=3),
            ),
            max_size=8,
        ),
    ),
)
def test_a_column_is_checked_at_once_as_value_by_value(column_type: str, values: list[Any]) -> None:
    # The plan checks a whole column from its values' types and bounds: the same answer.
    assert _all_fit(column_type, _fits_as(column_type), values) == all(
        value_fits(column_type, value) for value in values
    )


PAIRS = TableDescriptor(
    namespace="bank",
    name="pairs",
    columns=parse_columns("region:string,id:bigint,balance:bigint"),
)
# One change: its key (region, id), whether it deletes, and the balance it writes.
CHANGES = st.lists(
    st.tuples(
        st.sampled_from(["eu", "us"]),
        st.integers(0, 4),
        st.booleans(),
        st.integers(-(2**63), 2**63 - 1),
    ),
    max_size=40,
)


@given(CHANGES, st.booleans())
def test_the_reduction_keeps_each_keys_last_change_of_the_batch(
    changes: list[tuple[str, int, bool, int]], two_column_key: bool
) -> None:
    """Against the plain reading of a batch: the changes in commit order, each key's last one
    wins; a key whose last change deletes it has no row, and every key changed goes."""
    keys = ["region", "id"] if two_column_key else ["id"]
    columns = ChangeColumns.empty(["region", "id", "balance"])
    expected: dict[tuple[Any, ...], dict[str, Any] | None] = {}
    for region, number, deleted, balance in changes:
        row = {"region": region, "id": number, "balance": None if deleted else balance}
        if deleted and not two_column_key:
            row["region"] = None  # a delete carries its key alone
        for name, value in row.items():
            columns.values[name].append(value)
        columns.deleted.append(deleted)
        expected[tuple(row[key] for key in keys)] = None if deleted else row
    rows, changed = reduce_changes(PAIRS, keys, columns)
    order = lambda row: tuple(str(row[name]) for name in ("region", "id"))  # noqa: E731
    assert sorted(rows.to_pylist(), key=order) == sorted(
        (row for row in expected.values() if row is not None), key=order
    )
    assert sorted(tuple(key.values()) for key in changed.to_pylist()) == sorted(expected)


def test_the_first_change_that_does_not_fit_is_the_one_named() -> None:
    """Values are checked by column once the batch is read: the misfit named is still the
    first in batch order, whatever its column, and before a later change's missing column."""
    fine = {"id": 1, "owner": "a", "balance": 1}
    batch = (
        change(1, "insert", 1, fine),
        change(2, "insert", 2, fine | {"balance": "lots"}),
        change(3, "insert", 3, fine | {"owner": 7}),
        change(4, "insert", 4, {"id": 4}),
    )
    with pytest.raises(ChangeMisfit, match="change 2 of public.accounts: balance = 'lots'"):
        plan(*batch)
    with pytest.raises(ChangeMisfit, match="change 3 of public.accounts: owner = 7"):
        plan(batch[0], batch[2], batch[1])
    with pytest.raises(ChangeMisfit, match="change 4 .* missing column.s. owner, balance"):
        plan(batch[0], batch[3], batch[1])
