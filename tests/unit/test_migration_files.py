from __future__ import annotations

from pathlib import Path

import pytest

from procbus.db.migrate import discover_migrations
from procbus.errors import MigrationError


def write(folder: Path, *names: str) -> Path:
    for name in names:
        (folder / name).write_text("SELECT 1;")
    return folder


def test_shipped_migrations_are_numbered_from_one() -> None:
    migrations = discover_migrations()
    assert [m.version for m in migrations] == list(range(1, len(migrations) + 1))


def test_migrations_sort_by_number(tmp_path: Path) -> None:
    folder = write(tmp_path, "0002_b.sql", "0001_a.sql", "README.txt")
    assert [m.name for m in discover_migrations(folder)] == ["a", "b"]


def test_a_gap_is_refused(tmp_path: Path) -> None:
    with pytest.raises(MigrationError, match="expected 0002, found 0003_c.sql"):
        discover_migrations(write(tmp_path, "0001_a.sql", "0003_c.sql"))


def test_a_badly_named_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(MigrationError, match="not named NNNN_name.sql"):
        discover_migrations(write(tmp_path, "1_first.sql"))
