"""Capturing an application's table into a topic.

    captures = Captures(pool)
    await captures.create("public.accounts", topic="bank")     # key: the primary key
    await captures.create("savings", topic="bank", key=["id"])

Why triggers and not logical decoding: a trigger publishes into the topic's queue inside the
application's transaction, so the change is queued if and only if that transaction commits, the
queue's bounds and per-key order apply as to any publish, and it works on any PostgreSQL (no
wal_level=logical, no replication slot that pins WAL while a consumer is away, no superuser).
The price is a queue row written in the application's transaction, which is what the outbox
already costs.

Each change is one event on the topic: its key is the table and the row's key; its payload
{"op", "schema", "table", "key", "row"} (the row after; null for a delete); its transaction the
database's own (`pg_<xid>`), whose last event is marked with the transaction's event count at
commit, so the topic's grouped batches never split it. Per key, the queue position (the
entry's ID) is commit order: the row lock and the topic's key lock serialise a key's writers.
"""

from __future__ import annotations

import hashlib
from datetime import datetime

import asyncpg
from pydantic import BaseModel, Field

from procbus.core import EndpointKind, parse_endpoint
from procbus.db import load_queries
from procbus.errors import InvalidRequest, QueueFull
from procbus.topics.models import check_topic_name
from procbus.topics.refusals import topic_error

QUERIES = "procbus.capture"
TABLE_KINDS = {"r": "table", "p": "partitioned table"}


class SourceColumn(BaseModel):
    """A captured table's column as PostgreSQL has it now."""

    name: str
    base_type: str  # format_type without modifiers: 'numeric', 'character varying'
    type: str  # with them: 'numeric(10,2)'
    not_null: bool
    has_default: bool


def pipeline_principal(topic: str) -> str:
    """Return whom a change pipeline applies as.

    It is granted `write` on its lake table when the capture is made; revoke it and the
    pipeline stops.
    """
    return f"pipeline:{topic}"


class Capture(BaseModel):
    """A table captured into a topic, and the trigger that publishes its changes."""

    source_schema: str
    source_table: str
    topic: str
    key_columns: list[str]
    trigger_name: str
    snapshot_rows: int = 0
    created_at: datetime | None = None
    granted_write: str | None = Field(
        default=None,
        description="the lake table its pipeline's principal was granted write on, if any",
    )

    @property
    def source(self) -> str:
        return f"{self.source_schema}.{self.source_table}"


def trigger_name(topic: str) -> str:
    """The capture trigger's name on its table: one per topic, within PostgreSQL's 63 bytes."""
    return f"procbus_capture_{hashlib.sha256(topic.encode()).hexdigest()[:24]}"


