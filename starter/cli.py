"""The `procbus` command line."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, TypeVar

import typer
from typer.exceptions import TyperException

from procbus.errors import ConfigError, ProcbusError, encoded_payload_error
from procbus.starter.access import acl_app
from procbus.starter.locks import lock_app
from procbus.starter.output import console, print_error, print_json, print_json_error, styled
from procbus.starter.pipelines import capture_app, pipeline_app
from procbus.starter.procedures import proc_app
from procbus.starter.scenes import DEMO_STEPS
from procbus.starter.schedules import schedule_app
from procbus.starter.tables import namespace_app, table_app
from procbus.starter.temporal import temporal_app
from procbus.starter.topics import topic_app
from procbus.starter.workers import workers_app

if TYPE_CHECKING:
    from procbus.config import Settings

T = TypeVar("T")

app = typer.Typer(
    name="procbus",
    help="Safe multi-step, multi-system operations for data platforms, on Temporal.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
db_app = typer.Typer(help="The procbus database: schema migrations.", no_args_is_help=True)
app.add_typer(db_app, name="db")
app.add_typer(namespace_app, name="namespace")
app.add_typer(table_app, name="table")
app.add_typer(proc_app, name="proc")
app.add_typer(lock_app, name="lock")
app.add_typer(topic_app, name="topic")
app.add_typer(capture_app, name="capture")
app.add_typer(pipeline_app, name="pipeline")
app.add_typer(schedule_app, name="schedule")
app.add_typer(acl_app, name="acl")
app.add_typer(workers_app, name="workers")
app.add_typer(temporal_app, name="temporal")

JSON_OPTION = typer.Option(False, "--json", help="Print the result as JSON.")


def _print_version(asked: bool) -> None:
    if asked:
        from importlib.metadata import version

        console.print(f"procbus {version('procbus')}", highlight=False)
        raise typer.Exit(0)


@app.callback()
def connection_flags(
    address: str | None = typer.Option(
        None,
        "--address",
        metavar="HOST:PORT",
        help="The Temporal frontend: over PROCBUS_TEMPORAL_ADDRESS, TEMPORAL_ADDRESS and the "
        "temporal.toml profile.",
    ),
    namespace: str | None = typer.Option(
        None,
        "--namespace",
        help="The Temporal namespace: over PROCBUS_TEMPORAL_NAMESPACE, TEMPORAL_NAMESPACE and "
        "the temporal.toml profile.",
    ),
    profile: str | None = typer.Option(
        None,
        "--profile",
        help="The profile of Temporal's temporal.toml to connect with: over "
        "PROCBUS_TEMPORAL_PROFILE and TEMPORAL_PROFILE.",
    ),
    _version: bool = typer.Option(
        False,
        "--version",
        callback=_print_version,
        is_eager=True,
        help="Print procbus's version and exit.",
    ),
) -> None:
    # A flag is its PROCBUS_ setting, for this command and every process it starts.
    for name, value in (
        ("PROCBUS_TEMPORAL_ADDRESS", address),
        ("PROCBUS_TEMPORAL_NAMESPACE", namespace),
        ("PROCBUS_TEMPORAL_PROFILE", profile),
    ):
        if value is not None:
            os.environ[name] = value


def _settings() -> Settings:
    # Imported when a command runs, not for --help: the CLI answers at once.
    from procbus.config import load_settings

    return load_settings()


def _run(coroutine: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(coroutine)


@app.command()
def dev(
    quiet: bool = typer.Option(False, "--quiet", "-q", help="Print nothing once started."),
) -> None:
    """Run the embedded stack in the foreground: Temporal server + Web UI, PostgreSQL, a worker.

    State lives in PROCBUS_STATE_DIR (default .procbus/) and survives restarts. Ctrl-C or
    SIGTERM stops everything it started.
    """
    from procbus.starter.dev import run_dev
    from procbus.starter.logs import configure_logging

    settings = _settings()
    configure_logging(settings.log_level, settings.log_format)
    _run(run_dev(settings, quiet=quiet))


@app.command()
def status(json_output: bool = JSON_OPTION) -> None:
    """Whether Temporal, PostgreSQL and a worker are up; exits 0 only when all are."""
    from rich.table import Table

    from procbus.stack import check_status

    result = _run(check_status(_settings()))
    if json_output:
        print_json(result)
    else:
        table = Table(show_header=False, box=None)
        for component in result.components:
            mark = styled("up", "green") if component.up else styled("down", "red")
            table.add_row(component.name, mark, component.detail)
        console.print(table)
        for label, value in (
            ("Temporal", result.temporal_address),
            ("namespace", result.namespace),
            ("Web UI", result.ui_url),
            ("database", result.database_url),
            ("task queue", result.task_queue),
            ("metrics", result.metrics_url),
        ):
            if value:
                console.print(f"{label:<11}{value}", highlight=False)
    raise typer.Exit(0 if result.up else 1)


@app.command()
def worker(
    workflows: list[str] = typer.Option(
        [],
        "--workflows",
        metavar="MODULE",
        help="A module of your own procedures to run beside the built-in ones (repeatable): "
        "its @workflow.defn classes, its @activity.defn functions and its ACTIVITIES list. "
        "Installed packages add theirs through the procbus.workflows entry-point group.",
    ),
) -> None:
    """Run a worker against the configured services (PROCBUS_TEMPORAL_ADDRESS, ...)."""
    from procbus.stack import resolve_addresses
    from procbus.starter.logs import configure_logging
    from procbus.worker import run_worker
    from procbus.worker.extensions import entry_point_modules, load_user_procedures
    from procbus.worker.main import WORKFLOWS

    # Before any service is touched: a module that cannot run stops the worker here.
    user = load_user_procedures([*workflows, *entry_point_modules()], WORKFLOWS)
    settings = _settings()
    configure_logging(settings.log_level, settings.log_format)
    services = resolve_addresses(settings)
    console.print(
        f"worker on task queue {services.task_queue!r} at {services.temporal_address} "
        f"(namespace {services.namespace}); Ctrl-C stops it",
        highlight=False,
    )
    for module in user.modules:
        names = ", ".join(
            sorted(cls.__name__ for cls in user.workflows if cls.__module__ == module)
        )
        console.print(f"  your procedures from {module}: {names}", highlight=False)
    _run(run_worker(settings, user=user))


@app.command()
def demo(
    json_output: bool = JSON_OPTION,
    only: list[str] = typer.Option(
        [],
        "--only",
        help=f"Only these scenes (repeatable, or comma-separated): {', '.join(DEMO_STEPS)}. "
        "The stack check always runs; a scene in the demo's namespace brings create-table "
        "along.",
    ),
) -> None:
    """Run the main job end to end, on the running stack or on an embedded one it starts."""
    from procbus.starter.demo import run_demo

    report = _run(run_demo(_settings(), quiet=json_output, only=only))
    if json_output:
        print_json(report)


@db_app.command("migrate")
def db_migrate(json_output: bool = JSON_OPTION) -> None:
    """Apply the pending migrations, then the changed functions files; safe from two at once."""
    from procbus.db import connect
    from procbus.db.migrate import applied_migrations, migrate
    from procbus.stack import resolve_database_url

    async def apply() -> tuple[list[str], list[str], int]:
        connection = await connect(resolve_database_url(_settings()))
        try:
            applied = await migrate(connection)
            total = len(await applied_migrations(connection))
        finally:
            await connection.close()
        migrations = [f"{m.version:04d}_{m.name}" for m in applied.migrations]
        return migrations, [file.name for file in applied.functions], total

    migrations, functions, total = _run(apply())
    if json_output:
        print_json({"applied": migrations, "functions": functions, "schema_version": total})
    elif migrations or functions:
        console.print(f"applied {', '.join(migrations + functions)}; schema at version {total}")
    else:
        console.print(f"nothing to apply; schema at version {total}")


def run(argv: list[str]) -> int:
    """Run the `procbus` CLI on `argv`; return its exit code.

    A user error is one line on stderr, or with `--json` one JSON object there
    ({"type", "message", "exit_code"}): stdout keeps only results.
    """
    as_json = "--json" in (argv[: argv.index("--")] if "--" in argv else argv)
    try:
        returned = app(args=argv, prog_name="procbus", standalone_mode=False)
        # Without standalone mode click returns the code of typer.Exit instead of raising it.
        return returned if isinstance(returned, int) else 0
    except ConfigError as error:
        return _report(error, str(error), 2, as_json)
    except ProcbusError as error:
        return _report(error, str(error), 1, as_json)
    except typer.Abort as error:
        return _report(error, "aborted", 130, as_json)
    except KeyboardInterrupt:
        return 130
    except SystemExit as exit_:
        return exit_.code if isinstance(exit_.code, int) else 1
    except TyperException as error:  # usage errors: unknown option, missing argument, ...
        show = getattr(error, "show", None)
        if as_json or not callable(show):
            return _report(error, error.format_message(), error.exit_code, as_json)
        show()
        return error.exit_code
    except Exception as error:  # payloads of a user's codec, read without it: one line
        encoded = encoded_payload_error(error)
        if encoded is None:
            raise
        return _report(encoded, str(encoded), 2, as_json)


def _report(error: BaseException, message: str, exit_code: int, as_json: bool) -> int:
    if as_json:
        print_json_error(type(error).__name__, message, exit_code)
    else:
        print_error(message)
    return exit_code


def main() -> None:
    """Run the `procbus` CLI: one line per user error, a hard exit (temporalio sdk-python #300)."""
    code = run(sys.argv[1:])
    if "opentelemetry.trace" in sys.modules:  # traced: send what the exporter still holds
        from procbus.core import flush_traces

        flush_traces()
    sys.stdout.flush()
    sys.stderr.flush()
    # A process that used a Temporal client can abort in interpreter shutdown; skip it.
    os._exit(code)


if __name__ == "__main__":
    main()
