"""The nemesis's schedule and checkers (procbus.testing.nemesis): each checker passes a clean
history and finds the violation planted in it."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

from procbus.testing.nemesis import (
    BANK_ACCOUNTS,
    BANK_OPENING,
    FAULT_KINDS,
    GROUPED_TOPIC,
    HOOKS_TOPIC,
    SINK_FAULT_KINDS,
    app_transactions,
    check_access,
    check_caches,
    check_catalog,
    check_deadlines,
    check_fencing,
    check_lake,
    check_locks,
    check_notes,
    check_procedures,
    check_spark,
    check_topics,
    evicted_tables,
    fault_schedule,
    recheck,
    workload,
)


def status(kind: str, target: str, state: str, closed_at: str, **more: Any) -> dict[str, Any]:
    return {
        "procedure_type": kind,
        "target": target,
        "state": state,
        "closed_at": closed_at,
        **more,
    }


OUTCOMES = {
    "c1": status("CreateTable", "sales.orders", "SUCCEEDED", "2026-01-01T00:00:01"),
    "d1": status("DeleteTable", "sales.orders", "SUCCEEDED", "2026-01-01T00:00:02"),
    "c2": status("CreateTable", "sales.orders", "SUCCEEDED", "2026-01-01T00:00:03"),
    "c3": status("CreateTable", "crm.events", "ROLLED_BACK", "2026-01-01T00:00:04"),
    "g1": status("ChangeAccess", "sales.orders", "STUCK", "2026-01-01T00:00:05", stuck_error="x"),
}
EVENTS = [
    {"procedure_id": "c1", "event_type": "TableCreated"},
    {"procedure_id": "d1", "event_type": "TableDeleted"},
    {"procedure_id": "c2", "event_type": "TableCreated"},
    {"procedure_id": "setup", "event_type": "NamespaceCreated"},  # not the workload's
]
END: dict[str, Any] = {
    "catalog_events": EVENTS,
    "tables": ["sales.orders"],
    "grants": ["etl:sales.orders:write"],
    "folders": ["sales.orders"],
    "workers": {
        "w1": {"tables": ["sales.orders"], "grants": ["etl:sales.orders:write"]},
        "w2": {"tables": ["sales.orders"], "grants": ["etl:sales.orders:write"]},
    },
}


def test_a_clean_history_has_no_violations() -> None:
    assert check_procedures(OUTCOMES) == []
    assert check_catalog(OUTCOMES, END) == []
    assert check_caches(END) == []


def test_a_saved_run_is_checked_again_as_it_was_and_an_old_one_gets_its_types_back(
    tmp_path: Path,
) -> None:
    """`bench/nemesis.py --recheck`: the history and end state a run saved give the checkers
    what they had; a history from before "ended" kept type and target takes them from the
    start's command line, so the catalog checker sees the same procedures."""
    events: list[dict[str, Any]] = [{"t": 0.0, "event": "began", "seed": 3}]
    for procedure_id, outcome in OUTCOMES.items():
        command = {
            "CreateTable": ["table", "create"],
            "DeleteTable": ["table", "delete"],
            "ChangeAccess": ["acl", "grant", "etl"],
        }[outcome["procedure_type"]]
        argv = [*command, outcome["target"], "--id", procedure_id]
        kept = {k: v for k, v in outcome.items() if k not in ("procedure_type", "target")}
        events.append({"t": 1.0, "event": "started", "procedure_id": procedure_id, "argv": argv})
        events.append({"t": 2.0, "event": "ended", "procedure_id": procedure_id, **kept})
    saved = tmp_path / "seed3.jsonl"
    saved.write_text("".join(json.dumps(event) + "\n" for event in events))
    saved.with_suffix(".end.json").write_text(json.dumps(END))
    history, outcomes, end = recheck(saved)
    assert (history.events, end) == (events, END)
    assert check_catalog(outcomes, end) == []
    # The table procedures are typed again from their commands; the grant's is not a table's.
    assert {pid: o.get("procedure_type") for pid, o in outcomes.items()} == {
        "c1": "CreateTable",
        "d1": "DeleteTable",
        "c2": "CreateTable",
        "c3": "CreateTable",
        "g1": None,
    }


