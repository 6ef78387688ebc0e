"""A procbus cluster on hosts of its own (procbus.testing.cluster): PostgreSQL, Temporal,
three workers and a webhook receiver each in its network namespace, driven from the machine by
the `procbus` CLI, and the faults the nemesis injects: a cut link, a killed worker, a paused
one."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator

import pytest

from examples.cluster import PROCBUS, cut_w1_from_the_database, live_workers
from procbus.testing.cluster import (
    NAME_PREFIX,
    SINK_PORT,
    Cluster,
    remove_dead_clusters,
    running_cluster,
    wait_until,
)

MEMBER_TIMEOUT = 3.0


# Only DeleteTable's catalog removal waits (no other test here deletes a table): a window
# between its first eviction and the removal, for a worker to rebuild its caches in.
REMOVAL_DELAY = 8


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    faults = f"DeleteTable.remove_from_catalog:delay_first={REMOVAL_DELAY}"
    with running_cluster(
        3, member_timeout_seconds=MEMBER_TIMEOUT, worker_settings={"faults": faults}, sink=True
    ) as running:
        yield running


def cli(cluster: Cluster, *args: str) -> str:
    result = subprocess.run(
        [PROCBUS, *args], env=cluster.cli_env(), capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, (args, result.stdout, result.stderr, cluster.log_tails())
    return result.stdout


def applied_on(cluster: Cluster, namespace: str) -> set[str]:
    """The workers a new namespace's cache refresh reached."""
    return reached(cluster, cli(cluster, "namespace", "create", namespace, "--wait").split()[0])


def reached(cluster: Cluster, procedure_id: str) -> set[str]:
    """The workers a CreateNamespace's cache refresh reached, from its status."""
    status = json.loads(cli(cluster, "proc", "status", procedure_id, "--json"))
    assert status["state"] == "SUCCEEDED", status
    members = status["broadcasts"]["refresh_cache"]["members"]
    return {m["member_id"] for m in members if m["outcome"] == "applied"}


def test_each_service_listens_on_its_own_host_and_the_cli_reaches_them(cluster: Cluster) -> None:
    hosts = cluster.network.hosts
    assert hosts["db"].listening() == [(hosts["db"].address, 5432)]
    # The dev server binds every address of its namespace: its own and its loopback.
    assert ("*", 7233) in hosts["temporal"].listening()
    assert hosts["sink"].listening() == [(hosts["sink"].address, SINK_PORT)]
    for name in cluster.worker_names:
        assert all(address in ("127.0.0.1", "*") for address, _ in hosts[name].listening())
    # Every worker is a member from its own host, and a procedure's broadcast reaches each.
    wait_until(lambda: live_workers(cluster) == {"w1", "w2", "w3"}, 60, "three live workers")
    assert applied_on(cluster, "everyone") == {"w1", "w2", "w3"}


def test_events_published_while_the_sink_is_cut_off_arrive_in_order_after_the_heal(
    cluster: Cluster,
) -> None:
    """Every worker cut from the sink host: the topic's delivery fails and retries, nothing is
    lost, and after the heal each event arrives, in key order."""
    endpoint = cluster.sink_url("/hooks")
    cli(cluster, "topic", "create", "cut-off", "--endpoint", endpoint, "--retry-sleep", "0.5")
    for name in cluster.worker_names:
        cluster.network.cut(name, "sink")
    try:
        for n in range(6):
            payload = json.dumps({"n": n})
            cli(cluster, "topic", "publish", "cut-off", "--payload", payload, "--key", "k")

        def retrying() -> bool:
            return bool(json.loads(cli(cluster, "topic", "stats", "cut-off", "--json"))["retrying"])

        wait_until(retrying, 60, "a failed attempt")
        assert cluster.sink_requests() == []
    finally:
        for name in cluster.worker_names:
            cluster.network.heal(name)

    def arrived() -> list[int]:
        return [e["data"]["n"] for r in cluster.sink_requests() for e in r["events"]]

    wait_until(lambda: len(set(arrived())) == 6, 90, "six events at the sink after the heal")
    assert list(dict.fromkeys(arrived())) == [0, 1, 2, 3, 4, 5]  # first arrivals in key order
    stats = json.loads(cli(cluster, "topic", "stats", "cut-off", "--json"))
    assert stats["depth"] == 0 and stats["dead_letters"] == 0


