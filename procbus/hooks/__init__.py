"""Post-commit hooks and the durable outbox.

transaction: `transaction(conn)` with in-process hooks, savepoints and durable calls (outbox rows
written in the same transaction); outbox: the relay that performs those rows after commit, and
the Temporal Schedule that sweeps what a dead relay left.
"""

from procbus.hooks.outbox import SWEEP_SCHEDULE_ID, OutboxRelay, OutboxRow, ensure_sweep_schedule
from procbus.hooks.transaction import (
    HookFailedAfterCommit,
    PreviousHookFailed,
    SavepointRolledBack,
    Transaction,
    TransactionAborted,
    run_in_transaction,
    transaction,
)

__all__ = [
    "SWEEP_SCHEDULE_ID",
    "HookFailedAfterCommit",
    "OutboxRelay",
    "OutboxRow",
    "PreviousHookFailed",
    "SavepointRolledBack",
    "Transaction",
    "TransactionAborted",
    "ensure_sweep_schedule",
    "run_in_transaction",
    "transaction",
]
