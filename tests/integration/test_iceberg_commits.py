"""Iceberg commits through procbus's own compare-and-set on the SQL catalog's rows, checked by
pyiceberg's own SqlCatalog (no procbus code on the reading side): several tables in one
PostgreSQL transaction land together or not at all, a rewrite whose inputs went is refused,
and an engine committing beside procbus waits and lands after it, losing nothing."""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any

import asyncpg
import pyarrow
import pyarrow.parquet as parquet
import pytest
from pyiceberg.catalog.sql import SqlCatalog

from procbus.errors import InvalidRequest, SnapshotConflict
from procbus.lakehouse import iceberg
from procbus.lakehouse.commits import IcebergCatalog
from procbus.lakehouse.schemas import Column, parse_columns

COLUMNS = parse_columns("id:bigint,name:string,amount:decimal(10,2),day:date")


def sql_catalog(database_url: str, warehouse: Path) -> SqlCatalog:
    """pyiceberg's own catalog on the same rows, as a user outside procbus would open it."""
    uri = database_url.replace("postgresql://", "postgresql+psycopg2://", 1)
    return SqlCatalog(iceberg.CATALOG_NAME, uri=uri, warehouse=warehouse.as_uri())


def rows_of(
    catalog: SqlCatalog, table: str, snapshot_id: int | None = None
) -> list[dict[str, Any]]:
    scan = catalog.load_table(table).scan(snapshot_id=snapshot_id)
    return sorted(scan.to_arrow().to_pylist(), key=lambda row: row["id"])


def write_rows(folder: Path, name: str, ids: range) -> str:
    """A Parquet file as Spark writes it for the table (no Iceberg field IDs); its URI."""
    import datetime
    import decimal

    folder.mkdir(parents=True, exist_ok=True)
    rows = pyarrow.table(
        {
            "id": pyarrow.array(list(ids), pyarrow.int64()),
            "name": [f"n{i}" for i in ids],
            "amount": pyarrow.array(
                [decimal.Decimal(f"{i}.50") for i in ids], pyarrow.decimal128(10, 2)
            ),
            "day": [datetime.date(2026, 11, 1 + i % 28) for i in ids],
        }
    )
    path = folder / f"{name}.parquet"
    parquet.write_table(rows, path)
    return iceberg.file_uri(path)


async def make_tables(pool: asyncpg.Pool, warehouse: Path, *names: str) -> IcebergCatalog:
    catalog = IcebergCatalog()
    async with pool.acquire() as connection, connection.transaction():
        await catalog.add_namespace(connection, "shop", {})
        for name in names:
            await catalog.add_table(
                connection, "shop", name, warehouse / "shop" / name, COLUMNS, [], {}
            )
    return catalog


async def test_two_tables_commit_in_one_transaction_or_not_at_all(
    pool: asyncpg.Pool, database_url: str, warehouse: Path
) -> None:
    catalog = await make_tables(pool, warehouse, "orders", "payments")
    orders = write_rows(warehouse / "shop" / "orders" / "data", "a", range(0, 3))
    payments = write_rows(warehouse / "shop" / "payments" / "data", "a", range(10, 12))
    async with pool.acquire() as connection, connection.transaction():
        first = await catalog.commit_files(
            connection,
            "shop",
            "orders",
            warehouse / "shop" / "orders",
            [orders],
            [],
            iceberg.snapshot_properties("job-1", "p"),
        )
        await catalog.commit_files(
            connection,
            "shop",
            "payments",
            warehouse / "shop" / "payments",
            [payments],
            [],
            iceberg.snapshot_properties("job-1", "p"),
        )
    reader = await asyncio.to_thread(sql_catalog, database_url, warehouse)
    assert [row["id"] for row in rows_of(reader, "shop.orders")] == [0, 1, 2]
    assert [row["id"] for row in rows_of(reader, "shop.payments")] == [10, 11]
    snapshot = reader.load_table("shop.orders").current_snapshot()
    assert snapshot is not None and snapshot.snapshot_id == first
    assert iceberg.summary_of(snapshot)[iceberg.JOB_KEY_PROPERTY] == "job-1"

    # A transaction that fails after the first table's commit leaves both tables as they were.
    more_orders = write_rows(warehouse / "shop" / "orders" / "data", "b", range(3, 5))
    more_payments = write_rows(warehouse / "shop" / "payments" / "data", "b", range(12, 14))
    with pytest.raises(RuntimeError, match="cut"):
        async with pool.acquire() as connection, connection.transaction():
            await catalog.commit_files(
                connection, "shop", "orders", warehouse / "shop" / "orders", [more_orders], [], {}
            )
            await catalog.commit_files(
                connection,
                "shop",
                "payments",
                warehouse / "shop" / "payments",
                [more_payments],
                [],
                {},
            )
            raise RuntimeError("cut before the commit")
    assert [row["id"] for row in rows_of(reader, "shop.orders")] == [0, 1, 2]
    assert [row["id"] for row in rows_of(reader, "shop.payments")] == [10, 11]


