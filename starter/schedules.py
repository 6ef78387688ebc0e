"""`procbus schedule ...`: Temporal Schedules that run a procedure periodically (a compaction).

A schedule is Temporal's own object: at each time of its spec Temporal starts the procedure's
workflow on the procbus task queue, with the search attributes `procbus proc list` finds. A run
is skipped while the previous one still runs (overlap SKIP), and a failed run pauses the
schedule (pause on failure) until someone looks. The input is checked here, by the check the
procedure runs first, before anything is created. Heavy modules are imported inside the
commands, so `--help` answers at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import time
from collections.abc import Iterator, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

import typer
from pydantic import BaseModel

from procbus.errors import ProcbusError
from procbus.starter.output import console, print_json
from procbus.starter.procedures import JSON_OPTION, _client, run_command

if TYPE_CHECKING:
    from temporalio.client import (
        Client,
        ScheduleActionResult,
        ScheduleCalendarSpec,
        ScheduleDescription,
        ScheduleHandle,
        ScheduleRange,
        ScheduleSpec,
    )

    from procbus.procedures import ProcedureInput

# --procedure NAME -> the workflow type its schedule starts.
PROCEDURES: dict[str, str] = {"compact": "CompactTable"}
DEFAULT_CATCHUP_WINDOW = "10m"
MIN_CATCHUP_WINDOW = timedelta(seconds=10)  # Temporal raises a shorter window to this, silently
TRIGGER_WAIT_SECONDS = 10.0
POLL_SECONDS = 0.25
_DURATION = re.compile(r"^(\d+)([smhd])$")
_UNIT_SECONDS = {"d": 86_400, "h": 3_600, "m": 60, "s": 1}
# The schedule's ID also names its runs' workflow IDs: keep it to what reads well in both.
_SCHEDULE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,199}$")
# Cron fields as Temporal's calendars hold them: (name, first value, last value).
_CRON_FIELDS = (
    ("minute", 0, 59),
    ("hour", 0, 23),
    ("day_of_month", 1, 31),
    ("month", 1, 12),
    ("day_of_week", 0, 6),
)

NAME_ARGUMENT = typer.Argument(..., help="The schedule's ID.")

schedule_app = typer.Typer(
    help="Schedules: run a procedure periodically (a table compaction), on Temporal Schedules.",
    no_args_is_help=True,
)


class ScheduleNotFound(ProcbusError):
    """No schedule with that ID (or no longer)."""


# ---- checking the command line (pure) ----


def parse_duration(option: str, text: str, minimum: timedelta = timedelta(seconds=1)) -> timedelta:
    """'30s', '15m', '1h', '1d' -> a timedelta of at least `minimum`."""
    match = _DURATION.fullmatch(text.strip())
    if match is None:
        raise ProcbusError(
            f"{option} {text!r}: give a whole number and a unit (s, m, h, d), e.g. 30s, 15m, 1h, 1d"
        )
    duration = timedelta(seconds=int(match[1]) * _UNIT_SECONDS[match[2]])
    if duration < minimum:
        raise ProcbusError(f"{option} {text!r}: at least {format_duration(minimum)}")
    return duration


def format_duration(duration: timedelta) -> str:
    """The inverse of parse_duration: 3600 s -> '1h', 5400 s -> '90m'."""
    seconds = duration.total_seconds()
    if seconds != int(seconds) or seconds <= 0:
        return f"{seconds:g}s"
    for unit, size in _UNIT_SECONDS.items():
        if int(seconds) % size == 0:
            return f"{int(seconds) // size}{unit}"
    raise AssertionError("unreachable: every whole number of seconds has a unit")


def check_name(name: str) -> None:
    if not _SCHEDULE_NAME.fullmatch(name):
        raise ProcbusError(
            f"schedule name {name!r}: use letters, digits, '_', '.', '-' (at most 200), "
            "starting with a letter or digit"
        )


def workflow_type_of(procedure: str) -> str:
    try:
        return PROCEDURES[procedure]
    except KeyError:
        raise ProcbusError(
            f"unknown procedure {procedure!r}; known: {', '.join(PROCEDURES)}"
        ) from None


def procedure_of(workflow_type: str) -> str:
    """The --procedure name of a workflow type; another schedule's workflow type as it is."""
    names = {workflow: name for name, workflow in PROCEDURES.items()}
    return names.get(workflow_type, workflow_type)


