"""`procbus namespace|table|proc` as users run them, on a `procbus dev` stack."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from temporalio.client import Client

from procbus.procedures.client import list_procedures
from procbus.stack.processes import free_port
from tests.e2e.conftest import PROCBUS, DevStack, procbus
from tests.services import subprocess_environment


def ok(stack: DevStack, *args: str) -> str:
    result = procbus(stack.env, *args)
    assert result.returncode == 0, (args, result.stdout, result.stderr)
    return result.stdout


def tables(stack: DevStack) -> list[str]:
    return [
        f"{t['namespace']}.{t['name']}" for t in json.loads(ok(stack, "table", "list", "--json"))
    ]


def test_table_lifecycle_and_bad_input(module_dev_stack: DevStack) -> None:
    dev_stack = module_dev_stack
    # The module's stack: what the other tests on it made is there before, and stays as it is.
    others = tables(dev_stack)
    earlier = {
        p["procedure_id"]
        for p in json.loads(ok(dev_stack, "proc", "list", "--type", "DeleteTable", "--json"))
    }
    created = json.loads(ok(dev_stack, "namespace", "create", "sales", "--wait", "--json"))
    assert created["state"] == "SUCCEEDED"
    status = json.loads(
        ok(
            dev_stack,
            "table",
            "create",
            "sales.orders",
            "--schema",
            "id:bigint,amount:decimal(12,2),dt:date",
            "--partition-by",
            "dt",
            "--wait",
            "--json",
        )
    )
    assert status["state"] == "SUCCEEDED"
    assert status["steps_done"][-1] == "record_event"
    described = json.loads(ok(dev_stack, "table", "describe", "sales.orders", "--json"))
    assert [c["type"] for c in described["columns"]] == ["bigint", "decimal(12,2)", "date"]
    assert described["partition_by"] == ["dt"]
    assert Path(described["location"], "_procbus_table.json").is_file()

    # Bad input is refused before anything starts, by the check the procedure itself runs.
    for args, says in [
        (["table", "create", "sales.o2", "--schema", "id:bigint,id:int"], "appears twice"),
        (["table", "create", "sales.o2", "--schema", "id:uuid"], "unknown column type"),
        (["table", "create", "sales/../x.o", "--schema", "id:int"], "NAMESPACE.TABLE"),
        (["table", "create", 'sales."x"', "--schema", "id:int"], "lower-case letters"),
        (["table", "create", "sales.", "--schema", "id:int"], "name is empty"),
        (["table", "create", "sales." + "x" * 64, "--schema", "id:int"], "at most 63"),
        (["table", "create", "sales.t", "--schema", "from:int"], "reserved SQL word"),
        (["namespace", "create", "Sales"], "lower-case letters"),
        (["proc", "status", "no-such-procedure"], "no procedure with ID"),
        (["proc", "list", "--state", "SLEEPING"], "unknown state"),
    ]:
        result = procbus(dev_stack.env, *args)
        assert result.returncode == 1, (args, result.stdout)
        assert says in result.stderr, (args, result.stderr)
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert tables(dev_stack) == sorted([*others, "sales.orders"])

    # What contradicts the catalog is the procedure's preflight to refuse: the same error a
    # `temporal` CLI user gets, and nothing is left behind.
    for args, says in [
        (["table", "create", "sales.orders", "--schema", "id:bigint"], "exists already"),
        (["table", "delete", "sales.nothing"], "does not exist"),
        (["namespace", "create", "sales"], "exists already"),
        (["namespace", "delete", "sales"], "holds 1 tables"),
        (["namespace", "delete", "nothing"], "does not exist"),
    ]:
        result = procbus(dev_stack.env, *args, "--wait", "--json")
        assert result.returncode == 1, (args, result.stdout, result.stderr)
        refused = json.loads(result.stdout)
        assert refused["state"] == "ROLLED_BACK", refused
        assert refused["error"].startswith("InvalidRequest: ") and says in refused["error"]
        assert refused["steps_done"] == [] and refused["failed_step"] == "preflight"
        shown = procbus(dev_stack.env, *args, "--wait")  # and as a person reads it
        assert shown.returncode == 1 and "error: InvalidRequest: " in shown.stdout
    assert tables(dev_stack) == sorted([*others, "sales.orders"])

    for script in (
        ["procbus.starter.start_create_table", "sales.items", "id:int,sku:string"],
        ["procbus.starter.start_delete_table", "sales.items"],
    ):
        ran = subprocess.run(
            [sys.executable, "-m", *script],
            env=dev_stack.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert ran.returncode == 0, ran.stderr
        assert json.loads(ran.stdout)["table"]["name"] == "items"
    assert tables(dev_stack) == sorted([*others, "sales.orders"])

    procedure_id = ok(dev_stack, "table", "delete", "sales.orders").strip()
    waited = json.loads(ok(dev_stack, "proc", "wait", procedure_id, "--timeout", "60", "--json"))
    assert waited["state"] == "SUCCEEDED"
    assert waited["pivot_step"] == "remove_from_catalog"
    assert tables(dev_stack) == others
    assert not Path(described["location"]).exists()

    async def visible(client: Client) -> bool:  # the list comes from visibility, a moment behind
        listed = await list_procedures(client, procedure_type="DeleteTable")
        return any(p.procedure_id == procedure_id and p.state == "SUCCEEDED" for p in listed)

    dev_stack.wait_in_temporal(visible, timeout=30)
    listed = json.loads(ok(dev_stack, "proc", "list", "--type", "DeleteTable", "--json"))
    states = {p["procedure_id"]: p["state"] for p in listed if p["procedure_id"] not in earlier}
    assert states.get(procedure_id) == "SUCCEEDED"
    # And the one the starter script ran; the two refused in preflight rolled back.
    assert sorted(states.values()) == ["ROLLED_BACK", "ROLLED_BACK", "SUCCEEDED", "SUCCEEDED"]


@pytest.fixture
def faulty_env(state_dir: Path) -> dict[str, str]:
    return subprocess_environment(
        state_dir,
        dev_temporal_port=str(free_port()),
        dev_ui_port=str(free_port()),
        metrics_port=str(free_port()),
        # Step 3 fails; undoing step 1 fails until an operator steps in.
        faults="CreateTable.refresh_cache.apply:fail_before,CreateTable.create_layout.undo:fail_before",
    )


def test_a_stuck_procedure_waits_for_an_operator(
    faulty_env: dict[str, str], state_dir: Path
) -> None:
    stack = DevStack(faulty_env, state_dir)
    try:
        stack.start()
        ok(stack, "namespace", "create", "sales", "--wait")
        result = procbus(
            stack.env, "table", "create", "sales.orders", "--schema", "id:int", "--wait"
        )
        assert result.returncode == 1
        assert "STUCK" in result.stdout and "procbus proc skip" in result.stdout
        procedure_id = result.stdout.split()[0]
        status = json.loads(ok(stack, "proc", "status", procedure_id, "--json"))
        assert status["state"] == "STUCK"
        assert status["stuck_step"] == "create_layout"
        refused = procbus(stack.env, "proc", "abort", procedure_id)
        assert refused.returncode == 1 and "already rolling back" in refused.stderr
        ok(stack, "proc", "skip", procedure_id, "--reason", "folder removed by hand")
        waited = procbus(stack.env, "proc", "wait", procedure_id, "--timeout", "60", "--json")
        assert waited.returncode == 1  # it ended, but not SUCCEEDED
        final = json.loads(waited.stdout)
        assert final["state"] == "ROLLED_BACK"
        assert final["compensations_skipped"][0]["reason"] == "folder removed by hand"
        assert tables(stack) == []
    finally:
        stack.stop()


def test_acl_and_workers_from_the_cli(module_dev_stack: DevStack) -> None:
    dev_stack = module_dev_stack
    # The module's stack, shared: a namespace of its own; the others' tables are there too.
    others = tables(dev_stack)
    ok(dev_stack, "namespace", "create", "crm", "--wait")
    ok(dev_stack, "table", "create", "crm.orders", "--schema", "id:bigint", "--wait")
    workers = json.loads(ok(dev_stack, "workers", "list", "--json"))
    assert len(workers) == 1  # the dev stack's worker
    assert workers[0]["live"] and workers[0]["pid"] > 0
    worker_id = workers[0]["member_id"]

    granted = json.loads(
        ok(dev_stack, "acl", "grant", "etl", "crm.orders", "write", "--wait", "--json")
    )
    assert granted["state"] == "SUCCEEDED"
    assert granted["broadcasts"]["commit_on_workers"]["members"][0]["outcome"] == "committed"
    assert json.loads(ok(dev_stack, "acl", "list", "--json")) == [
        {
            "principal": "etl",
            "namespace": "crm",
            "table": "orders",
            "permission": "write",
            "scope": "table",
        }
    ]
    inspected = json.loads(ok(dev_stack, "workers", "inspect", "--json"))
    [member] = inspected["members"]
    assert member["member_id"] == worker_id
    assert member["report"]["tables"] == sorted([*others, "crm.orders"])
    assert [g["principal"] for g in member["report"]["access"]] == ["etl"]

    revoked = procbus(dev_stack.env, "acl", "revoke", "etl", "crm.orders", "write", "--wait")
    assert revoked.returncode == 0, revoked.stderr
    assert "commit_on_workers on workers" in revoked.stdout
    assert f"{worker_id} committed" in revoked.stdout
    assert json.loads(ok(dev_stack, "acl", "list", "--json")) == []

    # On the namespace: every table in it ('crm.*', its procedure ID without the '*').
    on_namespace = json.loads(
        ok(dev_stack, "acl", "grant", "ana", "crm.*", "read", "--wait", "--json")
    )
    assert on_namespace["state"] == "SUCCEEDED"
    assert "*" not in on_namespace["procedure_id"]
    assert json.loads(ok(dev_stack, "acl", "list", "--json")) == [
        {
            "principal": "ana",
            "namespace": "crm",
            "table": "*",
            "permission": "read",
            "scope": "namespace",
        }
    ]
    assert "crm.*" in ok(dev_stack, "acl", "list")

    for args, says in [
        (["acl", "grant", "etl", "crm.orders", "delete"], "unknown permission 'delete'"),
        (["acl", "grant", "bad principal", "crm.orders", "read"], "bad principal"),
        (["acl", "grant", "etl", "orders", "read"], "NAMESPACE.TABLE, or NAMESPACE.*"),
    ]:
        refused = procbus(dev_stack.env, *args)
        assert refused.returncode == 1, args
        assert says in refused.stderr
    missing = procbus(dev_stack.env, "acl", "grant", "etl", "crm.nope", "read", "--wait")
    assert missing.returncode == 1
    assert "table 'crm.nope' does not exist" in missing.stdout


@pytest.fixture
def slow_env(state_dir: Path) -> dict[str, str]:
    return subprocess_environment(
        state_dir,
        dev_temporal_port=str(free_port()),
        dev_ui_port=str(free_port()),
        metrics_port=str(free_port()),
        # Long enough that the procedure is still running while its worker is paused.
        faults="CreateNamespace.create_namespace:delay=3",
    )


def wait_for_line(process: subprocess.Popen[str], says: str, timeout: float = 60) -> str:
    """The first line of the process's stderr that holds `says` (read as it comes)."""
    assert process.stderr is not None
    deadline = time.monotonic() + timeout
    seen = []
    while time.monotonic() < deadline:
        line = process.stderr.readline()
        if not line:
            break
        seen.append(line)
        if says in line:
            return line
    raise AssertionError(f"no line with {says!r} in {seen}")


