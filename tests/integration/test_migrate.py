from __future__ import annotations

import asyncio

import asyncpg
import pytest

from procbus.db import connect
from procbus.db.migrate import Migration, applied_migrations, discover_migrations, migrate
from procbus.errors import MigrationError
from tests.services import create_test_database, drop_test_database


@pytest.fixture
async def empty_database(postgres_url: str):  # type: ignore[no-untyped-def]
    url = await create_test_database(postgres_url, migrated=False)
    yield url
    await drop_test_database(postgres_url, url)


async def test_migrations_apply_once(empty_database: str) -> None:
    connection = await connect(empty_database)
    try:
        first = await migrate(connection)
        second = await migrate(connection)
        applied = await applied_migrations(connection)
    finally:
        await connection.close()
    assert [m.version for m in first] == [m.version for m in discover_migrations()]
    assert second == []
    assert [a.version for a in applied] == [m.version for m in first]


async def test_two_processes_migrating_at_once_apply_each_migration_once(
    empty_database: str,
) -> None:
    connections = [await connect(empty_database) for _ in range(4)]
    try:
        results = await asyncio.gather(*(migrate(c) for c in connections))
        applied = await applied_migrations(connections[0])
    finally:
        for connection in connections:
            await connection.close()
    applied_now = sorted(m.version for result in results for m in result)
    assert applied_now == [m.version for m in discover_migrations()]
    assert len(applied) == len(applied_now)


async def test_a_failing_migration_leaves_nothing_behind(empty_database: str) -> None:
    shipped = discover_migrations()
    broken = Migration(len(shipped) + 1, "broken", 'CREATE TABLE "half" (id int); SELECT 1/0;')
    connection = await connect(empty_database)
    try:
        with pytest.raises(
            MigrationError, match=f"{broken.version:04d}_broken.sql failed: division by zero"
        ):
            await migrate(connection, [*shipped, broken])
        # All or nothing: neither the shipped migrations nor the half-made table remain.
        tables = await connection.fetch(
            "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"
        )
        assert tables == []
    finally:
        await connection.close()


async def test_an_edited_applied_migration_is_refused(database_url: str) -> None:
    shipped = discover_migrations()
    edited = [Migration(m.version, m.name, m.sql + "\n-- edited") for m in shipped]
    connection = await connect(database_url)
    try:
        with pytest.raises(MigrationError, match="was changed after it was applied"):
            await migrate(connection, edited)
        with pytest.raises(MigrationError, match="newer than this procbus knows"):
            await migrate(connection, shipped[:-1] if len(shipped) > 1 else [])
    finally:
        await connection.close()


async def test_the_test_database_is_migrated(pool: asyncpg.Pool) -> None:
    assert await pool.fetchval('SELECT count(*) FROM "procbus_stack_checks"') == 0
