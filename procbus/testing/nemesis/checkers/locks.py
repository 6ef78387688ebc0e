"""The checkers that replay the lock log: no two incompatible grants overlapped, every catalog
write was fenced by locks still held, and no principal wrote a table after losing its grant."""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from typing import Any

from procbus.core import Fence, LockMode, namespace_resource, table_resource
from procbus.locks.modes import compatible
from procbus.testing.nemesis.checkers._history import commands_of, ends_of, first_x_holders
from procbus.testing.nemesis.operations import DELETER


def check_locks(end: dict[str, Any]) -> list[str]:
    """No two incompatible grants on one resource overlapped in time: replaying every change of
    the lock table, when a holder is granted a mode, no other holder (outside its family of
    parent procedures) holds an incompatible one there with its lease still running."""
    rows: dict[tuple[str, str], dict[str, Any]] = {}  # (resource, holder) -> its row now
    violations = []
    for change in end.get("lock_log", []):
        key = (change["resource"], change["holder"])
        before = rows.pop(key, None)
        if change["op"] == "DELETE":
            continue
        rows[key] = change
        granted = change["token"] is not None and (
            before is None or (before["token"], before["mode"]) != (change["token"], change["mode"])
        )
        if not granted:
            continue
        at = datetime.fromisoformat(change["at"])
        for (resource, holder), other in rows.items():
            if resource != change["resource"] or holder == change["holder"]:
                continue
            if other["token"] is None or datetime.fromisoformat(other["lease_expires_at"]) <= at:
                continue  # waiting, or its lease ran out: no longer held
            if holder in change["family"] or change["holder"] in other["family"]:
                continue
            if not compatible(LockMode(other["mode"]), LockMode(change["mode"])):
                violations.append(
                    f"{resource}: {change['holder']} was granted {change['mode']} at "
                    f"{change['at']} while {holder} held {other['mode']} (leased until "
                    f"{other['lease_expires_at']})"
                )
    return violations


# The lock resource a write to each catalog relation needs (or an ancestor's), from its row.
WRITTEN_RESOURCE: dict[str, Callable[[dict[str, Any]], str]] = {
    "procbus_namespaces": lambda row: namespace_resource(row["name"]),
    "procbus_namespace_acl": lambda row: namespace_resource(row["namespace"]),
    "procbus_tables": lambda row: table_resource(row["namespace"], row["name"]),
    "procbus_acl": lambda row: table_resource(row["namespace"], row["table_name"]),
    "procbus_events": lambda row: (
        table_resource(row["namespace"], row["table_name"])
        if row["table_name"]
        else namespace_resource(row["namespace"])
    ),
}


def check_fencing(end: dict[str, Any]) -> list[str]:
    """Every write that reached the catalog carried a fence covering what it wrote, and when it
    was written that fence's locks were still held and, for an exclusive write, its token the
    newest on its resource (an append under an IX lock shares it with others): replaying the
    lock log and the catalog log together, in the database's time order. A change pipeline's
    commit carries its batch instead (its claim fences it), and may write only its own lake
    table (`pipeline_tables`: topic -> table resource)."""
    changes = [(change["at"], 0, change) for change in end.get("lock_log", [])]
    changes += [(write["at"], 1, write) for write in end.get("catalog_log", [])]
    rows: dict[tuple[str, str], dict[str, Any]] = {}  # (resource, holder) -> its lock row now
    newest: dict[str, int] = {}  # resource -> the newest token granted on it
    violations = []
    for _, is_write, change in sorted(changes, key=lambda c: (datetime.fromisoformat(c[0]), c[1])):
        if not is_write:
            key = (change["resource"], change["holder"])
            rows.pop(key, None)
            if change["op"] != "DELETE":
                rows[key] = change
                if change["token"] is not None:
                    newest[key[0]] = max(newest.get(key[0], 0), change["token"])
            continue
        row = json.loads(change["row"])
        written = WRITTEN_RESOURCE[change["relation"]](row)
        what = f"{change['op']} on {change['relation']} ({written}) at {change['at']}"
        if change["fence"] is None and change.get("batch") is not None:
            topic = json.loads(change["batch"])["topic"]
            if end.get("pipeline_tables", {}).get(topic) != written:
                violations.append(f"{what} was written by a batch of pipeline {topic}")
            continue
        if change["fence"] is None:
            violations.append(f"{what} carried no fence")
            continue
        fence = Fence.model_validate_json(change["fence"])
        if written != fence.resource and not written.startswith(f"{fence.resource}/"):
            violations.append(
                f"{what} carried a fence on {fence.resource}, which does not cover it"
            )
        for resource, token in [(fence.resource, fence.token)] + [
            (grant.resource, grant.token) for grant in fence.path
        ]:
            if not any(r == resource and lock["token"] == token for (r, _), lock in rows.items()):
                violations.append(f"{what}: its lock on {resource} (token {token}) was not held")
        if fence.mode is LockMode.X and fence.token < newest.get(fence.resource, 0):
            violations.append(
                f"{what}: its token {fence.token} on {fence.resource} was older than the newest, "
                f"{newest[fence.resource]}"
            )
    return violations


def check_access(history: list[dict[str, Any]], end: dict[str, Any]) -> list[str]:
    """No data change was made as a principal whose grant was revoked before it began.

    The workload deletes tables as `etl` (deleting a table's data is writing it). On a table,
    every procedure that changes it or its grants (create, delete, grant, revoke) holds its X
    lock, so the lock log orders them. Replayed in that order: etl may write the table once a
    grant of write on it succeeded, until a revoke of it or the table's deletion (which takes its
    grants) succeeded. An etl deletion that succeeded while etl could not write is a violation.
    After a change that never ended, or ended STUCK, the table's grants are unknown until the
    next one that succeeded."""
    commands = commands_of(history, "procbus")
    ends = ends_of(history)
    granted_first = first_x_holders(end, commands)
    violations = []
    for table in sorted({_table_of(argv) for argv in commands.values()}):
        may_write: bool | None = False  # None: unknown
        since = "never granted it"  # why etl may not write, for the violation's sentence
        for procedure_id in granted_first[table_resource(*table.split("."))]:
            argv, state = commands[procedure_id], ends.get(procedure_id, {}).get("state")
            action = argv[1]
            as_deleter = action == "delete" and "--as" in argv
            if as_deleter and state == "SUCCEEDED" and may_write is False:
                violations.append(
                    f"{procedure_id} deleted {table} as {DELETER}, who could not write it: {since}"
                )
            if state not in ("SUCCEEDED", "ROLLED_BACK"):
                may_write = None  # half-done, or never ended: unknown until the next change
            elif state == "SUCCEEDED" and action in ("create", "delete"):
                # A new table has no grants; a deleted one took them.
                may_write, since = False, f"{procedure_id} {action}d the table"
            elif state == "SUCCEEDED" and argv[2:3] == [DELETER] and argv[4:5] == ["write"]:
                may_write, since = action == "grant", f"{procedure_id} revoked it"
    return violations


def _table_of(argv: list[str]) -> str:
    """The table a workload command acts on: `table ACTION NS.T ...`, `acl ACTION WHO NS.T`."""
    return argv[2] if argv[0] == "table" else argv[3]
