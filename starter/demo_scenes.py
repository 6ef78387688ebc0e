"""The demo's scenes by the names `procbus demo --only` takes, in the order they run (the stack
check runs first, always): one list for the demo, its command's help and the docs' test."""

from __future__ import annotations

DEMO_STEPS = (
    "create-table",
    "failed-create-table",
    "hooks",
    "locks",
    "bad-input",
    "topics",
    "grouped",
    "kafka",
    "bus",
    "table-data",
    "pipeline",
    "own-procedure",
)
# The scenes in the demo's namespace: they need create-table's table.
NEEDS_CREATE_TABLE = frozenset({"failed-create-table", "bus", "table-data", "pipeline"})
