"""A cluster of hosts on this machine (docs/internals/testing.md): the `procbus` CLI talks to
it from the machine, and a worker is cut from PostgreSQL, then healed. Needs root."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from procbus.testing import Cluster, running_cluster, wait_until

PROCBUS = str(Path(sys.executable).parent / "procbus")  # the CLI installed beside Python


def procbus_on(cluster: Cluster, *args: str) -> str:
    """A `procbus` command run on the machine against the cluster; its output."""
    done = subprocess.run(
        [PROCBUS, *args], env=cluster.cli_env(), capture_output=True, text=True, check=True
    )
    return done.stdout


def live_workers(cluster: Cluster) -> set[str]:
    listed = json.loads(procbus_on(cluster, "workers", "list", "--json"))
    return {member["member_id"] for member in listed}


def cut_w1_from_the_database(cluster: Cluster) -> list[str]:
    """w1 cut from PostgreSQL while three namespaces are created, then healed: the IDs of the
    procedures, each done within a minute on the workers that can reach the database."""
    wait_until(lambda: live_workers(cluster) == {"w1", "w2", "w3"}, 60, "3 live workers")
    cluster.network.cut("w1", "db")  # its heartbeat lapses: it drops out of the bus
    try:
        wait_until(lambda: live_workers(cluster) == {"w2", "w3"}, 60, "w1 dropped")
        started = [
            procbus_on(cluster, "namespace", "create", f"while_cut_{n}").split()[0]
            for n in range(3)
        ]
        for procedure_id in started:
            procbus_on(cluster, "proc", "wait", procedure_id, "--timeout", "60")
    finally:
        cluster.network.heal("w1")
    wait_until(lambda: "w1" in live_workers(cluster), 60, "w1 back")
    return started


if __name__ == "__main__":
    with running_cluster(workers=3) as cluster:
        for procedure_id in cut_w1_from_the_database(cluster):
            print(procbus_on(cluster, "proc", "status", procedure_id))
