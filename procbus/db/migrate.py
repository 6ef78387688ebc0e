"""Numbered .sql migrations, each applied once and recorded, safe when two processes run them."""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from datetime import datetime
from importlib import resources
from importlib.resources.abc import Traversable

import asyncpg

from procbus.db.queries import load_queries
from procbus.errors import MigrationError

_FILE_NAME = re.compile(r"^(?P<version>\d{4})_(?P<name>[a-z0-9_]+)\.sql$")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


@dataclass(frozen=True)
class AppliedMigration:
    version: int
    name: str
    applied_at: datetime


def discover_migrations(folder: Traversable | None = None) -> list[Migration]:
    """The migrations in `folder` (default: procbus/db/migrations), numbered without gaps."""
    folder = folder if folder is not None else resources.files("procbus.db") / "migrations"
    migrations = []
    for entry in folder.iterdir():
        if not entry.name.endswith(".sql"):
            continue
        match = _FILE_NAME.match(entry.name)
        if match is None:
            raise MigrationError(f"migration file {entry.name!r} is not named NNNN_name.sql")
        migrations.append(Migration(int(match["version"]), match["name"], entry.read_text()))
    migrations.sort(key=lambda migration: migration.version)
    for expected, migration in enumerate(migrations, start=1):
        if migration.version != expected:
            raise MigrationError(
                f"migrations must be numbered without gaps: expected {expected:04d}, "
                f"found {migration.version:04d}_{migration.name}.sql"
            )
    return migrations


async def migrate(
    connection: asyncpg.Connection, migrations: list[Migration] | None = None
) -> list[Migration]:
    """Apply every pending migration in one transaction; returns the ones applied now.

    All or nothing: a failing migration leaves the schema as it was.
    """
    queries = load_queries("procbus.db")
    migrations = migrations if migrations is not None else discover_migrations()
    async with connection.transaction():
        await connection.execute(queries["take_migration_lock"])
        await connection.execute(queries["create_migrations_table"])
        applied = {
            row["version"]: row for row in await connection.fetch(queries["applied_migrations"])
        }
        pending = []
        for migration in migrations:
            row = applied.get(migration.version)
            if row is None:
                pending.append(migration)
            elif row["checksum"] != migration.checksum:
                raise MigrationError(
                    f"migration {migration.version:04d}_{migration.name}.sql was changed after "
                    "it was applied; add a new migration instead of editing an applied one"
                )
        unknown = sorted(set(applied) - {migration.version for migration in migrations})
        if unknown:
            raise MigrationError(
                f"the database has migration {unknown[-1]:04d}, newer than this procbus knows; "
                "upgrade procbus"
            )
        for migration in pending:
            try:
                await connection.execute(migration.sql)
            except asyncpg.PostgresError as error:
                raise MigrationError(
                    f"migration {migration.version:04d}_{migration.name}.sql failed: {error}"
                ) from error
            await connection.execute(
                queries["record_migration"], migration.version, migration.name, migration.checksum
            )
    return pending


async def applied_migrations(connection: asyncpg.Connection) -> list[AppliedMigration]:
    rows = await connection.fetch(load_queries("procbus.db")["applied_migrations"])
    return [AppliedMigration(row["version"], row["name"], row["applied_at"]) for row in rows]
