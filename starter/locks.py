"""`procbus lock list`: who holds which lock, with its fencing token and lease, and who waits."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import typer

from procbus.starter.output import console, print_json, styled

if TYPE_CHECKING:
    from procbus.locks.models import LockEntry

lock_app = typer.Typer(
    help="Hierarchical locks: holders, tokens, leases, waiters.", no_args_is_help=True
)


async def _entries(holder: str | None) -> list[LockEntry]:
    from procbus.config import load_settings
    from procbus.db import create_pool
    from procbus.locks.table import LockTable
    from procbus.stack.addresses import resolve_addresses

    pool = await create_pool(
        resolve_addresses(load_settings()).database_url, min_size=1, max_size=1
    )
    try:
        return await LockTable(pool).list_locks(holder)
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
    from procbus.locks.models import by_resource

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