async def test_a_rewrite_whose_inputs_were_replaced_is_refused(
    pool: asyncpg.Pool, database_url: str, warehouse: Path
) -> None:
    catalog = await make_tables(pool, warehouse, "orders")
    data = warehouse / "shop" / "orders" / "data"
    small = [write_rows(data, f"small-{n}", range(n * 2, n * 2 + 2)) for n in range(3)]
    async with pool.acquire() as connection, connection.transaction():
        loaded = await catalog.commit_files(
            connection, "shop", "orders", warehouse / "shop" / "orders", small, [], {}
        )
    merged = write_rows(data, "merged", range(0, 6))
    async with pool.acquire() as connection, connection.transaction():
        await catalog.commit_files(
            connection, "shop", "orders", warehouse / "shop" / "orders", [merged], small, {}
        )
    again = write_rows(data, "merged-again", range(0, 6))
    with pytest.raises(SnapshotConflict, match="no longer live"):
        async with pool.acquire() as connection, connection.transaction():
            await catalog.commit_files(
                connection, "shop", "orders", warehouse / "shop" / "orders", [again], small, {}
            )

    reader = await asyncio.to_thread(sql_catalog, database_url, warehouse)
    table = reader.load_table("shop.orders")
    assert [row["id"] for row in rows_of(reader, "shop.orders")] == list(range(6))
    assert [task.file.file_path for task in table.scan().plan_files()] == [merged]
    current = table.current_snapshot()
    assert current is not None and iceberg.summary_of(current)["operation"] == "replace"
    # Time travel to the load still reads its three files.
    assert [row["id"] for row in rows_of(reader, "shop.orders", loaded)] == list(range(6))


async def test_an_engine_committing_beside_procbus_lands_after_it(
    pool: asyncpg.Pool, database_url: str, warehouse: Path
) -> None:
    catalog = await make_tables(pool, warehouse, "orders")
    data = warehouse / "shop" / "orders" / "data"
    reader = await asyncio.to_thread(sql_catalog, database_url, warehouse)
    theirs = pyarrow.table(
        {
            "id": pyarrow.array([100], pyarrow.int64()),
            "name": ["theirs"],
            "amount": pyarrow.array([None], pyarrow.decimal128(10, 2)),
            "day": pyarrow.array([None], pyarrow.date32()),
        }
    )
    engine_done = threading.Event()
    errors: list[BaseException] = []

    def engine_append() -> None:
        try:
            reader.load_table("shop.orders").append(theirs)
        except BaseException as error:  # reported to the test below
            errors.append(error)
        finally:
            engine_done.set()

    async with pool.acquire() as connection, connection.transaction():
        await catalog.commit_files(
            connection,
            "shop",
            "orders",
            warehouse / "shop" / "orders",
            [write_rows(data, "ours", range(3))],
            [],
            {},
        )
        # Loaded before procbus's commit lands: the engine's compare-and-set must lose, wait
        # behind the locked row, and land on the new snapshot after retrying.
        engine = threading.Thread(target=engine_append)
        engine.start()
        await asyncio.sleep(1.0)
        assert not engine_done.is_set(), "the engine committed while procbus held the row"
    await asyncio.to_thread(engine.join, 60)
    assert not errors, errors
    assert [row["id"] for row in rows_of(reader, "shop.orders")] == [0, 1, 2, 100]


