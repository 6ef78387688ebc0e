"""`procbus namespace|table|proc ...`: start table procedures and steer any procedure."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Coroutine
from dataclasses import dataclass
from typing import Any

import typer
from rich.live import Live
from rich.table import Table
from temporalio.client import Client

from procbus.catalog import (
    Catalog,
    parse_columns,
    parse_table_name,
    validate_name,
    validate_partitioning,
)
from procbus.config import load_settings
from procbus.db import create_pool
from procbus.endpoints import Endpoints, resolve_endpoints
from procbus.errors import ProcbusError
from procbus.procedure_client import (
    abort_procedure,
    list_procedures,
    new_procedure_id,
    procedure_status,
    retry_procedure,
    skip_compensation,
    start_procedure,
    wait_for_procedure,
)
from procbus.procedures import ProcedureInput, ProcedureState, ProcedureStatus
from procbus.table_models import (
    CreateNamespaceInput,
    CreateTableInput,
    DeleteNamespaceInput,
    DeleteTableInput,
)
from procbus.temporal import connect_client, workflow_ui_url
from starter.output import console, print_json

JSON_OPTION = typer.Option(False, "--json", help="Print the result as JSON.")
WAIT_OPTION = typer.Option(
    False, "--wait", help="Show the steps live, wait for the end, exit non-zero unless SUCCEEDED."
)
ID_OPTION = typer.Option(
    None, "--id", help="Procedure ID (idempotent: the same ID returns the same procedure)."
)

namespace_app = typer.Typer(help="Namespaces of the lake catalog.", no_args_is_help=True)
table_app = typer.Typer(help="Tables of the lake catalog.", no_args_is_help=True)
proc_app = typer.Typer(
    help="Procedures: list, status, wait, abort, retry, skip.", no_args_is_help=True
)


@dataclass
class Session:
    endpoints: Endpoints
    client: Client
    catalog: Catalog


@contextlib.asynccontextmanager
async def session() -> AsyncIterator[Session]:
    settings = load_settings()
    endpoints = resolve_endpoints(settings)
    client = await connect_client(endpoints.temporal_address, endpoints.namespace, settings)
    pool = await create_pool(endpoints.database_url, min_size=1, max_size=2)
    try:
        yield Session(endpoints, client, Catalog(pool))
    finally:
        await pool.close()


# ---- rendering ----


def _steps_table(status: ProcedureStatus) -> Table:
    colour = {
        ProcedureState.SUCCEEDED: "green",
        ProcedureState.ROLLED_BACK: "yellow",
        ProcedureState.STUCK: "red",
        ProcedureState.FAILED: "red",
        ProcedureState.ROLLING_BACK: "yellow",
        ProcedureState.ROLLING_FORWARD: "magenta",
        ProcedureState.WAITING: "yellow",
    }.get(status.state, "cyan")
    table = Table(
        title=f"{status.procedure_type}: [{colour}]{status.state.value}[/]",
        title_justify="left",
        show_header=True,
    )
    table.add_column("step")
    table.add_column("state")
    undone = set(status.compensations_done)
    skipped = {entry.step: entry.reason for entry in status.compensations_skipped}
    for step in status.steps_done:
        if step in undone:
            table.add_row(step, "[yellow]done, undone[/]")
        elif step in skipped:
            table.add_row(step, f"[red]done, undo skipped[/] ({skipped[step]})")
        elif step == status.pivot_step:
            table.add_row(step, "[green]done[/] (pivot: point of no return)")
        else:
            table.add_row(step, "[green]done[/]")
    if status.step_running:
        table.add_row(status.step_running, "[cyan]running[/]")
    if status.failed_step and status.failed_step not in status.steps_done:
        mark = "undone" if status.failed_step in undone else "failed"
        table.add_row(status.failed_step, f"[red]failed[/], {mark}")
    if status.stuck_step:
        table.add_row(f"undo {status.stuck_step}", f"[red]STUCK[/]: {status.stuck_error}")
    for waiting in status.waiting_for:
        table.add_row("(locks)", f"[yellow]waiting[/]: {waiting}")
    return table


def _print_outcome(status: ProcedureStatus) -> None:
    if status.error:
        console.print(f"error: {status.error}", highlight=False)
    if status.rollback_reason:
        console.print(f"rolled back because {status.rollback_reason}", highlight=False)
    for refusal in status.refused:
        console.print(f"[dim]{refusal}[/]", highlight=False)
    if status.state is ProcedureState.STUCK:
        console.print(
            f"STUCK: fix the cause, then `procbus proc retry {status.procedure_id}` or "
            f"`procbus proc skip {status.procedure_id} --reason '...'`",
            highlight=False,
        )


async def _follow(
    current: Session, procedure_id: str, json_output: bool, timeout_seconds: float | None
) -> int:
    if json_output:
        status = await wait_for_procedure(
            current.client, procedure_id, timeout_seconds=timeout_seconds
        )
        print_json(status)
    else:
        with Live(console=console, auto_refresh=False) as live:

            def show(status: ProcedureStatus) -> None:
                live.update(_steps_table(status), refresh=True)

            status = await wait_for_procedure(
                current.client, procedure_id, timeout_seconds=timeout_seconds, on_change=show
            )
        _print_outcome(status)
    return 0 if status.state is ProcedureState.SUCCEEDED else 1


async def _start(
    current: Session,
    procedure_type: str,
    target: str,
    request: ProcedureInput,
    procedure_id: str | None,
    wait: bool,
    json_output: bool,
) -> int:
    procedure_id = procedure_id or new_procedure_id(procedure_type, target)
    await start_procedure(
        current.client,
        procedure_type,
        request,
        task_queue=current.endpoints.task_queue,
        procedure_id=procedure_id,
        summary=f"{procedure_type} {target}",
    )
    if not wait:
        if json_output:
            print_json({"procedure_id": procedure_id})
        else:
            console.print(procedure_id, highlight=False)
        return 0
    if not json_output:
        url = workflow_ui_url(current.endpoints.ui_url, current.endpoints.namespace, procedure_id)
        console.print(f"{procedure_id}" + (f"  {url}" if url else ""), highlight=False)
    return await _follow(current, procedure_id, json_output, None)


def _run(coroutine: Coroutine[Any, Any, int]) -> None:
    raise typer.Exit(asyncio.run(coroutine))


# ---- namespaces ----


@namespace_app.command("create")
def namespace_create(
    name: str,
    wait: bool = WAIT_OPTION,
    json_output: bool = JSON_OPTION,
    procedure_id: str | None = ID_OPTION,
) -> None:
    """Start a CreateNamespace procedure."""

    async def run() -> int:
        validate_name("namespace", name)
        async with session() as current:
            if procedure_id is None and await current.catalog.get_namespace(name) is not None:
                raise ProcbusError(f"namespace {name!r} exists already")
            return await _start(
                current,
                "CreateNamespace",
                name,
                CreateNamespaceInput(namespace=name),
                procedure_id,
                wait,
                json_output,
            )

    _run(run())


@namespace_app.command("delete")
def namespace_delete(
    name: str,
    wait: bool = WAIT_OPTION,
    json_output: bool = JSON_OPTION,
    procedure_id: str | None = ID_OPTION,
) -> None:
    """Start a DeleteNamespace procedure (refused while the namespace holds tables)."""

    async def run() -> int:
        validate_name("namespace", name)
        async with session() as current:
            if procedure_id is None:
                if await current.catalog.get_namespace(name) is None:
                    raise ProcbusError(f"namespace {name!r} does not exist")
                tables = await current.catalog.count_tables(name)
                if tables:
                    raise ProcbusError(
                        f"namespace {name!r} holds {tables} tables: delete them first"
                    )
            return await _start(
                current,
                "DeleteNamespace",
                name,
                DeleteNamespaceInput(namespace=name),
                procedure_id,
                wait,
                json_output,
            )

    _run(run())


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
    wait: bool = WAIT_OPTION,
    json_output: bool = JSON_OPTION,
    procedure_id: str | None = ID_OPTION,
) -> None:
    """Start a CreateTable procedure: layout, catalog, caches, event; undone if any step fails."""

    async def run() -> int:
        namespace, table = parse_table_name(name)
        validate_partitioning(parse_columns(schema), partition_by)
        async with session() as current:
            if procedure_id is None:
                if await current.catalog.get_namespace(namespace) is None:
                    raise ProcbusError(f"namespace {namespace!r} does not exist")
                if await current.catalog.get_table(namespace, table) is not None:
                    raise ProcbusError(f"table {name!r} exists already")
            request = CreateTableInput(table=name, columns=schema, partition_by=partition_by)
            return await _start(
                current, "CreateTable", name, request, procedure_id, wait, json_output
            )

    _run(run())


@table_app.command("delete")
def table_delete(
    name: str = typer.Argument(..., help="NAMESPACE.TABLE"),
    wait: bool = WAIT_OPTION,
    json_output: bool = JSON_OPTION,
    procedure_id: str | None = ID_OPTION,
) -> None:
    """Start a DeleteTable procedure: the catalog removal is the point of no return."""

    async def run() -> int:
        namespace, table = parse_table_name(name)
        async with session() as current:
            if procedure_id is None and await current.catalog.get_table(namespace, table) is None:
                raise ProcbusError(f"table {name!r} does not exist")
            return await _start(
                current,
                "DeleteTable",
                name,
                DeleteTableInput(table=name),
                procedure_id,
                wait,
                json_output,
            )

    _run(run())


@table_app.command("describe")
def table_describe(
    name: str = typer.Argument(..., help="NAMESPACE.TABLE"), json_output: bool = JSON_OPTION
) -> None:
    """A table's schema, partitioning, location and the procedure that created it."""

    async def run() -> int:
        namespace, table_name = parse_table_name(name)
        async with session() as current:
            table = await current.catalog.get_table(namespace, table_name)
        if table is None:
            raise ProcbusError(f"table {name!r} does not exist")
        if json_output:
            print_json(table)
            return 0
        console.print(f"[bold]{table.qualified_name}[/]  at {table.location}", highlight=False)
        grid = Table("column", "type", "partition")
        for column in table.columns:
            grid.add_row(
                column.name, column.type, "yes" if column.name in table.partition_by else ""
            )
        console.print(grid)
        console.print(f"created by {table.created_by} at {table.created_at}", highlight=False)
        return 0

    _run(run())


