"""`procbus acl grant|revoke|list`: permissions on tables and namespaces, changed on every
worker at once.

A grant is on NAMESPACE.TABLE, or on NAMESPACE.* (quote it in a shell): the namespace, so every
table in it, now and later. grant and revoke start a ChangeAccess procedure (a two-phase
broadcast around the catalog write); list reads the catalog.
"""

from __future__ import annotations

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
from procbus.starter.tables import catalog

acl_app = typer.Typer(
    help="Permissions on tables and namespaces: kept in the catalog, cached and enforced on "
    "every worker.",
    no_args_is_help=True,
)

PRINCIPAL = typer.Argument(..., help="Who: a user or service name.")
TABLE = typer.Argument(
    ...,
    metavar="TARGET",
    help="NAMESPACE.TABLE, or 'NAMESPACE.*' (quoted) for the namespace: every table in it, "
    "now and later.",
)
PERMISSION = typer.Argument(..., help="read, write or admin (may grant and revoke)")


def _change(
    action: str,
    principal: str,
    table: str,
    permission: str,
    wait: bool,
    json_output: bool,
    procedure_id: str | None,
    as_principal: str | None,
    deadline: float | None,
) -> None:
    from procbus.lakehouse import ChangeAccessInput
    from procbus.procedures import new_procedure_id

    request = ChangeAccessInput.model_validate(
        {
            "action": action,
            "principal": principal,
            "table": table,
            "permission": permission,
            "deadline_seconds": deadline,
        }
    )
    entry = request.check()  # a bad name or permission never starts anything
    # No '*' in a procedure ID: pasted into a shell unquoted, it would be a glob.
    procedure_id = procedure_id or new_procedure_id(
        "ChangeAccess", f"{entry.namespace}.all-tables" if entry.namespace_wide else table
    )
    run_command(
        start("ChangeAccess", table, request, procedure_id, wait, json_output, as_principal)
    )


@acl_app.command("grant")
def acl_grant(
    principal: str = PRINCIPAL,
    table: str = TABLE,
    permission: str = PERMISSION,
    wait: bool = WAIT_OPTION,
    json_output: bool = JSON_OPTION,
    procedure_id: str | None = ID_OPTION,
    as_principal: str | None = AS_OPTION,
    deadline: float | None = DEADLINE_OPTION,
) -> None:
    """Grant PERMISSION on TARGET to PRINCIPAL on every worker (all or none). On 'NS.*' it
    holds for every table in NS, now and later; only an admin of the namespace may give it."""
    _change(
        "grant",
        principal,
        table,
        permission,
        wait,
        json_output,
        procedure_id,
        as_principal,
        deadline,
    )


@acl_app.command("revoke")
def acl_revoke(
    principal: str = PRINCIPAL,
    table: str = TABLE,
    permission: str = PERMISSION,
    wait: bool = WAIT_OPTION,
    json_output: bool = JSON_OPTION,
    procedure_id: str | None = ID_OPTION,
    as_principal: str | None = AS_OPTION,
    deadline: float | None = DEADLINE_OPTION,
) -> None:
    """Revoke PERMISSION on TARGET from PRINCIPAL on every worker; once it succeeded, no worker
    lets PRINCIPAL do it through this grant (a grant on the table or on its namespace, whichever
    is left, still counts)."""
    _change(
        "revoke",
        principal,
        table,
        permission,
        wait,
        json_output,
        procedure_id,
        as_principal,
        deadline,
    )


@acl_app.command("list")
def acl_list(json_output: bool = JSON_OPTION) -> None:
    """Every grant in the catalog; NS.* is a grant on the namespace NS (every table in it).
    --json: one object per grant, "table" "*" and "scope" "namespace" for those."""

    async def run() -> int:
        async with catalog() as lake:
            entries = await lake.list_access()
        if json_output:
            print_json(
                [entry.model_dump(mode="json") | {"scope": entry.scope} for entry in entries]
            )
            return 0
        if not entries:
            console.print("no grants")
            return 0
        from rich.table import Table

        on_namespaces = any(entry.namespace_wide for entry in entries)
        grid = Table(
            "table",
            "principal",
            "permission",
            caption="NS.*: the namespace NS, every table in it" if on_namespaces else None,
        )
        for entry in entries:
            grid.add_row(entry.qualified_table, entry.principal, entry.permission.value)
        console.print(grid)
        return 0

    run_command(run())
