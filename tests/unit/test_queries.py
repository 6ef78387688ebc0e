from __future__ import annotations

import re
from pathlib import Path

import pytest

from procbus.db.queries import load_queries, parse_queries

PROJECT = Path(__file__).resolve().parents[2]


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


def test_an_unknown_name_lists_the_known_ones() -> None:
    with pytest.raises(KeyError, match="known: .*get_stack_check"):
        load_queries()["no_such_query"]


def test_every_query_the_code_names_exists() -> None:
    used: set[str] = set()
    for source in (PROJECT / "procbus").rglob("*.py"):
        used |= set(re.findall(r'queries\["([a-z_0-9]+)"\]', source.read_text()))
    assert used, "the code names no queries: the pattern is out of date"
    assert used <= set(load_queries())
