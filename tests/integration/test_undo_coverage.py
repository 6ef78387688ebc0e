"""Undo coverage (procbus.testing.undo) of the built-in table procedures and of a user's
procedure: each rollback leaves nothing behind, each roll-forward finishes. The suite runs the
cut points at the steps that tell the most (a catalog write, a broadcast, the pivot, one past
it) within its time; bench/undo_coverage.py runs every one. The user's procedure is the docs'
example (examples/testing_procedures.py), run here with every cut kind."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from temporalio.client import Client

# Collected here: what the docs show a user, every cut kind of RefreshCaches.
from examples.testing_procedures import (
    test_refresh_caches_leaves_nothing_behind as test_refresh_caches_leaves_nothing_behind,
)
from examples.user_procedures import RefreshCaches, RefreshInput, forget_refresh, note_refresh
from procbus.lakehouse.cache import DescriptorCache
from procbus.testing.tables import TableCoverage, TableStates, create_namespace
from procbus.testing.undo import CutKind
from procbus.workflows.namespaces import CreateNamespace
from procbus.workflows.tables import CreateTable, DeleteTable
from tests.services import TEMPLATE_DATABASE

pytest_plugins = ["procbus.testing.pytest_plugin"]


@pytest.fixture
def worker_workflows() -> Sequence[type]:
    return [CreateNamespace, CreateTable, DeleteTable]


@pytest.fixture(scope="session")
def procbus_services(temporal_address: str, postgres_url: str) -> Any:
    """The plugin's fixtures on the suite's own servers and template: no server of their own."""
    from procbus.testing.pytest_plugin import ProcbusServices

    return ProcbusServices(temporal_address, "default", postgres_url, TEMPLATE_DATABASE)


@pytest.fixture
async def tables(
    client: Client, start_worker: Any, task_queue: str, pool: asyncpg.Pool, warehouse: Path
) -> TableCoverage:
    cache = DescriptorCache()
    async with start_worker(cache=cache):
        await create_namespace(client, task_queue)
    return TableCoverage(
        client,
        task_queue,
        lambda faults: start_worker(faults=faults, cache=cache),
        TableStates(pool, warehouse, cache),
    )


async def test_create_table_rolls_back_whole_from_a_write_and_a_broadcast(
    tables: TableCoverage,
) -> None:
    report = await tables.create_table(steps=["add_to_catalog", "refresh_cache"]).run()
    print(report.summary())
    report.assert_covered()
    assert report.steps[2:4] == ["add_to_catalog", "refresh_cache"]
    assert (report.proven, report.total, report.pivot) == (6, 6, None)


async def test_delete_table_rolls_back_at_its_pivot_and_forward_past_it(
    tables: TableCoverage,
) -> None:
    report = await tables.delete_table(steps=["remove_from_catalog", "delete_data"]).run()
    print(report.summary())
    report.assert_covered()
    assert report.pivot == "remove_from_catalog"
    assert (report.proven, report.total) == (6, 6)
    past = [result.cut.past_pivot for result in report.results]
    assert past == [False] * 3 + [True] * 3


async def test_a_cut_point_not_proven_fails_the_assertion_naming_it(
    procbus_undo_coverage: Any, tmp_path: Path
) -> None:
    """A residue check that finds something: the report says which cut points, and fails."""
    coverage = procbus_undo_coverage(
        workflows=[RefreshCaches],
        activities=[note_refresh, forget_refresh],
        procedure="RefreshCaches",
        make_input=lambda name: RefreshInput(table=name, notes=str(tmp_path / "notes")),
        residue=lambda request: _always_left(request.table),
        kinds=[CutKind.FAIL_BEFORE],
        steps=["note"],
    )
    report = await coverage.run()
    assert (report.proven, report.total) == (0, 1)
    with pytest.raises(AssertionError, match="cut points not proven: fail_before note") as failed:
        report.assert_covered()
    assert "left: a row" in str(failed.value) and "proven: 0 / 1" in str(failed.value)


async def _always_left(table: str) -> list[str]:
    return [f"left: a row of {table}"]
