from __future__ import annotations

import re
from pathlib import Path

import pytest

import procbus
from procbus.db.migrate import FUNCTION_PACKAGES, discover_functions, discover_migrations
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


def test_every_functions_file_is_applied() -> None:
    package_root = Path(procbus.__file__).parent
    on_disk = sorted(f"procbus.{path.parent.name}" for path in package_root.glob("*/functions.sql"))
    assert sorted(FUNCTION_PACKAGES) == on_disk


def test_functions_files_only_replace_and_migrations_make_no_functions() -> None:
    # A functions file runs again over what it made; a migration's function would never change.
    for file in discover_functions():
        assert not re.search(r"^\s*CREATE\s+FUNCTION", file.sql, re.IGNORECASE | re.MULTILINE), (
            file.name
        )
    for migration in discover_migrations():
        assert not re.search(
            r"^\s*CREATE\s+(OR\s+REPLACE\s+)?(FUNCTION|TRIGGER|CONSTRAINT\s+TRIGGER)",
            migration.sql,
            re.IGNORECASE | re.MULTILINE,
        ), migration.name