async def test_types_and_partitions_iceberg_lacks_are_refused_before_anything_is_written(
    pool: asyncpg.Pool, warehouse: Path
) -> None:
    catalog = await make_tables(pool, warehouse)
    with pytest.raises(InvalidRequest, match="Apache Iceberg tables have no tinyint; use int"):
        parse_columns("id:tinyint")  # what every table procedure's input check runs first
    async with pool.acquire() as connection, connection.transaction():
        with pytest.raises(InvalidRequest, match="no Apache Iceberg type"):
            odd = [Column(name="id", type="smallint")]  # past the input check
            await catalog.add_table(connection, "shop", "odd", warehouse / "odd", odd, [], {})
        with pytest.raises(InvalidRequest, match="the partitioning does not apply"):
            await catalog.add_table(
                connection, "shop", "odd", warehouse / "odd", COLUMNS, ["nope"], {}
            )
    assert not (warehouse / "odd").exists()
    assert await pool.fetchval('SELECT count(*) FROM "iceberg_tables"') == 0


class AttemptLost(Exception):
    """The worker of a creation's first attempt died before its transaction committed."""


async def test_a_creation_tried_again_leaves_one_metadata_file(
    pool: asyncpg.Pool, database_url: str, warehouse: Path
) -> None:
    """Seen in a fresh-clone run: a CreateTable step that wrote the table's first metadata file
    and then lost its worker (or its timeout) was tried again, and the second attempt wrote a
    second first file; the first stayed in the table's folder, listed by nothing."""
    catalog = await make_tables(pool, warehouse)
    folder = warehouse / "shop" / "orders"
    with pytest.raises(AttemptLost):
        async with pool.acquire() as connection, connection.transaction():
            await catalog.add_table(
                connection, "shop", "orders", folder, COLUMNS, [], {}, created_by="create-1"
            )
            raise AttemptLost
    async with pool.acquire() as connection, connection.transaction():
        location = await catalog.add_table(
            connection, "shop", "orders", folder, COLUMNS, [], {}, created_by="create-1"
        )
    assert [p.name for p in (folder / "metadata").iterdir()] == [Path(location).name]
    table = sql_catalog(database_url, warehouse).load_table("shop.orders")
    assert table.metadata_location == location
    assert rows_of(sql_catalog(database_url, warehouse), "shop.orders") == []
    # Another creation of a table at that place is another Iceberg table.
    async with pool.acquire() as connection, connection.transaction():
        await catalog.drop_table(connection, "shop", "orders")
        again = await catalog.add_table(
            connection, "shop", "orders", folder, COLUMNS, [], {}, created_by="create-2"
        )
    assert again != location
    assert sql_catalog(database_url, warehouse).load_table("shop.orders").metadata.table_uuid != (
        table.metadata.table_uuid
    )


def keys_of(ids: list[int]) -> pyarrow.Table:
    return pyarrow.table({"id": pyarrow.array(ids, pyarrow.int64())})


def write_images(folder: Path, name: str, images: dict[int, str], note: bool = False) -> str:
    """A batch's new row images (id -> name) as the apply's Spark job writes them; its URI."""
    import datetime
    import decimal

    columns: dict[str, Any] = {
        "id": pyarrow.array(list(images), pyarrow.int64()),
        "name": list(images.values()),
        "amount": pyarrow.array([decimal.Decimal("1.00")] * len(images), pyarrow.decimal128(10, 2)),
        "day": [datetime.date(2026, 11, 28)] * len(images),
    }
    if note:
        columns["note"] = [f"note {i}" for i in images]
    path = folder / f"{name}.parquet"
    parquet.write_table(pyarrow.table(columns), path)
    return iceberg.file_uri(path)


def names_of(catalog: SqlCatalog, table: str) -> dict[int, str]:
    return {row["id"]: row["name"] for row in rows_of(catalog, table)}


