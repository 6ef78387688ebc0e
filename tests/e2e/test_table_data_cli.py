"""`procbus table load|read|snapshots|compact` as a user runs them, on a `procbus dev` stack whose
worker runs the Spark jobs on local Spark."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.conftest import DevStack, procbus

pytestmark = pytest.mark.spark


def ok(stack: DevStack, *args: str, timeout: float = 180) -> str:
    result = procbus(stack.env, *args, timeout=timeout)
    assert result.returncode == 0, (args, result.stdout, result.stderr)
    return result.stdout


def test_load_read_compact_from_the_cli(dev_stack: DevStack, tmp_path: Path) -> None:
    dev_stack.start()
    ok(dev_stack, "namespace", "create", "sales", "--wait")
    ok(
        dev_stack,
        "table",
        "create",
        "sales.orders",
        "--schema",
        "id:bigint,region:string,amount:double",
        "--partition-by",
        "region",
        "--wait",
    )
    incoming = dev_stack.state_dir / "warehouse" / "incoming"  # where its worker loads from
    for batch in range(2):
        source = incoming / f"orders{batch}.csv"
        source.write_text(
            "id,region,amount\n"
            + "".join(
                f"{i},{('eu', 'us')[i % 2]},{i}.5\n" for i in range(batch * 10, batch * 10 + 10)
            )
        )
        if batch == 0:
            loaded = json.loads(
                ok(
                    dev_stack,
                    "table",
                    "load",
                    "sales.orders",
                    "--from",
                    str(source),
                    "--wait",
                    "--json",
                )
            )
            assert loaded["state"] == "SUCCEEDED", loaded
        else:  # the Python starter script, as a person would run it
            ran = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "procbus.starter.start_load_table",
                    "sales.orders",
                    str(source),
                ],
                env=dev_stack.env,
                capture_output=True,
                text=True,
                timeout=180,
            )
            assert ran.returncode == 0, ran.stderr
            assert json.loads(ran.stdout)["records"] == 10
    read = json.loads(ok(dev_stack, "table", "read", "sales.orders", "--limit", "0", "--json"))
    loads = json.loads(ok(dev_stack, "table", "snapshots", "sales.orders", "--json"))
    assert [s["operation"] for s in loads] == ["load", "load"]
    assert read["snapshot_id"] == loads[0]["snapshot_id"]  # Iceberg's snapshot IDs, newest first
    assert sorted(row["id"] for row in read["rows"]) == list(range(20))
    assert (read["row_count"], read["truncated"]) == (20, False)
    # The default limit: the JSON says rows were left out, and how many the snapshot holds.
    page = json.loads(ok(dev_stack, "table", "read", "sales.orders", "--limit", "3", "--json"))
    assert (len(page["rows"]), page["row_count"], page["truncated"]) == (3, 20, True)
    first = json.loads(
        ok(
            dev_stack,
            "table",
            "read",
            "sales.orders",
            "--snapshot",
            str(loads[1]["snapshot_id"]),
            "--limit",
            "0",
            "--json",
        )
    )
    assert sorted(row["id"] for row in first["rows"]) == list(range(10))

    compacted = ok(dev_stack, "table", "compact", "sales.orders", "--wait")
    assert "SUCCEEDED" in compacted and "swap" in compacted, compacted
    snapshots = json.loads(ok(dev_stack, "table", "snapshots", "sales.orders", "--json"))
    assert [s["operation"] for s in snapshots] == ["compact", "load", "load"]
    assert snapshots[1:] == loads
    assert snapshots[0]["files_added"] == 2  # one file per region
    again = json.loads(ok(dev_stack, "table", "read", "sales.orders", "--limit", "0", "--json"))
    assert sorted((r["id"], r["region"], r["amount"]) for r in again["rows"]) == sorted(
        (r["id"], r["region"], r["amount"]) for r in read["rows"]
    )
    shown = ok(dev_stack, "table", "read", "sales.orders", "--limit", "3")
    assert f"snapshot {snapshots[0]['snapshot_id']}: 3 of 20 rows" in shown

    # Bad input: a clear error, exit 1, nothing committed.
    bad = incoming / "bad.csv"
    bad.write_text("id,region,amount\n1,eu,lots\n")
    failed = procbus(
        dev_stack.env, "table", "load", "sales.orders", "--from", str(bad), "--wait", timeout=180
    )
    assert failed.returncode == 1
    assert "column 'amount'" in failed.stdout and "do not fit" in failed.stdout, failed.stdout
    assert "lots" not in failed.stdout  # the input's text stays out of the history
    # Outside the worker's load roots: refused before anything reads it.
    secret = tmp_path / "secret.csv"
    secret.write_text("id,region,amount\nhunter2,eu,1\n")
    outside = procbus(
        dev_stack.env, "table", "load", "sales.orders", "--from", str(secret), "--wait"
    )
    assert outside.returncode == 1
    assert "is not under a folder this worker loads from" in outside.stdout, outside.stdout
    assert "hunter2" not in outside.stdout + outside.stderr
    for args, says in [
        (
            ["table", "load", "sales.orders", "--from", str(bad), "--format", "xml"],
            "unknown format 'xml'",
        ),
        (["table", "compact", "sales.orders", "--target-file-size", "10"], "at least 1024 bytes"),
        (["table", "compact", "sales.orders", "--partition", "region"], "expected COLUMN=VALUE"),
        (["table", "read", "sales.nope"], "does not exist"),
        (["table", "read", "sales.orders", "--snapshot", "9"], "has no snapshot 9"),
    ]:
        refused = procbus(dev_stack.env, *args)
        assert refused.returncode == 1, (args, refused.stdout)
        assert says in refused.stdout + refused.stderr, (args, refused.stdout, refused.stderr)
    assert len(json.loads(ok(dev_stack, "table", "snapshots", "sales.orders", "--json"))) == 3
