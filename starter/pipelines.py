"""`procbus capture ...` and `procbus pipeline ...`: application tables captured into topics,
and table:// topics applying them to lake tables."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

import typer

from procbus.starter.output import console, print_json

if TYPE_CHECKING:
    import asyncpg

JSON_OPTION = typer.Option(False, "--json", help="Print the result as JSON.")

capture_app = typer.Typer(
    help="Capture an application table's committed changes into a grouped topic.",
    no_args_is_help=True,
)
pipeline_app = typer.Typer(
    help="Change pipelines: table:// topics applying captured changes to lake tables.",
    no_args_is_help=True,
)


@contextlib.asynccontextmanager
async def _pool() -> AsyncIterator[asyncpg.Pool]:
    """A pool on the configured (or running) stack's database: the application's own."""
    from procbus.config import load_settings
    from procbus.db import create_pool
    from procbus.stack import resolve_database_url

    pool = await create_pool(resolve_database_url(load_settings()), min_size=1, max_size=2)
    try:
        yield pool
    finally:
        await pool.close()


@capture_app.command("create")
def create(
    source_table: str = typer.Argument(..., help="[SCHEMA.]TABLE in procbus's database"),
    topic: str = typer.Option(..., "--topic", help="A topic created with --group-transactions."),
    key: str | None = typer.Option(
        None, "--key", help="Key column(s), comma-separated; default: the primary key."
    ),
    json_output: bool = JSON_OPTION,
) -> None:
    """Publish a table's committed changes into a topic (its rows already there first)."""
    from procbus.capture import Captures

    async def run() -> None:
        async with _pool() as pool:
            columns = [name.strip() for name in key.split(",")] if key else None
            capture = await Captures(pool).create(source_table, topic, key=columns)
        if json_output:
            print_json(capture)
            return
        console.print(
            f"capturing {capture.source} into {capture.topic} (key: "
            f"{', '.join(capture.key_columns)}); {capture.snapshot_rows} rows already there "
            "published as one transaction",
            highlight=False,
        )

    asyncio.run(run())


@capture_app.command("list")
def list_captures(
    topic: str | None = typer.Option(None, "--topic", help="Only this topic's."),
    json_output: bool = JSON_OPTION,
) -> None:
    """The tables captured, into which topics."""
    from rich.table import Table

    from procbus.capture import Captures

    async def run() -> None:
        async with _pool() as pool:
            found = await Captures(pool).list_captures(topic)
        if json_output:
            print_json([capture.model_dump(mode="json") for capture in found])
            return
        grid = Table("table", "topic", "key", "snapshot rows", "since")
        for capture in found:
            grid.add_row(
                capture.source,
                capture.topic,
                ", ".join(capture.key_columns),
                str(capture.snapshot_rows),
                str(capture.created_at),
            )
        console.print(grid)

    asyncio.run(run())


@capture_app.command("delete")
def delete(
    source_table: str = typer.Argument(..., help="[SCHEMA.]TABLE"),
    topic: str = typer.Option(..., "--topic"),
    json_output: bool = JSON_OPTION,
) -> None:
    """Stop capturing a table (what is queued already is still delivered)."""
    from procbus.capture import Captures

    async def run() -> None:
        async with _pool() as pool:
            capture = await Captures(pool).delete(source_table, topic)
        if json_output:
            print_json(capture)
            return
        console.print(f"{capture.source} is no longer captured into {topic}", highlight=False)

    asyncio.run(run())


@pipeline_app.command("status")
def status(name: str, json_output: bool = JSON_OPTION) -> None:
    """A pipeline (a table:// topic): source position, lag, batches applied, last error."""
    from procbus.pipeline import Pipelines

    async def run() -> None:
        async with _pool() as pool:
            found = await Pipelines(pool).status(name)
        if json_output:
            print_json(found)
            return
        for field, value in found.model_dump(mode="json").items():
            console.print(f"{field:<22}{value}", highlight=False)

    asyncio.run(run())


@pipeline_app.command("skip")
def skip(
    name: str,
    batch: str = typer.Option(
        ..., "--batch", help="The batch the pipeline stopped at (`pipeline status` shows it)."
    ),
    reason: str = typer.Option(..., "--reason", help="Why it is given up (kept with it)."),
    json_output: bool = JSON_OPTION,
) -> None:
    """Give up the batch a stopped pipeline holds first: its changes go to the dead letters with
    the reason, and the pipeline resumes with the changes behind it."""
    from procbus.topics import Topics

    async def run() -> None:
        async with _pool() as pool:
            skipped = await Topics(pool).skip_stopped_batch(name, batch, reason)
        if json_output:
            print_json(skipped)
            return
        console.print(
            f"batch {skipped.batch_id} skipped: its {len(skipped.dead_lettered)} changes are "
            f"dead letters of {name} (`procbus topic dead-letters {name}`); the pipeline resumes",
            highlight=False,
        )

    asyncio.run(run())
