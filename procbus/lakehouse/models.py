"""The lake catalog's objects, and the inputs and results of the table procedures and their
steps: JSON-friendly models, safe in the workflow sandbox.

Procedure inputs hold plain strings so the `temporal` CLI can send them; `check()` turns them
into checked names and schemas (InvalidRequest), and runs both in the procedure, before any step,
and in the `procbus` CLI, before anything is started.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, Field

from procbus.core import (
    ALL_TABLES,
    Fence,
    MemberResult,
    check_principal,
    parse_grant_target,
    parse_table_name,
    validate_name,
)
from procbus.errors import InvalidRequest
from procbus.lakehouse.schemas import Column, parse_columns, validate_partitioning
from procbus.procedures import ProcedureInput


class TableDescriptor(BaseModel):
    """A table as the catalog records it."""

    namespace: str
    name: str
    columns: list[Column]
    partition_by: list[str] = Field(default_factory=list)
    properties: dict[str, str] = Field(default_factory=dict)
    location: str = ""
    created_by: str = ""
    created_run: str = Field(
        default="",
        description="the first run ID of the procedure that made it (empty: made before "
        "procbus recorded it); with created_by, what tells its maker's own undo and retries",
    )
    created_at: datetime | None = None
    key_columns: list[str] = Field(
        default_factory=list,
        description="the key a change pipeline applies its rows by (set by its first apply)",
    )
    metadata_location: str = Field(
        default="", description="its current Iceberg metadata file (as read with it)"
    )

    @property
    def qualified_name(self) -> str:
        return f"{self.namespace}.{self.name}"

    @property
    def maker(self) -> str:
        """Its maker as one key (what names its first metadata file): the procedure ID, with
        the procedure's first run ID when recorded."""
        return f"{self.created_by}@{self.created_run}" if self.created_run else self.created_by

    def made_by(self, procedure_id: str, procedure_run: str) -> bool:
        """Whether this run of that procedure made it: a later procedure under the same
        workflow ID did not."""
        return self.created_by == procedure_id and self.created_run == procedure_run


class NamespaceDescriptor(BaseModel):
    """A namespace as the catalog records it."""

    name: str
    properties: dict[str, str] = Field(default_factory=dict)
    created_by: str = ""
    created_run: str = Field(
        default="",
        description="the first run ID of the procedure that made it (empty: made before "
        "procbus recorded it); with created_by, what tells its maker's own undo and retries",
    )
    created_at: datetime | None = None

    def made_by(self, procedure_id: str, procedure_run: str) -> bool:
        """Whether this run of that procedure made it (see TableDescriptor.made_by)."""
        return self.created_by == procedure_id and self.created_run == procedure_run


# ---- procedure inputs ----


class CreateNamespaceInput(ProcedureInput):
    """Input of CreateNamespace."""

    namespace: str
    properties: dict[str, str] = Field(default_factory=dict)

    def check(self) -> str:
        return validate_name("namespace", self.namespace)


class DeleteNamespaceInput(ProcedureInput):
    """Input of DeleteNamespace: the namespace must be empty."""

    namespace: str

    def check(self) -> str:
        return validate_name("namespace", self.namespace)


class CreateTableInput(ProcedureInput):
    """Input of CreateTable."""

    table: str = Field(description="NAMESPACE.TABLE")
    columns: str = Field(description="NAME:TYPE pairs, e.g. 'id:bigint,amount:double'")
    partition_by: list[str] = Field(default_factory=list)
    properties: dict[str, str] = Field(default_factory=dict)

    def check(self, created_by: str = "", created_run: str = "") -> TableDescriptor:
        """The table asked for, every name and type checked."""
        namespace, name = parse_table_name(self.table)
        columns = parse_columns(self.columns)
        return TableDescriptor(
            namespace=namespace,
            name=name,
            columns=columns,
            partition_by=validate_partitioning(columns, self.partition_by),
            properties=self.properties,
            created_by=created_by,
            created_run=created_run,
        )


class DeleteTableInput(ProcedureInput):
    """Who asks is the start's verified principal (never a field a client could just write)."""

    table: str = Field(description="NAMESPACE.TABLE")

    def check(self) -> tuple[str, str]:
        return parse_table_name(self.table)


# ---- results ----


class NamespaceResult(BaseModel):
    """The result of CreateNamespace or DeleteNamespace."""

    namespace: NamespaceDescriptor


class TableResult(BaseModel):
    """The result of CreateTable or DeleteTable."""

    table: TableDescriptor