def cron_text(calendar: ScheduleCalendarSpec) -> str:
    """A calendar as cron text: Temporal compiles a cron expression into calendars and keeps
    only those, so `0 3 * * 1-5` comes back as it was given."""
    fields = [_range_text(getattr(calendar, name), low, high) for name, low, high in _CRON_FIELDS]
    if [(r.start, r.end) for r in calendar.second] != [(0, 0)]:
        fields.insert(0, _range_text(calendar.second, 0, 59))
    if calendar.year:
        fields.append(_range_text(calendar.year, 0, 9999))
    return " ".join(fields)


def _range_text(ranges: Sequence[ScheduleRange], low: int, high: int) -> str:
    parts = []
    for entry in ranges:
        # Temporal's defaults: an end before the start is the start, a step of 0 is 1.
        start, end, step = entry.start, max(entry.end, entry.start), max(entry.step, 1)
        if (start, end) == (low, high):
            parts.append("*" if step == 1 else f"*/{step}")
        elif start == end:
            parts.append(str(start))
        else:
            parts.append(f"{start}-{end}" + (f"/{step}" if step > 1 else ""))
    return ",".join(parts) or "*"


def spec_fields(spec: ScheduleSpec) -> dict[str, Any]:
    every = [format_duration(interval.every) for interval in spec.intervals]
    cron = [cron_text(calendar) for calendar in spec.calendars] + list(spec.cron_expressions)
    text = ", ".join([f"every {e}" for e in every] + [f"cron {c}" for c in cron])
    return {
        "spec": text,
        "every": ", ".join(every) or None,
        "cron": ", ".join(cron) or None,
    }


def _time(moment: datetime | None) -> str | None:
    return moment.isoformat() if moment else None


def _shown_time(moment: str | None) -> str:
    return f"{datetime.fromisoformat(moment):%Y-%m-%d %H:%M:%S}" if moment else ""


# ---- reading schedules ----


@contextlib.contextmanager
def _errors_of(name: str) -> Iterator[None]:
    """Temporal's errors about schedule `name` as a user reads them."""
    from temporalio.service import RPCError, RPCStatusCode

    try:
        yield
    except RPCError as error:
        if error.status is RPCStatusCode.NOT_FOUND:
            raise ScheduleNotFound(f"schedule {name!r} does not exist") from None
        raise ProcbusError(f"schedule {name!r}: {error.message}") from None


async def _describe(client: Client, name: str) -> ScheduleDescription:
    with _errors_of(name):
        return await client.get_schedule_handle(name).describe()


async def _run_result(client: Client, workflow_id: str) -> str | None:
    """How a run went: its procedure state if it is a procedure, else Temporal's status."""
    from temporalio.service import RPCError

    from procbus.core import PROCEDURE_STATE

    try:
        description = await client.get_workflow_handle(workflow_id).describe()
    except RPCError:  # gone: past the namespace's retention
        return None
    state = description.typed_search_attributes.get(PROCEDURE_STATE)
    if state:
        return state
    return description.status.name if description.status else None


async def _action(client: Client, result: ScheduleActionResult) -> dict[str, Any]:
    from temporalio.client import ScheduleActionExecutionStartWorkflow

    workflow_id = (
        result.action.workflow_id
        if isinstance(result.action, ScheduleActionExecutionStartWorkflow)
        else None
    )
    return {
        "workflow_id": workflow_id,
        "scheduled_at": _time(result.scheduled_at),
        "started_at": _time(result.started_at),
        "result": await _run_result(client, workflow_id) if workflow_id else None,
    }


