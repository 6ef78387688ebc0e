from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from procbus.stack.processes import free_port
from procbus.stack.temporal_server import temporal_binary
from procbus.starter.scenes import DEMO_STEPS
from tests.e2e.conftest import PROCBUS, DevStack, procbus, wait_until_dead
from tests.services import subprocess_environment

PROJECT = Path(__file__).resolve().parents[2]


def test_dev_survives_sigkill_and_keeps_its_workflows(dev_stack: DevStack) -> None:
    dev_stack.start()
    status = json.loads(procbus(dev_stack.env, "status", "--json").stdout)
    assert status["up"] is True
    assert status["ui_url"].startswith("http://127.0.0.1:")
    assert status["source"] == "embedded"
    # Its signing key, made at start, readable by its owner only: the CLI signs with it.
    assert (dev_stack.state_dir / "auth.key").stat().st_mode & 0o777 == 0o600

    # The demo on the running stack, beside its worker (the whole demo runs in the test below):
    # the scenes that use a table and a topic, and the table's scene that --only brings along.
    demo = procbus(dev_stack.env, "demo", "--json", "--only", "topics,bus")
    assert demo.returncode == 0, demo.stderr
    report = json.loads(demo.stdout)
    assert report["started_stack"] is False
    assert report["metrics_url"] == status["metrics_url"] is not None
    assert report["steps"] == ["create-table", "topics", "bus"]
    assert report["create_table"]["status"]["state"] == "SUCCEEDED"
    assert report["topics"]["delivered_once_each"] and report["access"]["revoke_id"]
    assert report["table_data"] is None and report["pipeline"] is None
    workflow_id = report["stack_check_workflow_id"]

    starter = subprocess.run(
        [sys.executable, "-m", "procbus.starter.start_stack_check", "e2e"],
        env=dev_stack.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert starter.returncode == 0, starter.stderr
    assert json.loads(starter.stdout)["message"] == "hello from a starter script"

    servers = dev_stack.server_pids()
    dev_stack.signal(signal.SIGKILL)
    # The servers die with their parent: nothing is left holding ports or files.
    assert wait_until_dead(servers) == []
    assert procbus(dev_stack.env, "status").returncode == 1

    dev_stack.start()
    assert procbus(dev_stack.env, "status").returncode == 0
    listed = subprocess.run(
        [
            str(temporal_binary()),
            "workflow",
            "list",
            "--address",
            status["temporal_address"],
            "--query",
            f"WorkflowId = '{workflow_id}'",
            "--output",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert [run["execution"]["workflowId"] for run in json.loads(listed.stdout)] == [workflow_id]
    rows = procbus(dev_stack.env, "db", "migrate", "--json")
    assert json.loads(rows.stdout)["applied"] == []  # a restart reuses the migrated database

    servers = dev_stack.server_pids()
    assert dev_stack.signal(signal.SIGTERM) == 0
    assert wait_until_dead(servers, timeout=5) == []
    assert not (dev_stack.state_dir / "stack.json").exists()


def test_a_second_dev_on_the_same_state_is_refused(dev_stack: DevStack) -> None:
    dev_stack.start()
    second = procbus(dev_stack.env, "dev", timeout=30)
    assert second.returncode == 1
    assert "already runs" in second.stderr
    assert len(second.stderr.strip().splitlines()) == 1
    assert procbus(dev_stack.env, "status").returncode == 0


def test_a_port_in_use_is_one_line(state_dir: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = subprocess_environment(
            state_dir,
            dev_temporal_port=str(port),
            dev_ui_port=str(free_port()),
            metrics_port=str(free_port()),
        )
        result = procbus(env, "dev", timeout=30)
    assert result.returncode == 1
    assert "PROCBUS_DEV_TEMPORAL_PORT" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
    assert not (state_dir / "stack.json").exists()


def test_a_bad_setting_is_one_line_without_traceback(state_dir: Path) -> None:
    env = subprocess_environment(state_dir, database_url="mysql://db:3306/procbus")
    result = procbus(env, "status")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: invalid setting PROCBUS_DATABASE_URL: expected a postgresql:// URL, got scheme "
        "'mysql'"
    ]


def test_commands_without_a_stack_say_how_to_start_one(state_dir: Path) -> None:
    result = procbus(subprocess_environment(state_dir), "db", "migrate")
    assert result.returncode == 1
    assert "procbus dev" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.spark
@pytest.mark.timeout(600)  # the whole demo: over 240 s when the suite shares 2 cores
def test_demo_starts_its_own_stack_when_none_runs(dev_env: dict[str, str], state_dir: Path) -> None:
    # As `make demo` runs it: from the project's folder (the own-procedure scene imports the
    # example module from there), the state folder named relative to it.
    result = subprocess.run(
        [PROCBUS, "demo", "--json"],
        env=dev_env | {"PROCBUS_STATE_DIR": os.path.relpath(state_dir, PROJECT)},
        cwd=PROJECT,
        capture_output=True,
        text=True,
        timeout=540,
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["started_stack"] is True
    assert report["steps"] == list(DEMO_STEPS)
    assert report["stack_check"]["check_id"] == report["stack_check_workflow_id"]
    assert report["create_table"]["status"]["state"] == "SUCCEEDED"
    assert report["failed_create_table"]["status"]["state"] == "ROLLED_BACK"
    assert report["failed_create_table"]["status"]["failed_step"] == "refresh_cache"
    assert report["residue_after_rollback"] == []
    hooks = report["hooks"]
    assert hooks["committed_workflow_run_id"]
    assert "rolled back" in hooks["rolled_back_hook_error"]
    assert not hooks["rolled_back_workflow_started"] and hooks["outbox_rows_of_rolled_back"] == 0
    bad_input = report["bad_input"]
    assert bad_input["temporal_cli_exit_code"] != 0
    assert bad_input["error_type"] == "InvalidProcedureInput" and "tabel" in bad_input["error"]
    assert report["metrics_url"] is None  # its own stack runs no `procbus dev` worker
    topics = report["topics"]
    assert topics["delivered_once_each"] and topics["key_order_kept"]
    assert topics["failed_attempts_while_down"] >= 3 and topics["signatures_verified"] >= 6
    assert topics["delivered_while_a_key_failed"] == 3 and topics["redriven_with_its_webhook_id"]
    kafka = report["kafka"]
    assert kafka["seen_by_read_committed"] == kafka["transaction_events"] == 6
    assert kafka["one_batch_id"] and kafka["keys_in_order"]
    own = report["own_procedure"]
    assert (own["state"], own["refused_state"]) == ("SUCCEEDED", "ROLLED_BACK")
    assert own["notes_after_rollback"] == ["orders"] and len(own["broadcast_reached"]) == 4
    assert own["rows_counted"] == 500  # its Spark job step, in the worker's session
    # It stopped what it started.
    assert not (state_dir / "stack.json").exists()


def test_the_demo_refuses_an_unknown_scene_before_it_starts_anything(
    dev_env: dict[str, str], state_dir: Path
) -> None:
    result = procbus(dev_env, "demo", "--only", "topics,nonsense")
    assert result.returncode == 1
    assert "no demo step 'nonsense': choose from create-table," in result.stderr
    assert list(state_dir.iterdir()) == []  # nothing started, nothing written


def test_every_command_has_help() -> None:
    env = subprocess_environment(Path("/nonexistent"))
    for command in (
        ["--help"],
        ["dev", "--help"],
        ["status", "--help"],
        ["worker", "--help"],
        ["demo", "--help"],
        ["db", "migrate", "--help"],
    ):
        result = procbus(env, *command)
        assert result.returncode == 0, (command, result.stderr)
        assert "Usage" in result.stdout
