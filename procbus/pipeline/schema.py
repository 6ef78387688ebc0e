"""Changes of schema at a captured source table, as the change pipeline meets them in a batch.

A column added at the source (`ALTER TABLE ... ADD COLUMN`) shows up as a new field of the row
images: it is added to the lake table's columns, at the end, in the catalog commit of the first
batch that carries it (procbus.pipeline.apply). Lake rows from before it read NULL for it until
their next change; PostgreSQL fills a column added with a default into old rows without any row
trigger firing, so those values never reach the lake.

What the lake table cannot follow is refused with the reason, and the pipeline stops (nothing of
the batch applied, the batch kept first in the queue): a column dropped (or renamed) at the
source, a type that changed so that the values no longer fit, a new column NOT NULL without a
default (the lake rows from before it have no value), or of a type the lake has no column type
for.

A column the source had already when its capture began, but that the lake table was made
without, is no change of schema: a misfit, refused as before (procbus.pipeline.apply).
"""

from __future__ import annotations

import re
from typing import Any

from procbus.capture import Captures, SourceColumn
from procbus.core import validate_name
from procbus.errors import InvalidRequest
from procbus.lakehouse import Column, TableDescriptor
from procbus.topics import Entry

# PostgreSQL types (format_type without modifiers) and the lake column type their to_jsonb
# values are read into; numeric is decimal(p,s) when it has a precision of at most 38.
LAKE_TYPES = {
    "smallint": "int",  # Iceberg has no smallint
    "integer": "int",
    "bigint": "bigint",
    "real": "float",
    "double precision": "double",
    "boolean": "boolean",
    "text": "string",
    "character varying": "string",
    "character": "string",
    "uuid": "string",
    "date": "date",
    "timestamp without time zone": "timestamp",
    "timestamp with time zone": "timestamp",
}
_NUMERIC = re.compile(r"^numeric\((?P<precision>\d+),(?P<scale>\d+)\)$")


class ChangeMisfit(InvalidRequest):
    """A change that its lake table can never take as it is."""


def lake_type(column: SourceColumn) -> str | None:
    """The lake column type for a source column's values; None when there is none."""
    if column.base_type == "numeric":
        found = _NUMERIC.fullmatch(column.type)
        if found and int(found["precision"]) <= 38:
            return f"decimal({found['precision']},{found['scale']})"
        return None
    return LAKE_TYPES.get(column.base_type)


def how_to_resume(table: TableDescriptor) -> str:
    """The fix (the stopped topic's reason adds how to resume, or to give the batch up)."""
    return f"make lake table {table.qualified_name} anew with the source's columns"


def _rows_unlike(
    entries: tuple[Entry, ...], source: str, columns: set[str]
) -> list[tuple[int, dict[str, Any]]]:
    """The (entry ID, row after) of the batch's inserts and updates of `source` whose columns
    are not exactly `columns`, in order."""
    images = []
    for entry in entries:
        change = entry.payload
        if not isinstance(change, dict) or change.get("op") in (None, "delete"):
            continue
        row = change.get("row")
        if (
            isinstance(row, dict)
            and row.keys() != columns
            and f"{change.get('schema')}.{change.get('table')}" == source
        ):
            images.append((entry.id, row))
    return images


async def added_columns(
    captures: Captures,
    topic: str,
    table: TableDescriptor,
    source: str,
    entries: tuple[Entry, ...],
) -> list[Column]:
    """The columns of `source` that the batch's row images carry and lake table `table` lacks,
    added at the source since its capture began, to add to the lake table (in order); none when
    the rows fit. ChangeMisfit with the reason when the batch shows a change of schema that the
    lake table cannot follow; a column the lake table was made without is left for the batch's
    planning to refuse as a misfit."""
    have = [column.name for column in table.columns]
    unknown: dict[str, int] = {}  # name -> the first change that carries it
    missing: dict[str, int] = {}
    for entry_id, row in _rows_unlike(entries, source, set(have)):
        for name in row:
            if name not in have:
                unknown.setdefault(name, entry_id)
        for name in have:
            if name not in row:
                missing.setdefault(name, entry_id)
    if not unknown and not missing:
        return []
    schema, _, name = source.partition(".")
    now = await captures.source_columns(schema, name)
    dropped = [column for column in missing if column not in now]
    if dropped:
        raise ChangeMisfit(
            f"change {missing[dropped[0]]} of {source}: column(s) {', '.join(dropped)} were "
            f"dropped at the source (or renamed); lake table {table.qualified_name} keeps its "
            f"columns, so this cannot be applied: {how_to_resume(table)}"
        )
    captured = await captures.captured_columns(topic, schema, name)
    added: list[Column] = []
    for column, entry_id in unknown.items():
        if captured is not None and column in captured:
            continue  # the lake table was made without it: a misfit, not a change of schema
        said = f"change {entry_id} of {source}: column {column} was added at the source, but "
        found = now.get(column)
        if found is None:
            raise ChangeMisfit(
                f"{said}is gone from it again, so its type is unknown: {how_to_resume(table)}"
            )
        if found.not_null and not found.has_default:
            raise ChangeMisfit(
                f"{said}{column} is NOT NULL without a default: lake table "
                f"{table.qualified_name}'s rows from before it have no value for it: "
                f"{how_to_resume(table)}"
            )
        column_type = lake_type(found)
        if column_type is None:
            raise ChangeMisfit(
                f"{said}its type {found.type} has no lake column type (known: "
                f"{', '.join(sorted(LAKE_TYPES))}, numeric(p,s)): {how_to_resume(table)}"
            )
        try:
            validate_name("column", column)
        except InvalidRequest as bad:
            raise ChangeMisfit(f"{said}{bad}: {how_to_resume(table)}") from None
        added.append(Column(name=column, type=column_type))
    return added


async def explain_type_misfit(
    captures: Captures,
    table: TableDescriptor,
    source: str,
    column: str,
    misfit: ChangeMisfit,
) -> ChangeMisfit:
    """A value that does not fit its lake column: when the source column's type changed, the
    misfit says so."""
    schema, _, name = source.partition(".")
    found = (await captures.source_columns(schema, name)).get(column)
    lake_column = next((c for c in table.columns if c.name == column), None)
    if found is None or lake_column is None or lake_type(found) == lake_column.type:
        return misfit
    return ChangeMisfit(
        f"{misfit}: {column} is now {found.type} at the source; the lake column is "
        f"{lake_column.type}, and a change of type cannot be applied: "
        f"{how_to_resume(table)}"
    )
