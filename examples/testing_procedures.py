"""Undo coverage of your own procedure with procbus's pytest fixtures: RefreshCaches
(examples/user_procedures.py) cut at every step, checked for what each rollback left behind.
Shown in docs/how-to/testing-procedures.md; run by tests/integration/test_undo_coverage.py."""

from __future__ import annotations

# --8<-- [start:conftest]
# conftest.py: procbus's fixtures (procbus_client, procbus_pool, procbus_worker, ...)
pytest_plugins = ["procbus.testing.pytest_plugin"]
# --8<-- [end:conftest]

# --8<-- [start:test]
from pathlib import Path
from typing import Any

import asyncpg

from examples.user_procedures import (
    RefreshCaches,
    RefreshInput,
    forget_refresh,
    note_refresh,
    refuse_refresh,
)
from procbus.testing import CutKind


def noted(notes: Path) -> list[str]:
    """The tables your system holds a note for."""
    text = notes.read_text() if notes.exists() else ""
    return [line.split(" ", 1)[1] for line in text.splitlines()]


async def test_refresh_caches_leaves_nothing_behind(
    procbus_undo_coverage: Any, procbus_pool: asyncpg.Pool, tmp_path: Path
) -> None:
    notes = tmp_path / "notes"

    async def residue(request: RefreshInput) -> list[str]:
        """What a rolled-back run left: its note, a lock still held."""
        held = await procbus_pool.fetchval('SELECT count(*) FROM "procbus_locks"')
        left = [f"a note for {request.table}"] if request.table in noted(notes) else []
        return left + ([f"{held} locks still held"] if held else [])

    async def missing(request: RefreshInput) -> list[str]:
        """What a finished run lacks: its note."""
        return [] if request.table in noted(notes) else [f"no note for {request.table}"]

    coverage = procbus_undo_coverage(
        workflows=[RefreshCaches],
        activities=[note_refresh, forget_refresh, refuse_refresh],
        procedure="RefreshCaches",
        make_input=lambda name: RefreshInput(table=name, notes=str(notes)),
        residue=residue,
        missing=missing,
        kinds=list(CutKind),  # KILL too: a worker stopped mid-step
    )
    report = await coverage.run()
    print(report.summary())
    report.assert_covered()  # fails listing every cut point not proven
    assert report.total == 8  # 2 steps x 4 kinds


# --8<-- [end:test]
