"""Applying a table:// topic's batches of captured changes to lake tables.

The topic's delivery (procbus.delivery) hands each transaction-grouped batch to TableApplier,
its endpoint client: the changes are checked against their lake tables, a Spark job reduces each
key's changes in commit order and writes one change file per lake table (merge-on-read), and
one PostgreSQL transaction commits a snapshot of every lake table the batch touched, together
with the batch's ID and the source position reached. A lake reader never sees part of a source
transaction, in one table or across tables.

Exactly once: the batch ID is recorded in that transaction, so a retried apply of the same
batch (its commit's answer was lost) finds it and commits nothing; its files are removed, never
those a snapshot lists. The commit also locks the delivery attempt's claim on the batch: a new
owner's take-over bumps the topic's owner epoch and ends the claim first, so a zombie attempt
(of an older epoch) neither commits nor claims again, and the new owner may sweep what killed
attempts left (their staging, files no snapshot lists).

A column added at the source since its capture began is added to the lake table's columns in
the batch's commit (procbus.pipeline.schema). A change that does not fit its lake table (a
column missing or unknown, a value of the wrong type, a table that does not exist, a change of
schema the lake table cannot follow), or a lake table the pipeline may not write, is refused:
nothing of the batch is applied, and the topic stops with the reason, the batch kept first in
its queue and nothing dead-lettered, so nothing behind it is applied first. An operator fixes the
cause and runs `procbus topic enable` (the batch is applied, then the rest), or gives the batch
up with `procbus pipeline skip` (it goes to the dead letters with the operator's reason).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from itertools import repeat
from pathlib import Path
from typing import TYPE_CHECKING, Any

import asyncpg

from procbus.capture import Captures, pipeline_principal
from procbus.core import Endpoint, collector_paused
from procbus.db import load_queries
from procbus.delivery import EndpointClient, Message, Outcome, Sent
from procbus.errors import AttemptFencedOut, InvalidRequest, ProcbusError, SnapshotConflict
from procbus.lakehouse import Catalog, Column, TableDescriptor
from procbus.lakehouse.data import DataFile
from procbus.lakehouse.warehouse import DATA_FOLDER, inside
from procbus.pipeline.models import PipelineStatus
from procbus.pipeline.rows import ChangeColumns, reduce_changes, write_rows
from procbus.pipeline.schema import ChangeMisfit, added_columns, explain_type_misfit
from procbus.spark import staging
from procbus.topics import Entry

if TYPE_CHECKING:
    import pyarrow

QUERIES = "procbus.pipeline"
CHANGE_TYPE = "change"  # the event type of a captured change (procbus.capture)
# A batch's fence row outlives its settlement this long (then no attempt can still send it).
FORGET_BATCHES_AFTER_SECONDS = 24 * 3600.0
_INTEGER_BITS = {"int": 32, "bigint": 64}
# How often Pipelines.until_applied reads a pipeline's progress.
POLL_SECONDS = 0.02


class PipelineNotAllowed(InvalidRequest):
    """The pipeline's principal may not write a lake table its batch changes: it stops."""


class TypeMisfit(ChangeMisfit):
    """A value that does not fit its lake column's type (a change of type at the source?)."""

    def __init__(self, message: str, table: str, source: str, column: str) -> None:
        super().__init__(message)
        self.table, self.source, self.column = table, source, column


def value_fits(column_type: str, value: Any) -> bool:
    """Whether a JSON value (as PostgreSQL's to_jsonb wrote it) fits a lake column's type."""
    if value is None:
        return True
    if column_type in _INTEGER_BITS:
        bound = 2 ** (_INTEGER_BITS[column_type] - 1)
        return isinstance(value, int) and not isinstance(value, bool) and -bound <= value < bound
    if column_type in ("float", "double") or column_type.startswith("decimal"):
        return isinstance(value, int | float) and not isinstance(value, bool)
    if column_type == "boolean":
        return isinstance(value, bool)
    if column_type == "timestamp":
        return isinstance(value, str) and _timestamp(value) is not None
    return isinstance(value, str)  # string, date, binary


def _fits_as(column_type: str) -> Callable[[Any], bool]:
    """value_fits for one column type, as one cheap call (a batch checks every value it holds)."""
    if column_type in _INTEGER_BITS:
        low, high = -(2 ** (_INTEGER_BITS[column_type] - 1)), 2 ** (_INTEGER_BITS[column_type] - 1)
        # `type(...) is int`: JSON's integers are ints exactly, and a bool is no integer here.
        return lambda value: value is None or (type(value) is int and low <= value < high)
    if column_type in ("string", "date", "binary"):
        return lambda value: value is None or type(value) is str
    return lambda value: value_fits(column_type, value)


