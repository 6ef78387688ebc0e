"""A batch's changes of one lake table as Arrow, in the worker: each key's changes reduced in
commit order to its newest row image, then the rows to add (keys not deleted) and every key the
batch changed (the commit deletes their live rows by position). The rows go into one Parquet
file under the table's data folder, named with the apply attempt's token.

No Spark job: a batch is at most a topic's batch of changes, in the worker's memory already, and
a Spark job's fixed cost per batch (about 0.4 s here, more than writing the rows) was what held
the pipeline at a tenth of its floor and its latency above a second (docs/concepts/pipeline.md).
"""

from __future__ import annotations

from datetime import date, datetime
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

from procbus.lakehouse.data import DELETED_COLUMN, DataFile
from procbus.lakehouse.models import TableDescriptor
from procbus.lakehouse.reader import arrow_type
from procbus.lakehouse.warehouse import DATA_FOLDER

if TYPE_CHECKING:
    import pyarrow

# A change's place in its batch (commit order), beside DELETED_COLUMN in a planned change.
SEQUENCE_COLUMN = "_procbus_seq"


def arrow_value(column_type: str, value: Any) -> Any:
    """A change's JSON value (checked to fit by the plan) as Arrow takes it for the column."""
    if value is None:
        return None
    if column_type == "timestamp":
        return datetime.fromisoformat(value)  # normalized to UTC by the plan
    if column_type == "date":
        return date.fromisoformat(value)
    if column_type == "binary":
        # PostgreSQL's to_jsonb writes bytea as '\x' and hex digits.
        return bytes.fromhex(value[2:]) if value.startswith("\\x") else value.encode()
    if column_type.startswith("decimal("):
        scale = int(column_type.removesuffix(")").rsplit(",", 1)[1])
        return Decimal(str(value)).quantize(Decimal(1).scaleb(-scale), rounding=ROUND_HALF_UP)
    if column_type in ("float", "double"):
        return float(value)
    return value


def reduce_changes(
    table: TableDescriptor, keys: list[str], changes: list[dict[str, Any]]
) -> tuple[pyarrow.Table, pyarrow.Table]:
    """The rows to add (each changed key's newest image, none for a key it last deleted), in
    the table's columns and types, and every key the batch changed."""
    # pyarrow loads only where table files are written: importing this module stays cheap.
    import pyarrow

    newest: dict[tuple[Any, ...], dict[str, Any]] = {}
    for change in sorted(changes, key=lambda c: c[SEQUENCE_COLUMN]):  # commit order
        newest[tuple(change[key] for key in keys)] = change
    types = {column.name: column.type for column in table.columns}
    schema = pyarrow.schema([(c.name, arrow_type(c.type)) for c in table.columns])
    live = [change for change in newest.values() if not change[DELETED_COLUMN]]
    rows = pyarrow.table(
        {
            name: pyarrow.array(
                _as_arrow(types[name], [change.get(name) for change in live]),
                schema.field(name).type,
            )
            for name in schema.names
        },
        schema=schema,
    )
    key_schema = pyarrow.schema([schema.field(key) for key in keys])
    changed = pyarrow.table(
        {
            key: pyarrow.array(
                _as_arrow(types[key], [values[place] for values in newest]),
                key_schema.field(key).type,
            )
            for place, key in enumerate(keys)
        },
        schema=key_schema,
    )
    return rows, changed


# Column types whose checked JSON values Arrow takes as they are: a batch converts no value of
# these one by one. (Not float or double: Arrow refuses a JSON integer beyond 2^53 for them.)
_TAKEN_AS_THEY_ARE = frozenset({"int", "bigint", "string", "boolean"})


def _as_arrow(column_type: str, values: list[Any]) -> list[Any]:
    if column_type in _TAKEN_AS_THEY_ARE:
        return values
    return [arrow_value(column_type, value) for value in values]


def write_rows(rows: pyarrow.Table, folder: Path, token: str) -> list[DataFile]:
    """The rows as one Parquet file under the table's data folder (none for no rows)."""
    import pyarrow.parquet as parquet

    if rows.num_rows == 0:
        return []
    relative = Path(DATA_FOLDER, f"{token}-rows.parquet")
    (folder / DATA_FOLDER).mkdir(parents=True, exist_ok=True)
    parquet.write_table(rows, folder / relative)
    return [
        DataFile(
            path=relative.as_posix(),
            records=rows.num_rows,
            bytes=(folder / relative).stat().st_size,
        )
    ]