async def schedule_view(
    client: Client, description: ScheduleDescription, *, recent_runs: bool = True
) -> dict[str, Any]:
    """A schedule as the CLI shows it, procbus's or not; without `recent_runs` only the last
    run is looked up (a listing needs no more)."""
    from temporalio.client import ScheduleActionStartWorkflow

    action = description.schedule.action
    workflow_type = workflow_id = task_queue = None
    request: Any = None
    if isinstance(action, ScheduleActionStartWorkflow):
        workflow_type, workflow_id, task_queue = action.workflow, action.id, action.task_queue
        decoded = await client.data_converter.decode(action.args) if action.args else []
        request = decoded[0] if decoded else None
    info, policy, state = description.info, description.schedule.policy, description.schedule.state
    recent = sorted(info.recent_actions, key=lambda result: result.started_at)
    shown = recent if recent_runs else recent[-1:]
    actions = await asyncio.gather(*(_action(client, result) for result in shown))
    catchup = policy.catchup_window
    view = {
        "schedule_id": description.id,
        "procedure": procedure_of(workflow_type) if workflow_type else None,
        "workflow_type": workflow_type,
        "table": request.get("table") if isinstance(request, dict) else None,
        "input": request,
        **spec_fields(description.schedule.spec),
        "paused": state.paused,
        "note": state.note or None,
        "next_run": _time(info.next_action_times[0]) if info.next_action_times else None,
        "last_run": actions[-1] if actions else None,
        "workflow_id": workflow_id,
        "task_queue": task_queue,
        "policies": {
            "overlap": policy.overlap.name,
            "catchup_window": format_duration(catchup) if catchup is not None else None,
            "pause_on_failure": policy.pause_on_failure,
        },
        "next_runs": [_time(moment) for moment in info.next_action_times[:5]],
        "runs": info.num_actions,
        "skipped_overlapping": info.num_actions_skipped_overlap,
        "missed_catchup_window": info.num_actions_missed_catchup_window,
        "created_at": _time(info.created_at),
    }
    return view | {"recent_actions": actions} if recent_runs else view


async def _view(client: Client, name: str, *, recent_runs: bool = True) -> dict[str, Any]:
    return await schedule_view(client, await _describe(client, name), recent_runs=recent_runs)


def _print_detail(view: dict[str, Any]) -> None:
    from rich.table import Table

    policies = view["policies"]
    console.print(view["schedule_id"], style="bold", highlight=False)
    for label, value in (
        ("procedure", view["procedure"]),
        ("workflow", view["workflow_type"]),
        # Temporal appends each run's scheduled time to this ID.
        ("run IDs", f"{view['workflow_id']}-<time>" if view["workflow_id"] else None),
        ("task queue", view["task_queue"]),
        ("table", view["table"]),
        ("input", json.dumps(view["input"]) if view["input"] is not None else None),
        ("spec", view["spec"] + " (UTC)"),
        ("paused", "yes" if view["paused"] else "no"),
        ("note", view["note"]),
        ("overlap", policies["overlap"]),
        ("catchup", policies["catchup_window"]),
        ("on failure", "pause" if policies["pause_on_failure"] else "keep running"),
        ("next runs", ", ".join(_shown_time(moment) for moment in view["next_runs"])),
        (
            "runs",
            f"{view['runs']} started, {view['skipped_overlapping']} skipped (overlap), "
            f"{view['missed_catchup_window']} missed (catchup window)",
        ),
    ):
        if value is not None:
            console.print(f"{label:<11}{value}", highlight=False)
    if view["recent_actions"]:
        grid = Table("recent run", "scheduled", "result", title_justify="left")
        for action in reversed(view["recent_actions"]):
            grid.add_row(
                action["workflow_id"], _shown_time(action["scheduled_at"]), action["result"] or ""
            )
        console.print(grid)


# ---- procbus schedule ... ----