def test_a_worker_cut_from_the_database_drops_out_and_rejoins_after_the_heal(
    cluster: Cluster,
) -> None:
    # Its heartbeat cannot reach the membership table: after the timeout it is gone, and
    # procedures started meanwhile go on without it (the docs' example). Before w1 refused
    # work out of its lease, a procedure whose workflow task it took stalled on it for good.
    for created_while_cut in cut_w1_from_the_database(cluster):
        assert reached(cluster, created_while_cut) == {"w2", "w3"}
    wait_until(lambda: live_workers(cluster) == {"w1", "w2", "w3"}, 60, "w1 back after the heal")
    assert applied_on(cluster, "after_heal") == {"w1", "w2", "w3"}


def test_a_killed_worker_restarts_under_its_id_and_a_paused_one_comes_back(
    cluster: Cluster,
) -> None:
    wait_until(lambda: live_workers(cluster) == {"w1", "w2", "w3"}, 60, "three live workers")
    cluster.workers["w2"].kill()
    wait_until(lambda: "w2" not in live_workers(cluster), 60, "killed w2 dropped")
    cluster.start_worker("w2")
    wait_until(lambda: "w2" in live_workers(cluster), 60, "w2 back under its ID")

    cluster.workers["w3"].pause()
    try:
        wait_until(lambda: "w3" not in live_workers(cluster), 60, "paused w3 dropped")
    finally:
        cluster.workers["w3"].resume()
    wait_until(lambda: live_workers(cluster) == {"w1", "w2", "w3"}, 60, "w3 back after SIGCONT")
    assert applied_on(cluster, "after_restarts") == {"w1", "w2", "w3"}


def test_a_worker_started_while_postgresql_is_down_joins_once_it_is_back(
    cluster: Cluster,
) -> None:
    wait_until(lambda: live_workers(cluster) == {"w1", "w2", "w3"}, 60, "three live workers")
    cluster.workers["w2"].kill()
    cluster.postgres.stop()
    try:
        cluster.start_worker("w2")
        time.sleep(3)  # it tries, and waits: before, it exited at once
        assert cluster.workers["w2"].running(), cluster.log_tails()
    finally:
        cluster.postgres.launch()
        cluster.postgres.wait_ready()
    wait_until(lambda: live_workers(cluster) == {"w1", "w2", "w3"}, 60, "w2 joined")
    assert applied_on(cluster, "after_postgresql_came_back") == {"w1", "w2", "w3"}


def test_a_worker_that_rebuilds_its_caches_mid_delete_drops_the_table_too(
    cluster: Cluster,
) -> None:
    """Found by the nemesis (seed 2): DeleteTable evicts the table from every worker's cache,
    then removes it from the catalog. A worker whose heartbeat lapsed in between read it back
    from the catalog, and kept it for good."""
    wait_until(lambda: live_workers(cluster) == {"w1", "w2", "w3"}, 60, "three live workers")
    cli(cluster, "namespace", "create", "purge", "--wait")
    cli(cluster, "table", "create", "purge.old", "--schema", "id:bigint", "--wait")
    procedure_id = cli(cluster, "table", "delete", "purge.old").split()[0]

    def steps_done() -> list[str]:
        status = json.loads(cli(cluster, "proc", "status", procedure_id, "--json"))
        done: list[str] = status["steps_done"]
        return done

    wait_until(lambda: "evict_cache" in steps_done(), 30, "the first eviction")
    # Paused past its lease while the removal waits: back, it reads its caches from the
    # catalog, which still lists the table.
    cluster.workers["w3"].pause()
    time.sleep(MEMBER_TIMEOUT + 1)
    cluster.workers["w3"].resume()
    cli(cluster, "proc", "wait", procedure_id, "--timeout", "90")
    inspected = json.loads(cli(cluster, "workers", "inspect", "--json"))
    cached = {m["member_id"]: m["report"]["tables"] for m in inspected["members"]}
    assert all("purge.old" not in tables for tables in cached.values()), cached
    assert "purge.old" not in cli(cluster, "table", "list")


def test_the_namespaces_of_a_dead_run_are_removed_and_a_live_runs_kept(cluster: Cluster) -> None:
    ended = subprocess.Popen(["true"])
    ended.wait()  # reaped: its PID names a run that died
    dead = f"{NAME_PREFIX}{ended.pid}-db"
    subprocess.run(["ip", "netns", "add", dead], check=True)
    removed = remove_dead_clusters()
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    assert dead in removed and dead not in listed
    assert cluster.network.hosts["db"].netns in listed  # this run's own, alive