_NONE = type(None)


def _all_fit(column_type: str, fits: Callable[[Any], bool], values: list[Any]) -> bool:
    """Whether every value of a column fits its type: for integer and string columns, from the
    set of the values' types and their bounds, without a Python call per value."""
    kinds = set(map(type, values))
    if column_type in _INTEGER_BITS and kinds <= {int, _NONE}:
        present = [value for value in values if value is not None] if _NONE in kinds else values
        bound = 2 ** (_INTEGER_BITS[column_type] - 1)
        return not present or (-bound <= min(present) and max(present) < bound)
    if column_type in ("string", "date", "binary"):
        return kinds <= {str, _NONE}
    return all(map(fits, values))


def _timestamp(text: str) -> str | None:
    """A timestamp as Spark reads it here (UTC, microseconds); None if it is not one. A value
    without an offset (a PostgreSQL `timestamp`) is taken as UTC."""
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f+00:00")


@dataclass
class TableChanges:
    """One lake table's part of a batch: its changes in batch order, which per key is commit
    order (ChangeColumns: the table's columns, the row after, nulls but the key for a delete;
    whether each is a delete), values checked and normalized (timestamps in UTC)."""

    table: TableDescriptor
    keys: list[str]
    source: str  # the captured table, SCHEMA.TABLE
    changes: ChangeColumns
    # Added at the source since the capture began: the commit adds them to the lake table.
    added_columns: list[Column] = field(default_factory=list)

    @property
    def columns(self) -> list[str]:
        return [column.name for column in self.table.columns]

    def checks(self) -> list[tuple[str, str, Callable[[Any], bool]]]:
        """Each column's name, type and value check, in order."""
        return [(column.name, column.type, _fits_as(column.type)) for column in self.table.columns]


def plan_batch(
    endpoint: Endpoint,
    entries: tuple[Entry, ...],
    tables: dict[str, TableDescriptor | None],
    added: dict[str, list[Column]] | None = None,
) -> dict[str, TableChanges]:
    """The batch's changes per lake table (`tables`: each name looked up, None when missing),
    each checked against its table with the columns `added` to it (rows from before a column
    was added at the source lack it: NULL); ChangeMisfit naming the first change that does not
    fit."""
    planned: dict[str, TableChanges] = {}
    shapes: dict[str, _Shape] = {}  # each table's columns and their checks
    rows_of: dict[str, list[Any]] = {}  # each table's rows (a delete's key), values checked after
    # Each source table's lake table, found and checked at its first change.
    routes: dict[tuple[Any, Any], tuple[TableChanges, _Shape, list[Any]]] = {}
    at = 0  # the place of the change being read: the misfit's, if one is raised
    try:
        for at, entry in enumerate(entries):  # noqa: B007
            change = entry.payload
            # A route is made only for a change that passes _is_change: a change that finds one
            # has a string schema and table, and only its op and key are left to check.
            route = (
                routes.get((change.get("schema"), change.get("table")))
                if type(change) is dict
                else None
            )
            key = change.get("key") if route is not None else None
            if (
                route is None
                or entry.type != CHANGE_TYPE
                or change.get("op") not in _OPS
                or type(key) is not dict
            ):
                if entry.type != CHANGE_TYPE or not _is_change(change):
                    raise _not_a_change(entry)
                key = change["key"]
                route = routes.get((change["schema"], change["table"]))
                if route is None:
                    route = _route(endpoint, change, tables, added, planned, shapes, rows_of)
                    routes[(change["schema"], change["table"])] = route
            part, shape, rows = route
            if list(key) != part.keys:
                raise ChangeMisfit(f"change {entry.id} is keyed by {list(key)}, not {part.keys}")
            if change["op"] == "delete":
                rows.append(key)
                part.changes.deleted.append(True)
                continue
            row = change.get("row")
            if type(row) is not dict or row.keys() != shape.names:
                _check_row_columns(part, shape, entry.id, change["op"], row)
            rows.append(row)
            part.changes.deleted.append(False)
    except ChangeMisfit:
        # A value of an earlier change that does not fit is the first misfit: named first.
        _raise_first_value_misfit(_taken(endpoint, entries[:at]), planned, shapes)
        raise
    for name, part in planned.items():
        rows = rows_of[name]
        for column, column_type, fits in shapes[name].checks:
            values = list(map(dict.get, rows, repeat(column)))
            if not _all_fit(column_type, fits, values):
                _raise_first_value_misfit(_taken(endpoint, entries), planned, shapes)
            if column_type == "timestamp":
                values = [_timestamp(value) if value else value for value in values]
            part.changes.values[column] = values
    return planned