@table_app.command("list")
def table_list(
    namespace: str | None = typer.Option(None, "--namespace", help="Only this namespace."),
    json_output: bool = JSON_OPTION,
) -> None:
    """Every table in the catalog."""

    async def run() -> int:
        async with session() as current:
            tables = await current.catalog.list_tables(namespace)
        if json_output:
            print_json([table.model_dump(mode="json") for table in tables])
            return 0
        grid = Table("table", "columns", "partitioned by", "created by")
        for table in tables:
            grid.add_row(
                table.qualified_name,
                ", ".join(f"{c.name}:{c.type}" for c in table.columns),
                ", ".join(table.partition_by),
                table.created_by,
            )
        console.print(grid)
        return 0

    _run(run())


# ---- procedures ----


@proc_app.command("list")
def proc_list(
    state: str | None = typer.Option(None, "--state", help="e.g. ROLLING_BACK, STUCK"),
    procedure_type: str | None = typer.Option(None, "--type", help="e.g. CreateTable"),
    json_output: bool = JSON_OPTION,
) -> None:
    """Procedures, newest first (from Temporal's visibility: a second or so behind)."""

    async def run() -> int:
        async with session() as current:
            found = await list_procedures(
                current.client, state=state, procedure_type=procedure_type
            )
        if json_output:
            print_json([entry.model_dump(mode="json") for entry in found])
            return 0
        grid = Table("procedure", "type", "target", "state", "started")
        for entry in found:
            started = f"{entry.started_at:%Y-%m-%d %H:%M:%S}" if entry.started_at else ""
            grid.add_row(
                entry.procedure_id, entry.procedure_type, entry.target, entry.state, started
            )
        console.print(grid)
        return 0

    _run(run())


