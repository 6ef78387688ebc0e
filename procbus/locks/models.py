"""What goes in and out of the lock table, as JSON-friendly models (safe in the workflow sandbox).

The grants and fences themselves are procbus.core.fences: every layer that writes carries them.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field, field_validator

from procbus.core import Fence, LockGrant, LockMode
from procbus.locks.modes import parse_path, stronger

DEFAULT_LEASE_SECONDS = 30.0


class Blocker(BaseModel):
    """A holder that stands in a waiting lock's way."""

    holder: str
    mode: LockMode
    granted: bool


class LockWait(BaseModel):
    """A request still queued: what it waits for and behind whom (granted first, then queue)."""

    resource: str
    mode: LockMode
    behind: list[Blocker] = Field(default_factory=list)

    def describe(self) -> str:
        behind = ", ".join(
            f"{b.holder} ({b.mode.value}, {'holding' if b.granted else 'queued'})"
            for b in self.behind
        )
        return f"{self.resource} ({self.mode.value}) behind {behind or 'nobody'}"


class LockSpec(BaseModel):
    """One lock of a set: a resource path and its mode."""

    resource: str
    mode: LockMode


class LockSetRequest(BaseModel):
    """A holder's whole lock set, already expanded (intention locks included)."""

    holder: str
    locks: list[LockSpec]
    family: list[str] = Field(
        default_factory=list, description="ancestor procedures whose locks this one inherits"
    )
    lease_seconds: float = DEFAULT_LEASE_SECONDS
    execution: str | None = Field(
        default=None,
        description="the holder's execution (a procedure's first run ID): once it released,"
        " a late request of it takes nothing",
    )

    @field_validator("lease_seconds")
    @classmethod
    def _positive_lease(cls, value: float) -> float:
        if value <= 0:
            raise ValueError(f"the lease TTL must be more than 0 seconds, got {value}")
        return value

    @field_validator("holder")
    @classmethod
    def _named_holder(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("the lock holder is empty")
        return value


class LockSetState(BaseModel):
    """A holder's lock set: what is granted, what waits, and until when the leases run."""

    holder: str
    grants: list[LockGrant] = Field(default_factory=list)
    waiting: list[LockWait] = Field(default_factory=list)
    lease_expires_at: datetime | None = None
    woken: list[str] = Field(
        default_factory=list, description="other holders granted something by this call"
    )

    @property
    def granted(self) -> bool:
        return not self.waiting


class HoldRequest(BaseModel):
    """Keep a granted lock set's leases alive while its holder lives."""

    holder: str
    grants: list[LockGrant]
    lease_seconds: float = DEFAULT_LEASE_SECONDS
    leased_until: datetime | None = Field(
        default=None, description="when the leases run out unless renewed (database time)"
    )
    # The activity returns after this long and is started again: no activity runs for days.
    max_seconds: float = 3600.0


class HoldResult(BaseModel):
    """How a run of the lease keeper ended: the leases' expiry it left (None: released)."""

    leased_until: datetime | None = None


class ReleaseRequest(BaseModel):
    """Release every lock of a holder."""

    holder: str
    execution: str | None = Field(
        default=None, description="recorded: a later request of this execution is refused"
    )


class ReleaseResult(BaseModel):
    """The holders a release granted something to."""

    woken: list[str] = Field(default_factory=list)


class InheritedLocks(BaseModel):
    """What a child procedure's input says it inherits, to check against the lock table."""

    holder: str = Field(description="the child")
    family: list[str] = Field(description="its ancestors, parent first, as its input says")
    grants: list[LockGrant]


class InheritedLocksCheck(BaseModel):
    refusal: str | None = Field(default=None, description="why they are not its ancestors'")


class LockEntry(BaseModel):
    """One row of `procbus lock list`."""

    resource: str
    mode: LockMode
    holder: str
    token: int | None
    queue_position: int
    requested_at: datetime
    granted_at: datetime | None
    lease_expires_at: datetime
    expired: bool

    @property
    def granted(self) -> bool:
        return self.token is not None


class ResourceLocks(BaseModel):
    """One resource of `procbus lock list`: its holders, then its waiters in queue order."""

    resource: str
    holders: list[LockEntry] = Field(default_factory=list)
    waiters: list[LockEntry] = Field(default_factory=list, description="in queue order")


def by_resource(entries: list[LockEntry]) -> list[ResourceLocks]:
    """Group lock entries by resource, holders first, as the lock table lists them."""
    resources: dict[str, ResourceLocks] = {}
    for entry in entries:
        current = resources.setdefault(entry.resource, ResourceLocks(resource=entry.resource))
        (current.holders if entry.granted else current.waiters).append(entry)
    return list(resources.values())


def fence_for(grants: list[LockGrant], resource: str, mode: LockMode = LockMode.X) -> Fence | None:
    """Return the fence of a write to `resource` under these grants; None if they do not cover it.

    `mode` IX: an append under an intention lock on `resource` (a load), fenced by that lock
    when nothing stronger covers it.
    """
    covering = covering_grant(grants, resource, LockMode.X)
    fenced_mode = LockMode.X
    if covering is None and mode is LockMode.IX:
        covering, fenced_mode = covering_grant(grants, resource, LockMode.IX), LockMode.IX
    if covering is None:
        return None
    above = parse_path(covering.resource)[:-1]
    ancestors = {"/".join(above[:depth]) for depth in range(1, len(above) + 1)}
    return Fence(
        resource=covering.resource,
        token=covering.token,
        path=[grant for grant in grants if grant.resource in ancestors],
        mode=fenced_mode,
    )


def covering_grant(grants: list[LockGrant], resource: str, mode: LockMode) -> LockGrant | None:
    """Return the grant that already gives `mode` on `resource`, or None.

    The same resource in a mode at least as strong, or an ancestor in S/SIX (reads below) or X
    (everything below).
    """
    segments = parse_path(resource)
    by_resource = {grant.resource: grant for grant in grants}
    same = by_resource.get(resource)
    if same is not None and stronger(same.mode, mode) is same.mode:
        return same
    reads = mode in (LockMode.IS, LockMode.S)
    for depth in range(len(segments) - 1, 0, -1):
        ancestor = by_resource.get("/".join(segments[:depth]))
        if ancestor is None:
            continue
        if ancestor.mode is LockMode.X or (reads and ancestor.mode in (LockMode.S, LockMode.SIX)):
            return ancestor
    return None


# Sent to a waiting procedure when a release granted it something: it asks again at once.
LOCKS_CHANGED_SIGNAL = "procbus_locks_changed"


class LockRelease(BaseModel):
    """Locks released by someone other than their holder, and the audit row that says so."""

    holder: str
    execution: str | None = None
    resources: list[str] = Field(default_factory=list, description="empty: it held none")
    audit_id: int | None = None
    woken: list[str] = Field(default_factory=list)


class LockAudit(BaseModel):
    """One row of `procbus lock audit`: who released whose locks, and why."""

    id: int
    holder: str
    execution: str | None
    resources: list[str]
    released_by: str
    reason: str
    released_at: datetime
