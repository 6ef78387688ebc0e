"""The nemesis's workload, from a seed: table procedures and grants, the user's own procedure,
loads and compactions (its operations), and application transactions that publish to topics,
each at random times; and the names and rates the run and the checkers share with it."""

from __future__ import annotations

import json
import random
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

NAMESPACES = ("sales", "crm")
TABLES = ("orders", "customers", "events")
PRINCIPALS = ("etl", "analyst")
PERMISSIONS = ("read", "write")
# The topics the application transactions publish to: one event at a time, and in batches that
# never split a transaction (the sink's path tells them apart).
HOOKS_TOPIC, GROUPED_TOPIC = "nemesis-hooks", "nemesis-grouped"
TOPIC_PATHS = {HOOKS_TOPIC: "/hooks", GROUPED_TOPIC: "/grouped?batch=1"}
KEYS = ("k0", "k1", "k2", "k3", "k4")
# On a cluster with a Kafka broker on the sink host: a third topic, delivered to the Kafka topic
# KAFKA_TARGET (three partitions, made by `topic create`), read back by a read_committed
# consumer at the end; each record counts as one request of path "/kafka" for the checker.
KAFKA_TOPIC, KAFKA_TARGET = "nemesis-kafka", "nemesis"
# On a cluster with a RabbitMQ broker on the sink host: a fourth topic, delivered to the queue
# AMQP_QUEUE (through the default exchange), read whole at the end; each message counts as one
# request of path "/amqp" for the checker.
AMQP_TOPIC, AMQP_QUEUE = "nemesis-amqp", "nemesis"
# Half the deletions run as this principal (deleting a table's data is writing it): the access
# checker follows its write grants, which the workload's grants and revokes change.
DELETER, DELETER_SHARE = "etl", 0.5
# The user's own procedure (examples/user_procedures.py's RefreshCaches, when the cluster's
# workers run that module), started with the `temporal` CLI as its users do, on the workload's
# tables in `sales`: its X lock contends with theirs. It writes a note in a file of the table's,
# then evicts the table from every worker's cache; one in four then fails, to be undone.
USER_MODULE, USER_PROCEDURE = "examples.user_procedures", "RefreshCaches"
USER_RATE, USER_REFUSE_SHARE = 0.1, 0.25
# Table procedures and grants a second (each started by a `procbus` CLI process).
OPERATIONS_PER_SECOND = 0.7
# On a cluster with a Spark host: loads (of LOAD_ROWS rows from a CSV file of their own) and
# compactions, each a job that runs as a driver on the Spark cluster, at this rate (a driver
# and its executor are two JVMs: seconds of CPU each).
SPARK_OPERATIONS_PER_SECOND, LOAD_ROWS = 1 / 40, 40
# Three in four of them on LAKE_TABLES, made at the start and never deleted (loads and
# compactions contend there: IX against X); the others on the workload's tables, which its
# deletions race.
LAKE_NAMESPACE, LAKE_TABLES, LAKE_SHARE = "lake", ("orders", "events"), 0.75
# And the application's bank: BANK_ACCOUNTS accounts in PostgreSQL, captured into a change
# pipeline that applies their changes to the lake table BANK_TABLE, transfers between them at
# TRANSFERS_PER_SECOND (one in five rolled back), a compaction Schedule on the lake table, and a
# reader of the lake table every LAKE_READ_SECONDS: each snapshot it reads must keep the total.
BANK_SOURCE, BANK_TOPIC, BANK_NAMESPACE, BANK_TABLE = (
    *("nemesis_accounts", "nemesis-bank", "bank", "accounts"),
)
BANK_ACCOUNTS, BANK_OPENING, TRANSFERS_PER_SECOND = 20, 1000, 2.0
BANK_COMPACTION_SCHEDULE, BANK_COMPACTION_EVERY = "nemesis-compact-bank", "90s"
# A run that failed pauses the Schedule (pause on failure): the harness unpauses it, as an
# operator would, when it finds it paused on a look this often.
SCHEDULE_CHECK_SECONDS = 30.0
LAKE_READ_SECONDS = 3.0
# One table procedure in three gets a deadline (`--deadline`), some shorter than a lock wait.
DEADLINE_SHARE, DEADLINES = 1 / 3, (4.0, 8.0, 15.0, 30.0)


@dataclass(frozen=True)
class Operation:
    at: float
    procedure_id: str
    argv: tuple[str, ...]  # the command that starts it, without its program
    deadline_seconds: float | None = None
    program: str = "procbus"  # or "temporal": the `temporal` CLI


@dataclass(frozen=True)
class AppTransaction:
    """An application transaction: its events (topic, key), committed or rolled back on
    purpose."""

    at: float
    txn: str
    events: tuple[tuple[str, str], ...]
    roll_back: bool


def arrivals(rng: random.Random, seconds: float, rate_per_second: float) -> Iterator[float]:
    """Random times within `seconds` (a Poisson process of `rate_per_second`)."""
    at = rng.expovariate(rate_per_second)
    while at < seconds:
        yield at
        at += rng.expovariate(rate_per_second)


