"""A clean history of the nemesis's procedures and the end state it leaves, and rows of the lock
and catalog change logs, for its checkers' tests to plant violations in."""

from __future__ import annotations

import json
from typing import Any


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