@schedule_app.command("create")
def create(
    name: str = NAME_ARGUMENT,
    procedure: str | None = typer.Option(
        None, "--procedure", help=f"A table procedure to run: {', '.join(PROCEDURES)}."
    ),
    table: str | None = typer.Option(None, "--table", help="NAMESPACE.TABLE (--procedure)."),
    workflow: str | None = typer.Option(
        None,
        "--workflow",
        metavar="TYPE",
        help="Any procedure's workflow type instead, a built-in one or your own.",
    ),
    input_json: str = typer.Option(
        "{}", "--input", metavar="JSON", help="The --workflow's input, a JSON object."
    ),
    target: str | None = typer.Option(
        None,
        "--target",
        help="What `proc list` shows a --workflow run acting on (default: the input's "
        "table, else the schedule's name).",
    ),
    every: str | None = typer.Option(None, "--every", help="Run every 30s, 15m, 1h, 1d, ..."),
    cron: str | None = typer.Option(
        None, "--cron", help="Run at the times of a cron expression (UTC), e.g. '0 3 * * *'."
    ),
    partitions: list[str] = typer.Option(
        [], "--partition", help="Only this partition, e.g. 'region=eu' (repeatable)."
    ),
    target_file_size: int | None = typer.Option(
        None, "--target-file-size", help="Bytes per rewritten file (default: 128 MiB)."
    ),
    catchup_window: str = typer.Option(
        DEFAULT_CATCHUP_WINDOW,
        "--catchup-window",
        help="A run missed while Temporal was down still starts if it is at most this late.",
    ),
    paused: bool = typer.Option(False, "--paused", help="Create it paused."),
    note: str | None = typer.Option(None, "--note", help="Shown with its state."),
    json_output: bool = JSON_OPTION,
) -> None:
    """Create a schedule that starts a procedure periodically (skipped while one runs): a table
    procedure (--procedure compact --table T) or any workflow type with its JSON input."""
    check_name(name)
    if (procedure is None) == (workflow is None):
        raise ProcbusError("give either --procedure (with --table) or --workflow TYPE, not both")
    if (every is None) == (cron is None):
        raise ProcbusError("give either --every (e.g. 1h) or --cron EXPR, not both or neither")
    interval = parse_duration("--every", every) if every is not None else None
    catchup = parse_duration("--catchup-window", catchup_window, MIN_CATCHUP_WINDOW)
    request: BaseModel | dict[str, Any]
    if procedure is not None:
        workflow_type = workflow_type_of(procedure)
        if table is None:
            raise ProcbusError(f"--procedure {procedure} needs --table NAMESPACE.TABLE")
        request = _compact_input(table, partitions, target_file_size)
        shown_target, workflow_id = table, f"{procedure}-{table}-{name}"
    else:
        assert workflow is not None
        workflow_type = workflow
        request = workflow_input(workflow, input_json)
        fields = request.model_dump(mode="json") if isinstance(request, BaseModel) else request
        found_table = fields.get("table")
        shown_target = target or (found_table if isinstance(found_table, str) else name)
        workflow_id = f"{workflow}-{name}"

    async def run() -> int:
        from temporalio.client import ScheduleAlreadyRunningError
        from temporalio.service import RPCError, RPCStatusCode

        from procbus.config import load_settings
        from procbus.procedures import procedure_schedule
        from procbus.temporal import client_signer

        client, services = await _client()
        # Its runs start as this client's principal: a production worker refuses unsigned ones.
        signer = client_signer(load_settings())
        schedule = procedure_schedule(
            workflow_type,
            request,
            target=shown_target,
            workflow_id=workflow_id,
            task_queue=services.task_queue,
            every=interval,
            cron=cron,
            catchup_window=catchup,
            paused=paused,
            note=note,
            headers=signer.schedule_headers(workflow_id, workflow_type, request)
            if signer
            else None,
        )
        try:
            await client.create_schedule(name, schedule)
        except ScheduleAlreadyRunningError:
            raise ProcbusError(f"schedule {name!r} exists already") from None
        except RPCError as error:
            if cron is not None and error.status is RPCStatusCode.INVALID_ARGUMENT:
                raise ProcbusError(
                    f"Temporal refused the cron expression {cron!r}: {error.message}"
                ) from None
            raise ProcbusError(f"cannot create schedule {name!r}: {error.message}") from None
        view = await _view(client, name)
        if json_output:
            print_json(view)
        else:
            next_run = f"; next run {_shown_time(view['next_run'])}" if view["next_run"] else ""
            console.print(
                f"schedule {name} created: {workflow_type} {shown_target}, {view['spec']} (UTC)"
                + (", paused" if paused else next_run),
                highlight=False,
            )
        return 0

    run_command(run())