def workload(
    seed: int, seconds: float, rate_per_second: float = OPERATIONS_PER_SECOND
) -> list[Operation]:
    """Table procedures and grants on shared tables (their locks contend), at random times;
    some with a deadline, some deletions as `etl` (each from a random generator of its own, so
    a seed's operations and their times stayed what they were before these came)."""
    rng = random.Random(f"workload-{seed}")
    deadline_rng = random.Random(f"deadlines-{seed}")
    principal_rng = random.Random(f"principals-{seed}")
    operations: list[Operation] = []
    for number, at in enumerate(arrivals(rng, seconds, rate_per_second), start=1):
        table = f"{rng.choice(NAMESPACES)}.{rng.choice(TABLES)}"
        kind = rng.choice(("create", "create", "delete", "grant", "revoke"))
        procedure_id = f"nemesis-{seed}-{number}-{kind}"
        argv: tuple[str, ...]
        if kind == "create":
            argv = ("table", "create", table, "--schema", "id:bigint,note:string")
        elif kind == "delete":
            argv = ("table", "delete", table)
            if principal_rng.random() < DELETER_SHARE:
                argv = (*argv, "--as", DELETER)
        else:
            principal, permission = rng.choice(PRINCIPALS), rng.choice(PERMISSIONS)
            argv = ("acl", kind, principal, table, permission)
        deadline = None
        if deadline_rng.random() < DEADLINE_SHARE:
            deadline = deadline_rng.choice(DEADLINES)
            argv = (*argv, "--deadline", str(deadline))
        argv = (*argv, "--id", procedure_id)
        operations.append(Operation(round(at, 2), procedure_id, argv, deadline))
    return operations


def user_operations(seed: int, seconds: float, notes: Path) -> list[Operation]:
    """The user's procedure at random times (from a generator of its own), each started with
    `temporal workflow start` under an ID of the seed's, its notes in `notes`/notes-TABLE."""
    rng = random.Random(f"user-{seed}")
    operations = []
    for number, at in enumerate(arrivals(rng, seconds, USER_RATE), start=1):
        table = rng.choice(TABLES)
        request = {
            "table": table,
            "notes": str(notes / f"notes-{table}"),
            "refuse": rng.random() < USER_REFUSE_SHARE,
        }
        procedure_id = f"nemesis-{seed}-u{number}-refresh"
        argv = (
            *("workflow", "start", "--type", USER_PROCEDURE, "--task-queue", "procbus"),
            *("--workflow-id", procedure_id, "--input", json.dumps(request)),
            # Asked again after a lost answer, it must not start a second run of a closed one.
            *("--id-reuse-policy", "RejectDuplicate"),
        )
        operations.append(Operation(round(at, 2), procedure_id, argv, program="temporal"))
    return operations


def spark_operations(seed: int, seconds: float, inputs: Path) -> list[Operation]:
    """Loads and compactions at random times (from a generator of their own), mostly of the
    lake tables, the others of the workload's tables; each load from its own CSV file under
    `inputs`, written when the run sets up."""
    rng = random.Random(f"spark-{seed}")
    operations = []
    for number, at in enumerate(arrivals(rng, seconds, SPARK_OPERATIONS_PER_SECOND), start=1):
        table = f"{rng.choice(NAMESPACES)}.{rng.choice(TABLES)}"
        if rng.random() < LAKE_SHARE:
            table = f"{LAKE_NAMESPACE}.{rng.choice(LAKE_TABLES)}"
        kind = rng.choice(("load", "load", "compact"))
        procedure_id = f"nemesis-{seed}-s{number}-{kind}"
        argv: tuple[str, ...] = ("table", "compact", table)
        if kind == "load":
            argv = ("table", "load", table, "--from", str(inputs / f"{procedure_id}.csv"))
        operations.append(Operation(round(at, 2), procedure_id, (*argv, "--id", procedure_id)))
    return operations


def write_load_inputs(operations: Sequence[Operation], inputs: Path) -> None:
    """Each load's CSV file: LOAD_ROWS rows of the workload's table schema (id, note)."""
    inputs.mkdir(parents=True, exist_ok=True)
    for number, operation in enumerate(operations):
        if "--from" in operation.argv:
            path = Path(operation.argv[operation.argv.index("--from") + 1])
            first = number * LOAD_ROWS
            rows = (f"{n},{operation.procedure_id}" for n in range(first, first + LOAD_ROWS))
            path.write_text("id,note\n" + "\n".join(rows) + "\n")


def app_transactions(
    seed: int,
    seconds: float,
    rate_per_second: float = 2.0,
    topics: tuple[str, ...] = (HOOKS_TOPIC, GROUPED_TOPIC),
) -> list[AppTransaction]:
    """Application transactions at random times, one after another: each publishes one to four
    events to the two topics, on a few keys; one in five is rolled back."""
    rng = random.Random(f"transactions-{seed}")
    transactions: list[AppTransaction] = []
    for number, at in enumerate(arrivals(rng, seconds, rate_per_second), start=1):
        events = tuple((rng.choice(topics), rng.choice(KEYS)) for _ in range(rng.randint(1, 4)))
        roll_back = rng.random() < 0.2
        transactions.append(AppTransaction(round(at, 2), f"t{seed}-{number}", events, roll_back))
    return transactions
