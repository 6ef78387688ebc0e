"""Topics spread over a cluster's workers, and how fast they move when a worker is lost: a
cluster of hosts on this machine (network namespaces: run as root), 24 topics delivering to the
`sink` host.

    python bench/scaleout.py [--topics 24] [--workers 3]

Each topic has one delivery owner, the worker running its TopicDelivery workflow's activity. The
bench reads who owns what, then takes the busiest owner away twice: first SIGKILLed (the
baseline, restarted after), then cut from both PostgreSQL and Temporal (healed after). Each
time it publishes one event to each of that worker's topics and times how long until the sink
receives it: that is the takeover, bounded below by the delivery activity's heartbeat timeout
(15 s). The last line is JSON: the spread, each takeover's p50 and p99, and the partition's p99
over the kill's (measured in the same run).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import asyncpg
from harness import emit, sized  # bench/, beside this script
from temporalio.client import Client

from procbus.delivery.owner import delivery_workflow_id
from procbus.testing.cluster import Cluster, running_cluster, wait_until
from procbus.topics import Event, Topics

PROCBUS = str(Path(sys.executable).parent / "procbus")
FIGURES = (
    "topics",
    "workers",
    "owned_per_worker",
    "max_owned",
    "heartbeat_timeout_s",
    "kill_takeover_p50_s",
    "kill_takeover_p99_s",
    "takeover_p50_s",
    "takeover_p99_s",
    "ratio_partition_over_kill_p99",
)


async def owners(cluster: Cluster, topics: list[str]) -> dict[str, str | None]:
    """Each topic's delivery owner (the worker whose process runs its activity now), or None
    while the activity waits for a worker."""
    by_pid = {str(worker.pid): name for name, worker in cluster.workers.items()}
    client = await Client.connect(cluster.temporal.address)
    found: dict[str, str | None] = {}
    for topic in topics:
        described = await client.get_workflow_handle(delivery_workflow_id(topic)).describe()
        pending = described.raw_description.pending_activities
        identity = pending[0].last_worker_identity if pending else ""
        started = bool(pending) and pending[0].last_started_time.seconds > 0
        found[topic] = by_pid.get(identity.split("@")[0]) if started else None
    return found


async def delivery_heartbeat_timeout(cluster: Cluster, topic: str) -> float:
    """The heartbeat timeout the topic's delivery activity was scheduled with, from its
    workflow's history: what bounds a takeover from below in this run."""
    client = await Client.connect(cluster.temporal.address)
    history = await client.get_workflow_handle(delivery_workflow_id(topic)).fetch_history()
    for event in history.events:
        if event.HasField("activity_task_scheduled_event_attributes"):
            scheduled = event.activity_task_scheduled_event_attributes
            if scheduled.activity_type.name == "deliver_topic":
                return scheduled.heartbeat_timeout.ToTimedelta().total_seconds()
    raise RuntimeError(f"the delivery of {topic} scheduled no deliver_topic activity")


async def publish_markers(cluster: Cluster, topics: list[str], phase: str) -> float:
    """One event to each topic, all committed at once; the wall time they were."""
    pool = await asyncpg.create_pool(cluster.database_url, min_size=1, max_size=4)
    try:
        queue = Topics(pool)
        for topic in topics:
            await queue.publish(topic, Event(payload={"phase": phase, "topic": topic}))
    finally:
        await pool.close()
    return time.time()


def takeover_seconds(cluster: Cluster, topics: list[str], phase: str, since: float) -> list[float]:
    """For each topic, how long after `since` the sink first received its `phase` marker."""
    arrived: dict[str, float] = {}

    def all_arrived() -> bool:
        for request in cluster.sink_requests():
            for event in request["events"]:
                data = event["data"]
                if data.get("phase") == phase and data["topic"] in topics:
                    arrived.setdefault(data["topic"], request["at"])
        return len(arrived) == len(topics)

    wait_until(all_arrived, 180, f"every {phase} marker at the sink")
    return sorted(arrived[topic] - since for topic in topics)


def percentile(values: list[float], share: float) -> float:
    if len(values) < 2:
        return round(values[0], 2)
    return round(statistics.quantiles(values, n=100, method="inclusive")[int(share * 100) - 1], 2)


def lose_busiest(
    cluster: Cluster, topics: list[str], phase: str, lose: Callable[[str], None]
) -> tuple[str, list[float]]:
    owned = asyncio.run(owners(cluster, topics))
    busiest = collections.Counter(o for o in owned.values() if o).most_common(1)[0][0]
    mine = [topic for topic, owner in owned.items() if owner == busiest]
    lose(busiest)
    since = asyncio.run(publish_markers(cluster, mine, phase))
    return busiest, takeover_seconds(cluster, mine, phase, since)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--topics", type=int, default=sized(24, 2))
    parser.add_argument("--workers", type=int, default=sized(3, 2))
    options = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with running_cluster(options.workers, member_timeout_seconds=5.0, sink=True) as cluster:
        env = cluster.cli_env()
        topics = [f"spread-{n:02d}" for n in range(options.topics)]
        for topic in topics:
            subprocess.run(
                [PROCBUS, "topic", "create", topic, "--endpoint", cluster.sink_url("/hooks")],
                env=env,
                check=True,
                capture_output=True,
            )

        def spread() -> dict[str, str | None]:
            return asyncio.run(owners(cluster, topics))

        wait_until(lambda: all(spread().values()), 120, "every topic owned")
        owned = spread()
        heartbeat_timeout = asyncio.run(delivery_heartbeat_timeout(cluster, topics[0]))
        per_worker = dict(sorted(collections.Counter(o for o in owned.values() if o).items()))
        print(f"{len(topics)} topics over {options.workers} workers: {per_worker}")

        def kill(name: str) -> None:
            cluster.workers[name].kill()

        killed, after_kill = lose_busiest(cluster, topics, "kill", kill)
        print(f"killed {killed}: its {len(after_kill)} topics resumed after {after_kill} s")
        cluster.start_worker(killed)
        wait_until(lambda: all(spread().values()), 120, "every topic owned again")

        def partition(name: str) -> None:
            cluster.network.cut(name, "db", "temporal")

        cut, after_cut = lose_busiest(cluster, topics, "partition", partition)
        print(f"cut {cut} from db and temporal: its topics resumed after {after_cut} s")
        cluster.network.heal(cut)
    kill_p99, cut_p99 = percentile(after_kill, 0.99), percentile(after_cut, 0.99)
    emit(
        {
            "topics": len(topics),
            "workers": options.workers,
            "owned_per_worker": per_worker,
            "max_owned": max(per_worker.values()),
            "heartbeat_timeout_s": heartbeat_timeout,
            "kill_takeover_p50_s": percentile(after_kill, 0.5),
            "kill_takeover_p99_s": kill_p99,
            "takeover_p50_s": percentile(after_cut, 0.5),
            "takeover_p99_s": cut_p99,
            "ratio_partition_over_kill_p99": round(cut_p99 / kill_p99, 2),
        },
        FIGURES,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