async def test_a_batch_of_updates_and_deletes_lands_in_two_tables_at_once(
    pool: asyncpg.Pool, database_url: str, warehouse: Path
) -> None:
    catalog = await make_tables(pool, warehouse, "orders", "payments")
    orders, payments = (warehouse / "shop" / name / "data" for name in ("orders", "payments"))
    async with pool.acquire() as connection, connection.transaction():
        await catalog.commit_files(
            connection,
            "shop",
            "orders",
            warehouse / "shop" / "orders",
            [write_rows(orders, "load", range(10))],
            [],
            {},
        )
        await catalog.commit_files(
            connection,
            "shop",
            "payments",
            warehouse / "shop" / "payments",
            [write_rows(payments, "load", range(10, 15))],
            [],
            {},
        )
    # One source transaction: in orders 1 updated, 2 deleted, 20 inserted; in payments 10
    # deleted, 11 updated.
    async with pool.acquire() as connection, connection.transaction():
        await catalog.apply_rows(
            connection,
            "shop",
            "orders",
            warehouse / "shop" / "orders",
            [write_images(orders, "batch-1", {1: "changed", 20: "new"})],
            keys_of([1, 2, 20]),
            iceberg.snapshot_properties("batch-1", "pipeline:bank"),
        )
        await catalog.apply_rows(
            connection,
            "shop",
            "payments",
            warehouse / "shop" / "payments",
            [write_images(payments, "batch-1", {11: "changed"})],
            keys_of([10, 11]),
            iceberg.snapshot_properties("batch-1", "pipeline:bank"),
        )
    reader = await asyncio.to_thread(sql_catalog, database_url, warehouse)
    expected_orders = {i: f"n{i}" for i in range(10) if i != 2} | {1: "changed", 20: "new"}
    assert names_of(reader, "shop.orders") == expected_orders
    assert names_of(reader, "shop.payments") == {11: "changed", 12: "n12", 13: "n13", 14: "n14"}
    summary = iceberg.summary_of(reader.load_table("shop.orders").current_snapshot())  # type: ignore[arg-type]
    assert summary["operation"] == "overwrite"
    assert summary["added-position-deletes"] == "2"  # the load's 1 and 2; 20 is new

    # A key changed again, now living in the first batch's file; one deleted; a column added
    # at the source arrives with the batch, and older rows read it as NULL.
    async with pool.acquire() as connection, connection.transaction():
        await catalog.apply_rows(
            connection,
            "shop",
            "orders",
            warehouse / "shop" / "orders",
            [write_images(orders, "batch-2", {1: "again"}, note=True)],
            keys_of([1, 20]),
            {},
            parse_columns("note:string"),
        )
    rows = {row["id"]: row for row in rows_of(reader, "shop.orders")}
    assert {i: row["name"] for i, row in rows.items()} == {
        i: f"n{i}" for i in range(10) if i != 2
    } | {1: "again"}
    assert rows[1]["note"] == "note 1" and rows[3]["note"] is None


async def test_a_rewrite_planned_before_rows_of_its_inputs_were_deleted_is_refused(
    pool: asyncpg.Pool, database_url: str, warehouse: Path
) -> None:
    catalog = await make_tables(pool, warehouse, "orders")
    data = warehouse / "shop" / "orders" / "data"
    small = [write_rows(data, f"small-{n}", range(n * 3, n * 3 + 3)) for n in range(2)]
    async with pool.acquire() as connection, connection.transaction():
        planned = await catalog.commit_files(
            connection, "shop", "orders", warehouse / "shop" / "orders", small, [], {}
        )
    merged = write_rows(data, "merged", range(6))  # what a compaction read at `planned`
    async with pool.acquire() as connection, connection.transaction():
        await catalog.apply_rows(
            connection, "shop", "orders", warehouse / "shop" / "orders", [], keys_of([4]), {}
        )
    with pytest.raises(SnapshotConflict, match="would bring them back"):
        async with pool.acquire() as connection, connection.transaction():
            await catalog.commit_files(
                connection,
                "shop",
                "orders",
                warehouse / "shop" / "orders",
                [merged],
                small,
                {},
                based_on=planned,
            )
    reader = await asyncio.to_thread(sql_catalog, database_url, warehouse)
    assert sorted(names_of(reader, "shop.orders")) == [0, 1, 2, 3, 5]

    # Planned after the delete, the rewrite applies it and lands.
    table = reader.load_table("shop.orders")
    current = table.current_snapshot()
    assert current is not None
    survivors = table.scan().to_arrow()
    folded = data / "folded.parquet"
    parquet.write_table(survivors, folded)
    async with pool.acquire() as connection, connection.transaction():
        await catalog.commit_files(
            connection,
            "shop",
            "orders",
            warehouse / "shop" / "orders",
            [iceberg.file_uri(folded)],
            small,
            {},
            based_on=current.snapshot_id,
        )
    assert sorted(names_of(reader, "shop.orders")) == [0, 1, 2, 3, 5]
    # The delete file named rows of the replaced files only: it went with them.
    compacted = reader.load_table("shop.orders")
    assert all(not task.delete_files for task in compacted.scan().plan_files())
    summary = iceberg.summary_of(compacted.current_snapshot())  # type: ignore[arg-type]
    assert summary["operation"] == "replace"
    assert (summary["removed-delete-files"], summary["total-delete-files"]) == ("1", "0")
    assert iceberg.referenced_files(compacted) == {iceberg.file_uri(folded)}


