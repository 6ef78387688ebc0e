"""`procbus temporal setup`: procbus's search attributes on a Temporal of your own."""

from __future__ import annotations

import typer

from procbus.starter.output import console, print_json, styled
from procbus.starter.procedures import JSON_OPTION, run_command

temporal_app = typer.Typer(
    help="The Temporal namespace procbus runs in: what it needs there.", no_args_is_help=True
)


@temporal_app.command("setup")
def temporal_setup(
    namespace: str | None = typer.Option(
        None,
        "--namespace",
        help="The Temporal namespace, over the global `procbus --namespace`; unset: that flag, "
        "else PROCBUS_TEMPORAL_NAMESPACE, TEMPORAL_NAMESPACE, the temporal.toml profile's (or "
        "`procbus dev`'s).",
    ),
    json_output: bool = JSON_OPTION,
) -> None:
    """Register procbus's search attributes (ProcedureType, ProcedureState, ProcedureTarget) on
    the namespace; those already there are left as they are. Workers refuse to start without
    them. The Temporal server is the one every command connects to (`procbus --address`,
    PROCBUS_TEMPORAL_ADDRESS, TEMPORAL_ADDRESS, a temporal.toml profile, else `procbus dev`'s)."""

    async def run() -> int:
        from procbus.config import load_settings
        from procbus.stack import resolve_temporal
        from procbus.temporal import Registration, connect_client, ensure_search_attributes

        settings = load_settings()
        services = resolve_temporal(settings)
        address, chosen = services.temporal_address, namespace or services.namespace
        client = await connect_client(address, chosen, settings, options=services.temporal_options)
        done = await ensure_search_attributes(client, chosen)
        if json_output:
            print_json(
                {
                    "namespace": chosen,
                    "attributes": [
                        {"name": item.name, "type": item.type, "outcome": item.outcome.value}
                        for item in done
                    ],
                }
            )
            return 0
        from rich.table import Table

        grid = Table(show_header=False, box=None)
        for item in done:
            if item.outcome == Registration.ADDED:
                grid.add_row(item.name, item.type, styled("added", "green"))
            else:
                grid.add_row(item.name, item.type, styled("already there", "dim"))
        console.print(f"namespace {chosen} at {address}", highlight=False)
        console.print(grid)
        return 0

    run_command(run())