def test_a_procedure_that_never_ended_or_is_stuck_without_a_reason_is_a_violation() -> None:
    planted = {
        **OUTCOMES,
        "c4": status("CreateTable", "crm.x", "RUNNING", ""),
        "g2": status("ChangeAccess", "crm.x", "STUCK", "2026-01-01T00:00:06"),
    }
    assert check_procedures(planted) == [
        "c4 did not end: RUNNING",
        "g2 is STUCK without a reason",
    ]


def test_a_table_that_regressed_or_left_residue_is_a_violation() -> None:
    # The last succeeded procedure on sales.orders created it: a catalog without it regressed.
    regressed = {**END, "tables": [], "folders": []}
    assert check_catalog(OUTCOMES, regressed) == [
        "sales.orders: missing in the catalog, but the last procedure that succeeded on it was "
        "CreateTable c2"
    ]
    # A rolled-back create that left its folder behind.
    residue = {**END, "folders": ["crm.events", "sales.orders"]}
    residue["folder_makers"] = {"crm.events": "c3", "sales.orders": "c2"}
    assert check_catalog(OUTCOMES, residue) == [
        "crm.events: a folder without a catalog entry (residue of an undone or half-done procedure)"
    ]
    # The same folder, its maker STUCK rolling back (its locks lost): its undo waits for an
    # operator, so nothing was undone yet; a folder no procedure made is residue all the same.
    stuck = {**OUTCOMES, "c3": OUTCOMES["c3"] | {"state": "STUCK", "stuck_error": "LockLost"}}
    assert check_catalog(stuck, residue) == []
    unmarked = {**residue, "folders": ["crm.other", "sales.orders"]}
    assert check_catalog(stuck, unmarked) == [
        "crm.other: a folder without a catalog entry (residue of an undone or half-done procedure)"
    ]


def test_a_table_a_stuck_delete_removed_last_is_left_to_its_operator() -> None:
    """Seed 20: a DeleteTable removed the table's row, then lost its locks; its undo (putting
    the row back) is refused and it is STUCK. Row gone and folder kept wait for its operator;
    the same end after a delete that is not STUCK, or after a STUCK load, is a violation."""
    created = write(3, "procbus_tables", ORDERS, fence("sales/orders", 3, ("sales", 3)))
    removed = created | {"at": "2026-01-01T00:00:09+00:00", "op": "DELETE"}
    removed["fence"] = json.dumps(fence("sales/orders", 4, ("sales", 4)))
    end = {
        **END,
        "tables": [],
        "folders": ["sales.orders"],
        "folder_makers": {"sales.orders": "c2"},
        "catalog_log": [created, removed],
        "lock_log": [
            change("INSERT", 2, "sales/orders", "c2", "X", 3, 30),
            change("DELETE", 4, "sales/orders", "c2", "X", 3, 30),
            change("INSERT", 8, "sales/orders", "d2", "X", 4, 38),
        ],
    }
    stuck = {**OUTCOMES, "d2": status("DeleteTable", "sales.orders", "STUCK", "", stuck_error="x")}
    assert check_catalog(stuck, end) == []
    half_done = [
        "sales.orders: missing in the catalog, but the last procedure that succeeded on it was "
        "CreateTable c2",
        "sales.orders: a folder without a catalog entry (residue of an undone or half-done "
        "procedure)",
    ]
    rolled_back = {
        **stuck,
        "d2": stuck["d2"] | {"state": "ROLLED_BACK", "closed_at": "2026-01-01T00:00:10"},
    }
    assert check_catalog(rolled_back, end) == half_done
    a_load = {**stuck, "d2": stuck["d2"] | {"procedure_type": "LoadTable"}}
    assert check_catalog(a_load, end) == half_done