# ---- steps ----


class NamespaceStep(BaseModel):
    procedure_id: str
    namespace: NamespaceDescriptor
    fence: Fence | None = None
    grants: list[AccessEntry] = Field(
        default_factory=list, description="CreateNamespace: its creator's, added with it"
    )


class NamespaceRef(BaseModel):
    procedure_id: str
    namespace: str
    fence: Fence | None = None
    requested_by: str | None = None  # who asks: its verified principal, an admin to delete it


class TableStep(BaseModel):
    procedure_id: str
    table: TableDescriptor
    fence: Fence | None = None
    principal: str | None = None  # who asks: its verified principal
    grants: list[AccessEntry] = Field(
        default_factory=list, description="CreateTable: its creator's, added with the table"
    )


class EventStep(BaseModel):
    procedure_id: str
    procedure_run: str = ""  # the procedure's first run ID: its event is its own only with it
    event_type: str
    namespace: str
    table: str | None = None
    payload: dict[str, Any] = Field(default_factory=dict)
    fence: Fence | None = None


class Permission(StrEnum):
    READ = "read"  # read the table's data
    WRITE = "write"  # change the table's data: load, compact, delete it
    # Grant and revoke permissions on the table (its creator has it); on a namespace, on the
    # namespace and on every table in it (its creator has it).
    ADMIN = "admin"


class AccessEntry(BaseModel):
    """One grant: `principal` may `permission` on `namespace.table`; with table ALL_TABLES
    ('*'), on the namespace: every table in it, now and later (and, for admin, grants on the
    namespace itself)."""

    principal: str
    namespace: str
    table: str
    permission: Permission

    @property
    def namespace_wide(self) -> bool:
        return self.table == ALL_TABLES

    @property
    def scope(self) -> Literal["namespace", "table"]:
        return "namespace" if self.namespace_wide else "table"

    @property
    def qualified_table(self) -> str:
        """'sales.orders', or 'sales.*' for a grant on the namespace."""
        return f"{self.namespace}.{self.table}"

    def on_namespace(self) -> AccessEntry:
        """The same permission on this entry's whole namespace: it allows this entry too."""
        return self.model_copy(update={"table": ALL_TABLES})

    def __str__(self) -> str:
        return f"{self.principal} {self.permission.value} on {self.qualified_table}"


class ChangeAccessInput(ProcedureInput):
    """Grant or revoke one permission, on every worker at once (a two-phase broadcast)."""

    action: Literal["grant", "revoke"]
    principal: str = Field(description="who: a user or service name, e.g. 'etl' or 'ana@corp'")
    table: str = Field(
        description="NAMESPACE.TABLE, or NAMESPACE.* for the namespace: every table in it, now "
        "and later"
    )
    permission: str = Field(description="read, write or admin")

    def check(self) -> AccessEntry:
        check_principal(self.principal)
        namespace, table = parse_grant_target(self.table)
        try:
            permission = Permission(self.permission)
        except ValueError:
            known = ", ".join(p.value for p in Permission)
            raise InvalidRequest(
                f"unknown permission {self.permission!r}: expected one of {known}"
            ) from None
        return AccessEntry(
            principal=self.principal, namespace=namespace, table=table, permission=permission
        )


class AccessStep(BaseModel):
    procedure_id: str
    action: Literal["grant", "revoke"]
    entry: AccessEntry
    fence: Fence | None = None
    requested_by: str | None = None  # who asks: its verified principal, an admin of the target


def creator_grants(table: TableDescriptor, principal: str) -> list[AccessEntry]:
    """What a table's creator gets: admin (so someone may grant on it) and write."""
    return [
        AccessEntry(principal=principal, namespace=table.namespace, table=table.name, permission=p)
        for p in (Permission.ADMIN, Permission.WRITE)
    ]


def namespace_creator_grants(namespace: str, principal: str) -> list[AccessEntry]:
    """What a namespace's creator gets: admin on it (it may grant on it and on its tables)."""
    return [
        AccessEntry(
            principal=principal, namespace=namespace, table=ALL_TABLES, permission=Permission.ADMIN
        )
    ]


TableStep.model_rebuild()
NamespaceStep.model_rebuild()


class AccessResult(BaseModel):
    action: Literal["grant", "revoke"]
    entry: AccessEntry
    members: list[MemberResult] = Field(
        default_factory=list, description="each worker's outcome of the two-phase update"
    )