def _not_a_change(entry: Entry) -> ChangeMisfit:
    return ChangeMisfit(
        f"event {entry.id} is not a captured change (type {entry.type!r}; a change has an op of "
        "insert, update or delete, a schema, a table and a key object)"
    )


def _route(
    endpoint: Endpoint,
    change: dict[str, Any],
    tables: dict[str, TableDescriptor | None],
    added: dict[str, list[Column]] | None,
    planned: dict[str, TableChanges],
    shapes: dict[str, _Shape],
    rows_of: dict[str, list[Any]],
) -> tuple[TableChanges, _Shape, list[Any]]:
    """Where a source table's changes go: its lake table's part of the batch (made, and the
    table checked, at the first change to it), its shape and its rows; ChangeMisfit when the
    lake table is missing or takes another source table's changes."""
    name = lake_table_name(endpoint, change)
    table = tables.get(name)
    if table is None:
        raise ChangeMisfit(
            f"lake table {endpoint.namespace}.{name} does not exist: create it with the "
            f"columns of {change['schema']}.{change['table']}"
        )
    source = f"{change['schema']}.{change['table']}"
    part = planned.get(name)
    if part is not None:
        raise ChangeMisfit(
            f"changes of {part.source} and {source} would both go to lake table "
            f"{table.qualified_name}: a table:// endpoint naming one table takes one "
            "source table"
        )
    new_columns = (added or {}).get(name, [])
    table = table.model_copy(update={"columns": [*table.columns, *new_columns]})
    keys = list(change["key"])
    part = planned[name] = TableChanges(
        table=table,
        keys=keys,
        source=source,
        changes=ChangeColumns.empty([column.name for column in table.columns]),
        added_columns=new_columns,
    )
    _check_table(table, keys, change)
    shape = shapes[name] = _Shape(
        part.columns, {column.name for column in new_columns}, part.checks()
    )
    rows = rows_of[name] = []
    return part, shape, rows


def _taken(endpoint: Endpoint, entries: tuple[Entry, ...]) -> list[_Taken]:
    """The changes as the plan took them, in batch order (all read and checked already but
    their values): for naming the first value that does not fit."""
    taken = []
    for entry in entries:
        change = entry.payload
        row = change["key"] if change["op"] == "delete" else change["row"]
        taken.append(_Taken(lake_table_name(endpoint, change), entry.id, row))
    return taken


_OPS = frozenset({"insert", "update", "delete"})


def _is_change(payload: Any) -> bool:
    """Whether an event's payload has a captured change's fields (procbus.capture writes them;
    any application may write a row to the queue)."""
    return (
        isinstance(payload, dict)
        and payload.get("op") in _OPS
        and isinstance(payload.get("schema"), str)
        and isinstance(payload.get("table"), str)
        and isinstance(payload.get("key"), dict)
    )


@dataclass
class _Shape:
    """What a lake table's changes must look like: its columns in order, those that rows from
    before their addition at the source may lack (`optional`), and each column's check."""

    wanted: list[str]
    optional: set[str]
    checks: list[tuple[str, str, Callable[[Any], bool]]]
    names: set[str] = field(init=False)

    def __post_init__(self) -> None:
        self.names = set(self.wanted)


def first_source(endpoint: Endpoint, entries: tuple[Entry, ...], name: str) -> str | None:
    """The captured table (SCHEMA.TABLE) of the batch's first change to lake table `name`."""
    for entry in entries:
        change = entry.payload
        if (
            isinstance(change, dict)
            and "table" in change
            and "schema" in change
            and lake_table_name(endpoint, change) == name
        ):
            return f"{change['schema']}.{change['table']}"
    return None


def lake_table_name(endpoint: Endpoint, change: dict[str, Any]) -> str:
    if endpoint.table is not None:
        return endpoint.table
    return str(change["table"])


