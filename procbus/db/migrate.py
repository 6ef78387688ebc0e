"""The schema, brought up to date in one transaction, safe when two processes run it at once.

Tables change by numbered migrations (procbus/db/migrations/NNNN_name.sql; 0001_baseline holds
every table, index and sequence as they were when the migrations were squashed): each applied
once, recorded, and never edited after. The PL/pgSQL of a mechanism lives beside its code
(procbus/topics/functions.sql, ...) in its current form, as CREATE OR REPLACE statements, and is
applied again whenever its text changes (Flyway's repeatable migrations), after the numbered
migrations, so a function always finds the columns it reads.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from datetime import datetime
from importlib import resources
from importlib.resources.abc import Traversable

import asyncpg

from procbus.db.queries import load_queries
from procbus.errors import MigrationError, MigrationHistoryError

_FILE_NAME = re.compile(r"^(?P<version>\d{4})_(?P<name>[a-z0-9_]+)\.sql$")
FUNCTIONS_FILE = "functions.sql"
# The mechanisms with a functions file, in the order they are applied: a file may use what an
# earlier one defines (capture publishes through the topics' functions).
FUNCTION_PACKAGES = ("procbus.locks", "procbus.topics", "procbus.capture")
# What a pre-squash `procbus dev` state folder or database needs, in one line.
RESET_INSTRUCTION = (
    "start from an empty database (procbus dev: stop it, then rm -rf .procbus; "
    "a database of your own: drop it and create it again)"
)


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


@dataclass(frozen=True)
class FunctionsFile:
    """A mechanism's functions (and the triggers that call them), applied whenever they change."""

    package: str
    sql: str

    @property
    def name(self) -> str:
        return f"{self.package.replace('.', '/')}/{FUNCTIONS_FILE}"

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


@dataclass(frozen=True)
class AppliedMigration:
    version: int
    name: str
    applied_at: datetime


@dataclass(frozen=True)
class Applied:
    """What one migrate() applied: the pending migrations, then the changed functions files."""

    migrations: list[Migration]
    functions: list[FunctionsFile]


def discover_migrations(folder: Traversable | None = None) -> list[Migration]:
    """The migrations in `folder` (default: procbus/db/migrations), numbered without gaps."""
    folder = folder if folder is not None else resources.files("procbus.db") / "migrations"
    migrations = []
    for entry in folder.iterdir():
        if not entry.name.endswith(".sql"):
            continue
        match = _FILE_NAME.fullmatch(entry.name)
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


def discover_functions(packages: tuple[str, ...] = FUNCTION_PACKAGES) -> list[FunctionsFile]:
    """The functions files of `packages`, in that order."""
    return [
        FunctionsFile(package, (resources.files(package) / FUNCTIONS_FILE).read_text())
        for package in packages
    ]


async def migrate(
    connection: asyncpg.Connection,
    migrations: list[Migration] | None = None,
    functions: list[FunctionsFile] | None = None,
) -> Applied:
    """Apply every pending migration, then every changed functions file, in one transaction.

    All or nothing: a failing migration or functions file leaves the schema as it was.
    """
    queries = load_queries("procbus.db")
    migrations = migrations if migrations is not None else discover_migrations()
    functions = functions if functions is not None else discover_functions()
    async with connection.transaction():
        await connection.execute(queries["take_migration_lock"])
        await connection.execute(queries["create_migrations_table"])
        await connection.execute(queries["create_functions_table"])
        applied = {
            row["version"]: row for row in await connection.fetch(queries["applied_migrations"])
        }
        _check_same_history(applied, migrations)
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
            await _execute(
                connection, migration.sql, f"migration {migration.version:04d}_{migration.name}.sql"
            )
            await connection.execute(
                queries["record_migration"], migration.version, migration.name, migration.checksum
            )
        recorded = {
            row["file"]: row["checksum"]
            for row in await connection.fetch(queries["applied_functions"])
        }
        changed = [file for file in functions if recorded.get(file.name) != file.checksum]
        for file in changed:
            await _execute(connection, file.sql, file.name)
            await connection.execute(queries["record_functions"], file.name, file.checksum)
    return Applied(pending, changed)


def _check_same_history(applied: dict[int, asyncpg.Record], migrations: list[Migration]) -> None:
    """Refuse a database whose migrations began otherwise: made before a squash of them."""
    first = applied.get(1)
    if first is None or not migrations or first["name"] == migrations[0].name:
        return
    raise MigrationHistoryError(
        f"the database's migrations begin with 0001_{first['name']}, this procbus's with "
        f"0001_{migrations[0].name}: procbus squashed its migrations since and cannot upgrade "
        f"this database; {RESET_INSTRUCTION}"
    )


async def _execute(connection: asyncpg.Connection, sql: str, source: str) -> None:
    try:
        await connection.execute(sql)
    except asyncpg.PostgresError as error:
        raise MigrationError(f"{source} failed: {error}") from error


async def applied_migrations(connection: asyncpg.Connection) -> list[AppliedMigration]:
    rows = await connection.fetch(load_queries("procbus.db")["applied_migrations"])
    return [AppliedMigration(row["version"], row["name"], row["applied_at"]) for row in rows]
