"""procbus/db/schema.sql is the schema the migrations make, object for object."""

from __future__ import annotations

import subprocess
from importlib import resources

from procbus.db import connect
from procbus.stack.postgres import POSTGRES_BIN_PATH
from tests.services import create_test_database, drop_test_database

MIGRATIONS_TABLE = "procbus_schema_migrations"  # migrate()'s own bookkeeping


def schema_dump(database_url: str) -> list[str]:
    """pg_dump's schema of the database: tables, indexes, constraints, functions' source."""
    dumped = subprocess.run(
        [
            str(POSTGRES_BIN_PATH / "pg_dump"),
            "--schema-only",
            "--no-owner",
            "--no-privileges",
            f"--exclude-table={MIGRATIONS_TABLE}",
            database_url,
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    # \restrict lines carry a random key per dump; comments name objects already shown.
    return [
        line
        for line in dumped.stdout.splitlines()
        if line.strip() and not line.startswith(("\\", "--"))
    ]


async def test_schema_sql_matches_the_migrations(postgres_url: str) -> None:
    from_migrations = await create_test_database(postgres_url)  # a copy of the migrated one
    from_schema = await create_test_database(postgres_url, migrated=False)
    try:
        connection = await connect(from_schema)
        try:
            await connection.execute((resources.files("procbus.db") / "schema.sql").read_text())
        finally:
            await connection.close()
        migrated, written = schema_dump(from_migrations), schema_dump(from_schema)
        assert any("procbus_lock_acquire" in line for line in migrated), "the dump is empty"
        assert written == migrated
    finally:
        await drop_test_database(postgres_url, from_migrations)
        await drop_test_database(postgres_url, from_schema)