def _check_table(table: TableDescriptor, keys: list[str], change: dict[str, Any]) -> None:
    source = f"{change['schema']}.{change['table']}"
    if table.partition_by:
        raise ChangeMisfit(
            f"lake table {table.qualified_name} is partitioned: changes apply to unpartitioned "
            "tables only"
        )
    columns = {column.name for column in table.columns}
    missing_keys = [key for key in keys if key not in columns]
    if missing_keys:
        raise ChangeMisfit(
            f"the key of {source} ({', '.join(keys)}) is not in lake table "
            f"{table.qualified_name}'s columns"
        )
    if table.key_columns and table.key_columns != keys:
        raise ChangeMisfit(
            f"lake table {table.qualified_name} is merged by key {table.key_columns}, and the "
            f"changes of {source} are keyed by {keys}"
        )


@dataclass(slots=True)
class _Taken:
    """A change as the plan took it: its lake table, its entry, its row (its key, for a delete)."""

    table: str
    entry_id: int
    row: dict[str, Any]


def _check_row_columns(part: TableChanges, shape: _Shape, entry_id: int, op: str, row: Any) -> None:
    """ChangeMisfit unless the change's row has the table's columns (its values are checked by
    column, once the batch is read)."""
    if not isinstance(row, dict):
        raise ChangeMisfit(f"change {entry_id} of {part.source} has no row")
    if op != "delete" and row.keys() != shape.names:
        missing = [name for name in shape.wanted if name not in row and name not in shape.optional]
        unknown = [name for name in row if name not in shape.names]
        if missing or unknown:
            said = [f"missing column(s) {', '.join(missing)}"] if missing else []
            said += [f"unknown column(s) {', '.join(unknown)}"] if unknown else []
            raise ChangeMisfit(
                f"change {entry_id} of {part.source} does not fit lake table "
                f"{part.table.qualified_name}: {'; '.join(said)}"
            )


def _raise_first_value_misfit(
    taken: list[_Taken], planned: dict[str, TableChanges], shapes: dict[str, _Shape]
) -> None:
    """TypeMisfit for the first value, in batch order, that does not fit its column (none: the
    caller goes on)."""
    for each in taken:
        part = planned[each.table]
        for name, column_type, fits in shapes[each.table].checks:
            value = each.row.get(name)
            if not fits(value):
                raise TypeMisfit(
                    f"change {each.entry_id} of {part.source}: {name} = {value!r} does not fit "
                    f"lake table {part.table.qualified_name}'s column type {column_type}",
                    part.table.name,
                    part.source,
                    name,
                )


