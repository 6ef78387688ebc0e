"""The nemesis's schedule and checkers (procbus.testing.nemesis): each checker passes a clean
history and finds the violation planted in it."""

from __future__ import annotations

import itertools
from typing import Any

from procbus.testing.nemesis import (
    check_caches,
    check_catalog,
    check_procedures,
    fault_schedule,
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
END: dict[str, Any] = {
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
    assert check_catalog(OUTCOMES, residue) == [
        "crm.events: a folder without a catalog entry (residue of an undone or half-done procedure)"
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
    assert fault_schedule(7, 600, workers) != fault_schedule(8, 600, workers)
    faults = fault_schedule(7, 600, workers)
    # One at a time: each healed before the next begins.
    assert all(a.at + a.hold < b.at for a, b in itertools.pairwise(faults))