def workflow_input(workflow_type: str, text: str) -> BaseModel | dict[str, Any]:
    """--input for --workflow: a JSON object; a built-in procedure's is checked here by its
    own model and check, a user's procedure checks its own when each run starts."""
    try:
        fields = json.loads(text)
    except json.JSONDecodeError as error:
        raise ProcbusError(f"--input is not JSON: {error}") from None
    if not isinstance(fields, dict):
        raise ProcbusError(f"--input must be a JSON object, not {type(fields).__name__}")
    model = built_in_input_model(workflow_type)
    if model is None:
        return fields
    from pydantic import ValidationError

    from procbus.errors import validation_findings

    try:
        request = model.model_validate(fields)
    except ValidationError as error:
        raise ProcbusError(
            f"--input for {workflow_type}: {error.error_count()} validation error(s) for "
            f"{model.__name__}: {validation_findings(error)}"
        ) from None
    check = getattr(request, "check", None)
    if callable(check):
        check()
    return request


def built_in_input_model(workflow_type: str) -> type[BaseModel] | None:
    """The input model of a built-in procedure's workflow type; None for any other type."""
    from typing import get_type_hints

    from procbus.core import workflow_definition
    from procbus.worker.main import WORKFLOWS

    for cls in WORKFLOWS:
        definition = workflow_definition(cls)
        if definition is not None and definition.name == workflow_type:
            hints = get_type_hints(definition.run_fn)
            model = next((value for key, value in hints.items() if key != "return"), None)
            return model if isinstance(model, type) and issubclass(model, BaseModel) else None
    return None


def _compact_input(
    table: str, partitions: list[str], target_file_size: int | None
) -> ProcedureInput:
    """CompactTable's input, refused here by the check the procedure runs first."""
    from procbus.lakehouse import CompactTableInput

    fields: dict[str, object] = {"table": table, "partitions": partitions}
    if target_file_size is not None:  # else the model's default
        fields["target_file_size"] = target_file_size
    request = CompactTableInput.model_validate(fields)
    request.check()
    return request


@schedule_app.command("list")
def schedule_list(json_output: bool = JSON_OPTION) -> None:
    """Every schedule, procbus's or not (Temporal's visibility: a second or so behind)."""

    async def run() -> int:
        from rich.table import Table

        client, _ = await _client()
        names = [entry.id async for entry in await client.list_schedules()]
        found = await asyncio.gather(*(_listed(client, name) for name in sorted(names)))
        views = [view for view in found if view is not None]
        if json_output:
            print_json(views)
            return 0
        grid = Table("schedule", "procedure", "table", "spec", "paused", "next run", "last run")
        for view in views:
            last = view["last_run"]
            grid.add_row(
                view["schedule_id"],
                view["procedure"] or "",
                view["table"] or "",
                view["spec"],
                "yes" if view["paused"] else "",
                _shown_time(view["next_run"]),
                f"{last['result'] or '?'} ({_shown_time(last['started_at'])})" if last else "",
            )
        console.print(grid)
        return 0

    run_command(run())


async def _listed(client: Client, name: str) -> dict[str, Any] | None:
    """The view of a listed schedule; None if it was deleted since it was listed."""
    try:
        return await _view(client, name, recent_runs=False)
    except ScheduleNotFound:
        return None