class Pipelines:
    """The pipelines' state in the catalog: their fence, position and status."""

    def __init__(self, pool: asyncpg.Pool) -> None:
        self.pool = pool
        self.catalog = Catalog(pool)
        self.captures = Captures(pool)
        self.queries = load_queries(QUERIES)

    async def applied(self, topic: str, batch_id: str) -> bool:
        return bool(await self.pool.fetchval(self.queries["batch_applied"], topic, batch_id))

    async def record_error(self, topic: str, error: str) -> None:
        await self.pool.execute(self.queries["record_error"], topic, error)

    async def commit(
        self,
        topic: str,
        batch_id: str,
        entries: tuple[Entry, ...],
        written: list[Written],
        claim_id: str | None = None,
    ) -> dict[str, int] | None:
        """One transaction: the batch's fence, the columns added at the source to each lake
        table, a snapshot of each lake table adding its change files, the position reached.
        The snapshots committed; None when the batch was applied already (nothing committed).
        With `claim_id` (a delivery attempt's), AttemptFencedOut when another attempt took the
        batch over: its files may be swept already."""
        queries = self.queries
        async with self.pool.acquire() as connection, connection.transaction():
            if claim_id is not None and not await connection.fetchval(
                queries["batch_still_claimed"], topic, claim_id
            ):
                raise AttemptFencedOut(
                    f"topic {topic!r}: batch {batch_id} was taken over by another delivery "
                    "attempt; this one commits nothing"
                )
            await connection.execute(queries["ensure_pipeline"], topic)
            fenced = await connection.fetchval(
                queries["record_batch"], topic, batch_id, len(entries), {}
            )
            if fenced is None:
                return None
            # No lock fences a batch, its claim does: noted for audit triggers, as a fence is.
            await connection.execute(
                queries["note_batch"],
                json.dumps({"topic": topic, "batch": batch_id, "claim": claim_id}),
            )
            snapshots: dict[str, int] = {}
            principal = pipeline_principal(topic)
            # In name order: two pipelines' commits lock shared tables in the same order.
            for each in sorted(written, key=lambda w: w.part.table.qualified_name):
                part, table = each.part, each.part.table
                # Checked where it commits: a revoke that landed meanwhile stops the pipeline.
                if not await connection.fetchval(
                    queries["pipeline_may_write"], principal, table.namespace, table.name
                ):
                    raise PipelineNotAllowed(
                        f"the pipeline's principal {principal!r} may not write "
                        f"{table.qualified_name}: nothing applied; grant it (`procbus acl grant "
                        f"{principal} {table.qualified_name} write`)"
                    )
                if not await self.catalog.set_key_columns(
                    connection, table.namespace, table.name, part.keys
                ):
                    raise ChangeMisfit(
                        f"lake table {table.qualified_name} is merged by another key than "
                        f"{part.keys}"
                    )
                before = table.columns[: len(table.columns) - len(part.added_columns)]
                if part.added_columns and not await self.catalog.add_columns(
                    connection, table.namespace, table.name, before, table.columns
                ):
                    # Retryable: the batch is planned again on the columns there are now.
                    raise SnapshotConflict(
                        f"the columns of lake table {table.qualified_name} changed while "
                        "this batch was applied; nothing committed, it is applied again"
                    )
                snapshots[table.qualified_name] = await self.catalog.apply_rows(
                    connection,
                    table,
                    batch_id,
                    f"pipeline:{topic}",
                    each.files,
                    each.keys,
                    part.added_columns,
                    each.file_prefix,
                )
            await connection.execute(queries["record_snapshots"], topic, batch_id, snapshots)
            await connection.execute(
                queries["forget_settled_batches"], topic, FORGET_BATCHES_AFTER_SECONDS
            )
            await connection.execute(
                queries["advance"],
                topic,
                max(entry.id for entry in entries),
                len(entries),
                sum(1 for entry in entries if entry.txn_last),
                max(entry.created_at for entry in entries),
            )
        return snapshots

    async def changes_applied(self, topic: str) -> int:
        """How many changes the pipeline has applied, for a caller waiting for changes to land:
        one row read (status also counts the queue, a pass over every change waiting).
        InvalidRequest when there is no such topic, or it stopped (with why)."""
        row = await self.pool.fetchrow(self.queries["pipeline_progress"], topic)
        if row is None:
            raise InvalidRequest(f"no topic named {topic!r}")
        if not row["enabled"]:
            raise InvalidRequest(f"pipeline {topic!r} stopped: {row['disabled_reason']}")
        return int(row["changes_applied"])

    async def until_applied(
        self, topic: str, changes: int, *, timeout_seconds: float = 1800.0
    ) -> None:
        """Return once the pipeline has applied `changes` changes in all (changes_applied, polled
        every POLL_SECONDS); TimeoutError after `timeout_seconds`, InvalidRequest if it stops."""
        async with asyncio.timeout(timeout_seconds):
            # Polled: the commit is another process's, no event of this one says it came.
            while await self.changes_applied(topic) < changes:  # noqa: ASYNC110
                await asyncio.sleep(POLL_SECONDS)

    async def status(self, topic: str) -> PipelineStatus:
        row = await self.pool.fetchrow(self.queries["pipeline_status"], topic)
        if row is None:
            raise InvalidRequest(f"no topic named {topic!r}")
        if not row["endpoint"].startswith("table://"):
            raise InvalidRequest(
                f"topic {topic!r} is no pipeline: its endpoint is not table://NAMESPACE"
            )
        found = dict(row)
        oldest, now = found.pop("oldest_waiting"), found.pop("now")
        enabled, why = found.pop("enabled"), found.pop("disabled_reason")
        first_batch = found.pop("first_batch")
        return PipelineStatus(
            **found,
            state="running" if enabled else f"stopped: {why}",
            lag_seconds=0.0 if oldest is None else (now - oldest).total_seconds(),
            stopped_at_batch=None if enabled else first_batch,
        )


