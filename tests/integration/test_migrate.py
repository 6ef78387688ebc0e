from __future__ import annotations

import asyncio
from pathlib import Path

import asyncpg
import pytest

from procbus.db import connect
from procbus.db.migrate import (
    FunctionsFile,
    Migration,
    applied_migrations,
    discover_functions,
    discover_migrations,
    migrate,
)
from procbus.errors import MigrationError, MigrationHistoryError
from procbus.stack.embedded import migrate_database
from tests.services import create_test_database, drop_test_database

# The first and last of the 26 migrations procbus had before they were squashed into 0001_baseline.
PRE_SQUASH_HISTORY = [(1, "stack_checks"), (2, "catalog"), (26, "principal_token_uses")]


@pytest.fixture
async def empty_database(postgres_url: str):  # type: ignore[no-untyped-def]
    url = await create_test_database(postgres_url, migrated=False)
    yield url
    await drop_test_database(postgres_url, url)


async def public_tables(connection: asyncpg.Connection) -> list[str]:
    rows = await connection.fetch(
        "SELECT tablename FROM pg_tables WHERE schemaname = 'public' ORDER BY tablename"
    )
    return [row["tablename"] for row in rows]


async def test_migrations_and_functions_apply_once(empty_database: str) -> None:
    connection = await connect(empty_database)
    try:
        first = await migrate(connection)
        second = await migrate(connection)
        applied = await applied_migrations(connection)
        functions = await connection.fetchval(
            "SELECT count(*) FROM pg_proc WHERE proname LIKE 'procbus\\_%'"
        )
    finally:
        await connection.close()
    assert [m.version for m in first.migrations] == [m.version for m in discover_migrations()]
    assert [f.name for f in first.functions] == [
        "procbus/locks/functions.sql",
        "procbus/topics/functions.sql",
        "procbus/capture/functions.sql",
    ]
    assert (second.migrations, second.functions) == ([], [])
    assert [a.version for a in applied] == [m.version for m in first.migrations]
    assert functions > 0


async def test_two_processes_migrating_at_once_apply_everything_once(
    empty_database: str,
) -> None:
    connections = [await connect(empty_database) for _ in range(4)]
    try:
        results = await asyncio.gather(*(migrate(c) for c in connections))
        applied = await applied_migrations(connections[0])
    finally:
        for connection in connections:
            await connection.close()
    applied_now = sorted(m.version for result in results for m in result.migrations)
    assert applied_now == [m.version for m in discover_migrations()]
    assert len(applied) == len(applied_now)
    files_now = sorted(f.name for result in results for f in result.functions)
    assert files_now == sorted(f.name for f in discover_functions())


async def test_a_failing_migration_leaves_nothing_behind(empty_database: str) -> None:
    shipped = discover_migrations()
    broken = Migration(len(shipped) + 1, "broken", 'CREATE TABLE "half" (id int); SELECT 1/0;')
    connection = await connect(empty_database)
    try:
        with pytest.raises(
            MigrationError, match=f"migration {broken.version:04d}_broken.sql failed: division"
        ):
            await migrate(connection, [*shipped, broken])
        # All or nothing: neither the shipped migrations nor the half-made table remain.
        assert await public_tables(connection) == []
    finally:
        await connection.close()


async def test_a_failing_functions_file_leaves_nothing_behind(empty_database: str) -> None:
    broken = FunctionsFile(
        "procbus.broken",
        'CREATE OR REPLACE FUNCTION "half"() RETURNS int LANGUAGE sql AS $$ SELECT 1 $$;\n'
        "SELECT 1/0;",
    )
    connection = await connect(empty_database)
    try:
        with pytest.raises(MigrationError, match="procbus/broken/functions.sql failed: division"):
            await migrate(connection, functions=[*discover_functions(), broken])
        # The numbered migrations and the other files ran first, in the same transaction: they
        # are gone too, as is the half-made function.
        assert await public_tables(connection) == []
        assert await connection.fetchval("SELECT count(*) FROM pg_proc WHERE proname = 'half'") == 0
        assert await connection.fetchval("SELECT to_regproc('procbus_topic_publish')") is None
    finally:
        await connection.close()


async def test_an_edited_applied_migration_is_refused(database_url: str) -> None:
    shipped = discover_migrations()
    edited = [Migration(m.version, m.name, m.sql + "\n-- edited") for m in shipped]
    later = Migration(len(shipped) + 1, "later", 'CREATE TABLE "later" (id int);')
    connection = await connect(database_url)
    try:
        with pytest.raises(MigrationError, match="was changed after it was applied"):
            await migrate(connection, edited)
        await migrate(connection, [*shipped, later])
        with pytest.raises(MigrationError, match="newer than this procbus knows"):
            await migrate(connection, shipped)
    finally:
        await connection.close()


