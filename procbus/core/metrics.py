"""procbus's own metrics, on the same Prometheus endpoint as the Temporal SDK's.

Both go through the Temporal runtime's metric meter: the runtime of a process started with
PROCBUS_METRICS_PORT (`procbus worker`; `procbus dev` uses 9090 unless set) serves them at
http://HOST:PORT/metrics. Workflow code records through `workflow.metric_meter()`, which skips
replays, so each state change counts once.
"""

from __future__ import annotations

from temporalio.common import MetricCounter, MetricGauge, MetricGaugeFloat, MetricMeter

# Counter {procedure_type, state}: procedures entering each state (RUNNING, WAITING, ...).
PROCEDURE_STATES = "procbus_procedure_states"
# Counter {procedure_type}: procedures that had to wait for their locks.
LOCK_WAITS = "procbus_lock_waits"
# Histogram {procedure_type}, seconds: from queueing for the locks to holding them all.
LOCK_WAIT_SECONDS = "procbus_lock_wait_seconds"
# Gauge: committed outbox rows not performed yet.
OUTBOX_BACKLOG = "procbus_outbox_backlog"
# Counter {kind}: outbox rows performed (start_workflow, signal_workflow).
OUTBOX_PERFORMED = "procbus_outbox_performed"
# Counter: Temporal calls of outbox rows that failed (the row is tried again later).
OUTBOX_FAILURES = "procbus_outbox_failures"

# Gauge: procedures STUCK now in the worker's namespace (waiting for an operator).
STUCK_PROCEDURES = "procbus_stuck_procedures"

# Gauge {topic}: committed entries waiting for delivery.
TOPIC_DEPTH = "procbus_topic_depth"
# Gauge {topic}: dead letters kept.
TOPIC_DEAD_LETTERS = "procbus_topic_dead_letters"
# Counter {topic}: entries delivered (acknowledged by the endpoint).
TOPIC_DELIVERED = "procbus_topic_delivered"
# Gauge {topic}, seconds: age of the oldest entry waiting (a pipeline's lag).
TOPIC_OLDEST_SECONDS = "procbus_topic_oldest_seconds"

# Every metric procbus defines, for the docs (docs/how-to/metrics.md) and the tests.
PROCBUS_METRICS = (
    PROCEDURE_STATES,
    LOCK_WAITS,
    LOCK_WAIT_SECONDS,
    OUTBOX_BACKLOG,
    OUTBOX_PERFORMED,
    OUTBOX_FAILURES,
    STUCK_PROCEDURES,
    TOPIC_DEPTH,
    TOPIC_DEAD_LETTERS,
    TOPIC_DELIVERED,
    TOPIC_OLDEST_SECONDS,
)


class OutboxMetrics:
    """What the outbox relay reports: its backlog and what it performed or failed to."""

    def __init__(self, meter: MetricMeter) -> None:
        self.backlog: MetricGauge = meter.create_gauge(
            OUTBOX_BACKLOG, "committed outbox rows not performed yet"
        )
        self.performed: MetricCounter = meter.create_counter(
            OUTBOX_PERFORMED, "outbox rows performed, by kind"
        )
        self.failures: MetricCounter = meter.create_counter(
            OUTBOX_FAILURES, "Temporal calls of outbox rows that failed and wait for a retry"
        )


def stuck_procedures_gauge(meter: MetricMeter) -> MetricGauge:
    """The gauge of the procedures STUCK now (procbus.procedures.report_stuck sets it)."""
    return meter.create_gauge(STUCK_PROCEDURES, "procedures STUCK now, waiting for an operator")


class TopicMetrics:
    """What a topic's delivery reports: its depth, its dead letters, what it delivered, and the
    age of its oldest entry waiting."""

    def __init__(self, meter: MetricMeter) -> None:
        self.depth: MetricGauge = meter.create_gauge(TOPIC_DEPTH, "entries waiting for delivery")
        self.dead_letters: MetricGauge = meter.create_gauge(TOPIC_DEAD_LETTERS, "dead letters kept")
        self.delivered: MetricCounter = meter.create_counter(
            TOPIC_DELIVERED, "entries the endpoint acknowledged"
        )
        self.oldest_seconds: MetricGaugeFloat = meter.create_gauge_float(
            TOPIC_OLDEST_SECONDS, "age in seconds of the oldest entry waiting"
        )
