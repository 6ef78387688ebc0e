"""Partitions named by a person, and the inputs of the table data procedures (pure)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from temporalio.client import ScheduleOverlapPolicy

from procbus.errors import InvalidRequest
from procbus.lakehouse.data import (
    CompactTableInput,
    LoadTableInput,
    parse_partition,
    partition_matches,
    partition_resource,
)
from procbus.lakehouse.models import TableDescriptor
from procbus.lakehouse.schemas import parse_columns
from procbus.procedures.schedules import procedure_schedule

TABLE = TableDescriptor(
    namespace="sales",
    name="orders",
    columns=parse_columns("id:bigint,region:string,day:date"),
    partition_by=["region", "day"],
)


def test_a_partition_or_its_prefix_is_named_hive_style() -> None:
    assert parse_partition(TABLE, "region=eu/day=2026-11-24") == [
        ("region", "eu"),
        ("day", "2026-11-24"),
    ]
    assert parse_partition(TABLE, "region=eu") == [("region", "eu")]
    assert partition_resource("sales", "orders", [("region", "eu")]) == "sales/orders/region=eu"
    assert partition_matches({"region": "eu", "day": "2026-11-24"}, [("region", "eu")])
    assert not partition_matches({"region": "us", "day": "2026-11-24"}, [("region", "eu")])


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("region", "expected COLUMN=VALUE"),
        ("day=2026-11-24", "name its leading partition columns in order"),
        ("region=eu/day=x/extra=1", "name its leading partition columns in order"),
        ("region=e u", "may hold only letters"),
        ("region=../etc", "may hold only letters"),
        ("Region=eu", "may hold only lower-case"),
    ],
)
def test_a_bad_partition_is_refused_with_what_was_wrong(spec: str, says: str) -> None:
    with pytest.raises(InvalidRequest, match=says):
        parse_partition(TABLE, spec)


def test_an_unpartitioned_table_has_no_partitions() -> None:
    flat = TABLE.model_copy(update={"partition_by": []})
    with pytest.raises(InvalidRequest, match="is not partitioned"):
        parse_partition(flat, "region=eu")


def test_the_inputs_check_what_a_person_gets_wrong() -> None:
    assert CompactTableInput(table="sales.orders", partitions=["region=eu"]).check() == (
        "sales",
        "orders",
    )
    with pytest.raises(InvalidRequest, match="at least 1024 bytes"):
        CompactTableInput(table="sales.orders", target_file_size=10).check()
    with pytest.raises(InvalidRequest, match="expected COLUMN=VALUE"):
        CompactTableInput(table="sales.orders", partitions=["eu"]).check()
    with pytest.raises(InvalidRequest, match="source path is empty"):
        LoadTableInput(table="sales.orders", source=" ").check()
    with pytest.raises(InvalidRequest, match="NAMESPACE.TABLE"):
        LoadTableInput(table="orders", source="/x.csv").check()


def test_a_procedure_schedule_skips_overlaps_and_pauses_on_failure() -> None:
    schedule = procedure_schedule(
        "CompactTable",
        CompactTableInput(table="sales.orders"),
        target="sales.orders",
        workflow_id="compact-sales.orders-nightly",
        task_queue="procbus",
        every=timedelta(hours=1),
    )
    assert schedule.policy.overlap is ScheduleOverlapPolicy.SKIP
    assert schedule.policy.pause_on_failure
    assert schedule.spec.intervals[0].every == timedelta(hours=1)
    with pytest.raises(ValueError, match="either every or cron"):
        procedure_schedule(
            "CompactTable",
            CompactTableInput(table="sales.orders"),
            target="sales.orders",
            workflow_id="x",
            task_queue="procbus",
        )
