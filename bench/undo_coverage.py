"""Undo coverage of the built-in procedures: CreateTable and DeleteTable run once per cut point
(each step failed before its action, failed after it, cancelled mid-step, its worker stopped
mid-step), each on a worker of its own, with what each rollback left checked
(procbus.testing.undo). Prints every cut point with its outcome and run time, and the time per
cut point against a clean run's (worker start included in both) in the same run. Goal: every
cut point proven.
Last line: JSON.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sys
import uuid
from collections.abc import AsyncIterator

from harness import SMOKE, bench_services, emit  # bench/, beside this script

from procbus.auth.policy import BENCH_AUTH
from procbus.core import parse_faults
from procbus.db import connect, create_pool
from procbus.db.migrate import migrate
from procbus.lakehouse.cache import AccessCache, DescriptorCache
from procbus.temporal import connect_client
from procbus.testing.tables import TableCoverage, TableStates, create_namespace
from procbus.testing.undo import CutKind, UndoCoverageReport
from procbus.worker import build_worker
from procbus.worker.main import bus_member
from procbus.workflows.namespaces import CreateNamespace
from procbus.workflows.tables import CreateTable, DeleteTable

# A smoke run: one step of each, failed after its action (the hard case); a full one: all.
CREATE_STEPS = ["add_to_catalog"] if SMOKE else None
DELETE_STEPS = ["remove_from_catalog"] if SMOKE else None
KINDS = [CutKind.FAIL_AFTER] if SMOKE else list(CutKind)
FIGURES = (
    "cut_points",
    "cut_points_proven",
    "create_table_seconds_per_cut_point",
    "delete_table_seconds_per_cut_point",
    "clean_run_seconds",
    "ratio_cut_point_to_clean_run",
)


async def main() -> dict[str, float | int]:
    async with bench_services() as services:
        connection = await connect(services.database_url)
        await migrate(connection)
        await connection.close()
        pool = await create_pool(services.database_url)
        client = await connect_client(services.temporal_address, "default")
        queue, warehouse = f"bench-{uuid.uuid4().hex[:6]}", services.root / "warehouse"
        cache = DescriptorCache()

        @contextlib.asynccontextmanager
        async def start_worker(faults: str) -> AsyncIterator[None]:
            rules, access = parse_faults(faults), AccessCache()
            async with (
                build_worker(
                    client,
                    pool,
                    queue,
                    warehouse_root=warehouse,
                    faults=rules,
                    access=access,
                    auth=BENCH_AUTH,
                    workflows=[CreateNamespace, CreateTable, DeleteTable],
                ),
                bus_member(client, pool, queue, tables=cache, access=access, faults=rules),
            ):
                yield

        async with start_worker(""):
            await create_namespace(client, queue)
        tables = TableCoverage(
            client, queue, start_worker, TableStates(pool, warehouse, cache), kinds=KINDS
        )
        reports = [
            await tables.create_table(CREATE_STEPS).run(),
            await tables.delete_table(DELETE_STEPS).run(),
        ]
        await pool.close()
    for report in reports:
        print(report.summary())
    return figures(reports)


def per_cut_point(report: UndoCoverageReport) -> float:
    return sum(result.seconds for result in report.results) / max(report.total, 1)


def figures(reports: list[UndoCoverageReport]) -> dict[str, float | int]:
    create, delete = reports
    total = sum(report.total for report in reports)
    mean = sum(per_cut_point(report) * report.total for report in reports) / max(total, 1)
    clean = sum(report.clean_seconds for report in reports) / len(reports)
    return {
        "cut_points": total,
        "cut_points_proven": sum(report.proven for report in reports),
        "create_table_seconds_per_cut_point": round(per_cut_point(create), 3),
        "delete_table_seconds_per_cut_point": round(per_cut_point(delete), 3),
        "clean_run_seconds": round(clean, 3),  # the mean of the two procedures' clean runs
        "ratio_cut_point_to_clean_run": round(mean / clean, 2),
    }


if __name__ == "__main__":
    # Every failure here is injected on purpose: no traceback for each.
    logging.getLogger("temporalio.activity").setLevel(logging.ERROR)
    result = asyncio.run(main())
    print(f"cut points proven: {result['cut_points_proven']} / {result['cut_points']}")
    emit(result, FIGURES)
    sys.stderr.flush()
    os._exit(0 if result["cut_points_proven"] == result["cut_points"] else 1)  # sdk-python #300
