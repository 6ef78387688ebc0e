"""A nemesis over a test cluster (procbus.testing.cluster): from a seed, a schedule of faults
and a workload of procedures and (on a cluster with a sink) application transactions that
publish to topics, run at once, every event written to a history, and checkers that read the
history, the sink's journal and the cluster's end state (docs/internals/testing.md).

The same seed gives the same schedule of faults and operations; what the cluster does with them
depends on timing, which is the point of running it.

Its modules: `operations` (the workload), `faults` (the nemesis proper), `run` (one run),
`ends` (what a run ends with), `checkers` (one module per concern), `report` (run to verdict).
"""

from procbus.testing.nemesis.checkers import (
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
    last_table_writers,
)
from procbus.testing.nemesis.ends import procedure_ends
from procbus.testing.nemesis.faults import FAULT_KINDS, SINK_FAULT_KINDS, Fault, fault_schedule
from procbus.testing.nemesis.history import History
from procbus.testing.nemesis.operations import (
    BANK_ACCOUNTS,
    BANK_OPENING,
    GROUPED_TOPIC,
    HOOKS_TOPIC,
    OPERATIONS_PER_SECOND,
    AppTransaction,
    Operation,
    app_transactions,
    spark_operations,
    user_operations,
    workload,
)
from procbus.testing.nemesis.report import Report, recheck, run_on_a_new_cluster, verdicts
from procbus.testing.nemesis.run import Run

__all__ = [
    "BANK_ACCOUNTS",
    "BANK_OPENING",
    "FAULT_KINDS",
    "GROUPED_TOPIC",
    "HOOKS_TOPIC",
    "OPERATIONS_PER_SECOND",
    "SINK_FAULT_KINDS",
    "AppTransaction",
    "Fault",
    "History",
    "Operation",
    "Report",
    "Run",
    "app_transactions",
    "check_access",
    "check_caches",
    "check_catalog",
    "check_deadlines",
    "check_fencing",
    "check_lake",
    "check_locks",
    "check_notes",
    "check_procedures",
    "check_spark",
    "check_topics",
    "evicted_tables",
    "fault_schedule",
    "last_table_writers",
    "procedure_ends",
    "recheck",
    "run_on_a_new_cluster",
    "spark_operations",
    "user_operations",
    "verdicts",
    "workload",
]