class TableApplier(EndpointClient):
    """The endpoint client of a table:// topic: applies each batch it is sent."""

    batch = True
    takes_entries = True

    def __init__(
        self,
        topic: str,
        endpoint: Endpoint,
        pipelines: Pipelines,
    ) -> None:
        self.topic = topic
        self.endpoint = endpoint
        self.pipelines = pipelines
        # This topic's apply attempts name their files so; one client per delivery run.
        self.token_prefix = f"apply-{hashlib.sha256(topic.encode()).hexdigest()[:12]}-"
        self.swept: set[str] = set()

    async def sweep_leftovers(self, table: TableDescriptor) -> int:
        """Remove what earlier apply attempts of this topic left in the table's folder (a
        worker killed mid-apply): files under data/ the current snapshot does not list. Run by
        the topic's one owner after its take-over, which fences every earlier attempt's claims
        and commits out (its owner epoch, `batch_still_claimed`), so none of them can still
        list what goes here."""
        folder = Path(table.location)
        data = folder / DATA_FOLDER
        moved = sorted(data.rglob(f"{self.token_prefix}*")) if data.exists() else []
        paths = [path.relative_to(folder).as_posix() for path in moved]
        listed = await self.pipelines.catalog.live_among(table.namespace, table.name, paths)
        removed = 0
        for path in paths:
            if path not in listed:
                inside(folder, path, DATA_FOLDER).unlink(missing_ok=True)
                removed += 1
        return removed

    async def send(self, message: Message) -> Sent:
        batch_id = message.batch_id
        if batch_id is None or not message.entries:
            why = "a table:// endpoint takes grouped batches only"
            await self.pipelines.record_error(self.topic, why)
            return Sent(Outcome.REJECTED, error=why)
        try:
            if await self.pipelines.applied(self.topic, batch_id):
                return Sent(Outcome.ACK)  # a resend after a commit whose answer was lost
            await self.apply(batch_id, message.entries, message.claim_id)
        except (ChangeMisfit, PipelineNotAllowed) as refused:  # retrying cannot help: it stops
            await self.pipelines.record_error(self.topic, str(refused))
            return Sent(Outcome.REJECTED, error=str(refused))
        except Exception as error:  # any other failure: the batch is retried
            said = str(error) if isinstance(error, ProcbusError) else repr(error)
            await self.pipelines.record_error(self.topic, said)
            return Sent(Outcome.FAILED, error=said)
        return Sent(Outcome.ACK)

    async def apply(
        self, batch_id: str, entries: tuple[Entry, ...], claim_id: str | None = None
    ) -> None:
        namespace = self.endpoint.namespace or ""
        names = {
            lake_table_name(self.endpoint, entry.payload)
            for entry in entries
            if isinstance(entry.payload, dict) and "table" in entry.payload
        }
        # The columns procbus records, its source's: a column another engine added to a lake
        # table is left null in the rows a batch writes, not taken for one dropped at the source.
        catalog = self.pipelines.catalog
        tables = {name: await catalog.get_recorded_table(namespace, name) for name in names}
        added: dict[str, list[Column]] = {}
        for name, table in tables.items():
            source = first_source(self.endpoint, entries, name)
            if table is not None and source is not None:
                added[name] = await added_columns(
                    self.pipelines.captures, self.topic, table, source, entries
                )
        try:
            with collector_paused():
                planned = plan_batch(self.endpoint, entries, tables, added)
        except TypeMisfit as misfit:
            table, source = tables.get(misfit.table), misfit.source
            if table is None:
                raise
            raise await explain_type_misfit(
                self.pipelines.captures, table, source, misfit.column, misfit
            ) from None
        parts = list(planned.values())
        for part in parts:
            if part.table.qualified_name not in self.swept:
                self.swept.add(part.table.qualified_name)
                await self.sweep_leftovers(part.table)
        token = f"{self.token_prefix}{uuid.uuid4().hex}"
        written: list[Written] = []
        try:
            for part in parts:
                folder = Path(part.table.location)
                rows, keys = await asyncio.to_thread(
                    reduce_changes, part.table, part.keys, part.changes
                )
                files = await asyncio.to_thread(write_rows, rows, folder, token)
                written.append(Written(part, files, keys, f"{token}-"))
            committed = await self.pipelines.commit(
                self.topic, batch_id, entries, written, claim_id
            )
            if committed is None:  # applied already by an overlapping attempt
                for part in parts:
                    await asyncio.to_thread(
                        staging.discard_attempt, Path(part.table.location), token
                    )
        except BaseException:
            # The commit may have happened with its answer lost: then its files stay (an
            # overlapping attempt's commit leaves them unlisted, for the next sweep).
            if not written or not await self.pipelines.applied(self.topic, batch_id):
                for part in parts:
                    await asyncio.to_thread(
                        staging.discard_attempt, Path(part.table.location), token
                    )
            raise


@dataclass
class Written:
    """One lake table's part of a batch, ready to commit: the rows to add (under data/), the
    keys whose live rows go, and the prefix of the files the commit writes (its delete file)."""

    part: TableChanges
    files: list[DataFile]
    keys: pyarrow.Table
    file_prefix: str
