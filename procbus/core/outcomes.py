"""What a broadcast did at each member: outcomes, counts, the members' own reports.

Pure data with no other procbus imports, so procedure status can hold it.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, Field


class MemberReport(BaseModel):
    """What a member's caches hold, and how often each operation took effect on it."""

    member_id: str
    started_at: datetime
    tables: list[str]
    access: list[dict[str, Any]] = Field(
        default_factory=list, description="ACL entries: principal, namespace, table, permission"
    )
    applied: dict[str, int] = Field(
        default_factory=dict, description="operation ID -> times it changed this member's state"
    )
    staged: list[str] = Field(default_factory=list, description="prepared, not yet decided")


class MemberOutcome(StrEnum):
    """Where one member is in an operation."""

    PENDING = "pending"
    APPLIED = "applied"  # one phase: done
    PREPARED = "prepared"  # two phase: staged, waiting for the decision
    COMMITTED = "committed"
    ABORTED = "aborted"
    DROPPED = "dropped"  # stopped heartbeating: out of the set, rebuilds from the catalog
    FAILED = "failed"  # refused or never answered while alive


class MemberResult(BaseModel):
    """One member's outcome in a bus operation."""

    member_id: str
    outcome: MemberOutcome = MemberOutcome.PENDING
    sends: int = Field(default=0, description="how often the coordinator sent it this phase")
    error: str | None = None
    report: MemberReport | None = None


class BroadcastResult(BaseModel):
    """The outcome of one bus operation on every member."""

    operation_id: str
    succeeded: bool = True
    members: list[MemberResult] = Field(default_factory=list)
    error: str | None = None

    def summary(self) -> str:
        if not self.members:
            return "no members"
        return ", ".join(f"{m.member_id} {m.outcome.value}" for m in self.members)
