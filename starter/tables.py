"""`procbus namespace|table ...`: start the table procedures, read the catalog.

Starting needs only Temporal: the input is checked here by the same `check()` the procedure
runs (a bad name never starts anything); whether the namespace or table exists is the
procedure's preflight to say, as it says to a `temporal` CLI user.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from procbus.starter.output import console, print_json
from procbus.starter.procedures import (
    AS_OPTION,
    DEADLINE_OPTION,
    ID_OPTION,
    JSON_OPTION,
    WAIT_OPTION,
    run_command,
    start,
)

if TYPE_CHECKING:
    from procbus.lakehouse import (
        Catalog,
        CompactTableInput,
        CreateNamespaceInput,
        CreateTableInput,
        DeleteNamespaceInput,
        DeleteTableInput,
        LoadTableInput,
    )

    CheckedInput = (
        CreateNamespaceInput
        | DeleteNamespaceInput
        | CreateTableInput
        | DeleteTableInput
        | LoadTableInput
        | CompactTableInput
    )

namespace_app = typer.Typer(help="Namespaces of the lake catalog.", no_args_is_help=True)
table_app = typer.Typer(help="Tables of the lake catalog.", no_args_is_help=True)


@contextlib.asynccontextmanager
async def catalog() -> AsyncIterator[Catalog]:
    """The catalog on the configured (or running) stack's database; no Temporal needed."""
    from procbus.config import load_settings
    from procbus.db import create_pool
    from procbus.lakehouse import Catalog
    from procbus.stack import resolve_database_url

    pool = await create_pool(resolve_database_url(load_settings()), min_size=1, max_size=2)
    try:
        yield Catalog(pool)
    finally:
        await pool.close()


def start_checked(
    procedure_type: str,
    target: str,
    request: CheckedInput,
    procedure_id: str | None,
    wait: bool,
    json_output: bool,
    principal: str | None = None,
) -> None:
    """Refuse bad input here, with the check the procedure runs first; then start it."""
    request.check()
    run_command(start(procedure_type, target, request, procedure_id, wait, json_output, principal))


# ---- namespaces ----


@namespace_app.command("create")
def namespace_create(
    name: str,
    principal: str | None = AS_OPTION,
    wait: bool = WAIT_OPTION,
    json_output: bool = JSON_OPTION,
    procedure_id: str | None = ID_OPTION,
    deadline: float | None = DEADLINE_OPTION,
) -> None:
    """Start a CreateNamespace procedure; its creator gets admin on the namespace."""
    from procbus.lakehouse import CreateNamespaceInput

    request = CreateNamespaceInput(namespace=name, deadline_seconds=deadline)
    start_checked("CreateNamespace", name, request, procedure_id, wait, json_output, principal)


@namespace_app.command("delete")
def namespace_delete(
    name: str,
    principal: str | None = AS_OPTION,
    wait: bool = WAIT_OPTION,
    json_output: bool = JSON_OPTION,
    procedure_id: str | None = ID_OPTION,
    deadline: float | None = DEADLINE_OPTION,
) -> None:
    """Start a DeleteNamespace procedure: refused while the namespace holds tables, or unless
    the principal is an admin of the namespace."""
    from procbus.lakehouse import DeleteNamespaceInput

    request = DeleteNamespaceInput(namespace=name, deadline_seconds=deadline)
    start_checked("DeleteNamespace", name, request, procedure_id, wait, json_output, principal)


@namespace_app.command("list")
def namespace_list(json_output: bool = JSON_OPTION) -> None:
    """Every namespace in the catalog."""

    async def run() -> int:
        from rich.table import Table

        async with catalog() as tables:
            found = await tables.list_namespaces()
        if json_output:
            print_json([namespace.model_dump(mode="json") for namespace in found])
            return 0
        grid = Table("namespace", "created by", "created at")
        for namespace in found:
            created_at = namespace.created_at.isoformat() if namespace.created_at else ""
            grid.add_row(namespace.name, namespace.created_by, created_at)
        console.print(grid)
        return 0

    run_command(run())


# ---- tables ----


