"""The lake catalog's objects, and the inputs and results of the table procedures and their
steps: JSON-friendly models, safe in the workflow sandbox.

Procedure inputs hold plain strings so the `temporal` CLI can send them; `check()` turns them
into checked names and schemas (InvalidRequest), and runs both in the procedure, before any step,
and in the `procbus` CLI, before anything is started.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

from procbus.lakehouse.names import (
    Column,
    parse_columns,
    parse_table_name,
    validate_name,
    validate_partitioning,
)
from procbus.locks.models import Fence
from procbus.procedures.models import ProcedureInput


class TableDescriptor(BaseModel):
    namespace: str
    name: str
    columns: list[Column]
    partition_by: list[str] = Field(default_factory=list)
    properties: dict[str, str] = Field(default_factory=dict)
    location: str = ""
    created_by: str = ""
    created_at: datetime | None = None

    @property
    def qualified_name(self) -> str:
        return f"{self.namespace}.{self.name}"


class NamespaceDescriptor(BaseModel):
    name: str
    properties: dict[str, str] = Field(default_factory=dict)
    created_by: str = ""
    created_at: datetime | None = None


# ---- procedure inputs ----


class CreateNamespaceInput(ProcedureInput):
    namespace: str
    properties: dict[str, str] = Field(default_factory=dict)

    def check(self) -> str:
        return validate_name("namespace", self.namespace)


class DeleteNamespaceInput(ProcedureInput):
    namespace: str

    def check(self) -> str:
        return validate_name("namespace", self.namespace)


class CreateTableInput(ProcedureInput):
    table: str = Field(description="NAMESPACE.TABLE")
    columns: str = Field(description="NAME:TYPE pairs, e.g. 'id:bigint,amount:double'")
    partition_by: list[str] = Field(default_factory=list)
    properties: dict[str, str] = Field(default_factory=dict)

    def check(self, created_by: str = "") -> TableDescriptor:
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
        )


class DeleteTableInput(ProcedureInput):
    table: str = Field(description="NAMESPACE.TABLE")

    def check(self) -> tuple[str, str]:
        return parse_table_name(self.table)


# ---- results ----


class NamespaceResult(BaseModel):
    namespace: NamespaceDescriptor


class TableResult(BaseModel):
    table: TableDescriptor


# ---- steps ----


class NamespaceStep(BaseModel):
    procedure_id: str
    namespace: NamespaceDescriptor
    fence: Fence | None = None


class NamespaceRef(BaseModel):
    procedure_id: str
    namespace: str
    fence: Fence | None = None


class TableStep(BaseModel):
    procedure_id: str
    table: TableDescriptor
    fence: Fence | None = None


class EventStep(BaseModel):
    procedure_id: str
    event_type: str
    namespace: str
    table: str | None = None
    payload: dict[str, Any] = Field(default_factory=dict)
    fence: Fence | None = None
