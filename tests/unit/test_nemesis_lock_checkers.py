"""The nemesis's checkers of locks, fences, access and notes (procbus.testing.nemesis): each
passes a clean history and finds the violation planted in it."""

from __future__ import annotations

import json
from typing import Any

from procbus.testing.nemesis import (
    check_access,
    check_caches,
    check_fencing,
    check_locks,
    check_notes,
    evicted_tables,
)
from tests.unit.nemesis_helpers import END, ORDERS, change, fence, write

LOCK_LOG = [
    change("INSERT", 1, "sales", "p1", "IX", 1, 30),
    change("INSERT", 1, "sales/orders", "p1", "X", 1, 30),
    change("INSERT", 2, "sales", "p2", "IX", 2, 30),  # intentions go together
    change("INSERT", 2, "sales/orders", "p2", "X", None, 30),  # waits behind p1
    change("DELETE", 5, "sales/orders", "p1", "X", 1, 30),
    change("UPDATE", 5, "sales/orders", "p2", "X", 2, 30),  # granted once p1 released
    change("INSERT", 6, "sales", "p3", "X", None, 40),
    # p1's and p2's leases on "sales" run out (30 s): p3's X is granted although the rows stay.
    change("UPDATE", 31, "sales", "p3", "X", 3, 60),
]


def test_grants_that_wait_for_a_release_or_a_lease_have_no_violations() -> None:
    assert check_locks({"lock_log": LOCK_LOG}) == []


def test_two_incompatible_grants_that_overlapped_are_a_violation() -> None:
    early = [*LOCK_LOG[:4], change("UPDATE", 4, "sales/orders", "p2", "X", 2, 30)]
    assert check_locks({"lock_log": early}) == [
        "sales/orders: p2 was granted X at 2026-01-01T00:00:04+00:00 while p1 held X (leased "
        "until 2026-01-01T00:00:30+00:00)"
    ]
    # A child procedure inherits its parent's locks: a grant within the family is no conflict.
    child = {**change("INSERT", 3, "sales/orders", "p1/c", "X", 4, 30), "family": ["p1"]}
    assert check_locks({"lock_log": [*LOCK_LOG[:2], child]}) == []


def test_writes_under_held_current_fences_have_no_violations() -> None:
    catalog_log = [
        write(3, "procbus_tables", ORDERS, fence("sales/orders", 1, ("sales", 1))),
        write(
            4,
            "procbus_events",
            {"namespace": "sales", "table_name": "orders"},
            fence("sales/orders", 1),
        ),
        write(7, "procbus_acl", ORDERS | {"table_name": "orders"}, fence("sales/orders", 2)),
    ]
    assert check_fencing({"lock_log": LOCK_LOG, "catalog_log": catalog_log}) == []


def test_an_unfenced_uncovered_released_or_stale_write_is_a_violation() -> None:
    catalog_log = [
        write(3, "procbus_tables", ORDERS, None),
        write(
            3, "procbus_tables", {"namespace": "sales", "name": "returns"}, fence("sales/orders", 1)
        ),
        # p1 released its X at second 5, and p2 was granted token 2: p1 writes after.
        write(6, "procbus_tables", ORDERS, fence("sales/orders", 1)),
    ]
    found = check_fencing({"lock_log": LOCK_LOG, "catalog_log": catalog_log})
    at = "2026-01-01T00:00:0{}+00:00".format
    assert found == [
        f"INSERT on procbus_tables (sales/orders) at {at(3)} carried no fence",
        f"INSERT on procbus_tables (sales/returns) at {at(3)} carried a fence on sales/orders, "
        "which does not cover it",
        f"INSERT on procbus_tables (sales/orders) at {at(6)}: its lock on sales/orders (token 1) "
        "was not held",
        f"INSERT on procbus_tables (sales/orders) at {at(6)}: its token 1 on sales/orders was "
        "older than the newest, 2",
    ]


def test_an_append_under_a_shared_intention_lock_needs_only_its_lock_held() -> None:
    # p1 and p2 both hold IX on "sales" (tokens 1 and 2): p1's append is fenced by its own.
    append = {**fence("sales", 1), "mode": "IX"}
    namespace = {"name": "sales"}
    catalog_log = [write(3, "procbus_namespaces", namespace, append)]
    assert check_fencing({"lock_log": LOCK_LOG, "catalog_log": catalog_log}) == []
    exclusive = [write(3, "procbus_namespaces", namespace, fence("sales", 1))]
    assert check_fencing({"lock_log": LOCK_LOG, "catalog_log": exclusive}) == [
        "INSERT on procbus_namespaces (sales) at 2026-01-01T00:00:03+00:00: its token 1 on "
        "sales was older than the newest, 2"
    ]


def test_a_pipeline_batch_may_write_its_own_lake_table_only() -> None:
    batch = json.dumps({"topic": "bank", "batch": "b1", "claim": "c1"})
    own = write(3, "procbus_tables", {"namespace": "bank", "name": "accounts"}, None)
    other = write(4, "procbus_tables", ORDERS, None)
    end = {
        "lock_log": LOCK_LOG,
        "catalog_log": [own | {"batch": batch}, other | {"batch": batch}],
        "pipeline_tables": {"bank": "bank/accounts"},
    }
    assert check_fencing(end) == [
        "INSERT on procbus_tables (sales/orders) at 2026-01-01T00:00:04+00:00 was written by a "
        "batch of pipeline bank"
    ]


