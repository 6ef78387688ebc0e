"""The nemesis proper: a schedule of faults from a seed, and how each is injected into a test
cluster (procbus.testing.cluster), held, and healed."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

from procbus.testing.cluster import Cluster
from procbus.testing.nemesis.history import History

# How long each fault holds before it is healed, in seconds: (shortest, longest).
FAULT_SECONDS = (2.5, 11.0)
FAULT_KINDS = (
    *("kill", "pause", "cut_db", "cut_temporal", "cut_both"),
    *("restart_postgres", "restart_temporal"),
)
SERVER_OF = {"restart_postgres": "db", "restart_temporal": "temporal", "kill_driver": "spark"}
SINK_FAULT_KINDS = ("cut_sink",)  # on a cluster with a sink: a worker cut from the receiver
# On a cluster with latency proxies: a worker's link to PostgreSQL or Temporal slowed, each way
# by a delay in LATENCY_SECONDS (slow rather than dead).
LATENCY_FAULT_KINDS = ("slow_db", "slow_temporal")
LATENCY_SECONDS = (0.05, 1.0)
# On a cluster with a Spark host: every driver running there SIGKILLed (with its Python job).
SPARK_FAULT_KINDS = ("kill_driver",)


@dataclass(frozen=True)
class Fault:
    at: float  # seconds from the run's start
    kind: str
    target: str  # a worker, or "db" for a PostgreSQL restart
    hold: float
    delay: float = 0.0  # a slowed link's, each way


def fault_schedule(
    seed: int, seconds: float, workers: list[str], kinds: tuple[str, ...] = FAULT_KINDS
) -> list[Fault]:
    """Faults of `kinds` at random times, one at a time (each healed before the next begins)."""
    rng = random.Random(f"faults-{seed}")
    faults: list[Fault] = []
    at = rng.uniform(2, 5)
    while at < seconds:
        kind = rng.choice(kinds)
        target = SERVER_OF.get(kind) or rng.choice(workers)
        hold = round(rng.uniform(*FAULT_SECONDS), 2)
        delay = round(rng.uniform(*LATENCY_SECONDS), 3) if kind in LATENCY_FAULT_KINDS else 0.0
        faults.append(Fault(round(at, 2), kind, target, hold, delay))
        at += hold + rng.uniform(0.5, 1.5)
    return faults


def inject(cluster: Cluster, fault: Fault, history: History) -> None:
    """Inject `fault`, hold it for its time, then heal it."""
    network = cluster.network
    if fault.kind == "kill":
        cluster.workers[fault.target].kill()
        time.sleep(fault.hold)
        cluster.start_worker(fault.target)
    elif fault.kind == "pause":
        cluster.workers[fault.target].pause()
        time.sleep(fault.hold)
        cluster.workers[fault.target].resume()
    elif fault.kind.startswith("cut_"):
        peers = {"cut_db": ["db"], "cut_temporal": ["temporal"], "cut_sink": ["sink"]}.get(
            fault.kind, ["db", "temporal"]
        )
        network.cut(fault.target, *peers)
        time.sleep(fault.hold)
        network.heal(fault.target)
    elif fault.kind.startswith("slow_"):
        server = fault.kind.removeprefix("slow_")
        cluster.set_latency(fault.target, server, fault.delay)
        time.sleep(fault.hold)
        cluster.set_latency(fault.target, server, 0)
    elif fault.kind == "restart_postgres":
        cluster.postgres.stop()  # SIGINT: PostgreSQL's fast shutdown
        time.sleep(fault.hold)
        cluster.postgres.launch()
        cluster.postgres.wait_ready()
    elif fault.kind == "restart_temporal":
        cluster.temporal.stop()  # SIGTERM; its workflows are in its database file
        time.sleep(fault.hold)
        cluster.temporal.launch()
        cluster.temporal.wait_ready()
    elif fault.kind == "kill_driver":
        assert cluster.spark is not None
        history.record("drivers_killed", count=cluster.spark.kill_drivers())
        time.sleep(fault.hold)


def heal_all(cluster: Cluster) -> None:
    """Every worker reconnected, its links at full speed, resumed or started again."""
    for name in cluster.worker_names:
        cluster.network.heal(name)
        for server in cluster.proxies:
            cluster.set_latency(name, server, 0)
        worker = cluster.workers[name]
        if worker.running():
            worker.resume()
        else:
            cluster.start_worker(name)