def test_the_last_to_change_a_table_is_the_last_granted_its_x_lock_not_the_last_to_end() -> None:
    """Seed 9019: d2 removed the table and released its locks, c3 (waiting behind it) made it
    again and ended, and only then did d2's run close (its worker paused, its workflow task
    timed out and ran again elsewhere). The table is there: no violation (before: "present in
    the catalog, but the last procedure that succeeded on it was DeleteTable d2"). With the
    other grant order the same end is a violation."""
    outcomes = {
        **OUTCOMES,
        "d2": status("DeleteTable", "sales.orders", "SUCCEEDED", "2026-01-01T00:00:33"),
        "c3": status("CreateTable", "sales.orders", "SUCCEEDED", "2026-01-01T00:00:29"),
    }
    events = [
        *EVENTS,
        {"procedure_id": "d2", "event_type": "TableDeleted"},
        {"procedure_id": "c3", "event_type": "TableCreated"},
    ]
    log = [
        change("INSERT", 11, "sales/orders", "d2", "X", 4, 41),
        change("INSERT", 16, "sales/orders", "c3", "X", None, 46),
        change("DELETE", 27, "sales/orders", "d2", "X", 4, 41),
        change("UPDATE", 27, "sales/orders", "c3", "X", 5, 57),
    ]
    end = {**END, "catalog_events": events, "lock_log": log}
    assert check_catalog(outcomes, end) == []
    swapped = [change("INSERT", 1, "sales/orders", "c3", "X", 5, 31), log[0]]
    assert check_catalog(outcomes, {**end, "lock_log": swapped}) == [
        "sales.orders: present in the catalog, but the last procedure that succeeded on it was "
        "DeleteTable d2"
    ]


def test_a_lost_doubled_or_undone_catalog_event_is_a_violation() -> None:
    doubled = [*EVENTS[:2], EVENTS[0] | {"procedure_id": "c3"}, EVENTS[1]]
    assert check_catalog(OUTCOMES, {**END, "catalog_events": doubled}) == [
        "c2 SUCCEEDED, and its TableCreated event was recorded 0 times",
        "c3 ROLLED_BACK, and its TableCreated event was recorded 1 times",
        "d1 SUCCEEDED, and its TableDeleted event was recorded 2 times",
    ]


def test_a_worker_whose_caches_differ_from_the_catalog_is_a_violation() -> None:
    doubled = {
        **END,
        "workers": {
            **END["workers"],
            "w2": {"tables": ["sales.orders"], "grants": ["analyst:sales.orders:read"]},
        },
    }
    assert check_caches(doubled) == [
        "w2's grants differ from the catalog: missing ['etl:sales.orders:write'], extra "
        "['analyst:sales.orders:read']"
    ]
    # A deleted table's grants, kept unused in a cache until the name is created again, are not.
    dormant = {
        **END,
        "workers": {
            **END["workers"],
            "w2": {
                "tables": ["sales.orders"],
                "grants": ["etl:crm.gone:write", "etl:sales.orders:write"],
            },
        },
    }
    assert check_caches(dormant) == []


def test_a_seed_gives_the_same_schedule_and_another_seed_another() -> None:
    workers = ["w1", "w2", "w3"]
    assert fault_schedule(7, 600, workers) == fault_schedule(7, 600, workers)
    assert workload(7, 600) == workload(7, 600)
    assert app_transactions(7, 600) == app_transactions(7, 600) != app_transactions(8, 600)
    with_sink = fault_schedule(7, 600, workers, FAULT_KINDS + SINK_FAULT_KINDS)
    assert "cut_sink" in {fault.kind for fault in with_sink}
    assert "cut_sink" not in {fault.kind for fault in fault_schedule(7, 600, workers)}
    assert fault_schedule(7, 600, workers) != fault_schedule(8, 600, workers)
    faults = fault_schedule(7, 600, workers)
    # One at a time: each healed before the next begins.
    assert all(a.at + a.hold < b.at for a, b in itertools.pairwise(faults))


def test_some_operations_have_a_deadline_and_some_deletions_run_as_etl() -> None:
    operations = workload(7, 600)
    deletions = [o.argv for o in operations if o.argv[:2] == ("table", "delete")]
    as_etl = [argv for argv in deletions if argv[3:5] == ("--as", "etl")]
    assert 0 < len(as_etl) < len(deletions)
    with_deadline = [o for o in operations if o.deadline_seconds is not None]
    assert 0 < len(with_deadline) < len(operations)
    for operation in with_deadline:
        assert operation.argv[-4:-2] == ("--deadline", str(operation.deadline_seconds))


def started(procedure_id: str, deadline: float | None) -> dict[str, Any]:
    return {"event": "started", "procedure_id": procedure_id, "deadline_seconds": deadline}


