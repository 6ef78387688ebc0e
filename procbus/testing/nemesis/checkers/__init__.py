"""The checkers over a nemesis run's history and end state: each returns the violations it
found, as sentences (an empty list: none)."""

from procbus.testing.nemesis.checkers.catalog import (
    check_caches,
    check_catalog,
    evicted_tables,
    last_table_writers,
)
from procbus.testing.nemesis.checkers.lake import check_lake, check_spark
from procbus.testing.nemesis.checkers.locks import check_access, check_fencing, check_locks
from procbus.testing.nemesis.checkers.procedures import (
    check_deadlines,
    check_notes,
    check_procedures,
)
from procbus.testing.nemesis.checkers.topics import check_topics

__all__ = [
    "check_access",
    "check_caches",
    "check_catalog",
    "check_deadlines",
    "check_fencing",
    "check_lake",
    "check_locks",
    "check_notes",
    "check_procedures",
    "check_spark",
    "check_topics",
    "evicted_tables",
    "last_table_writers",
]