@table_app.command("create")
def table_create(
    name: str = typer.Argument(..., help="NAMESPACE.TABLE"),
    schema: str = typer.Option(
        ..., "--schema", help="NAME:TYPE pairs, e.g. 'id:bigint,ts:timestamp'"
    ),
    partition_by: list[str] = typer.Option(
        [], "--partition-by", help="A partition column (repeatable)."
    ),
    principal: str | None = AS_OPTION,
    wait: bool = WAIT_OPTION,
    json_output: bool = JSON_OPTION,
    procedure_id: str | None = ID_OPTION,
    deadline: float | None = DEADLINE_OPTION,
) -> None:
    """Start a CreateTable procedure: layout, catalog, cache, event; undone if any step fails."""
    from procbus.lakehouse import CreateTableInput

    request = CreateTableInput(
        table=name, columns=schema, partition_by=partition_by, deadline_seconds=deadline
    )
    start_checked("CreateTable", name, request, procedure_id, wait, json_output, principal)


@table_app.command("delete")
def table_delete(
    name: str = typer.Argument(..., help="NAMESPACE.TABLE"),
    principal: str | None = AS_OPTION,
    wait: bool = WAIT_OPTION,
    json_output: bool = JSON_OPTION,
    procedure_id: str | None = ID_OPTION,
    deadline: float | None = DEADLINE_OPTION,
) -> None:
    """Start a DeleteTable procedure: the catalog removal is the point of no return."""
    from procbus.lakehouse import DeleteTableInput

    request = DeleteTableInput(table=name, deadline_seconds=deadline)
    start_checked("DeleteTable", name, request, procedure_id, wait, json_output, principal)


@table_app.command("describe")
def table_describe(
    name: str = typer.Argument(..., help="NAMESPACE.TABLE"), json_output: bool = JSON_OPTION
) -> None:
    """A table's schema, partitioning, location and the procedure that created it."""

    async def run() -> int:
        from rich.table import Table
        from rich.text import Text

        from procbus.core import parse_table_name
        from procbus.errors import ProcbusError

        namespace, table_name = parse_table_name(name)
        async with catalog() as tables:
            table = await tables.get_table(namespace, table_name)
        if table is None:
            raise ProcbusError(f"table {name!r} does not exist")
        if json_output:
            print_json(table)
            return 0
        console.print(
            Text.assemble((table.qualified_name, "bold"), f"  at {table.location}"), highlight=False
        )
        grid = Table("column", "type", "partition")
        for column in table.columns:
            grid.add_row(
                column.name, column.type, "yes" if column.name in table.partition_by else ""
            )
        console.print(grid)
        console.print(f"created by {table.created_by} at {table.created_at}", highlight=False)
        return 0

    run_command(run())


@table_app.command("list")
def table_list(
    namespace: str | None = typer.Option(None, "--namespace", help="Only this namespace."),
    json_output: bool = JSON_OPTION,
) -> None:
    """Every table in the catalog."""

    async def run() -> int:
        from rich.table import Table

        async with catalog() as tables:
            found = await tables.list_tables(namespace)
        if json_output:
            print_json([table.model_dump(mode="json") for table in found])
            return 0
        grid = Table("table", "columns", "partitioned by", "created by")
        for table in found:
            grid.add_row(
                table.qualified_name,
                ", ".join(f"{c.name}:{c.type}" for c in table.columns),
                ", ".join(table.partition_by),
                table.created_by,
            )
        console.print(grid)
        return 0

    run_command(run())


# ---- table data ----


@table_app.command("load")
def table_load(
    name: str = typer.Argument(..., help="NAMESPACE.TABLE"),
    source: str = typer.Option(
        ...,
        "--from",
        help="A file or folder under the workers' load roots (PROCBUS_LOAD_ROOTS; by default "
        "WAREHOUSE/incoming).",
    ),
    input_format: str = typer.Option("csv", "--format", help="csv (with a header), json, parquet"),
    principal: str | None = AS_OPTION,
    wait: bool = WAIT_OPTION,
    json_output: bool = JSON_OPTION,
    procedure_id: str | None = ID_OPTION,
    deadline: float | None = DEADLINE_OPTION,
) -> None:
    """Start a LoadTable procedure: Spark checks and writes the input; one commit shows it all."""
    from procbus.errors import InvalidRequest
    from procbus.lakehouse import InputFormat, LoadTableInput

    if input_format not in {kind.value for kind in InputFormat}:
        raise InvalidRequest(
            f"unknown format {input_format!r}; known: {', '.join(k.value for k in InputFormat)}"
        )
    request = LoadTableInput(
        table=name,
        source=str(Path(source).resolve()),
        format=InputFormat(input_format),
        deadline_seconds=deadline,
    )
    start_checked("LoadTable", name, request, procedure_id, wait, json_output, principal)


