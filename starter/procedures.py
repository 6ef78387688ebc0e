"""`procbus proc ...`: list, status, wait, abort, retry and skip any procedure; and the start and
follow helpers the commands that start procedures share.

Only Temporal is needed: a procedure's own validation and preflight give every error, the same
one a `temporal` CLI user gets. Heavy modules are imported inside the commands, so `--help`
answers at once.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

import typer

from procbus.starter.output import console, error_console, print_json, styled

if TYPE_CHECKING:
    from rich.live import Live
    from rich.table import Table
    from temporalio.client import Client

    from procbus.procedures import ProcedureInput, ProcedureStatus
    from procbus.stack import TemporalAddresses

JSON_OPTION = typer.Option(False, "--json", help="Print the result as JSON.")
WAIT_OPTION = typer.Option(
    False, "--wait", help="Show the steps live, wait for the end, exit non-zero unless SUCCEEDED."
)
ID_OPTION = typer.Option(
    None, "--id", help="Procedure ID (idempotent: the same ID returns the same procedure)."
)
DEADLINE_OPTION = typer.Option(
    None,
    "--deadline",
    min=0.001,
    help="Roll it back when it has not finished this many seconds after its start (past its "
    "point of no return it finishes instead, and its status says the deadline was refused).",
)
AS_OPTION = typer.Option(
    None,
    "--as",
    help="Start it as this principal (signed with PROCBUS_AUTH_KEY or the dev stack's key); "
    "default PROCBUS_PRINCIPAL, or `dev` on `procbus dev`.",
)

proc_app = typer.Typer(
    help="Procedures: list, status, wait, abort, retry, skip.", no_args_is_help=True
)


def run_command(coroutine: Coroutine[Any, Any, int]) -> None:
    raise typer.Exit(asyncio.run(coroutine))


# ---- rendering ----


def steps_table(status: ProcedureStatus) -> Table:
    from rich.table import Table
    from rich.text import Text

    from procbus.procedures import ProcedureState

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
        title=Text.assemble(f"{status.procedure_type}: ", (status.state.value, colour)),
        title_justify="left",
        show_header=True,
    )
    table.add_column("step")
    table.add_column("state")
    undone = set(status.compensations_done)
    skipped = {entry.step: entry.reason for entry in status.compensations_skipped}
    for step in status.steps_done:
        if step in undone:
            table.add_row(step, styled("done, undone", "yellow"))
        elif step in skipped:
            table.add_row(step, Text.assemble(("done, undo skipped", "red"), f" ({skipped[step]})"))
        elif step == status.pivot_step:
            table.add_row(step, Text.assemble(("done", "green"), " (pivot: point of no return)"))
        else:
            table.add_row(step, styled("done", "green"))
    if status.step_running:
        table.add_row(status.step_running, styled("running", "cyan"))
    if status.failed_step and status.failed_step not in status.steps_done:
        mark = "undone" if status.failed_step in undone else "failed"
        table.add_row(status.failed_step, Text.assemble(("failed", "red"), f", {mark}"))
    if status.stuck_step:
        table.add_row(
            f"undo {status.stuck_step}", Text.assemble(("STUCK", "red"), f": {status.stuck_error}")
        )
    for waiting in status.waiting_for:
        table.add_row("(locks)", Text.assemble(("waiting", "yellow"), f": {waiting}"))
    for step, broadcast in status.broadcasts.items():
        table.add_row(f"  {step} on workers", broadcast.summary(), style="dim")
    return table


def print_outcome(status: ProcedureStatus) -> None:
    from procbus.procedures import ProcedureState

    if status.error:
        console.print(f"error: {status.error}", highlight=False)
    if status.rollback_reason:
        console.print(f"rolled back because {status.rollback_reason}", highlight=False)
    for refusal in status.refused:
        console.print(refusal, style="dim", highlight=False)
    for taken in status.locks_taken_again:
        console.print(taken, style="dim", highlight=False)
    if status.state is ProcedureState.STUCK:
        console.print(
            f"STUCK: fix the cause, then `procbus proc retry {status.procedure_id}` or "
            f"`procbus proc skip {status.procedure_id} --reason '...'`",
            highlight=False,
        )


# ---- starting and following ----


async def follow(
    client: Client, procedure_id: str, json_output: bool, timeout_seconds: float | None
) -> int:
    """Wait for the end (or STUCK), live on a terminal; 0 only when it SUCCEEDED."""
    from rich.live import Live

    from procbus.procedures import ProcedureState, wait_for_procedure

    if json_output:
        # Notes go to stderr: stdout stays one JSON document.
        status = await wait_for_procedure(
            client,
            procedure_id,
            timeout_seconds=timeout_seconds,
            on_unreadable=lambda note: error_console.print(note, style="yellow", highlight=False),
        )
        print_json(status)
    else:
        with Live(console=console, auto_refresh=False) as live:
            shown: list[ProcedureStatus] = []

            def show(status: ProcedureStatus) -> None:
                shown[:] = [status]
                live.update(steps_table(status), refresh=True)

            # A running Spark job's progress (its heartbeat) as a bar under the steps.
            watching = asyncio.create_task(show_job_progress(client, procedure_id, live, shown))
            try:
                status = await wait_for_procedure(
                    client,
                    procedure_id,
                    timeout_seconds=timeout_seconds,
                    on_change=show,
                    on_unreadable=lambda note: live.console.print(
                        note, style="yellow", highlight=False
                    ),
                )
            finally:
                watching.cancel()
            live.update(steps_table(status), refresh=True)
        print_outcome(status)
    return 0 if status.state is ProcedureState.SUCCEEDED else 1


async def show_job_progress(
    client: Client, procedure_id: str, live: Live, shown: list[ProcedureStatus]
) -> None:
    """Every half second: the steps, and under them a progress bar per running Spark job."""
    from pydantic import ValidationError
    from rich.console import Group
    from rich.progress_bar import ProgressBar
    from rich.table import Table

    from procbus.procedures.client import pending_details
    from procbus.spark import JobProgress

    while True:
        await asyncio.sleep(0.5)
        bars = Table.grid(padding=(0, 1))
        for step, details in (await pending_details(client, procedure_id)).items():
            try:
                progress = JobProgress.model_validate(details)
            except ValidationError:
                continue  # not a Spark job's heartbeat
            bars.add_row(
                f"  {step}: Spark {progress.phase.value}",
                ProgressBar(
                    total=max(progress.tasks_total, 1), completed=progress.tasks_done, width=30
                ),
                f"tasks {progress.tasks_done}/{progress.tasks_total}, stages "
                f"{progress.stages_done}/{progress.stages_total}",
            )
        if shown and bars.row_count:
            live.update(Group(steps_table(shown[0]), bars), refresh=True)


async def start(
    procedure_type: str,
    target: str,
    request: ProcedureInput,
    procedure_id: str | None,
    wait: bool,
    json_output: bool,
    principal: str | None = None,
) -> int:
    """Start a procedure, signed as `principal` (or the default one); print its ID, or with
    `wait` follow it to the end."""
    from procbus.procedures import new_procedure_id, start_procedure
    from procbus.temporal import workflow_ui_url

    client, services = await _client(principal)
    procedure_id = procedure_id or new_procedure_id(procedure_type, target)
    await start_procedure(
        client,
        procedure_type,
        request,
        task_queue=services.task_queue,
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
        url = workflow_ui_url(services.ui_url, services.namespace, procedure_id)
        console.print(f"{procedure_id}" + (f"  {url}" if url else ""), highlight=False)
    return await follow(client, procedure_id, json_output, None)


async def _client(principal: str | None = None) -> tuple[Client, TemporalAddresses]:
    """A Temporal client on the configured (or running) stack, signing its starts as
    `principal` (or the default one); no database needed."""
    from procbus.starter.scripts import connect

    return await connect(principal)


# ---- procbus proc ... ----


@proc_app.command("list")
def proc_list(
    state: str | None = typer.Option(None, "--state", help="e.g. ROLLING_BACK, STUCK"),
    procedure_type: str | None = typer.Option(None, "--type", help="e.g. CreateTable"),
    json_output: bool = JSON_OPTION,
) -> None:
    """Procedures, newest first (from Temporal's visibility: a second or so behind)."""

    async def run() -> int:
        from rich.table import Table

        from procbus.procedures import list_procedures

        client, _ = await _client()
        found = await list_procedures(client, state=state, procedure_type=procedure_type)
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

    run_command(run())


@proc_app.command("status")
def proc_status(procedure_id: str, json_output: bool = JSON_OPTION) -> None:
    """State, steps done, step running, compensations and error of one procedure."""

    async def run() -> int:
        from procbus.procedures import procedure_status

        client, _ = await _client()
        status = await procedure_status(client, procedure_id)
        if json_output:
            print_json(status)
        else:
            console.print(steps_table(status))
            print_outcome(status)
        return 0

    run_command(run())


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
        client, _ = await _client()
        return await follow(client, procedure_id, json_output, timeout)

    run_command(run())


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
        from procbus.procedures import abort_procedure

        client, _ = await _client()
        status = await abort_procedure(client, procedure_id, reason)
        if json_output:
            print_json(status)
        else:
            console.print(f"abort requested: {procedure_id} rolls back", highlight=False)
        return 0

    run_command(run())


@proc_app.command("retry")
def proc_retry(procedure_id: str, json_output: bool = JSON_OPTION) -> None:
    """Run a STUCK procedure's failing compensation again."""

    async def run() -> int:
        from procbus.procedures import retry_procedure

        client, _ = await _client()
        status = await retry_procedure(client, procedure_id)
        if json_output:
            print_json(status)
        else:
            console.print(f"retrying the compensation {status.stuck_step}", highlight=False)
        return 0

    run_command(run())


@proc_app.command("skip")
def proc_skip(
    procedure_id: str,
    reason: str = typer.Option(..., "--reason", help="Why it is safe to skip: recorded."),
    json_output: bool = JSON_OPTION,
) -> None:
    """Skip a STUCK procedure's failing compensation (recorded with your reason)."""

    async def run() -> int:
        from procbus.procedures import skip_compensation

        client, _ = await _client()
        status = await skip_compensation(client, procedure_id, reason)
        if json_output:
            print_json(status)
        else:
            console.print(f"skipped the compensation {status.stuck_step}", highlight=False)
        return 0

    run_command(run())