async def test_a_table_change_after_the_baseline_then_the_functions_that_use_it(
    database_url: str,
) -> None:
    """A numbered migration after the shipped ones runs before the functions files, so a
    changed file's function may read the column it adds; unchanged files are not run again."""
    shipped = discover_migrations()
    table_change = Migration(
        len(shipped) + 1,
        "namespace_readers",
        'CREATE TABLE "procbus_namespace_readers" ("principal" text NOT NULL, '
        '"namespace" text NOT NULL REFERENCES "procbus_namespaces" ("name"), '
        'PRIMARY KEY ("principal", "namespace"));\n'
        'ALTER TABLE "procbus_namespace_readers" ADD COLUMN "permission" text NOT NULL;',
    )
    # A LANGUAGE sql function is checked as it is made: the column must exist by then.
    added_function = (
        '\nCREATE OR REPLACE FUNCTION "procbus_namespace_readers"("p_namespace" text) '
        "RETURNS bigint LANGUAGE sql STABLE AS $$\n"
        '    SELECT count(*) FROM "procbus_namespace_readers" AS a\n'
        '    WHERE a."namespace" = "p_namespace" AND a."permission" = \'read\'\n$$;\n'
    )
    functions = [
        FunctionsFile(f.package, f.sql + added_function) if f.package == "procbus.topics" else f
        for f in discover_functions()
    ]
    connection = await connect(database_url)
    try:
        applied = await migrate(connection, [*shipped, table_change], functions)
        await connection.execute(
            'INSERT INTO "procbus_namespaces" ("name", "created_by") VALUES (\'sales\', \'t\');'
            'INSERT INTO "procbus_namespace_readers" ("principal", "namespace", "permission") '
            "VALUES ('alice', 'sales', 'read'), ('bob', 'sales', 'write')"
        )
        readers = await connection.fetchval('SELECT "procbus_namespace_readers"($1)', "sales")
        again = await migrate(connection, [*shipped, table_change], functions)
        recorded = await connection.fetch(
            'SELECT "file", "checksum" FROM "procbus_schema_functions" ORDER BY "file"'
        )
    finally:
        await connection.close()
    assert [m.name for m in applied.migrations] == ["namespace_readers"]
    assert [f.name for f in applied.functions] == ["procbus/topics/functions.sql"]
    assert readers == 1
    assert (again.migrations, again.functions) == ([], [])
    assert {row["file"]: row["checksum"] for row in recorded} == {
        f.name: f.checksum for f in functions
    }


async def record_pre_squash_history(connection: asyncpg.Connection) -> None:
    """What a database migrated by procbus before the squash records (its tables aside)."""
    await connection.execute(
        'CREATE TABLE "procbus_schema_migrations" ("version" integer PRIMARY KEY, '
        '"name" text NOT NULL, "checksum" text NOT NULL, '
        '"applied_at" timestamptz NOT NULL DEFAULT now())'
    )
    await connection.executemany(
        'INSERT INTO "procbus_schema_migrations" ("version", "name", "checksum") '
        "VALUES ($1, $2, 'old')",
        PRE_SQUASH_HISTORY,
    )


async def test_a_database_from_before_the_squash_is_told_to_reset(empty_database: str) -> None:
    connection = await connect(empty_database)
    try:
        await record_pre_squash_history(connection)
        with pytest.raises(MigrationHistoryError) as refused:
            await migrate(connection)
        tables = await public_tables(connection)
    finally:
        await connection.close()
    message = str(refused.value)
    assert "\n" not in message
    assert message.startswith(
        "the database's migrations begin with 0001_stack_checks, this procbus's with "
        "0001_baseline: procbus squashed its migrations since and cannot upgrade this database"
    )
    assert "procbus dev: stop it, then rm -rf .procbus" in message
    assert "drop it and create it again" in message
    assert tables == ["procbus_schema_migrations"]  # nothing else was made


async def test_procbus_dev_names_its_own_state_folder_to_remove(
    empty_database: str, tmp_path: Path
) -> None:
    connection = await connect(empty_database)
    try:
        await record_pre_squash_history(connection)
    finally:
        await connection.close()
    state_dir = tmp_path / "my state"
    with pytest.raises(MigrationHistoryError) as refused:
        await migrate_database(empty_database, state_dir)
    assert str(refused.value) == (
        f"{state_dir} holds a database from before procbus squashed its migrations, which it "
        f"cannot upgrade: remove the state folder and start again (rm -rf '{state_dir}')"
    )


async def test_the_test_database_is_migrated(pool: asyncpg.Pool) -> None:
    assert await pool.fetchval('SELECT count(*) FROM "procbus_stack_checks"') == 0


async def test_a_database_with_tables_of_the_former_lake_format_is_refused_before_any_drop(
    empty_database: str,
) -> None:
    """0005 drops procbus's own snapshot and file lists: a table made before 0004 (no Iceberg
    metadata) is refused with what to do, and the whole migration leaves nothing changed."""
    shipped = discover_migrations()
    before = [m for m in shipped if m.version < 4]
    connection = await connect(empty_database)
    try:
        await migrate(connection, before)
        await connection.execute(
            'INSERT INTO "procbus_namespaces" ("name", "created_by") VALUES (\'sales\', \'t\');'
            'INSERT INTO "procbus_tables" ("namespace", "name", "columns", "location", '
            '"created_by", "current_snapshot") '
            "VALUES ('sales', 'orders', '[]', '/w/sales/orders', 't', 1)"
        )
        with pytest.raises(MigrationError, match="former table format.*start from an empty"):
            await migrate(connection)
        # Nothing of 0004 or 0005 happened: the old lists and the table's row are all there.
        assert "procbus_snapshots" in await public_tables(connection)
        assert "iceberg_tables" not in await public_tables(connection)
        assert await connection.fetchval('SELECT "current_snapshot" FROM "procbus_tables"') == 1
    finally:
        await connection.close()
