"""Multiple-granularity lock modes (Gray et al.) on resource paths: the pure part of the locks.

Resources are paths, root first: `sales`, `sales/orders`, `sales/orders/dt=2026-11-22`. Locking
a node in S or X takes IS or IX on each ancestor, so "read the whole table" (S on the table) and
"write one partition" (X on the partition, IX on the table) conflict exactly when they should.
A lock set is acquired in one canonical order (root to leaf, then by path), which rules out
deadlock between lock sets; duplicates merge to the stronger mode. The modes themselves are
procbus.core.fences.LockMode.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from procbus.core import LockMode
from procbus.errors import LockError

MAX_DEPTH = 8
MAX_PATH_LENGTH = 512
_SEGMENT = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_=.\-]*$")


_COMPATIBLE: dict[LockMode, frozenset[LockMode]] = {
    LockMode.IS: frozenset({LockMode.IS, LockMode.IX, LockMode.S, LockMode.SIX}),
    LockMode.IX: frozenset({LockMode.IS, LockMode.IX}),
    LockMode.S: frozenset({LockMode.IS, LockMode.S}),
    LockMode.SIX: frozenset({LockMode.IS}),
    LockMode.X: frozenset(),
}

# Modes that are at least as strong as each mode (the lattice IS < IX, S < SIX < X).
_COVERS: dict[LockMode, frozenset[LockMode]] = {
    LockMode.IS: frozenset(LockMode),
    LockMode.IX: frozenset({LockMode.IX, LockMode.SIX, LockMode.X}),
    LockMode.S: frozenset({LockMode.S, LockMode.SIX, LockMode.X}),
    LockMode.SIX: frozenset({LockMode.SIX, LockMode.X}),
    LockMode.X: frozenset({LockMode.X}),
}


def compatible(held: LockMode, wanted: LockMode) -> bool:
    return wanted in _COMPATIBLE[held]


def stronger(first: LockMode, second: LockMode) -> LockMode:
    """The weakest mode at least as strong as both (IX with S gives SIX)."""
    both = _COVERS[first] & _COVERS[second]
    return max(both, key=lambda mode: len(_COVERS[mode]))  # covered by the most: the weakest


def intention(mode: LockMode) -> LockMode:
    """What a lock in `mode` takes on every ancestor."""
    return LockMode.IS if mode in (LockMode.IS, LockMode.S) else LockMode.IX


def parse_mode(text: str) -> LockMode:
    """Return the lock mode `text` names (case and spaces ignored).

    Args:
        text: a mode's name, such as "shared" or "X".

    Raises:
        LockError: when no mode has that name.
    """
    try:
        return LockMode(text.strip().upper())
    except ValueError:
        known = ", ".join(mode.value for mode in LockMode)
        raise LockError(f"unknown lock mode {text!r}; known: {known}") from None


def parse_path(path: str) -> tuple[str, ...]:
    """Split a lock path into its segments: 'sales/orders' -> ('sales', 'orders').

    Raises:
        LockError: when the path is empty, too long or too deep, or a segment empty or bad.
    """
    if not path or not path.strip():
        raise LockError("the lock path is empty")
    if len(path) > MAX_PATH_LENGTH:
        raise LockError(f"the lock path is {len(path)} characters; at most {MAX_PATH_LENGTH}")
    segments = tuple(path.split("/"))
    if len(segments) > MAX_DEPTH:
        raise LockError(
            f"the lock path {path!r} is {len(segments)} levels deep; at most {MAX_DEPTH}"
        )
    for segment in segments:
        if not segment:
            raise LockError(f"the lock path {path!r} has an empty segment")
        if not _SEGMENT.fullmatch(segment) or segment in (".", ".."):
            raise LockError(
                f"the lock path {path!r} has a bad segment {segment!r}: use letters, digits, "
                "'_', '=', '.', '-', starting with a letter, digit or '_'"
            )
    return segments


@dataclass(frozen=True, order=True)
class LockRequest:
    path: str
    mode: LockMode

    @property
    def segments(self) -> tuple[str, ...]:
        return tuple(self.path.split("/"))


def canonical_key(request: LockRequest) -> tuple[int, tuple[str, ...]]:
    """Root to leaf, then by path: every lock set is acquired in this one order."""
    return len(request.segments), request.segments


def expand(requests: Iterable[tuple[str, LockMode | str]]) -> list[LockRequest]:
    """Return the full lock set: intention modes on ancestors, duplicates merged, canonical order.

    Raises:
        LockError: for a bad path or an unknown mode.
    """
    modes: dict[tuple[str, ...], LockMode] = {}
    for path, mode in requests:
        segments = parse_path(path)
        wanted = mode if isinstance(mode, LockMode) else parse_mode(mode)
        for depth in range(1, len(segments)):
            ancestor = segments[:depth]
            held = modes.get(ancestor)
            modes[ancestor] = (
                intention(wanted) if held is None else stronger(held, intention(wanted))
            )
        held = modes.get(segments)
        modes[segments] = wanted if held is None else stronger(held, wanted)
    ordered = sorted(modes.items(), key=lambda item: (len(item[0]), item[0]))
    return [LockRequest("/".join(segments), mode) for segments, mode in ordered]


def lock_sets_conflict(first: list[LockRequest], second: list[LockRequest]) -> bool:
    """Whether two expanded lock sets can not be held at once."""
    held = {request.path: request.mode for request in first}
    return any(
        request.path in held and not compatible(held[request.path], request.mode)
        for request in second
    )
