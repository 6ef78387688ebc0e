"""Schemas of the lake catalog, checked here before any side effect (pure): a schema is NAME:TYPE
pairs of Spark SQL types that Apache Iceberg has (procbus.lakehouse.table_metadata maps them). The
names themselves are procbus.core.names.
"""

from __future__ import annotations

import re

from pydantic import BaseModel

from procbus.core import validate_name
from procbus.errors import InvalidRequest

_DECIMAL = re.compile(r"^decimal\((?P<precision>\d{1,2}),(?P<scale>\d{1,2})\)$")
COLUMN_TYPES = (
    "boolean",
    "int",
    "bigint",
    "float",
    "double",
    "string",
    "binary",
    "date",
    "timestamp",
    "decimal(p,s)",
)


class Column(BaseModel):
    """A table column: its name and Iceberg type."""

    name: str
    type: str


def normalize_type(text: str) -> str:
    column_type = text.strip().lower().replace(" ", "")
    column_type = {"integer": "int", "long": "bigint", "text": "string", "bool": "boolean"}.get(
        column_type, column_type
    )
    if column_type in COLUMN_TYPES:
        return column_type
    decimal = _DECIMAL.fullmatch(column_type)
    if decimal:
        precision, scale = int(decimal["precision"]), int(decimal["scale"])
        if 0 < precision <= 38 and scale <= precision:
            return column_type
    if column_type in ("tinyint", "smallint", "byte", "short"):
        raise InvalidRequest(
            f"column type {text.strip()!r}: Apache Iceberg tables have no {column_type}; use int"
        )
    raise InvalidRequest(f"unknown column type {text.strip()!r}; known: {', '.join(COLUMN_TYPES)}")


def parse_columns(spec: str) -> list[Column]:
    """Parse 'id:bigint,amount:double' into columns.

    Raises:
        InvalidRequest: when the spec is empty, an entry is no NAME:TYPE pair, a name is bad
            or repeated, or a type unknown.
    """
    if not spec.strip():
        raise InvalidRequest("the schema is empty: give NAME:TYPE pairs, e.g. 'id:bigint'")
    columns: list[Column] = []
    # decimal(p,s) holds a comma: split on commas that start a new NAME:TYPE pair.
    for entry in re.split(r",(?=\s*[^,()]+:)", spec):
        name, separator, column_type = entry.partition(":")
        if not separator:
            raise InvalidRequest(f"expected NAME:TYPE in the schema, got {entry.strip()!r}")
        column = Column(
            name=validate_name("column", name.strip()), type=normalize_type(column_type)
        )
        if any(existing.name == column.name for existing in columns):
            raise InvalidRequest(f"column {column.name!r} appears twice in the schema")
        columns.append(column)
    return columns


def validate_partitioning(columns: list[Column], partition_by: list[str]) -> list[str]:
    """Return `partition_by` once checked against the table's columns.

    Args:
        columns: the table's columns.
        partition_by: the names of the partition columns, in order.

    Raises:
        InvalidRequest: when a partition column is unknown, named twice, or leaves no data column.
    """
    names = {column.name for column in columns}
    for column in partition_by:
        if column not in names:
            raise InvalidRequest(f"partition column {column!r} is not in the schema")
    if len(set(partition_by)) != len(partition_by):
        raise InvalidRequest("a partition column appears twice")
    if len(partition_by) >= len(columns):
        raise InvalidRequest("a table needs at least one column that is not a partition column")
    return partition_by
