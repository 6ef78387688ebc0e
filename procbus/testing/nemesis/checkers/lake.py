"""The checkers of the lake and its Spark jobs: the bank's lake table kept its total in every
snapshot read and matches its source, each table's folder holds its snapshot's files, and each
job committed at most once."""

from __future__ import annotations

import collections
from typing import Any

from procbus.testing.nemesis.checkers.procedures import ENDED
from procbus.testing.nemesis.operations import BANK_ACCOUNTS, BANK_OPENING


def check_lake(history: list[dict[str, Any]], end: dict[str, Any]) -> list[str]:
    """The bank's lake table: every snapshot a reader read during the run kept the bank's total
    (no half-applied transfer), and at the end it equals the source row for row. Every lake
    table's folder holds exactly its current snapshot's files: none missing, none that no
    snapshot lists (an undone or killed attempt's), no staging left."""
    violations = []
    total = BANK_ACCOUNTS * BANK_OPENING
    for read in history:  # (a read before the first batch was applied finds no snapshot)
        if read["event"] == "lake_read" and read["snapshot_id"] and read["total"] != total:
            violations.append(
                f"at {read['t']} s a reader read snapshot {read['snapshot_id']} of the bank's "
                f"lake table totalling {read['total']}, not {total}"
            )
    if end["bank_depth"] != 0:
        violations.append(
            f"the bank's pipeline did not drain: {end['bank_depth']} changes queued "
            f"(status: {end['pipeline']})"
        )
    source = {row["id"]: row for row in end["bank_source"]}
    lake = {row["id"]: row for row in end["bank_lake"]}
    differ = sorted(key for key in {*source, *lake} if source.get(key) != lake.get(key))
    if differ:
        shown = ", ".join(f"{key}: {source.get(key)} vs {lake.get(key)}" for key in differ[:5])
        violations.append(
            f"the bank's lake table differs from its source in {len(differ)} accounts: {shown}"
        )
    for table, files in sorted(end["lake_files"].items()):
        live, on_disk = set(files["live"]), set(files["on_disk"])
        for path in sorted(live - on_disk):
            violations.append(f"{table}: {path} is listed by its current snapshot but missing")
        for path in sorted(on_disk - live):
            violations.append(f"{table}: {path} is on disk but no current snapshot lists it")
    return violations


def check_spark(outcomes: dict[str, dict[str, Any]], end: dict[str, Any]) -> list[str]:
    """One committed attempt per job: no job committed two snapshots; a load that succeeded
    committed one, a compaction at most one (of nothing to compact, none), one undone none; no
    job's ledger row is left running or staged, and no driver is left running."""
    violations = []
    commits = collections.Counter(  # an expiry's commit has no job
        (entry["namespace"], entry["table_name"], entry["job_key"])
        for entry in end["snapshot_log"]
        if entry["job_key"]
    )
    for (namespace, table, job_key), count in sorted(commits.items()):
        if count > 1:
            violations.append(f"{namespace}.{table}: job {job_key} committed {count} snapshots")
    by_procedure = collections.Counter(entry["procedure_id"] for entry in end["snapshot_log"])
    for procedure_id, status in sorted(outcomes.items()):
        kind, state = status.get("procedure_type"), status.get("state")
        if kind not in ("LoadTable", "CompactTable") or state not in ENDED - {"STUCK"}:
            continue
        allowed = {"LoadTable": {1}, "CompactTable": {0, 1}}[kind] if state == "SUCCEEDED" else {0}
        if by_procedure[procedure_id] not in allowed:
            violations.append(
                f"{procedure_id} ({kind}) {state} and committed {by_procedure[procedure_id]} "
                "snapshots"
            )
    stuck = {pid for pid, status in outcomes.items() if status.get("state") == "STUCK"}
    for job in end["spark_jobs"]:
        if job["state"] in ("running", "staged") and job["procedure_id"] not in stuck:
            violations.append(
                f"job {job['job_key']} of {job['procedure_id']} is left {job['state']} "
                f"(attempt {job['attempt']})"
            )
    drivers = end["spark_drivers"]
    if drivers["active"] or drivers["processes"]:
        violations.append(
            f"drivers left running: the master lists {drivers['active']}, processes "
            f"{drivers['processes']}"
        )
    return violations