@table_app.command("compact")
def table_compact(
    name: str = typer.Argument(..., help="NAMESPACE.TABLE"),
    partitions: list[str] = typer.Option(
        [], "--partition", help="Only this partition, e.g. 'region=eu' (repeatable)."
    ),
    target_file_size: int | None = typer.Option(
        None, "--target-file-size", help="Bytes per rewritten file, about (default 128 MiB)."
    ),
    principal: str | None = AS_OPTION,
    wait: bool = WAIT_OPTION,
    json_output: bool = JSON_OPTION,
    procedure_id: str | None = ID_OPTION,
    deadline: float | None = DEADLINE_OPTION,
) -> None:
    """Start a CompactTable procedure: small files rewritten near the target size, rows kept."""
    from procbus.lakehouse import CompactTableInput

    sized = {} if target_file_size is None else {"target_file_size": target_file_size}
    request = CompactTableInput.model_validate(
        {"table": name, "partitions": partitions, "deadline_seconds": deadline, **sized}
    )
    start_checked("CompactTable", name, request, procedure_id, wait, json_output, principal)


@table_app.command("read")
def table_read(
    name: str = typer.Argument(..., help="NAMESPACE.TABLE"),
    limit: int | None = typer.Option(
        20,
        "--limit",
        help="At most this many rows (0: all); --json says the snapshot's row_count and whether "
        "rows were left out (truncated).",
    ),
    snapshot_id: int | None = typer.Option(
        None, "--snapshot", help="This snapshot, not the current."
    ),
    json_output: bool = JSON_OPTION,
) -> None:
    """Read one snapshot of a table whole, through the catalog (no Spark needed)."""

    async def run() -> int:
        from rich.table import Table

        from procbus.core import parse_table_name
        from procbus.lakehouse import read_snapshot_rows

        namespace, table_name = parse_table_name(name)
        async with catalog() as tables:
            snapshot = await tables.table_files(namespace, table_name, snapshot_id)
        read = await asyncio.to_thread(read_snapshot_rows, snapshot, limit or None)
        if json_output:
            # The count and `truncated` say whether `rows` is the snapshot whole or its first page.
            print_json(
                {
                    "table": name,
                    "snapshot_id": snapshot.snapshot_id,
                    "row_count": read.row_count,
                    "truncated": read.truncated,
                    "rows": read.rows,
                }
            )
            return 0
        grid = Table(*(column.name for column in snapshot.table.columns))
        for row in read.rows:
            grid.add_row(*("" if value is None else str(value) for value in row.values()))
        console.print(grid)
        shown = f"{len(read.rows)} of {read.row_count} rows" if snapshot.files else "no data yet"
        more = " (--limit 0 shows all)" if read.truncated else ""
        console.print(f"snapshot {snapshot.snapshot_id}: {shown}{more}", highlight=False)
        return 0

    run_command(run())


@table_app.command("snapshots")
def table_snapshots(
    name: str = typer.Argument(..., help="NAMESPACE.TABLE"), json_output: bool = JSON_OPTION
) -> None:
    """A table's snapshots, newest first: what each commit added and removed."""

    async def run() -> int:
        from rich.table import Table

        from procbus.core import parse_table_name

        namespace, table_name = parse_table_name(name)
        async with catalog() as tables:
            snapshots = await tables.list_snapshots(namespace, table_name)
        if json_output:
            print_json([snapshot.model_dump(mode="json") for snapshot in snapshots])
            return 0
        grid = Table("snapshot", "operation", "files +/-", "rows +/-", "procedure", "committed")
        for snapshot in snapshots:
            grid.add_row(
                str(snapshot.snapshot_id),
                snapshot.operation,
                f"+{snapshot.files_added} -{snapshot.files_removed}",
                f"+{snapshot.records_added} -{snapshot.records_removed}",
                snapshot.procedure_id,
                f"{snapshot.committed_at:%Y-%m-%d %H:%M:%S}" if snapshot.committed_at else "",
            )
        console.print(grid)
        return 0

    run_command(run())