@proc_app.command("status")
def proc_status(procedure_id: str, json_output: bool = JSON_OPTION) -> None:
    """State, steps done, step running, compensations and error of one procedure."""

    async def run() -> int:
        async with session() as current:
            status = await procedure_status(current.client, procedure_id)
        if json_output:
            print_json(status)
        else:
            console.print(_steps_table(status))
            _print_outcome(status)
        return 0

    _run(run())


@proc_app.command("wait")
def proc_wait(
    procedure_id: str,
    timeout: float | None = typer.Option(
        None, "--timeout", help="Give up after this many seconds."
    ),
    json_output: bool = JSON_OPTION,
) -> None:
    """Wait for the end (or STUCK); exit 0 only when it SUCCEEDED."""

    async def run() -> int:
        async with session() as current:
            return await _follow(current, procedure_id, json_output, timeout)

    _run(run())


@proc_app.command("abort")
def proc_abort(
    procedure_id: str,
    reason: str = typer.Option(
        "aborted by an operator", "--reason", help="Recorded in the status."
    ),
    json_output: bool = JSON_OPTION,
) -> None:
    """Roll a procedure back; refused once it passed its pivot."""

    async def run() -> int:
        async with session() as current:
            status = await abort_procedure(current.client, procedure_id, reason)
        if json_output:
            print_json(status)
        else:
            console.print(f"abort requested: {procedure_id} rolls back", highlight=False)
        return 0

    _run(run())


@proc_app.command("retry")
def proc_retry(procedure_id: str, json_output: bool = JSON_OPTION) -> None:
    """Run a STUCK procedure's failing compensation again."""

    async def run() -> int:
        async with session() as current:
            status = await retry_procedure(current.client, procedure_id)
        if json_output:
            print_json(status)
        else:
            console.print(f"retrying the compensation {status.stuck_step}", highlight=False)
        return 0

    _run(run())


@proc_app.command("skip")
def proc_skip(
    procedure_id: str,
    reason: str = typer.Option(..., "--reason", help="Why it is safe to skip: recorded."),
    json_output: bool = JSON_OPTION,
) -> None:
    """Skip a STUCK procedure's failing compensation (recorded with your reason)."""

    async def run() -> int:
        async with session() as current:
            status = await skip_compensation(current.client, procedure_id, reason)
        if json_output:
            print_json(status)
        else:
            console.print(f"skipped the compensation {status.stuck_step}", highlight=False)
        return 0

    _run(run())
