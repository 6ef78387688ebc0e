"""A nemesis run from start to verdict: a cluster up for one run, torn down after it, and each
checker's violations (run_on_a_new_cluster); or the checkers again on a history an earlier run
saved (recheck, then verdicts)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from procbus.testing.cluster import running_cluster
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
)
from procbus.testing.nemesis.history import History
from procbus.testing.nemesis.operations import OPERATIONS_PER_SECOND, USER_MODULE
from procbus.testing.nemesis.run import Run

# A saved history from before "ended" kept a procedure's type: its start's command says it.
_COMMAND_TYPES = {
    ("table", "create"): "CreateTable",
    ("table", "delete"): "DeleteTable",
    ("table", "load"): "LoadTable",
    ("table", "compact"): "CompactTable",
}


@dataclass
class Report:
    """A finished run: what it did, the cluster's state after the quiet period, and each
    checker's violations."""

    run: Run
    outcomes: dict[str, dict[str, Any]]
    end: dict[str, Any]
    violations: dict[str, list[str]]


def run_on_a_new_cluster(
    seed: int,
    seconds: float,
    procbus: str,
    workers: int = 3,
    history: Path | None = None,
    worker_modules: Sequence[str] = (USER_MODULE,),
    *,
    latency: bool = True,
    amqp: bool = True,
    spark: bool = False,
    operations_per_second: float = OPERATIONS_PER_SECOND,
) -> Report:
    """A cluster of `workers` workers and a sink (with a Kafka broker) up for one run from
    `seed` (bench/nemesis.py's and the short run of `make test`), torn down after it; its
    history written to `history`, also when the run failed. The workers run the user's
    procedures of `worker_modules` too, imported from the folder this runs in (the project's,
    for examples.user_procedures). `latency`: the latency proxies and their faults; `amqp`: a
    RabbitMQ broker on the sink host and a topic delivered to it; `spark`: a Spark cluster on
    its own host, with loads, compactions, the bank's change pipeline and driver kills (checked by
    the lake and Spark checkers); `operations_per_second`: the workload's rate of table
    procedures and grants."""
    with running_cluster(
        workers,
        member_timeout_seconds=5.0,
        sink=True,
        worker_modules=worker_modules,
        latency=latency,
        kafka=True,
        amqp=amqp,
        spark=spark,
    ) as cluster:
        run = Run(cluster, seed, seconds, procbus, operations_per_second)
        try:
            run.setup()
            run.run()
            outcomes = run.outcomes()
            end = run.end_state()
        finally:
            if history is not None:
                run.history.write(history)
        if history is not None:  # the end state beside it, for a reader of a failed run
            history.with_suffix(".end.json").write_text(json.dumps(end, default=str))
    return Report(run, outcomes, end, verdicts(outcomes, end, run.history))


def recheck(history_path: Path) -> tuple[History, dict[str, dict[str, Any]], dict[str, Any]]:
    """A finished run's history, each procedure's end and the end state, as `--history` saved
    them (the end state beside it, .end.json), for the checkers to run again (verdicts)."""
    history = History(
        events=[json.loads(line) for line in history_path.read_text().splitlines() if line]
    )
    end: dict[str, Any] = json.loads(history_path.with_suffix(".end.json").read_text())
    outcomes = {event["procedure_id"]: dict(event) for event in history.of("ended")}
    for started in history.of("started"):
        argv, status = started.get("argv") or [], outcomes.get(started["procedure_id"])
        kind = _COMMAND_TYPES.get(tuple(argv[:2]))
        if status is not None and kind is not None and status.get("procedure_type") is None:
            status.update(procedure_type=kind, target=argv[2])
    return history, outcomes, end


def verdicts(
    outcomes: dict[str, dict[str, Any]], end: dict[str, Any], history: History
) -> dict[str, list[str]]:
    return {
        "procedures": check_procedures(outcomes),
        "deadlines": check_deadlines(history.events, outcomes),
        "catalog": check_catalog(outcomes, end),
        "caches": check_caches(end, evicted_tables(history.events, end)),
        "topics": check_topics(history.events, end),
        "locks": check_locks(end),
        "fencing": check_fencing(end),
        "access": check_access(history.events, end),
        "notes": check_notes(history.events, end),
        **(
            {"lake": check_lake(history.events, end), "spark": check_spark(outcomes, end)}
            if "spark_jobs" in end
            else {}
        ),
    }
