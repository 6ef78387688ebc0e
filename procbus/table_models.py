"""Inputs and results of the table procedures and of their steps: JSON-friendly models.

Procedure inputs hold plain strings so the `temporal` CLI can send them; the procedures check
them (procbus.catalog) before any step runs.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field

from procbus.catalog import NamespaceDescriptor, TableDescriptor
from procbus.lock_models import Fence
from procbus.procedures.models import ProcedureInput


class CreateNamespaceInput(ProcedureInput):
    namespace: str
    properties: dict[str, str] = Field(default_factory=dict)


class DeleteNamespaceInput(ProcedureInput):
    namespace: str


class CreateTableInput(ProcedureInput):
    table: str = Field(description="NAMESPACE.TABLE")
    columns: str = Field(description="NAME:TYPE pairs, e.g. 'id:bigint,amount:double'")
    partition_by: list[str] = Field(default_factory=list)
    properties: dict[str, str] = Field(default_factory=dict)


class DeleteTableInput(ProcedureInput):
    table: str = Field(description="NAMESPACE.TABLE")


def namespace_resource(namespace: str) -> str:
    """The lock resource of a namespace."""
    return namespace


def table_resource(namespace: str, table: str) -> str:
    """The lock resource of a table: below its namespace's."""
    return f"{namespace}/{table}"


class NamespaceResult(BaseModel):
    namespace: NamespaceDescriptor


class TableResult(BaseModel):
    table: TableDescriptor


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
