"""What a write carries to prove that its locks are still its own: a lock's mode, a grant with its
fencing token, and the fence. Pure data: safe in the workflow sandbox.

A grant's fencing token travels with every write a step makes under it (`Fence`); the catalog
refuses, in the write's own transaction, a token older than the resource's newest one. The
modes' lattice, the lock paths and the lock table are procbus.locks.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, Field


class LockMode(StrEnum):
    IS = "IS"  # intends to read somewhere below
    IX = "IX"  # intends to write somewhere below
    S = "S"  # reads this node and everything below
    SIX = "SIX"  # reads everything below and intends to write somewhere below
    X = "X"  # writes this node and everything below


class LockGrant(BaseModel):
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
