"""procbus under a nemesis: a cluster of hosts on this machine (network namespaces: run as
root), faults and a workload of procedures and application transactions publishing to topics
(delivered to a webhook receiver on the `sink` host) from a seed, then the checkers' verdicts.
With --spark, a Spark cluster on its own host, and loads, compactions and a change pipeline too.

    python bench/nemesis.py --seed 7 --minutes 30 --spark

Prints each fault and each procedure's end, then the checkers' violations; the last line is
JSON: faults, operations, transactions by outcome, requests the sink received, lock table changes
and catalog writes replayed, with --spark the bank's transfers, the lake reads and the snapshots
committed, violations, and each checker's count. The same seed gives the same schedule of
faults and operations (docs/internals/testing.md says how to reproduce one).
"""

from __future__ import annotations

import argparse
import collections
import signal
import sys
import time
from pathlib import Path
from typing import Any

from harness import emit, sized  # bench/, beside this script

from procbus.testing.nemesis import (
    OPERATIONS_PER_SECOND,
    recheck,
    run_on_a_new_cluster,
    verdicts,
)

PROCBUS = str(Path(sys.executable).parent / "procbus")
# The checkers' names (procbus.testing.nemesis.verdicts), each with its count of violations.
CHECKERS = (
    "procedures",
    "deadlines",
    "catalog",
    "caches",
    "topics",
    "locks",
    "fencing",
    "access",
    "notes",
)
FIGURES = (
    "seed",
    "minutes",
    "seconds",
    "faults",
    "operations",
    "ended",
    "transactions",
    "sink_requests",
    "kafka_records",
    "amqp_messages",
    "lock_changes",
    "catalog_writes",
    "violations",
    *CHECKERS,
)
# With --spark: the lake's figures, and its two checkers.
SPARK_FIGURES = (
    "transfers",
    "lake_reads",
    "lake_snapshots_read",
    "lake_reads_failed",
    "snapshots_committed",
    "drivers_killed",
    "lake",
    "spark",
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--minutes", type=float, default=sized(2.0, 0.5))
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--history", type=Path, help="write the run's history here (JSON lines)")
    parser.add_argument(
        "--operations-per-second",
        type=float,
        default=OPERATIONS_PER_SECOND,
        help="table procedures and grants a second",
    )
    parser.add_argument("--no-amqp", action="store_true", help="no RabbitMQ broker and topic")
    parser.add_argument(
        "--spark",
        action="store_true",
        help="a Spark cluster on its own host: loads, compactions, the bank's change pipeline, "
        "driver kills, and the lake and Spark checkers",
    )
    parser.add_argument(
        "--recheck",
        type=Path,
        metavar="HISTORY",
        help="run no cluster: run the checkers again on a history an earlier run saved",
    )
    options = parser.parse_args()
    # SIGTERM (a timeout, a CI's cancel) ends it like Ctrl-C: the cluster is torn down.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    began = time.monotonic()
    if options.recheck is not None:
        history, outcomes, end = recheck(options.recheck)
        found, planned = verdicts(outcomes, end, history), len(history.of("started"))
        options.spark = "spark_jobs" in end
        options.seed, options.minutes = history.of("began")[0]["seed"], None
        began -= history.events[-1]["t"]  # the run's own seconds, not this recheck's
    else:
        report = run_on_a_new_cluster(
            options.seed,
            options.minutes * 60,
            PROCBUS,
            options.workers,
            options.history,
            amqp=not options.no_amqp,
            spark=options.spark,
            operations_per_second=options.operations_per_second,
        )
        history, outcomes, end, found = (
            report.run.history,
            report.outcomes,
            report.end,
            report.violations,
        )
        planned = len(report.run.operations)
    for fault in history.of("fault"):
        slowed = f"  +{fault['delay']}s each way" if fault["delay"] else ""
        print(
            f"{fault['t']:8.1f}s  {fault['kind']:<17} {fault['target']:<3} {fault['hold']}s{slowed}"
        )
    ended = collections.Counter(status.get("state", "UNKNOWN") for status in outcomes.values())
    print(f"operations: {planned} planned, {len(outcomes)} started, ended {dict(ended)}")
    transactions = collections.Counter(txn["outcome"] for txn in history.of("txn"))
    requests = len(end["sink_requests"])
    paths = collections.Counter(request["path"] for request in end["sink_requests"])
    kafka_records, amqp_messages = paths["/kafka"], paths["/amqp"]
    webhooks = requests - kafka_records - amqp_messages
    print(
        f"transactions: {dict(transactions)}; the sink received {webhooks} webhook requests, "
        f"its Kafka topic holds {kafka_records} records and its queue {amqp_messages} messages"
    )
    lake: dict[str, object] = {}
    if options.spark:
        transfers = collections.Counter(event["outcome"] for event in history.of("transfer"))
        reads = history.of("lake_read")
        committed = collections.Counter(
            snapshot_maker(entry, outcomes) for entry in end["snapshot_log"]
        )
        lake = {
            "transfers": dict(transfers),
            "lake_reads": len(reads),
            "lake_snapshots_read": len({read["snapshot_id"] for read in reads}),
            "lake_reads_failed": len(history.of("lake_read_failed")),
            "snapshots_committed": dict(committed),
            "drivers_killed": sum(kill["count"] for kill in history.of("drivers_killed")),
        }
        print(
            f"bank: transfers {dict(transfers)}; a lake reader read {len(reads)} times "
            f"({lake['lake_snapshots_read']} snapshots, {lake['lake_reads_failed']} reads "
            f"failed); snapshots committed {dict(committed)}; drivers killed "
            f"{lake['drivers_killed']}"
        )
    lock_changes = len(end["lock_log"])
    catalog_writes = len(end["catalog_log"])
    print(f"lock table changes replayed: {lock_changes}; catalog writes: {catalog_writes}")
    for checker, violations in found.items():
        print(f"{checker}: {len(violations)} violation(s)")
        for violation in violations:
            print(f"  {violation}")
    total = sum(len(violations) for violations in found.values())
    emit(
        {
            "seed": options.seed,
            "minutes": options.minutes,
            "seconds": round(time.monotonic() - began, 1),
            "faults": len(history.of("fault")),
            "operations": len(outcomes),
            "ended": dict(ended),
            "transactions": dict(transactions),
            "sink_requests": webhooks,
            "kafka_records": kafka_records,
            "amqp_messages": amqp_messages,
            "lock_changes": lock_changes,
            "catalog_writes": catalog_writes,
            **lake,
            "violations": total,
            **{checker: len(violations) for checker, violations in found.items()},
        },
        (*FIGURES, *SPARK_FIGURES) if options.spark else FIGURES,
    )
    return 1 if total else 0


def snapshot_maker(entry: dict[str, Any], outcomes: dict[str, dict[str, Any]]) -> str:
    """What committed a snapshot of the log: a pipeline batch, a procedure (by its type), or an
    expiry (no job)."""
    procedure_id: str = entry["procedure_id"]
    if not procedure_id:
        return "expiry"
    if procedure_id.startswith("pipeline:"):
        return "pipeline batch"
    return str(outcomes.get(procedure_id, {}).get("procedure_type", "another procedure"))


if __name__ == "__main__":
    sys.exit(main())