def ended(state: str, seconds: float, *refused: str, reason: str | None = None) -> dict[str, Any]:
    return {
        "state": state,
        "started_at": "2026-01-01T00:00:00+00:00",
        "closed_at": f"2026-01-01T00:{int(seconds) // 60:02d}:{int(seconds) % 60:02d}+00:00",
        "refused": list(refused),
        "rollback_reason": reason,
    }


REFUSED = "its deadline passed: refused, the procedure passed its pivot 'add_to_catalog'"


def test_deadlines_met_rolled_back_or_refused_past_the_pivot_have_no_violations() -> None:
    history = [started(p, 10.0) for p in ("in_time", "rolled", "refused", "late_but_grace")]
    history.append(started("no_deadline", None))
    outcomes = {
        "in_time": ended("SUCCEEDED", 9),
        "rolled": ended("ROLLED_BACK", 55, reason="its deadline passed"),
        "refused": ended("SUCCEEDED", 95, REFUSED),
        "late_but_grace": ended("SUCCEEDED", 35),  # within the grace of a timer handled late
        "no_deadline": ended("SUCCEEDED", 300),
    }
    assert check_deadlines(history, outcomes) == []


def test_a_procedure_that_succeeded_long_past_its_deadline_unnoticed_is_a_violation() -> None:
    history = [started("late", 10.0), started("never_ended", 10.0)]
    outcomes = {"late": ended("SUCCEEDED", 70), "never_ended": {"state": None}}
    assert check_deadlines(history, outcomes) == [
        "late SUCCEEDED 70.0 s after its start, past its deadline of 10 s, and its status says "
        "nothing of the deadline"
    ]


def txn(name: str, outcome: str, *events: tuple[str, str]) -> dict[str, Any]:
    return {"event": "txn", "txn": name, "outcome": outcome, "events": [list(e) for e in events]}


def request(path: str, *events: tuple[str, int, str, str]) -> dict[str, Any]:
    """A request the sink journaled: its events as (txn, n, topic, key)."""
    return {
        "path": path,
        "events": [{"topic": t, "key": k, "data": {"txn": x, "n": n}} for x, n, t, k in events],
    }


HOOKS, GROUPED = (HOOKS_TOPIC, "k1"), (GROUPED_TOPIC, "k1")
TRANSACTIONS = [
    txn("t1", "committed", HOOKS, GROUPED, GROUPED),
    txn("t2", "rolled_back", HOOKS),
    txn("t3", "failed", HOOKS),
    txn("t4", "committed", HOOKS),
    txn("t5", "unknown", GROUPED, GROUPED),
]
DELIVERED = [
    request("/hooks", ("t1", 0, *HOOKS)),
    request("/grouped", ("t1", 1, *GROUPED), ("t1", 2, *GROUPED)),
    request("/hooks", ("t4", 0, *HOOKS)),
    request("/hooks", ("t1", 0, *HOOKS)),  # a resend after a lost answer: at least once
]
DRAINED = {"topic_depths": {HOOKS_TOPIC: 0, GROUPED_TOPIC: 0}}


def test_topics_delivered_at_least_once_in_order_and_whole_have_no_violations() -> None:
    assert check_topics(TRANSACTIONS, {**DRAINED, "sink_requests": DELIVERED}) == []
    # A transaction whose commit failed may have committed: delivered whole, it is fine too.
    t5 = request("/grouped", ("t5", 0, *GROUPED), ("t5", 1, *GROUPED))
    assert check_topics(TRANSACTIONS, {**DRAINED, "sink_requests": [*DELIVERED, t5]}) == []


def test_a_lost_a_phantom_or_a_reordered_event_is_a_violation() -> None:
    lost = DELIVERED[1:3]
    assert check_topics(TRANSACTIONS, {**DRAINED, "sink_requests": lost}) == [
        "t1#0 was committed but never delivered"
    ]
    phantom = [*DELIVERED, request("/hooks", ("t2", 0, *HOOKS), ("t3", 0, *HOOKS))]
    assert check_topics(TRANSACTIONS, {**DRAINED, "sink_requests": phantom}) == [
        "t2#0 was delivered, but never committed",
        "t3#0 was delivered, but never committed",
    ]
    reordered = [DELIVERED[2], *DELIVERED[:2]]
    assert check_topics(TRANSACTIONS, {**DRAINED, "sink_requests": reordered}) == [
        f"{HOOKS_TOPIC}/k1: t4#0 arrived out of commit order"
    ]


