"""A batch's changes of one lake table as Arrow, in the worker: each key's changes reduced in
commit order to its newest row image, then the rows to add (keys not deleted) and every key the
batch changed (the commit deletes their live rows by position). The rows go into one Parquet
file under the table's data folder, named with the apply attempt's token.

No Spark job: a batch is at most a topic's batch of changes, in the worker's memory already, and
a Spark job's fixed cost per batch (about 0.4 s here, more than writing the rows) was what held
the pipeline at a tenth of its floor and its latency above a second (docs/concepts/pipeline.md).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date, datetime
from decimal import ROUND_HALF_UP, Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

from procbus.errors import needs_extra
from procbus.lakehouse import TableDescriptor
from procbus.lakehouse.data import DataFile
from procbus.lakehouse.reader import arrow_type
from procbus.lakehouse.warehouse import DATA_FOLDER

if TYPE_CHECKING:
    import pyarrow


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


@dataclass
class ChangeColumns:
    """One lake table's changes of a batch, in batch order (per key, commit order), held as
    columns: each table column's values (the row after; nulls but the key for a delete), and
    whether each change is a delete. Columns, not a dict per change: a batch of 10,000 changes
    is then reduced by Arrow, not row by row in Python."""

    values: dict[str, list[Any]]
    deleted: list[bool] = field(default_factory=list)

    @classmethod
    def empty(cls, columns: list[str]) -> ChangeColumns:
        return cls({name: [] for name in columns})

    def __len__(self) -> int:
        return len(self.deleted)


def reduce_changes(
    table: TableDescriptor, keys: list[str], changes: ChangeColumns
) -> tuple[pyarrow.Table, pyarrow.Table]:
    """The rows to add (each changed key's newest image, none for a key it last deleted), in
    the table's columns and types, and every key the batch changed."""
    # pyarrow loads only where table files are written: importing this module stays cheap.
    with needs_extra("lake"):
        import pyarrow

    count = len(changes)
    key_values = [changes.values[key] for key in keys]
    # Each key's last change (the changes are in commit order): a later index replaces an
    # earlier one in place, so the keys keep the order they were first changed in.
    key_of = key_values[0] if len(keys) == 1 else list(zip(*key_values, strict=True))
    newest = dict(zip(key_of, range(count), strict=True))
    chosen = list(newest.values())
    live = pyarrow.array([at for at in chosen if not changes.deleted[at]], pyarrow.int64())
    schema = pyarrow.schema([(c.name, arrow_type(c.type)) for c in table.columns])
    every = {
        column.name: pyarrow.array(
            _as_arrow(column.type, changes.values[column.name]), schema.field(column.name).type
        )
        for column in table.columns
    }
    rows = pyarrow.table({name: every[name].take(live) for name in schema.names}, schema=schema)
    picked = pyarrow.array(chosen, pyarrow.int64())
    changed = pyarrow.table(
        {key: every[key].take(picked) for key in keys},
        schema=pyarrow.schema([schema.field(key) for key in keys]),
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
    with needs_extra("lake"):
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
