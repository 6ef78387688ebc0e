"""Hierarchical locks with leases and fencing tokens, kept in PostgreSQL.

modes: the multiple-granularity lattice and resource paths (pure); models: what goes in and out
of the lock table (pure, safe in the workflow sandbox); table: the lock table itself. The modes,
grants and fences every writer carries are procbus.core.fences.
"""

from procbus.core import Fence, LockGrant, LockMode
from procbus.errors import LockError, LockLost, LocksReleased, LockTimeout, StaleFencingToken
from procbus.locks.models import (
    DEFAULT_LEASE_SECONDS,
    LOCKS_CHANGED_SIGNAL,
    Blocker,
    HoldRequest,
    HoldResult,
    LockEntry,
    LockSetRequest,
    LockSetState,
    LockSpec,
    LockWait,
    ReleaseRequest,
    ReleaseResult,
    ResourceLocks,
    by_resource,
    covering_grant,
    fence_for,
)
from procbus.locks.modes import LockRequest, expand, parse_mode, parse_path
from procbus.locks.table import LockTable, check_fence, fence_of, lock_set

__all__ = [
    "DEFAULT_LEASE_SECONDS",
    "LOCKS_CHANGED_SIGNAL",
    "Blocker",
    "Fence",
    "HoldRequest",
    "HoldResult",
    "LockEntry",
    "LockError",
    "LockGrant",
    "LockLost",
    "LockMode",
    "LockRequest",
    "LockSetRequest",
    "LockSetState",
    "LockSpec",
    "LockTable",
    "LockTimeout",
    "LockWait",
    "LocksReleased",
    "ReleaseRequest",
    "ReleaseResult",
    "ResourceLocks",
    "StaleFencingToken",
    "by_resource",
    "check_fence",
    "covering_grant",
    "expand",
    "fence_for",
    "fence_of",
    "lock_set",
    "parse_mode",
    "parse_path",
]
