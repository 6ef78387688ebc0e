"""Prometheus metrics of `procbus dev`, scraped with a real HTTP client: the Temporal SDK's and
procbus's own on one endpoint, the one `procbus status --json` names."""

from __future__ import annotations

import json
import re
import socket
import time
from pathlib import Path

import httpx
from temporalio.client import Client

from procbus.core.metrics import (
    LOCK_WAIT_SECONDS,
    LOCK_WAITS,
    OUTBOX_BACKLOG,
    STUCK_PROCEDURES,
    TOPIC_DEAD_LETTERS,
    TOPIC_DEPTH,
    TOPIC_OLDEST_SECONDS,
)
from procbus.errors import ProcbusError
from procbus.procedures.client import procedure_status
from procbus.stack.processes import free_port
from tests.e2e.conftest import DevStack, procbus
from tests.services import subprocess_environment


def samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    """The samples of one metric: (labels, value)."""
    found = []
    for line in text.splitlines():
        match = re.match(rf"^{name}(?:{{(?P<labels>[^}}]*)}})? (?P<value>\S+)$", line)
        if match:
            labels = dict(re.findall(r'(\w+)="([^"]*)"', match["labels"] or ""))
            found.append((labels, float(match["value"])))
    return found


def wait_for_step(stack: DevStack, procedure_id: str, step: str) -> None:
    """Until the procedure runs `step` (a procedure runs its steps with its locks held), as
    `procbus proc status` would say, asked in this process."""

    async def running(client: Client) -> bool:
        try:
            return (await procedure_status(client, procedure_id)).step_running == step
        except ProcbusError:  # not answered yet
            return False

    assert stack.wait_in_temporal(running, timeout=60), f"{procedure_id} did not reach {step}"


def test_sdk_and_procbus_metrics_on_one_endpoint(state_dir: Path) -> None:
    port = free_port()
    env = subprocess_environment(
        state_dir,
        dev_temporal_port=str(free_port()),
        dev_ui_port=str(free_port()),
        metrics_port=str(port),
        # CreateTable slow enough that a DeleteNamespace of its namespace waits for its lock:
        # on a loaded machine, seeing the step and starting the delete took over 6 s.
        faults="CreateTable.create_layout:delay=20",
    )
    stack = DevStack(env, state_dir)
    try:
        stack.start()
        status = json.loads(procbus(env, "status", "--json").stdout)
        url = status["metrics_url"]
        assert url == f"http://127.0.0.1:{port}/metrics"
        # A topic whose endpoint is down: what it holds shows in its gauges.
        down = f"http://127.0.0.1:{free_port()}/hooks"
        assert procbus(env, "topic", "create", "metered", "--endpoint", down).returncode == 0
        for n in range(2):
            published = procbus(env, "topic", "publish", "metered", "--payload", f'{{"n": {n}}}')
            assert published.returncode == 0, published.stderr
        assert procbus(env, "namespace", "create", "sales", "--wait").returncode == 0
        creating = procbus(env, "table", "create", "sales.orders", "--schema", "id:int")
        table_id = creating.stdout.split()[0]
        wait_for_step(stack, table_id, "create_layout")  # CreateTable holds IX on sales now
        deleting = procbus(env, "namespace", "delete", "sales", "--wait")
        assert deleting.returncode == 1  # waited, then refused: the namespace holds the table
        assert procbus(env, "proc", "wait", table_id).returncode == 0

        text = ""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # the exporter shows what was recorded by now
            text = httpx.get(url, timeout=10).text
            depths = [value for _, value in samples(text, TOPIC_DEPTH)]
            if samples(text, f"{LOCK_WAITS}_total") and depths and depths[0] > 0:
                break  # the topic's gauge is read every 5 s: its first may predate the events
            time.sleep(0.5)
        # The SDK's own.
        assert samples(text, "temporal_workflow_completed_total")
        assert samples(text, "temporal_activity_execution_latency_count")
        # procbus's: procedures by type and state, lock waits and wait time, the outbox.
        states = {
            (labels["workflow_type"], labels["state"]): value
            for labels, value in samples(text, "procbus_procedure_states_total")
        }
        # Counted by the workflows: a workflow task that Temporal runs again (it timed out on a
        # loaded machine, or a signal came in while it ran) counts again, hence at least once.
        assert states[("CreateNamespace", "SUCCEEDED")] >= 1
        assert states[("CreateTable", "SUCCEEDED")] >= 1
        assert states[("DeleteNamespace", "WAITING")] >= 1
        assert states[("DeleteNamespace", "ROLLED_BACK")] >= 1
        assert {kind for kind, _ in states} == {"CreateNamespace", "CreateTable", "DeleteNamespace"}
        assert ("CreateTable", "ROLLED_BACK") not in states
        [(waits_labels, waits)] = samples(text, f"{LOCK_WAITS}_total")
        assert waits_labels["workflow_type"] == "DeleteNamespace" and waits >= 1
        waited = {
            labels["workflow_type"]: value
            for labels, value in samples(text, f"{LOCK_WAIT_SECONDS}_sum")
        }
        assert waited["DeleteNamespace"] > 0.5  # it waited for CreateTable's slow step
        assert samples(text, OUTBOX_BACKLOG) == [({"service_name": "temporal-core-sdk"}, 0.0)]
        # The topic's, from its delivery: both events wait, none is a dead letter yet.
        [(depth_labels, depth)] = samples(text, TOPIC_DEPTH)
        assert depth_labels["topic"] == "metered" and depth == 2
        assert [value for _, value in samples(text, TOPIC_DEAD_LETTERS)] == [0]
        [(oldest_labels, oldest)] = samples(text, TOPIC_OLDEST_SECONDS)
        assert oldest_labels["topic"] == "metered" and oldest > 0
        # Counted at the worker's start and every 30 s: none of these got stuck.
        assert [value for _, value in samples(text, STUCK_PROCEDURES)] == [0]
    finally:
        stack.stop()


def test_a_metrics_port_in_use_is_one_line(state_dir: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        env = subprocess_environment(
            state_dir,
            dev_temporal_port=str(free_port()),
            dev_ui_port=str(free_port()),
            metrics_port=str(taken.getsockname()[1]),
        )
        result = procbus(env, "dev", timeout=60)
    assert result.returncode == 1
    assert "PROCBUS_METRICS_PORT" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
