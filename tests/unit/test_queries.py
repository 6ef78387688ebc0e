from __future__ import annotations

import re
from pathlib import Path

import pytest

from procbus.db.queries import QUERIES_FILE, load_queries, parse_queries

PROJECT = Path(__file__).resolve().parents[2]
LIBRARY = PROJECT / "procbus"


def packages_with_queries() -> list[str]:
    """Every mechanism that keeps SQL: the packages with a queries.sql beside their code."""
    return sorted(
        ".".join(path.parent.relative_to(PROJECT).parts) for path in LIBRARY.rglob(QUERIES_FILE)
    )


def test_blocks_become_named_queries() -> None:
    queries = parse_queries(
        "-- name: first\nSELECT 1;\n\n-- name: second_one\n-- why: a comment stays\nSELECT $1;\n"
    )
    assert queries == {"first": "SELECT 1;", "second_one": "-- why: a comment stays\nSELECT $1;"}


def test_empty_and_duplicate_queries_are_refused() -> None:
    with pytest.raises(ValueError, match="'a' is empty"):
        parse_queries("-- name: a\n\n-- name: b\nSELECT 1;")
    with pytest.raises(ValueError, match="'a' is defined twice"):
        parse_queries("-- name: a\nSELECT 1;\n-- name: a\nSELECT 2;")


def test_an_unknown_name_names_the_file_and_lists_the_known_ones() -> None:
    with pytest.raises(KeyError, match="procbus/stack/queries.sql has .* known: .*get_stack_check"):
        load_queries("procbus.stack")["no_such_query"]


def test_every_mechanism_keeps_its_sql_beside_its_code() -> None:
    assert packages_with_queries() == [
        "procbus.auth",
        "procbus.bus",
        "procbus.capture",
        "procbus.db",
        "procbus.hooks",
        "procbus.lakehouse",
        "procbus.locks",
        "procbus.pipeline",
        "procbus.retention",
        "procbus.spark",
        "procbus.stack",
        "procbus.testing",  # the nemesis's own instruments
        "procbus.topics",
    ]
    assert not list(LIBRARY.rglob("sql/*.sql")), "SQL outside a mechanism's queries.sql"


def test_every_query_the_code_names_exists_in_its_package() -> None:
    named = 0
    for package in packages_with_queries():
        folder = PROJECT.joinpath(*package.split("."))
        used: set[str] = set()
        for source in folder.rglob("*.py"):  # subpackages too (procbus.testing.nemesis)
            used |= set(re.findall(r'queries(?:\([^)]*\))?\["([a-z_0-9]+)"\]', source.read_text()))
        named += len(used)
        assert used <= set(load_queries(package)), package
    assert named, "the code names no queries: the pattern is out of date"
