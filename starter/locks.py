"""`procbus lock list`: who holds which lock, with its fencing token and lease, and who waits;
`procbus lock release HOLDER`: an operator ends a holder's locks, with an audit row
(`procbus lock audit`)."""

from __future__ import annotations

import asyncio
import contextlib
import getpass
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import typer

from procbus.starter.output import console, print_json, styled

if TYPE_CHECKING:
    from procbus.locks import LockEntry, LockTable
    from procbus.locks.models import LockAudit, LockRelease

lock_app = typer.Typer(
    help="Hierarchical locks: holders, tokens, leases, waiters.", no_args_is_help=True
)


async def _entries(holder: str | None) -> list[LockEntry]:
    async with _lock_table() as locks:
        return await locks.list_locks(holder)


@contextlib.asynccontextmanager
async def _lock_table() -> AsyncIterator[LockTable]:
    from procbus.config import load_settings
    from procbus.db import create_pool
    from procbus.locks import LockTable
    from procbus.stack import resolve_database_url

    pool = await create_pool(resolve_database_url(load_settings()), min_size=1, max_size=1)
    try:
        yield LockTable(pool)
    finally:
        await pool.close()


def _lease(entry: LockEntry, now: datetime) -> str:
    left = (entry.lease_expires_at - now).total_seconds()
    return f"expired {-left:.0f} s ago" if left < 0 else f"{left:.0f} s left"


@lock_app.command("list")
def list_locks(
    holder: str | None = typer.Option(None, "--holder", help="Only this holder's locks."),
    json_output: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """Every lock: resource, mode, holder (procedure ID), fencing token, lease; then waiters."""
    from procbus.locks import by_resource

    resources = by_resource(asyncio.run(_entries(holder)))
    if json_output:
        print_json([resource.model_dump(mode="json") for resource in resources])
        return
    if not resources:
        console.print("no locks held or waited for")
        return
    from rich.table import Table

    now = datetime.now(UTC)
    table = Table(show_header=True)
    for column in ("resource", "mode", "holder", "token", "lease", "state"):
        table.add_column(column)
    for resource in resources:
        for entry in resource.holders:
            state = (
                styled("holding, lease expired", "red")
                if entry.expired
                else styled("holding", "green")
            )
            table.add_row(
                resource.resource,
                entry.mode.value,
                entry.holder,
                str(entry.token),
                _lease(entry, now),
                state,
            )
        for position, entry in enumerate(resource.waiters, start=1):
            table.add_row(
                resource.resource,
                entry.mode.value,
                entry.holder,
                "",
                _lease(entry, now),
                styled(f"waiting, #{position} in queue", "yellow"),
            )
    console.print(table)


async def _release(holder: str, reason: str, force: bool, released_by: str) -> LockRelease | str:
    """The release done, or why it was refused: a holder whose workflow runs keeps its locks
    unless forced (releasing them would let another procedure write beside it)."""
    from procbus.plugin import workflow_closed
    from procbus.starter.scripts import connect

    async with _lock_table() as locks:
        executions = await locks.executions_of(holder)
        running = False
        if executions:
            client, _ = await connect()
            running = await workflow_closed(client, holder) is None
            if running and not force:
                return (
                    f"{holder} is a running procedure: its locks are in use. End it first "
                    f"(procbus proc abort {holder}, or temporal workflow terminate -w {holder}), "
                    "or pass --force to release them under it (its later writes are refused by "
                    "their fencing tokens: it rolls back, or past its pivot takes them again "
                    "behind whoever holds them then)"
                )
        # A running procedure may take them again (it must, past its pivot): its execution is
        # not barred from the lock table, as an ended one's late requests are.
        execution = executions[0] if len(executions) == 1 and not running else None
        return await locks.release_for(holder, execution, released_by, reason)


@lock_app.command("release")
def release_locks(
    holder: str = typer.Argument(..., help="The holder (a procedure ID) whose locks end."),
    reason: str = typer.Option(..., "--reason", help="Why: kept in the audit row."),
    force: bool = typer.Option(
        False, "--force", help="Release them even while the holder's workflow still runs."
    ),
    as_principal: str | None = typer.Option(
        None, "--as", help="Who releases them, for the audit row (default PROCBUS_PRINCIPAL)."
    ),
    json_output: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """Release every lock and queue place of HOLDER, with an audit row (see: procbus lock audit):
    for a holder that will never release them (a workflow terminated, a script that died) with
    a long lease. A holder whose workflow still runs is refused unless --force."""
    from procbus.config import load_settings

    released_by = as_principal or load_settings().principal or f"{getpass.getuser()} (no principal)"
    done = asyncio.run(_release(holder, reason, force, released_by))
    if isinstance(done, str):
        console.print(styled(done, "red"), highlight=False)
        raise typer.Exit(1)
    if json_output:
        print_json(done.model_dump(mode="json"))
    elif not done.resources:
        console.print(f"{holder} holds no locks and waits for none: nothing released")
    else:
        console.print(
            f"released {len(done.resources)} lock(s) of {holder}: {', '.join(done.resources)} "
            f"(audit row {done.audit_id})",
            highlight=False,
        )


async def _audit() -> list[LockAudit]:
    async with _lock_table() as locks:
        return await locks.audit()


@lock_app.command("audit")
def lock_audit(
    json_output: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """Every release of locks by someone other than their holder: by procbus (the holder's
    workflow closed) or by an operator (procbus lock release), oldest first."""
    rows = asyncio.run(_audit())
    if json_output:
        print_json([row.model_dump(mode="json") for row in rows])
        return
    if not rows:
        console.print("no locks were released by anyone but their holder")
        return
    from rich.table import Table

    table = Table(show_header=True)
    for column in ("#", "released at", "holder", "resources", "by", "reason"):
        table.add_column(column)
    for row in rows:
        table.add_row(
            str(row.id),
            row.released_at.isoformat(timespec="seconds"),
            row.holder,
            ", ".join(row.resources),
            row.released_by,
            row.reason,
        )
    console.print(table)