async def test_every_snapshot_id_is_read_exactly_by_a_javascript_json_reader(
    pool: asyncpg.Pool, database_url: str, warehouse: Path
) -> None:
    """An append, a batch of row changes and a rewrite: each snapshot's ID is below 2^53, so a
    JSON reader whose numbers are doubles (the Temporal UI showing a procedure's result) shows
    it exactly, and an ID copied from there names the snapshot."""
    catalog = await make_tables(pool, warehouse, "orders")
    folder = warehouse / "shop" / "orders"
    load = write_rows(folder / "data", "load", range(6))
    async with pool.acquire() as connection, connection.transaction():
        appended = await catalog.commit_files(connection, "shop", "orders", folder, [load], [], {})
    batch = write_images(folder / "data", "batch", {1: "changed"})
    async with pool.acquire() as connection, connection.transaction():
        changed = await catalog.apply_rows(
            connection, "shop", "orders", folder, [batch], keys_of([1, 2]), {}
        )
    reader = await asyncio.to_thread(sql_catalog, database_url, warehouse)
    folded = folder / "data" / "folded.parquet"
    parquet.write_table(reader.load_table("shop.orders").scan().to_arrow(), folded)
    async with pool.acquire() as connection, connection.transaction():
        rewritten = await catalog.commit_files(
            connection,
            "shop",
            "orders",
            folder,
            [iceberg.file_uri(folded)],
            [load, batch],
            {},
            based_on=changed,
        )
    table = reader.load_table("shop.orders")
    ids = [snapshot.snapshot_id for snapshot in table.snapshots()]
    assert ids == [appended, changed, rewritten]
    assert all(0 < snapshot_id < 2**53 for snapshot_id in ids), ids
    assert all(json.loads(json.dumps(float(i))) == i for i in ids)  # a double holds each
    assert names_of(reader, "shop.orders") == {0: "n0", 1: "changed", 3: "n3", 4: "n4", 5: "n5"}


async def test_a_forged_catalog_row_is_refused_before_anything_is_read_or_written(
    pool: asyncpg.Pool, database_url: str, warehouse: Path
) -> None:
    """The Iceberg catalog's rows are procbus's tables, and anyone who writes the database can
    write them: a row pointing at another table's metadata, or at metadata that names another
    folder as the table's, must not lead procbus to read or write files there."""
    catalog = await make_tables(pool, warehouse, "orders", "payments")
    orders, payments = (warehouse / "shop" / name for name in ("orders", "payments"))
    async with pool.acquire() as connection, connection.transaction():
        await catalog.commit_files(
            connection,
            "shop",
            "payments",
            payments,
            [write_rows(payments / "data", "a", range(3))],
            [],
            {},
        )
    theirs = await pool.fetchval(
        'SELECT "metadata_location" FROM "iceberg_tables" WHERE "table_name" = \'payments\''
    )
    # A copy of payments' metadata inside orders' own metadata folder: it names payments' folder.
    copied = orders / "metadata" / "99999-forged.metadata.json"
    copied.write_bytes(iceberg.local_path(theirs).read_bytes())
    before = sorted(p.name for p in (payments / "metadata").iterdir())
    for forged, says in ((theirs, "outside its folder"), (iceberg.file_uri(copied), "lives in")):
        await pool.execute(
            'UPDATE "iceberg_tables" SET "metadata_location" = $1 WHERE "table_name" = \'orders\'',
            forged,
        )
        with pytest.raises(InvalidRequest, match=says):
            async with pool.acquire() as connection, connection.transaction():
                await catalog.commit_files(
                    connection,
                    "shop",
                    "orders",
                    orders,
                    [write_rows(orders / "data", "x", range(2))],
                    [],
                    {},
                )
    # Nothing was written where the forged rows pointed.
    assert sorted(p.name for p in (payments / "metadata").iterdir()) == before
