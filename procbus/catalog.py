"""The lake catalog in PostgreSQL: namespaces, tables (schema, partitioning), events.

Names and schemas are checked here, before any side effect; every write is idempotent per
procedure (a retried step finds its own row) and undo removes only what its procedure made.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Any

import asyncpg
from pydantic import BaseModel, Field

from procbus.db.queries import load_queries
from procbus.errors import ProcbusError
from procbus.lock_models import Fence
from procbus.locks import check_fence

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


class InvalidRequest(ProcbusError):
    """Bad input (a name, a schema) or a request that contradicts the catalog."""


class Column(BaseModel):
    name: str
    type: str


class TableDescriptor(BaseModel):
    namespace: str
    name: str
    columns: list[Column]
    partition_by: list[str] = Field(default_factory=list)
    properties: dict[str, str] = Field(default_factory=dict)
    location: str = ""
    created_by: str = ""
    created_at: datetime | None = None

    @property
    def qualified_name(self) -> str:
        return f"{self.namespace}.{self.name}"


class NamespaceDescriptor(BaseModel):
    name: str
    properties: dict[str, str] = Field(default_factory=dict)
    created_by: str = ""
    created_at: datetime | None = None


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
    return name


def parse_table_name(qualified: str) -> tuple[str, str]:
    """'sales.orders' -> ('sales', 'orders'), both names checked."""
    parts = qualified.split(".")
    if len(parts) != 2:
        raise InvalidRequest(f"expected NAMESPACE.TABLE, got {qualified!r}")
    return validate_name("namespace", parts[0]), validate_name("table", parts[1])


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


def _table(row: asyncpg.Record) -> TableDescriptor:
    return TableDescriptor(
        namespace=row["namespace"],
        name=row["name"],
        columns=[Column(**column) for column in json.loads(row["columns"])],
        partition_by=list(row["partition_by"]),
        properties=json.loads(row["properties"]),
        location=row["location"],
        created_by=row["created_by"],
        created_at=row["created_at"],
    )


def _namespace(row: asyncpg.Record) -> NamespaceDescriptor:
    return NamespaceDescriptor(
        name=row["name"],
        properties=json.loads(row["properties"]),
        created_by=row["created_by"],
        created_at=row["created_at"],
    )


class Catalog:
    """Catalog reads and writes on a pool."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool
        self.queries = load_queries()

    @contextlib.asynccontextmanager
    async def _writing(self, fence: Fence | None) -> AsyncIterator[asyncpg.Connection]:
        """A connection for one write; with a fence, a transaction that checks it first, so a
        holder whose lock was lost meanwhile can not write."""
        async with self.pool.acquire() as connection:
            if fence is None:
                yield connection
                return
            async with connection.transaction():
                await check_fence(connection, fence)
                yield connection

    async def get_namespace(self, name: str) -> NamespaceDescriptor | None:
        row = await self.pool.fetchrow(self.queries["get_namespace"], name)
        return _namespace(row) if row else None

    async def list_namespaces(self) -> list[NamespaceDescriptor]:
        return [_namespace(row) for row in await self.pool.fetch(self.queries["list_namespaces"])]

    async def create_namespace(
        self, namespace: NamespaceDescriptor, fence: Fence | None = None
    ) -> None:
        async with self._writing(fence) as connection:
            created = await connection.fetchval(
                self.queries["insert_namespace"],
                namespace.name,
                json.dumps(namespace.properties),
                namespace.created_by,
            )
        if created is None:
            raise InvalidRequest(f"namespace {namespace.name!r} exists already")

    async def remove_namespace_created_by(
        self, name: str, procedure_id: str, fence: Fence | None = None
    ) -> None:
        async with self._writing(fence) as connection:
            await connection.execute(
                self.queries["delete_namespace_created_by"], name, procedure_id
            )

    async def delete_empty_namespace(self, name: str, fence: Fence | None = None) -> bool:
        """Delete it unless it holds tables; False when it was gone already."""
        async with self._writing(fence) as connection, connection.transaction():
            if await connection.fetchrow(self.queries["get_namespace"], name) is None:
                return False
            if await connection.fetchval(self.queries["delete_empty_namespace"], name) is None:
                tables = await connection.fetchval(self.queries["count_tables_in_namespace"], name)
                raise InvalidRequest(f"namespace {name!r} holds {tables} tables: delete them first")
        return True

    async def restore_namespace(
        self, namespace: NamespaceDescriptor, fence: Fence | None = None
    ) -> None:
        async with self._writing(fence) as connection:
            await connection.execute(
                self.queries["restore_namespace"],
                namespace.name,
                json.dumps(namespace.properties),
                namespace.created_by,
                namespace.created_at,
            )

    async def count_tables(self, namespace: str) -> int:
        count: int = await self.pool.fetchval(self.queries["count_tables_in_namespace"], namespace)
        return count

    async def get_table(self, namespace: str, name: str) -> TableDescriptor | None:
        row = await self.pool.fetchrow(self.queries["get_table"], namespace, name)
        return _table(row) if row else None

    async def list_tables(self, namespace: str | None = None) -> list[TableDescriptor]:
        return [
            _table(row) for row in await self.pool.fetch(self.queries["list_tables"], namespace)
        ]

    async def add_table(self, table: TableDescriptor, fence: Fence | None = None) -> None:
        try:
            async with self._writing(fence) as connection:
                added = await connection.fetchval(
                    self.queries["insert_table"],
                    table.namespace,
                    table.name,
                    json.dumps([column.model_dump() for column in table.columns]),
                    table.partition_by,
                    json.dumps(table.properties),
                    table.location,
                    table.created_by,
                )
        except asyncpg.ForeignKeyViolationError:
            raise InvalidRequest(f"namespace {table.namespace!r} does not exist") from None
        if added is None:
            raise InvalidRequest(f"table {table.qualified_name!r} exists already")

    async def remove_table_created_by(
        self, namespace: str, name: str, procedure_id: str, fence: Fence | None = None
    ) -> None:
        async with self._writing(fence) as connection:
            await connection.execute(
                self.queries["delete_table_created_by"], namespace, name, procedure_id
            )

    async def remove_table(self, namespace: str, name: str, fence: Fence | None = None) -> None:
        async with self._writing(fence) as connection:
            await connection.execute(self.queries["delete_table"], namespace, name)

    async def restore_table(self, table: TableDescriptor, fence: Fence | None = None) -> None:
        async with self._writing(fence) as connection:
            await connection.execute(
                self.queries["restore_table"],
                table.namespace,
                table.name,
                json.dumps([column.model_dump() for column in table.columns]),
                table.partition_by,
                json.dumps(table.properties),
                table.location,
                table.created_by,
                table.created_at,
            )

    async def record_event(
        self,
        procedure_id: str,
        event_type: str,
        namespace: str,
        table: str | None,
        payload: dict[str, Any],
        fence: Fence | None = None,
    ) -> None:
        async with self._writing(fence) as connection:
            await connection.execute(
                self.queries["insert_event"],
                procedure_id,
                event_type,
                namespace,
                table,
                json.dumps(payload, default=str),
            )

    async def remove_event(
        self, procedure_id: str, event_type: str, fence: Fence | None = None
    ) -> None:
        async with self._writing(fence) as connection:
            await connection.execute(self.queries["delete_event"], procedure_id, event_type)

    async def list_events(self) -> list[dict[str, Any]]:
        rows = await self.pool.fetch(self.queries["list_events"])
        return [{**dict(row), "payload": json.loads(row["payload"])} for row in rows]
