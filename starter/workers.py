"""`procbus workers list|inspect`: the bus members, and what each one's caches hold."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import typer

from procbus.starter.output import console, print_json, styled
from procbus.starter.procedures import JSON_OPTION, run_command

workers_app = typer.Typer(
    help="Worker processes: bus members, each with its own task queue.", no_args_is_help=True
)


@workers_app.command("list")
def workers_list(
    all_members: bool = typer.Option(
        False, "--all", help="Also workers that stopped heartbeating (dropped)."
    ),
    json_output: bool = JSON_OPTION,
) -> None:
    """Registered workers: ID, host, pid, start, last heartbeat (from PostgreSQL)."""

    async def run() -> int:
        from procbus.bus import Membership
        from procbus.config import load_settings
        from procbus.db import create_pool
        from procbus.stack import resolve_database_url

        pool = await create_pool(resolve_database_url(load_settings()), min_size=1, max_size=1)
        try:
            members = await Membership(pool).members(live_only=not all_members)
        finally:
            await pool.close()
        if json_output:
            print_json([member.model_dump(mode="json") for member in members])
            return 0
        if not members:
            console.print("no workers")
            return 0
        from rich.table import Table

        now = datetime.now(UTC)
        grid = Table("worker", "host", "pid", "started", "heartbeat", "state")
        for member in members:
            age = (now - member.heartbeat_at).total_seconds()
            grid.add_row(
                member.member_id,
                member.host,
                str(member.pid),
                f"{member.started_at:%Y-%m-%d %H:%M:%S}",
                f"{age:.0f} s ago",
                styled("live", "green") if member.live else styled("dropped", "red"),
            )
        console.print(grid)
        return 0

    run_command(run())


@workers_app.command("inspect")
def workers_inspect(json_output: bool = JSON_OPTION) -> None:
    """Ask every live worker, through the bus, what its caches hold (tables, grants)."""

    async def run() -> int:
        from procbus.bus import BroadcastInput, ReportState
        from procbus.core import BROADCAST, BroadcastResult
        from procbus.starter.scripts import connect

        client, services = await connect()
        result: BroadcastResult = await client.execute_workflow(
            BROADCAST,
            BroadcastInput(operation=ReportState()),
            id=f"procbus-inspect-{uuid.uuid4().hex[:12]}",
            task_queue=services.task_queue,
            result_type=BroadcastResult,
        )
        if json_output:
            print_json(result.model_dump(mode="json"))
            return 0
        from rich.table import Table

        grid = Table("worker", "answer", "tables", "grants")
        for member in result.members:
            report = member.report
            grants = (
                ", ".join(
                    f"{g['principal']} {g['permission']} {g['namespace']}.{g['table']}"
                    for g in report.access
                )
                if report
                else ""
            )
            grid.add_row(
                member.member_id,
                member.outcome.value,
                ", ".join(report.tables) if report else "",
                grants,
            )
        console.print(grid)
        return 0

    run_command(run())
