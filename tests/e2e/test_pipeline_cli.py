"""`procbus capture ...` and `procbus pipeline status` as a user runs them, on a `procbus dev`
stack whose worker applies the changes with local Spark."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import asyncpg
import pytest

from procbus.pipeline import Pipelines
from procbus.stack.state import read_live_stack
from tests.e2e.conftest import DevStack, procbus
from tests.e2e.test_table_data_cli import ok

pytestmark = pytest.mark.spark


def fails(stack: DevStack, *args: str) -> str:
    result = procbus(stack.env, *args)
    assert result.returncode == 1, (args, result.stdout, result.stderr)
    assert "Traceback" not in result.stderr
    return result.stderr


def run_sql(url: str, *statements: str) -> list[dict[str, Any]]:
    """The application's statements, in one transaction; the rows of the last one."""

    async def run() -> list[dict[str, Any]]:
        connection = await asyncpg.connect(url)
        try:
            async with connection.transaction():
                for statement in statements[:-1]:
                    await connection.execute(statement)
                return [dict(row) for row in await connection.fetch(statements[-1])]
        finally:
            await connection.close()

    return asyncio.run(run())


def wait_for(stack: DevStack, done: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    """`pipeline status shop-accounts --json` once `done` says so of the status it shows, read in
    this process meanwhile (a `procbus` call costs about half a CPU-second)."""

    async def reached(pool: asyncpg.Pool) -> bool:
        return done((await Pipelines(pool).status("shop-accounts")).model_dump(mode="json"))

    stack.wait_in_database(reached, timeout=120)
    status: dict[str, Any] = json.loads(ok(stack, "pipeline", "status", "shop-accounts", "--json"))
    assert done(status), status
    return status


def test_capture_a_table_and_watch_its_pipeline(dev_stack: DevStack) -> None:
    dev_stack.start()
    # `status` masks the password; the application connects with the stack's own URL.
    stack = read_live_stack(dev_stack.state_dir)
    assert stack is not None
    url = stack.database_url
    ok(dev_stack, "namespace", "create", "shop", "--wait")
    ok(
        dev_stack,
        "table",
        "create",
        "shop.accounts",
        "--schema",
        "id:bigint,owner:string,balance:bigint",
        "--wait",
    )
    run_sql(
        url,
        'CREATE TABLE "accounts" ("id" bigint PRIMARY KEY, "owner" text, "balance" bigint)',
        "INSERT INTO accounts VALUES (1, 'ada', 100), (2, 'bob', 100), (3, 'cy', 100)",
        "SELECT 1",
    )
    ok(
        dev_stack,
        "topic",
        "create",
        "shop-accounts",
        "--endpoint",
        "table://shop.accounts",
        "--group-transactions",
    )
    capture = json.loads(
        ok(dev_stack, "capture", "create", "accounts", "--topic", "shop-accounts", "--json")
    )
    assert (capture["source_schema"], capture["key_columns"], capture["snapshot_rows"]) == (
        "public",
        ["id"],
        3,
    )
    # Bad input: one line, nothing done.
    ok(dev_stack, "topic", "create", "plain", "--endpoint", "http://127.0.0.1:9/x")
    assert "must queue and group transactions" in fails(
        dev_stack, "capture", "create", "accounts", "--topic", "plain"
    )
    assert "no table 'nope'" in fails(
        dev_stack, "capture", "create", "nope", "--topic", "shop-accounts"
    )
    assert "is no pipeline" in fails(dev_stack, "pipeline", "status", "plain")
    assert "carries the captures of public.accounts" in fails(
        dev_stack, "topic", "delete", "shop-accounts", "--force"
    )
    listed = json.loads(ok(dev_stack, "capture", "list", "--json"))
    assert [(c["source_table"], c["topic"]) for c in listed] == [("accounts", "shop-accounts")]

    source = run_sql(
        url,
        "UPDATE accounts SET balance = balance - 40 WHERE id = 1",
        "UPDATE accounts SET balance = balance + 40 WHERE id = 2",
        "DELETE FROM accounts WHERE id = 3",
        "SELECT * FROM accounts ORDER BY id",
    )
    status = wait_for(
        dev_stack,
        lambda status: status["lag_changes"] == 0 and status["transactions_applied"] == 2,
    )
    assert status["state"] == "running" and status["last_error"] is None
    assert status["changes_applied"] == 6 and status["position"] > 0
    shown = ok(dev_stack, "pipeline", "status", "shop-accounts")
    assert "lag_transactions" in shown and "running" in shown
    read = json.loads(ok(dev_stack, "table", "read", "shop.accounts", "--limit", "0", "--json"))
    assert (
        read["rows"]
        == source
        == [
            {"id": 1, "owner": "ada", "balance": 60},
            {"id": 2, "owner": "bob", "balance": 140},
        ]
    )
    # A column added at the source reaches the lake table: NULL for rows from before it.
    run_sql(
        url,
        'ALTER TABLE "accounts" ADD COLUMN "note" text',
        "UPDATE accounts SET note = 'vip' WHERE id = 2",
        "SELECT 1",
    )
    status = wait_for(dev_stack, lambda status: status["transactions_applied"] == 3)
    assert status["state"] == "running" and status["last_error"] is None
    read = json.loads(ok(dev_stack, "table", "read", "shop.accounts", "--limit", "0", "--json"))
    assert read["rows"] == [
        {"id": 1, "owner": "ada", "balance": 60, "note": None},
        {"id": 2, "owner": "bob", "balance": 140, "note": "vip"},
    ]
    # A dropped column cannot be applied: the pipeline stops, and its status says why.
    run_sql(
        url,
        'ALTER TABLE "accounts" DROP COLUMN "owner"',
        "UPDATE accounts SET balance = 1 WHERE id = 1",
        "SELECT 1",
    )
    status = wait_for(dev_stack, lambda status: status["state"] != "running")
    shown = ok(dev_stack, "pipeline", "status", "shop-accounts")
    assert "column(s) owner were dropped at the source" in shown
    # Nothing is dead-lettered: the batch waits first in the queue for the operator.
    batch = status["stopped_at_batch"]
    assert batch and (status["dead_letters"], status["lag_changes"]) == (0, 1)
    assert f"procbus pipeline skip shop-accounts --batch {batch}" in shown
    stats = json.loads(ok(dev_stack, "topic", "stats", "shop-accounts", "--json"))
    assert "owner were dropped" in stats["disabled_reason"] and stats["dead_letters"] == 0
    # The operator gives the batch up, saying why: to the dead letters, and the pipeline resumes.
    assert f"holds batch {batch} first" in fails(
        dev_stack, "pipeline", "skip", "shop-accounts", "--batch", "batch_0", "--reason", "no"
    )
    skipped = json.loads(
        ok(
            dev_stack,
            "pipeline",
            "skip",
            "shop-accounts",
            "--batch",
            batch,
            "--reason",
            "owner dropped on purpose",
            "--json",
        )
    )
    assert skipped["batch_id"] == batch and len(skipped["dead_lettered"]) == 1
    [dead] = json.loads(ok(dev_stack, "topic", "dead-letters", "shop-accounts", "--json"))
    assert dead["reason"] == "skipped by an operator: owner dropped on purpose"
    status = json.loads(ok(dev_stack, "pipeline", "status", "shop-accounts", "--json"))
    assert (status["state"], status["lag_changes"], status["dead_letters"]) == ("running", 0, 1)
    ok(dev_stack, "capture", "delete", "accounts", "--topic", "shop-accounts")
    assert json.loads(ok(dev_stack, "capture", "list", "--json")) == []
    ok(dev_stack, "topic", "delete", "shop-accounts")