class Captures:
    """Create, list and delete captures of this database's tables into topics."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool
        self.queries = load_queries(QUERIES)

    async def create(self, source: str, topic: str, *, key: list[str] | None = None) -> Capture:
        """Capture `source` (a table in this database; unqualified names go through the
        search_path) into `topic`, a queued topic that groups transactions. Rows already in the
        table are published first, as inserts, in the same transaction (QueueFull, with nothing
        done, if they do not fit). InvalidRequest saying what is wrong, with nothing done."""
        check_topic_name(topic)
        queries = self.queries
        async with self.pool.acquire() as connection, connection.transaction():
            found = await connection.fetchrow(queries["source_table"], source)
            if found is None or found["kind"] not in TABLE_KINDS:
                raise InvalidRequest(f"no table {source!r} in this database")
            columns = [
                row["name"]
                for row in await connection.fetch(queries["table_columns"], found["oid"])
            ]
            key_columns = key or [
                row["name"] for row in await connection.fetch(queries["primary_key"], found["oid"])
            ]
            qualified = f"{found['schema']}.{found['name']}"
            if not key_columns:
                raise InvalidRequest(
                    f"table {qualified} has no primary key: name the key column(s) with --key"
                )
            unknown = [name for name in key_columns if name not in columns]
            if unknown:
                raise InvalidRequest(
                    f"table {qualified} has no column {', '.join(map(repr, unknown))} "
                    f"(its columns: {', '.join(columns)})"
                )
            settings = await connection.fetchrow(queries["topic_for_capture"], topic)
            if settings is None:
                raise InvalidRequest(f"no topic named {topic!r}")
            if settings["sync"] or not settings["group_transactions"]:
                raise InvalidRequest(
                    f"topic {topic!r} must queue and group transactions to carry captured "
                    "changes (create it with --group-transactions, without --sync), so a "
                    "receiver never gets part of a transaction"
                )
            name = trigger_name(topic)
            created = await connection.fetchval(
                queries["insert_capture"],
                found["schema"],
                found["name"],
                topic,
                key_columns,
                name,
                columns,
            )
            if created is None:
                raise InvalidRequest(f"table {qualified} is captured into {topic!r} already")
            granted_write = await self._grant_pipeline_write(
                connection, topic, settings["endpoint"], found["name"]
            )
            try:
                rows = await connection.fetchval(
                    queries["attach"], found["oid"], topic, key_columns, name
                )
            except asyncpg.PostgresError as error:
                raised = topic_error(error)
                if isinstance(raised, QueueFull):
                    raise QueueFull(
                        f"{raised}: the {qualified} rows already there do not fit the topic's "
                        "bounds; nothing was captured"
                    ) from None
                raise raised from None
            await connection.execute(
                queries["record_snapshot"], found["schema"], found["name"], topic, rows
            )
        return Capture(
            source_schema=found["schema"],
            source_table=found["name"],
            topic=topic,
            key_columns=key_columns,
            trigger_name=name,
            snapshot_rows=rows,
            created_at=created,
            granted_write=granted_write,
        )

    async def _grant_pipeline_write(
        self, connection: asyncpg.Connection, topic: str, endpoint: str, source_table: str
    ) -> str | None:
        """In the capture's transaction: a table:// topic's principal may write the lake table
        the source's changes go to (NS.TABLE), when the catalog has it."""
        if not endpoint.startswith(f"{EndpointKind.TABLE.value}://"):
            return None
        target = parse_endpoint(endpoint)
        if target.namespace is None:
            return None
        table = target.table or source_table
        granted = await connection.fetchval(
            self.queries["grant_pipeline_write"],
            pipeline_principal(topic),
            target.namespace,
            table,
            f"capture of {source_table} into {topic}",
        )
        return f"{target.namespace}.{table}" if granted else None

    async def source_columns(self, schema: str, table: str) -> dict[str, SourceColumn]:
        """The table's columns as they are now, by name (empty when the table is gone)."""
        rows = await self.pool.fetch(self.queries["column_definitions"], schema, table)
        return {row["name"]: SourceColumn(**dict(row)) for row in rows}

    async def captured_columns(self, topic: str, schema: str, table: str) -> list[str] | None:
        """The table's columns when its capture into `topic` began; None when not known."""
        found = await self.pool.fetchval(self.queries["captured_columns"], topic, schema, table)
        return None if found is None else list(found)

    async def list_captures(self, topic: str | None = None) -> list[Capture]:
        rows = await self.pool.fetch(self.queries["list_captures"], topic)
        return [Capture(**dict(row)) for row in rows]

    async def delete(self, source: str, topic: str) -> Capture:
        """Stop capturing `source` into `topic` (what is queued stays queued). The name is
        resolved as `create` resolves it; a table dropped since is matched by its name."""
        found = await self.pool.fetchrow(self.queries["source_table"], source)
        if found is not None:
            schema, table = found["schema"], found["name"]
        else:
            schema, _, table = source.rpartition(".")
            schema = schema or "public"
        matches = [
            capture
            for capture in await self.list_captures(topic)
            if (capture.source_schema, capture.source_table) == (schema, table)
        ]
        if not matches:
            raise InvalidRequest(f"table {source!r} is not captured into {topic!r}")
        capture = matches[0]
        async with self.pool.acquire() as connection, connection.transaction():
            await connection.execute(
                self.queries["detach"],
                capture.source_schema,
                capture.source_table,
                capture.trigger_name,
            )
            await connection.fetchval(
                self.queries["delete_capture"],
                capture.source_schema,
                capture.source_table,
                capture.topic,
            )
        return capture
