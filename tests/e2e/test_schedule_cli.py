"""`procbus schedule ...` as a user runs it, on a `procbus dev` stack: create (interval and
cron), bad input, list, describe, pause, unpause, trigger, delete.

The CompactTable runs a trigger starts are only checked to exist with the right type, search
attributes and input: their table does not exist here, so they roll back.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from temporalio.client import Client

from procbus.procedures.client import list_procedures
from tests.e2e.conftest import DevStack, procbus

MIB = 1024 * 1024


def ok(stack: DevStack, *args: str) -> str:
    result = procbus(stack.env, *args)
    assert result.returncode == 0, (args, result.stdout, result.stderr)
    return result.stdout


def refused(stack: DevStack, *args: str) -> str:
    """The one-line error of a command that must fail with exit status 1."""
    result = procbus(stack.env, *args)
    assert result.returncode == 1, (args, result.stdout, result.stderr)
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    return result.stderr


def wait_for_listing(stack: DevStack, listing: bool, *names: str) -> None:
    """Until Temporal's visibility (a second or so behind) lists every one of `names`, or none
    (`listing` False), asked in this process: `schedule list` is then asked once."""

    async def settled(client: Client) -> bool:
        listed = {entry.id async for entry in await client.list_schedules()}
        return all((name in listed) == listing for name in names)

    stack.wait_in_temporal(settled, timeout=30)


def listed(stack: DevStack) -> dict[str, dict[str, Any]]:
    return {s["schedule_id"]: s for s in json.loads(ok(stack, "schedule", "list", "--json"))}


def described(stack: DevStack, name: str) -> dict[str, Any]:
    view: dict[str, Any] = json.loads(ok(stack, "schedule", "describe", name, "--json"))
    return view


async def started_with(address: str, namespace: str, workflow_id: str) -> tuple[str, Any]:
    """The workflow type and the input a run was started with, from its history."""
    client = await Client.connect(address, namespace=namespace)
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    started = history.events[0].workflow_execution_started_event_attributes
    return started.workflow_type.name, json.loads(started.input.payloads[0].data)


def test_schedules_from_the_cli(dev_stack: DevStack) -> None:
    dev_stack.start()
    compact = ["--procedure", "compact", "--table", "sales.orders"]
    created = json.loads(
        ok(
            dev_stack,
            "schedule",
            "create",
            "hourly",
            *compact,
            "--every",
            "1h",
            "--partition",
            "region=eu",
            "--json",
        )
    )
    assert created["schedule_id"] == "hourly"
    assert (created["procedure"], created["workflow_type"]) == ("compact", "CompactTable")
    assert created["workflow_id"] == "compact-sales.orders-hourly"
    assert created["table"] == "sales.orders"
    assert created["input"]["partitions"] == ["region=eu"]
    assert created["input"]["target_file_size"] == 128 * MIB  # the model's default
    assert (created["every"], created["cron"], created["paused"]) == ("1h", None, False)
    assert created["policies"] == {
        "overlap": "SKIP",
        "catchup_window": "10m",
        "pause_on_failure": True,
    }
    assert created["next_run"] is not None

    # Bad input is refused with one line, and creates nothing.
    bad_names = []
    for number, (args, says) in enumerate(
        [
            (["--every", "1h"], "schedule 'hourly' exists already"),
            (["--every", "1h", "--cron", "0 3 * * *"], "give either --every"),
            ([], "give either --every"),
            (["--every", "5x"], "--every '5x': give a whole number and a unit"),
            (["--every", "0s"], "--every '0s': at least 1s"),
            (["--every", "1h", "--catchup-window", "1s"], "at least 10s"),
            (["--cron", "61 * * * *"], "Temporal refused the cron expression '61 * * * *'"),
            (["--cron", "every day"], "Temporal refused the cron expression 'every day'"),
            (["--every", "1h", "--target-file-size", "10"], "at least 1024 bytes"),
            (["--every", "1h", "--partition", "/"], "partition"),  # CompactTableInput.check
        ]
    ):
        name = "hourly" if number == 0 else f"bad{number}"
        bad_names.append(name)
        stderr = refused(dev_stack, "schedule", "create", name, *compact, *args)
        assert says in stderr, (args, stderr)
    for args, says in [
        (
            ["bad-table", "--procedure", "compact", "--table", "sales", "--every", "1h"],
            "expected NAMESPACE.TABLE",
        ),
        (
            ["bad-proc", "--procedure", "vacuum", "--table", "sales.orders", "--every", "1h"],
            "unknown procedure 'vacuum'; known: compact",
        ),
        (["bad name", *compact, "--every", "1h"], "schedule name 'bad name'"),
        # A built-in procedure named by --workflow: its input checked by its own model.
        (
            ["bad-input", "--workflow", "CompactTable", "--input", '{"table": 7}', "--every", "1h"],
            "--input for CompactTable: 1 validation error(s) for CompactTableInput: table",
        ),
        (
            ["bad-both", *compact, "--workflow", "CompactTable", "--every", "1h"],
            "give either --procedure (with --table) or --workflow TYPE, not both",
        ),
    ]:
        bad_names.append(args[0])
        assert says in refused(dev_stack, "schedule", "create", *args)
    for name in bad_names[1:]:
        assert f"schedule {name!r} does not exist" in refused(
            dev_stack, "schedule", "describe", name
        )
    assert described(dev_stack, "hourly")["every"] == "1h"  # the existing one is unchanged

    # The list shows it, next to the outbox sweep's schedule the worker made (not procbus's
    # CLI's: its workflow type is its procedure).
    wait_for_listing(dev_stack, True, "hourly")
    schedules = listed(dev_stack)
    assert "hourly" in schedules
    compactions = {name for name, s in schedules.items() if s["procedure"] == "compact"}
    assert compactions == {"hourly"}
    assert schedules["procbus-outbox-sweep"]["procedure"] == "OutboxSweep"
    assert schedules["procbus-outbox-sweep"]["table"] is None
    table = ok(dev_stack, "schedule", "list")
    assert "hourly" in table and "sales.orders" in table and "every 1h" in table
    detail = ok(dev_stack, "schedule", "describe", "hourly")
    for says in ["CompactTable", "every 1h", "SKIP", "10m", "pause", "region=eu"]:
        assert says in detail, (says, detail)

    paused = json.loads(
        ok(dev_stack, "schedule", "pause", "hourly", "--note", "table maintenance", "--json")
    )
    assert (paused["paused"], paused["note"]) == (True, "table maintenance")
    view = described(dev_stack, "hourly")
    assert (view["paused"], view["note"]) == (True, "table maintenance")
    assert "paused" in ok(dev_stack, "schedule", "unpause", "hourly", "--note", "done")
    view = described(dev_stack, "hourly")
    assert (view["paused"], view["note"]) == (False, "done")

    nightly = json.loads(
        ok(
            dev_stack,
            "schedule",
            "create",
            "nightly",
            *compact,
            "--cron",
            "0 3 * * *",
            "--target-file-size",
            str(64 * MIB),
            "--catchup-window",
            "1h",
            "--paused",
            "--note",
            "starts next week",
            "--json",
        )
    )
    assert (nightly["cron"], nightly["every"]) == ("0 3 * * *", None)
    assert (nightly["paused"], nightly["note"]) == (True, "starts next week")
    assert nightly["policies"]["catchup_window"] == "1h"
    assert nightly["input"]["target_file_size"] == 64 * MIB

    # A trigger runs it now, even paused: a CompactTable run that `procbus proc list` finds.
    triggered = json.loads(ok(dev_stack, "schedule", "trigger", "nightly", "--json"))
    workflow_id = triggered["workflow_id"]
    assert workflow_id.startswith("compact-sales.orders-nightly-"), triggered
    stack = dev_stack.stack()
    workflow_type, request = asyncio.run(
        started_with(str(stack["temporal_address"]), str(stack["namespace"]), workflow_id)
    )
    assert workflow_type == "CompactTable"
    assert (request["table"], request["target_file_size"]) == ("sales.orders", 64 * MIB)

    async def visible(client: Client) -> bool:
        return workflow_id in {p.procedure_id for p in await list_procedures(client)}

    dev_stack.wait_in_temporal(visible, timeout=30)  # visibility, as `proc list` reads it
    found = json.loads(ok(dev_stack, "proc", "list", "--json"))
    run = next((p for p in found if p["procedure_id"] == workflow_id), None)
    assert run is not None, found
    assert (run["procedure_type"], run["target"]) == ("CompactTable", "sales.orders")
    view = described(dev_stack, "nightly")
    assert [action["workflow_id"] for action in view["recent_actions"]] == [workflow_id]
    assert view["last_run"]["workflow_id"] == workflow_id

    for name in ("hourly", "nightly"):
        assert json.loads(ok(dev_stack, "schedule", "delete", name, "--json"))["deleted"]
    for command in ("describe", "pause", "unpause", "trigger", "delete"):
        stderr = refused(dev_stack, "schedule", command, "nightly")
        assert "schedule 'nightly' does not exist" in stderr, stderr
    wait_for_listing(dev_stack, False, "hourly", "nightly")
    assert not {"hourly", "nightly"} & set(listed(dev_stack))
