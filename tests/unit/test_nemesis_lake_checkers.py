"""The nemesis's checkers of the lake and of Spark's commits (procbus.testing.nemesis): each
passes a clean history and finds the violation planted in it."""

from __future__ import annotations

from typing import Any

from procbus.testing.nemesis import (
    BANK_ACCOUNTS,
    BANK_OPENING,
    check_lake,
    check_spark,
)
from tests.unit.nemesis_helpers import status

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
