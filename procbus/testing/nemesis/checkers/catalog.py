"""The checkers of the catalog and the workers' caches of it: each table is there exactly when
the last procedure that succeeded on it says, with its folder and its event, and every live
worker's caches equal the catalog after the heal."""

from __future__ import annotations

import collections
import json
from collections.abc import Set as AbstractSet
from datetime import datetime
from typing import Any

from procbus.testing.nemesis.checkers._history import commands_of, ends_of, first_x_holders

# The catalog event each table procedure records once it succeeded (its last step).
TABLE_EVENTS = {"CreateTable": "TableCreated", "DeleteTable": "TableDeleted"}


def check_catalog(outcomes: dict[str, dict[str, Any]], end: dict[str, Any]) -> list[str]:
    """Each table exists at the end exactly when the last procedure that succeeded on it (in
    the order they were granted X on the table, which serializes them; the order they ended,
    for one the lock log lacks) created it, and its folder with it; each
    table procedure that succeeded recorded its catalog event once: a procedure that was
    undone left nothing behind, neither a folder nor an event. A folder whose maker is STUCK
    rolling back is not residue: its undo waits for an operator (retry or skip); nor is a
    table whose last catalog write was made by a procedure that is STUCK (a DeleteTable whose
    locks were lost after it removed the table: its undo waits for an operator too)."""
    succeeded = {
        procedure_id: status
        for procedure_id, status in outcomes.items()
        if status.get("state") == "SUCCEEDED"
        and status.get("procedure_type") in ("CreateTable", "DeleteTable")
    }
    # A procedure releases its locks before its run closes, and the close can come much later
    # (a worker paused between): the one that ended last need not have changed the table last.
    granted = first_x_holders(end, succeeded)
    last: dict[str, tuple[str, str]] = {}
    for procedure_id, status in sorted(succeeded.items(), key=lambda item: _ended_at(item[1])):
        last[status["target"]] = (status["procedure_type"], procedure_id)
    for resource, holders in granted.items():
        table = resource.replace("/", ".")
        if holders and table in last:
            last[table] = (succeeded[holders[-1]]["procedure_type"], holders[-1])
    operators = {
        table
        for table, writer in last_table_writers(end).items()
        if outcomes.get(writer, {}).get("state") == "STUCK"
        and outcomes[writer].get("procedure_type") in ("CreateTable", "DeleteTable")
    }
    violations = []
    for table in sorted({*last, *end["tables"]} - operators):
        expected = table in last and last[table][0] == "CreateTable"
        if expected != (table in end["tables"]):
            said = last.get(table, ("nothing", "-"))
            violations.append(
                f"{table}: {'missing' if expected else 'present'} in the catalog, but the last "
                f"procedure that succeeded on it was {said[0]} {said[1]}"
            )
    makers = end.get("folder_makers", {})
    for table in sorted((set(end["folders"]) ^ set(end["tables"])) - operators):
        if outcomes.get(makers.get(table, ""), {}).get("state") == "STUCK":
            continue  # its maker's undo waits for an operator: not undone, so no residue yet
        where = "a folder without a catalog entry" if table in end["folders"] else "no folder"
        violations.append(f"{table}: {where} (residue of an undone or half-done procedure)")
    recorded = collections.Counter(
        (event["procedure_id"], event["event_type"]) for event in end.get("catalog_events", [])
    )
    for procedure_id, status in sorted(outcomes.items()):
        event_type = TABLE_EVENTS.get(status.get("procedure_type", ""))
        if event_type is None or status.get("state") not in ("SUCCEEDED", "ROLLED_BACK"):
            continue
        once = 1 if status["state"] == "SUCCEEDED" else 0
        if recorded[(procedure_id, event_type)] != once:
            violations.append(
                f"{procedure_id} {status['state']}, and its {event_type} event was recorded "
                f"{recorded[(procedure_id, event_type)]} times"
            )
    return violations


def last_table_writers(end: dict[str, Any]) -> dict[str, str]:
    """Each table's last writer of its catalog row: the holder of the lock whose fence the
    write carried (from the lock log), by table ("namespace.name")."""
    holders = {
        (change["resource"], change["token"]): change["holder"]
        for change in end.get("lock_log", [])
        if change["token"] is not None
    }
    writers = {}
    for write in sorted(end.get("catalog_log", []), key=lambda w: datetime.fromisoformat(w["at"])):
        if write["relation"] != "procbus_tables" or write["fence"] is None:
            continue
        row, fence = json.loads(write["row"]), json.loads(write["fence"])
        writer = holders.get((fence["resource"], fence["token"]))
        if writer is not None:
            writers[f"{row['namespace']}.{row['name']}"] = writer
    return writers


def check_caches(end: dict[str, Any], evicted: AbstractSet[str] = frozenset()) -> list[str]:
    """After the heal, every live worker's caches (tables, grants) equal the catalog. A worker
    keeps a deleted table's grants, unused, until a table of that name is created again (which
    drops them first: docs/concepts/bus.md); those are not counted. A table the user's procedure
    evicted last (`evicted`) may be missing from a worker's cache, which reads it again when it
    is used."""
    violations = []
    for worker, caches in sorted(end["workers"].items()):
        in_use = {
            "tables": caches["tables"],
            "grants": [g for g in caches["grants"] if _grant_table(g) in end["tables"]]
            + [g for g in caches["grants"] if _grant_table(g).endswith(".*")],
        }
        for what in ("tables", "grants"):
            missing = sorted(
                item
                for item in set(end[what]) - set(in_use[what])
                if (item if what == "tables" else _grant_table(item)) not in evicted
            )
            extra = sorted(set(in_use[what]) - set(end[what]))
            if missing or extra:
                violations.append(
                    f"{worker}'s {what} differ from the catalog: missing {missing}, extra {extra}"
                )
    return violations


def evicted_tables(history: list[dict[str, Any]], end: dict[str, Any]) -> set[str]:
    """The tables the user's procedure was the last to evict from the workers' caches, or a
    table procedure left STUCK for its operator (its undo may have evicted the table before the
    step that is stuck), in the order of their X locks, after the last creation or deletion that
    succeeded: a worker may rightly not have them cached (it reads them again when used)."""
    commands = commands_of(history, "procbus") | commands_of(history, "temporal")
    ends = ends_of(history)
    evicted = set()
    for resource, holders in first_x_holders(end, commands).items():
        last_evicted = False
        for procedure_id in holders:
            argv = commands[procedure_id]
            state = ends.get(procedure_id, {}).get("state")
            table_procedure = argv[:2] in (["table", "create"], ["table", "delete"])
            if argv[0] == "workflow" or (table_procedure and state == "STUCK"):
                last_evicted = True  # an eviction (whether the procedure then failed or not)
            elif table_procedure and state == "SUCCEEDED":
                last_evicted = False
        if last_evicted:
            evicted.add(resource.replace("/", "."))
    return evicted


def _grant_table(grant: str) -> str:
    return grant.rsplit(":", 2)[1]  # a principal may hold ":" (pipeline:TOPIC)


def _ended_at(status: dict[str, Any]) -> str:
    return str(status.get("closed_at") or "")
