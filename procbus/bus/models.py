"""The bus's messages and outcomes as JSON-friendly models. Pure: safe in the workflow sandbox."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from procbus.core import MemberReport, WorkflowInput
from procbus.lakehouse import TableDescriptor
from procbus.lakehouse.models import AccessEntry

# ---- operations a member applies ----


class PutDescriptor(BaseModel):
    """Put a table in the member's descriptor cache (after CreateTable)."""

    kind: Literal["put_descriptor"] = "put_descriptor"
    table: TableDescriptor
    new_table: bool = Field(
        default=False,
        description="the table was just created: grants a member still holds for an earlier "
        "table of that name are dropped (the catalog dropped them with it)",
    )
    grants: list[AccessEntry] = Field(
        default_factory=list, description="a new table's creator's grants, in the catalog with it"
    )


class EvictDescriptor(BaseModel):
    """Take a table out of the member's descriptor cache (DeleteTable)."""

    kind: Literal["evict_descriptor"] = "evict_descriptor"
    qualified_name: str


class ChangeAccessOperation(BaseModel):
    """Grant or revoke one permission in the member's ACL cache."""

    kind: Literal["change_access"] = "change_access"
    action: Literal["grant", "revoke"]
    entry: AccessEntry


class ResetNamespaceGrants(BaseModel):
    """The member's grants on a namespace as a whole become `grants` (after CreateNamespace):
    any left from an earlier namespace of that name go (the catalog dropped them with it)."""

    kind: Literal["reset_namespace_grants"] = "reset_namespace_grants"
    namespace: str
    grants: list[AccessEntry] = Field(
        default_factory=list, description="a new namespace's creator's, in the catalog with it"
    )

    @model_validator(mode="after")
    def _on_the_namespace(self) -> ResetNamespaceGrants:
        for entry in self.grants:
            if entry.namespace != self.namespace or not entry.namespace_wide:
                raise ValueError(f"{entry} is not a grant on namespace {self.namespace!r}")
        return self


class ReportState(BaseModel):
    """Read only: the member answers with what its caches hold."""

    kind: Literal["report"] = "report"


Operation = Annotated[
    PutDescriptor | EvictDescriptor | ChangeAccessOperation | ResetNamespaceGrants | ReportState,
    Field(discriminator="kind"),
]


class BusMessage(BaseModel):
    """One operation sent to members; `operation_id` makes every phase of it idempotent."""

    operation_id: str
    operation: Operation


# ---- members ----


class Member(BaseModel):
    """A registered worker process: where to send it operations, and its heartbeat."""

    member_id: str
    task_queue: str
    host: str
    pid: int
    started_at: datetime
    heartbeat_at: datetime
    timeout_seconds: float
    live: bool = True


class ListMembers(BaseModel):
    """The coordinator's question: which members are live now (no options yet)."""


class MemberList(BaseModel):
    """The bus's live members."""

    members: list[Member]


class MemberReply(BaseModel):
    """A member's answer to one phase of an operation."""

    member_id: str
    phase: str
    changed: bool = Field(description="false when the member had seen this phase already")
    report: MemberReport | None = None


class BroadcastInput(WorkflowInput):
    """A broadcast on its own (not a procedure step): one phase, or two when `two_phase`.

    It may only read: an operation that changes the members' caches comes from the procedure
    that owns the change (CreateNamespace, CreateTable, DeleteTable, ChangeAccess), after the
    catalog has it, or a client could change every worker's ACL cache without the catalog.
    """

    operation: Operation
    two_phase: bool = False
    answer_timeout_seconds: float = Field(
        default=10.0, gt=0, description="resend to a live member that has not answered by then"
    )
    max_sends: int = Field(default=5, ge=1, description="a live member that never answers fails")

    @field_validator("operation")
    @classmethod
    def _read_only(cls, operation: Operation) -> Operation:
        if not isinstance(operation, ReportState):
            raise ValueError(
                f"a Broadcast on its own may only read (kind 'report'), not {operation.kind!r}: "
                "changes to the workers' caches come from the procedures that own them "
                "(CreateNamespace, CreateTable, DeleteTable, ChangeAccess)"
            )
        return operation