def commands(
    *steps: tuple[str, str, tuple[str, ...]],
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """A history of (procedure ID, end state, command) run one after another on sales.orders,
    and the lock log that orders them: each granted X on the table in turn."""
    history: list[dict[str, Any]] = []
    lock_log = []
    for second, (procedure_id, state, argv) in enumerate(steps, start=1):
        history.append({"event": "started", "procedure_id": procedure_id, "argv": list(argv)})
        history.append({"event": "ended", "procedure_id": procedure_id, "state": state})
        lock_log.append(change("INSERT", second, "sales/orders", procedure_id, "X", second, 90))
        lock_log.append(change("DELETE", second, "sales/orders", procedure_id, "X", second, 90))
    return history, {"lock_log": lock_log}


CREATE = ("table", "create", "sales.orders", "--schema", "id:bigint")
DELETE_AS_ETL = ("table", "delete", "sales.orders", "--as", "etl")
GRANT, REVOKE = (("acl", action, "etl", "sales.orders", "write") for action in ("grant", "revoke"))


def test_deletions_as_etl_while_it_may_write_or_refused_have_no_violations() -> None:
    history, end = commands(
        ("c1", "SUCCEEDED", CREATE),
        ("g1", "SUCCEEDED", GRANT),
        ("r0", "SUCCEEDED", ("acl", "revoke", "analyst", "sales.orders", "write")),
        ("d1", "SUCCEEDED", DELETE_AS_ETL),  # etl could write it
        ("c2", "SUCCEEDED", CREATE),
        ("d2", "ROLLED_BACK", DELETE_AS_ETL),  # refused: the new table has no grants
        ("g2", "STUCK", GRANT),
        ("d3", "SUCCEEDED", DELETE_AS_ETL),  # the grant's outcome is unknown: not counted
    )
    assert check_access(history, end) == []


def test_a_deletion_as_etl_after_its_grant_was_revoked_or_never_given_is_a_violation() -> None:
    history, end = commands(
        ("c1", "SUCCEEDED", CREATE),
        ("g1", "SUCCEEDED", GRANT),
        ("r1", "SUCCEEDED", REVOKE),
        ("d1", "SUCCEEDED", DELETE_AS_ETL),
        ("c2", "SUCCEEDED", CREATE),
        ("d2", "SUCCEEDED", DELETE_AS_ETL),
    )
    assert check_access(history, end) == [
        "d1 deleted sales.orders as etl, who could not write it: r1 revoked it",
        "d2 deleted sales.orders as etl, who could not write it: c2 created the table",
    ]


def refresh(table: str) -> tuple[str, ...]:
    request = {"table": table, "notes": f"/tmp/notes-{table}", "refuse": False}
    return ("workflow", "start", "--type", "RefreshCaches", "--input", json.dumps(request))


def with_program(history: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The `temporal` CLI's starts marked as such (the workload records each start's program)."""
    for recorded in history:
        if recorded["event"] == "started" and recorded["argv"][0] == "workflow":
            recorded["program"] = "temporal"
    return history


def test_notes_left_exactly_by_the_user_procedures_that_succeeded_have_no_violations() -> None:
    history, _ = commands(
        ("u1", "SUCCEEDED", refresh("orders")), ("u2", "ROLLED_BACK", refresh("orders"))
    )
    end = {"notes": {"orders": ["u1/note orders"]}}
    assert check_notes(with_program(history), end) == []


def test_a_lost_doubled_undone_or_stray_note_is_a_violation() -> None:
    history, _ = commands(
        ("u1", "SUCCEEDED", refresh("orders")),
        ("u2", "SUCCEEDED", refresh("orders")),
        ("u3", "ROLLED_BACK", refresh("events")),
    )
    notes = {
        "orders": ["u2/note orders", "u2/note orders"],
        "events": ["u3/note events", "u9/note events"],
    }
    assert check_notes(with_program(history), {"notes": notes}) == [
        "u1 SUCCEEDED, and its note is in orders's notes 0 times",
        "u2 SUCCEEDED, and its note is in orders's notes 2 times",
        "u3 was ROLLED_BACK, and its note is still in events's notes",
        "events's notes hold u9/note, of no procedure the workload started",
    ]


def test_a_table_the_user_procedure_evicted_last_may_be_missing_from_a_cache() -> None:
    evicted_last, end = commands(
        ("c1", "SUCCEEDED", CREATE),
        ("u1", "ROLLED_BACK", refresh("orders")),  # it failed after its eviction
        ("c2", "ROLLED_BACK", CREATE),  # the table was there: nothing cached anew
    )
    assert evicted_tables(with_program(evicted_last), end) == {"sales.orders"}
    created_after, end = commands(
        ("u1", "SUCCEEDED", refresh("orders")), ("c1", "SUCCEEDED", CREATE)
    )
    assert evicted_tables(with_program(created_after), end) == set()
    # A creation left STUCK undoing its catalog row (its locks lost) after its undo evicted it.
    stuck_undoing, end = commands(("c1", "SUCCEEDED", CREATE), ("c2", "STUCK", CREATE))
    assert evicted_tables(stuck_undoing, end) == {"sales.orders"}
    made_again, end = commands(("c1", "STUCK", CREATE), ("c2", "SUCCEEDED", CREATE))
    assert evicted_tables(made_again, end) == set()
    cleared = {**END, "workers": {"w1": {"tables": [], "grants": []}}}
    assert check_caches(cleared, {"sales.orders"}) == []
    assert check_caches(cleared) == [
        "w1's tables differ from the catalog: missing ['sales.orders'], extra []",
        "w1's grants differ from the catalog: missing ['etl:sales.orders:write'], extra []",
    ]
