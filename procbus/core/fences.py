"""What a write carries to prove that its locks are still its own: a lock's mode, a grant with its
fencing token, and the fence. Pure data: safe in the workflow sandbox.

A grant's fencing token travels with every write a step makes under it (`Fence`); the catalog
refuses, in the write's own transaction, a token older than the resource's newest one. The
modes' lattice, the lock paths and the lock table are procbus.locks.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, Field


class LockMode(StrEnum):
    """Hierarchical lock modes: intention (IS, IX), shared (S, SIX) and exclusive (X)."""

    IS = "IS"  # intends to read somewhere below
    IX = "IX"  # intends to write somewhere below
    S = "S"  # reads this node and everything below
    SIX = "SIX"  # reads everything below and intends to write somewhere below
    X = "X"  # writes this node and everything below


class LockGrant(BaseModel):
    """A granted lock and its fencing token."""

    resource: str
    mode: LockMode
    token: int


class Fence(BaseModel):
    """What a write carries to prove, where it happens, that its locks are still its own: the
    fencing token of the lock on the written resource (or the ancestor lock covering it) and the
    tokens of the intention locks above it.

    `mode` X (a write that excludes every other): the token must also be the resource's newest.
    IX (an append beside others, a load under its intention lock on the table): several hold
    the resource at once, so only that the lock is still held counts."""

    resource: str
    token: int
    path: list[LockGrant] = Field(default_factory=list, description="the locks on the ancestors")
    mode: LockMode = LockMode.X


_FENCE_FIELDS = frozenset(Fence.model_fields)


def refenced(value: Any, new_fence: Callable[[Fence], Fence | None]) -> Any:
    """Return `value` with every fence in it replaced by `new_fence` of it.

    After the locks were taken again, the same writes carry the new grants' tokens. A fence is
    an object with exactly Fence's keys.

    Args:
        value: a step's or an undo's argument, as JSON.
        new_fence: the fence to put in place of one; None keeps it.
    """
    if isinstance(value, dict):
        if value.keys() == _FENCE_FIELDS:
            new = new_fence(Fence.model_validate(value))
            return value if new is None else new.model_dump(mode="json")
        return {key: refenced(item, new_fence) for key, item in value.items()}
    if isinstance(value, list):
        return [refenced(item, new_fence) for item in value]
    return value