@schedule_app.command("describe")
def describe(name: str = NAME_ARGUMENT, json_output: bool = JSON_OPTION) -> None:
    """A schedule in detail: its spec, state, policies, next runs and recent runs."""

    async def run() -> int:
        client, _ = await _client()
        view = await _view(client, name)
        if json_output:
            print_json(view)
        else:
            _print_detail(view)
        return 0

    run_command(run())


@schedule_app.command("pause")
def pause(
    name: str = NAME_ARGUMENT,
    note: str | None = typer.Option(None, "--note", help="Why: shown with its state."),
    json_output: bool = JSON_OPTION,
) -> None:
    """Pause a schedule: no run starts until it is unpaused."""
    _set_paused(name, True, note or "paused with `procbus schedule pause`", json_output)


@schedule_app.command("unpause")
def unpause(
    name: str = NAME_ARGUMENT,
    note: str | None = typer.Option(None, "--note", help="Shown with its state."),
    json_output: bool = JSON_OPTION,
) -> None:
    """Unpause a schedule (also one paused by a failed run)."""
    _set_paused(name, False, note or "unpaused with `procbus schedule unpause`", json_output)


def _set_paused(name: str, paused: bool, note: str, json_output: bool) -> None:
    async def run() -> int:
        client, _ = await _client()
        handle = client.get_schedule_handle(name)
        with _errors_of(name):
            if paused:
                await handle.pause(note=note)
            else:
                await handle.unpause(note=note)
        view = await _view(client, name)
        if json_output:
            print_json(view)
        else:
            console.print(
                f"schedule {name} {'paused' if paused else 'unpaused'}: {note}", highlight=False
            )
        return 0

    run_command(run())


@schedule_app.command("trigger")
def trigger(name: str = NAME_ARGUMENT, json_output: bool = JSON_OPTION) -> None:
    """Run it now (skipped, as a scheduled run is, while the previous run still runs)."""

    async def run() -> int:
        client, _ = await _client()
        handle = client.get_schedule_handle(name)
        with _errors_of(name):
            before = (await handle.describe()).info
            # No overlap policy given: the schedule's own (SKIP) applies to this run too.
            await handle.trigger()
            workflow_id, skipped = await _triggered_run(
                handle, before.num_actions, before.num_actions_skipped_overlap
            )
        if json_output:
            print_json({"schedule_id": name, "workflow_id": workflow_id, "skipped": skipped})
        elif workflow_id:
            console.print(f"schedule {name} triggered: started {workflow_id}", highlight=False)
        elif skipped:
            console.print(
                f"schedule {name} triggered: skipped, its previous run still runs (overlap SKIP)",
                highlight=False,
            )
        else:
            console.print(
                f"schedule {name} triggered; its run has not started yet", highlight=False
            )
        return 0

    run_command(run())


async def _triggered_run(
    handle: ScheduleHandle, actions_before: int, skipped_before: int
) -> tuple[str | None, bool]:
    """The workflow ID the trigger started, or whether it was skipped; (None, False) if
    Temporal did neither within TRIGGER_WAIT_SECONDS."""
    from temporalio.client import ScheduleActionExecutionStartWorkflow

    deadline = time.monotonic() + TRIGGER_WAIT_SECONDS
    while time.monotonic() < deadline:
        info = (await handle.describe()).info
        if info.num_actions > actions_before and info.recent_actions:
            newest = max(info.recent_actions, key=lambda result: result.started_at).action
            if isinstance(newest, ScheduleActionExecutionStartWorkflow):
                return newest.workflow_id, False
        if info.num_actions_skipped_overlap > skipped_before:
            return None, True
        await asyncio.sleep(POLL_SECONDS)
    return None, False


@schedule_app.command("delete")
def delete(name: str = NAME_ARGUMENT, json_output: bool = JSON_OPTION) -> None:
    """Delete a schedule; the runs it started are left as they are."""

    async def run() -> int:
        client, _ = await _client()
        with _errors_of(name):
            await client.get_schedule_handle(name).delete()
        if json_output:
            print_json({"schedule_id": name, "deleted": True})
        else:
            console.print(f"schedule {name} deleted", highlight=False)
        return 0

    run_command(run())