def test_a_wait_outlasts_a_paused_worker_and_a_deadline_rolls_back(
    slow_env: dict[str, str], state_dir: Path
) -> None:
    """The dev stack's worker (the `procbus dev` process, which holds the sticky workflow task)
    is SIGSTOPped: status queries time out, and a wait keeps waiting instead of failing."""
    stack = DevStack(slow_env, state_dir)
    try:
        stack.start()
        assert stack.process is not None
        worker_pid = stack.process.pid
        procedure_id = ok(stack, "namespace", "create", "sales").strip()
        ok(stack, "proc", "status", procedure_id)  # its worker answered: the task is sticky there
        os.kill(worker_pid, signal.SIGSTOP)
        try:
            waiting = subprocess.Popen(
                [PROCBUS, "proc", "wait", procedure_id, "--timeout", "90", "--json"],
                env=stack.env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            try:
                line = wait_for_line(waiting, "cannot be read right now")
                assert "still waiting" in line, line
            finally:
                os.kill(worker_pid, signal.SIGCONT)
            out, err = waiting.communicate(timeout=90)
        finally:
            os.kill(worker_pid, signal.SIGCONT)
        assert waiting.returncode == 0, (out, err)
        assert json.loads(out)["state"] == "SUCCEEDED"

        # Paused to the end: the wait ends at its own timeout and says why.
        procedure_id = ok(stack, "namespace", "create", "returns").strip()
        ok(stack, "proc", "status", procedure_id)
        os.kill(worker_pid, signal.SIGSTOP)
        try:
            gave_up = procbus(stack.env, "proc", "wait", procedure_id, "--timeout", "6", "--json")
        finally:
            os.kill(worker_pid, signal.SIGCONT)
        assert gave_up.returncode == 1, (gave_up.stdout, gave_up.stderr)
        assert gave_up.stdout == ""
        last = gave_up.stderr.strip().splitlines()[-1]
        assert f"procedure {procedure_id}: its status could not be read" in last, last
        assert "could not be read for the last" in last and "gave up after 6s" in last, last

        # A deadline shorter than its slow step rolls it back, and says so; 0 is refused.
        late = procbus(
            stack.env, "namespace", "create", "late", "--deadline", "1", "--json", "--wait"
        )
        assert late.returncode == 1, (late.stdout, late.stderr)
        ended = json.loads(late.stdout)
        assert (ended["state"], ended["rollback_reason"]) == ("ROLLED_BACK", "its deadline passed")
        listed = json.loads(ok(stack, "namespace", "list", "--json"))
        assert {namespace["name"] for namespace in listed} == {"sales", "returns"}
        refused = procbus(stack.env, "namespace", "create", "never", "--deadline", "0")
        assert refused.returncode == 2 and "--deadline" in refused.stderr, refused.stderr
    finally:
        stack.stop()
