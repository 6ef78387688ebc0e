"""The nemesis's schedule and checkers (procbus.testing.nemesis): each checker passes a clean
history and finds the violation planted in it."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

from procbus.testing.nemesis import (
    FAULT_KINDS,
    GROUPED_TOPIC,
    HOOKS_TOPIC,
    SINK_FAULT_KINDS,
    app_transactions,
    check_caches,
    check_catalog,
    check_deadlines,
    check_procedures,
    check_topics,
    fault_schedule,
    recheck,
    workload,
)
from tests.unit.nemesis_helpers import END, EVENTS, ORDERS, OUTCOMES, change, fence, status, write


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