def test_part_of_a_transaction_in_a_grouped_batch_or_an_undrained_topic_is_a_violation() -> None:
    split = [
        DELIVERED[0],
        request("/grouped", ("t1", 1, *GROUPED)),
        request("/grouped", ("t1", 2, *GROUPED)),
        DELIVERED[2],
    ]
    assert check_topics(TRANSACTIONS, {**DRAINED, "sink_requests": split}) == [
        "a grouped batch held [1] of t1's [1, 2]",
        "a grouped batch held [2] of t1's [1, 2]",
    ]
    half = [*DELIVERED, request("/hooks", ("t5", 0, *GROUPED))]
    assert check_topics(TRANSACTIONS, {**DRAINED, "sink_requests": half}) == [
        "t5 (commit unknown) was delivered in part: [0]"
    ]
    waiting = {"topic_depths": {HOOKS_TOPIC: 0, GROUPED_TOPIC: 2}, "sink_requests": DELIVERED}
    assert check_topics(TRANSACTIONS, waiting) == [
        f"topics not drained after the heal: {{'{HOOKS_TOPIC}': 0, '{GROUPED_TOPIC}': 2}}"
    ]


def change(
    op: str, at: int, resource: str, holder: str, mode: str, token: int | None, lease: int
) -> dict[str, Any]:
    """A row of the lock table's change log, at second `at`, its lease to second `lease`."""
    stamp = "2026-01-01T00:00:{:02d}+00:00".format
    return {
        "op": op,
        "at": stamp(at),
        "resource": resource,
        "holder": holder,
        "mode": mode,
        "family": [],
        "token": token,
        "lease_expires_at": stamp(lease),
    }


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


def write(
    at: int, relation: str, row: dict[str, Any], fence: dict[str, Any] | None
) -> dict[str, Any]:
    """A row of the catalog's change log: what was written at second `at`, under which fence."""
    return {
        "at": f"2026-01-01T00:00:{at:02d}+00:00",
        "relation": relation,
        "op": "INSERT",
        "row": json.dumps(row),
        "fence": None if fence is None else json.dumps(fence),
    }


def fence(resource: str, token: int, *path: tuple[str, int]) -> dict[str, Any]:
    return {
        "resource": resource,
        "token": token,
        "path": [{"resource": r, "mode": "IX", "token": t} for r, t in path],
    }


ORDERS = {"namespace": "sales", "name": "orders"}


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


BANK_TOTAL = BANK_ACCOUNTS * BANK_OPENING
BANK_ROWS = [
    {"id": n, "owner": f"owner-{n}", "balance": BANK_OPENING} for n in range(1, BANK_ACCOUNTS + 1)
]
LAKE_HISTORY = [
    {"t": 3.0, "event": "lake_read", "snapshot_id": 1, "rows": 20, "total": BANK_TOTAL},
    {"t": 6.0, "event": "lake_read_failed", "error": "FileNotFoundError()"},
    {"t": 9.0, "event": "lake_read", "snapshot_id": 2, "rows": 20, "total": BANK_TOTAL},
]
LAKE_END: dict[str, Any] = {
    "bank_depth": 0,
    "pipeline": {"state": "running"},
    "bank_source": BANK_ROWS,
    "bank_lake": [dict(row) for row in BANK_ROWS],
    "lake_files": {
        "bank.accounts": {"live": ["data/a.parquet"], "on_disk": ["data/a.parquet"]},
        "sales.orders": {"live": [], "on_disk": []},
    },
}


def test_a_lake_that_kept_its_total_equals_its_source_and_holds_its_files_has_no_violations() -> (
    None
):
    assert check_lake(LAKE_HISTORY, LAKE_END) == []


