"""What several checkers read of a run's history and end state: the workload's commands, each
procedure's end, and the order procedures were first granted X on each resource."""

from __future__ import annotations

import collections
from collections.abc import Container
from typing import Any


def commands_of(history: list[dict[str, Any]], program: str) -> dict[str, list[str]]:
    """The workload's commands of `program` (procbus or temporal), by procedure ID."""
    return {
        recorded["procedure_id"]: recorded["argv"]
        for recorded in history
        if recorded["event"] in ("started", "not_started")
        and recorded.get("program", "procbus") == program
    }


def ends_of(history: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each procedure's end as the history recorded it, by procedure ID."""
    return {
        recorded["procedure_id"]: recorded for recorded in history if recorded["event"] == "ended"
    }


def first_x_holders(end: dict[str, Any], known: Container[str]) -> dict[str, list[str]]:
    """Per lock resource, the `known` procedures in the order each was first granted X on it:
    the order their changes to it took effect."""
    holders: dict[str, list[str]] = collections.defaultdict(list)
    for change in end.get("lock_log", []):
        ordered, holder = holders[change["resource"]], change["holder"]
        granted = change["token"] is not None and change["mode"] == "X"
        if granted and holder in known and holder not in ordered:
            ordered.append(holder)
    return holders
