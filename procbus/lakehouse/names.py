"""Names and schemas of the lake catalog: checked here, before any side effect (pure).

Namespace, table and column names are lower-case identifiers that fit PostgreSQL and Spark SQL
alike; a schema is NAME:TYPE pairs of Spark SQL types.
"""

from __future__ import annotations

import re

from pydantic import BaseModel

from procbus.errors import InvalidRequest

MAX_NAME_LENGTH = 63  # PostgreSQL's identifier limit, so names fit anywhere they are used
_NAME = re.compile(r"^[a-z_][a-z0-9_]*$")
_DECIMAL = re.compile(r"^decimal\((?P<precision>\d{1,2}),(?P<scale>\d{1,2})\)$")
COLUMN_TYPES = (
    "boolean",
    "tinyint",
    "smallint",
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
# SQL and Spark SQL keywords that make confusing or unusable table and column names.
RESERVED_WORDS = frozenset(
    """all alter and any as asc between by case cast check column constraint create cross
    current_date current_time current_timestamp current_user default delete desc distinct drop
    else end except exists false fetch for foreign from full grant group having in inner insert
    intersect into is join lateral left like limit natural not null of offset on only or order
    outer partition primary references right select session_user some table then to true union
    unique update user using values when where window with""".split()  # noqa: SIM905
)


class Column(BaseModel):
    name: str
    type: str


# The warehouse's folder a worker loads inputs from by default (WAREHOUSE/incoming): a
# namespace of that name would put its tables among them.
LOAD_FOLDER = "incoming"
# A grant's table that stands for every table of its namespace, now and later ('sales.*'): no
# table can be named so.
ALL_TABLES = "*"


def validate_name(kind: str, name: str) -> str:
    """A namespace, table or column name: lower-case letters, digits, '_'; not a keyword."""
    if not name:
        raise InvalidRequest(f"the {kind} name is empty")
    if len(name) > MAX_NAME_LENGTH:
        raise InvalidRequest(
            f"the {kind} name {name[:20]!r}... is {len(name)} characters; at most "
            f"{MAX_NAME_LENGTH} are allowed"
        )
    if not _NAME.match(name):
        raise InvalidRequest(
            f"the {kind} name {name!r} may hold only lower-case letters, digits and '_', "
            "and must not start with a digit"
        )
    if name in RESERVED_WORDS:
        raise InvalidRequest(f"the {kind} name {name!r} is a reserved SQL word")
    if kind == "namespace" and name == LOAD_FOLDER:
        raise InvalidRequest(
            f"the namespace name {name!r} is the warehouse's folder for load inputs; choose another"
        )
    return name


def parse_table_name(qualified: str) -> tuple[str, str]:
    """'sales.orders' -> ('sales', 'orders'), both names checked."""
    parts = qualified.split(".")
    if len(parts) != 2:
        raise InvalidRequest(f"expected NAMESPACE.TABLE, got {qualified!r}")
    return validate_name("namespace", parts[0]), validate_name("table", parts[1])


def parse_grant_target(target: str) -> tuple[str, str]:
    """What a grant is on: 'sales.orders' -> ('sales', 'orders'), one table; 'sales.*' ->
    ('sales', ALL_TABLES), the namespace: every table in it, now and later. A bare name is
    refused, so a forgotten dot never grants on a whole namespace."""
    parts = target.split(".")
    if len(parts) != 2 or ALL_TABLES in parts[0]:
        raise InvalidRequest(
            f"expected NAMESPACE.TABLE, or NAMESPACE.{ALL_TABLES} for every table in the "
            f"namespace, got {target!r}"
        )
    namespace = validate_name("namespace", parts[0])
    if parts[1] == ALL_TABLES:
        return namespace, ALL_TABLES
    return namespace, validate_name("table", parts[1])


def normalize_type(text: str) -> str:
    column_type = text.strip().lower().replace(" ", "")
    column_type = {"integer": "int", "long": "bigint", "text": "string", "bool": "boolean"}.get(
        column_type, column_type
    )
    if column_type in COLUMN_TYPES:
        return column_type
    decimal = _DECIMAL.match(column_type)
    if decimal:
        precision, scale = int(decimal["precision"]), int(decimal["scale"])
        if 0 < precision <= 38 and scale <= precision:
            return column_type
    raise InvalidRequest(f"unknown column type {text.strip()!r}; known: {', '.join(COLUMN_TYPES)}")


def parse_columns(spec: str) -> list[Column]:
    """'id:bigint,amount:double' -> columns; names unique, types known."""
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
    names = {column.name for column in columns}
    for column in partition_by:
        if column not in names:
            raise InvalidRequest(f"partition column {column!r} is not in the schema")
    if len(set(partition_by)) != len(partition_by):
        raise InvalidRequest("a partition column appears twice")
    if len(partition_by) >= len(columns):
        raise InvalidRequest("a table needs at least one column that is not a partition column")
    return partition_by


def namespace_resource(namespace: str) -> str:
    """The lock resource of a namespace."""
    return namespace


def table_resource(namespace: str, table: str) -> str:
    """The lock resource of a table: below its namespace's."""
    return f"{namespace}/{table}"


def grant_resource(namespace: str, table: str) -> str:
    """The lock resource a grant's change takes X on: its table, or its namespace for a grant
    on the namespace as a whole (table ALL_TABLES)."""
    if table == ALL_TABLES:
        return namespace_resource(namespace)
    return table_resource(namespace, table)