def test_a_torn_read_a_regressed_row_or_a_missing_or_orphan_file_is_a_violation() -> None:
    torn = [*LAKE_HISTORY, {**LAKE_HISTORY[0], "snapshot_id": 3, "total": BANK_TOTAL - 40}]
    assert [v for v in check_lake(torn, LAKE_END) if "snapshot 3" in v]
    regressed = {**LAKE_END, "bank_lake": [{**BANK_ROWS[0], "balance": 1}, *BANK_ROWS[1:]]}
    assert [v for v in check_lake(LAKE_HISTORY, regressed) if "differs" in v and "1:" in v]
    lost = {**LAKE_END, "bank_lake": BANK_ROWS[1:]}
    assert [v for v in check_lake(LAKE_HISTORY, lost) if "in 1 accounts" in v]
    undrained = {**LAKE_END, "bank_depth": 4}
    assert [v for v in check_lake(LAKE_HISTORY, undrained) if "did not drain" in v]
    files = {
        "bank.accounts": {"live": ["data/a.parquet", "data/b.parquet"], "on_disk": []},
        "sales.orders": {"live": [], "on_disk": ["_staging/t1/part-0.parquet"]},
    }
    found = check_lake(LAKE_HISTORY, {**LAKE_END, "lake_files": files})
    assert len([v for v in found if "missing" in v]) == 2
    assert [v for v in found if "sales.orders: _staging/t1/part-0.parquet is on disk" in v]


def snapshot(
    table: str, job_key: str, procedure_id: str, operation: str = "load"
) -> dict[str, Any]:
    namespace, name = table.split(".")
    return {
        "namespace": namespace,
        "table_name": name,
        "job_key": job_key,
        "procedure_id": procedure_id,
        "operation": operation,
    }


SPARK_OUTCOMES = {
    "l1": status("LoadTable", "sales.orders", "SUCCEEDED", "2026-01-01T00:00:01"),
    "l2": status("LoadTable", "sales.orders", "ROLLED_BACK", "2026-01-01T00:00:02"),
    "k1": status("CompactTable", "sales.orders", "SUCCEEDED", "2026-01-01T00:00:03"),
    "k2": status("CompactTable", "crm.events", "SUCCEEDED", "2026-01-01T00:00:04"),
}
SPARK_END: dict[str, Any] = {
    "snapshot_log": [
        snapshot("sales.orders", "l1-load", "l1"),
        snapshot("sales.orders", "k1-compact", "k1", "compact"),
        snapshot("bank.accounts", "batch-1", "pipeline", "apply"),
        snapshot("bank.accounts", "batch-2", "pipeline", "apply"),
    ],
    "spark_jobs": [
        {"job_key": "l1-load", "procedure_id": "l1", "attempt": 2, "state": "committed"},
        {"job_key": "l2-load", "procedure_id": "l2", "attempt": 1, "state": "cancelled"},
    ],
    "spark_drivers": {"active": [], "processes": []},
}


def test_one_commit_per_job_and_no_driver_left_have_no_violations() -> None:
    assert check_spark(SPARK_OUTCOMES, SPARK_END) == []


def test_a_doubled_lost_or_undone_commit_or_a_driver_left_running_is_a_violation() -> None:
    doubled = {
        **SPARK_END,
        "snapshot_log": [*SPARK_END["snapshot_log"], SPARK_END["snapshot_log"][2]],
    }
    assert [v for v in check_spark(SPARK_OUTCOMES, doubled) if "batch-1 committed 2" in v]
    lost = {**SPARK_END, "snapshot_log": SPARK_END["snapshot_log"][1:]}
    assert [v for v in check_spark(SPARK_OUTCOMES, lost) if "l1 (LoadTable) SUCCEEDED" in v]
    undone = {
        **SPARK_END,
        "snapshot_log": [*SPARK_END["snapshot_log"], snapshot("sales.orders", "l2-load", "l2")],
    }
    assert [v for v in check_spark(SPARK_OUTCOMES, undone) if "l2 (LoadTable) ROLLED_BACK" in v]
    half = {"job_key": "l3-load", "procedure_id": "l3", "attempt": 1, "state": "staged"}
    left = {**SPARK_END, "spark_jobs": [*SPARK_END["spark_jobs"], half]}
    assert [v for v in check_spark(SPARK_OUTCOMES, left) if "l3-load of l3 is left staged" in v]
    running = {**SPARK_END, "spark_drivers": {"active": [{"id": "driver-1"}], "processes": [42]}}
    assert [v for v in check_spark(SPARK_OUTCOMES, running) if "drivers left running" in v]
