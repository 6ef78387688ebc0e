"""Grants in the lake catalog: which principal may read, write or administer a table, or every
table of a namespace. These rows are the truth behind every worker's ACL cache
(procbus.lakehouse.cache); a namespace or table takes its creator's grants in the transaction
that makes it, and its removal takes them with it (procbus.lakehouse.catalog)."""

from __future__ import annotations

from typing import Literal

import asyncpg

from procbus.core import Fence
from procbus.db import Queries
from procbus.errors import InvalidRequest
from procbus.lakehouse.models import AccessEntry
from procbus.locks import check_fence


class Grants:
    """The catalog's grants, on a pool."""

    def __init__(self, pool: asyncpg.Pool, queries: Queries) -> None:
        self.pool = pool
        self.queries = queries

    async def list_access(self) -> list[AccessEntry]:
        """Every grant, those on a namespace as a whole ('*' for the table) included."""
        return [
            AccessEntry.model_validate(dict(row))
            for row in await self.pool.fetch(self.queries["list_access"])
        ]

    async def change_access(
        self,
        action: Literal["grant", "revoke"],
        entry: AccessEntry,
        procedure_id: str,
        fence: Fence | None = None,
    ) -> None:
        """Grant or revoke one permission, on a table or on a namespace as a whole; doing it
        twice changes nothing. With a fence, checked first in the same transaction."""
        try:
            async with self.pool.acquire() as connection, connection.transaction():
                if fence is not None:
                    await check_fence(connection, fence)
                if action == "grant":
                    await self.grant(connection, entry, procedure_id)
                else:
                    await self._revoke(connection, entry)
        except asyncpg.ForeignKeyViolationError:
            what = (
                f"namespace {entry.namespace!r}"
                if entry.namespace_wide
                else f"table {entry.qualified_table!r}"
            )
            raise InvalidRequest(f"{what} does not exist") from None

    async def grant(
        self, connection: asyncpg.Connection, entry: AccessEntry, granted_by: str
    ) -> None:
        """Inside the caller's transaction: grant `entry` (again: nothing changes)."""
        if entry.namespace_wide:
            await connection.execute(
                self.queries["grant_namespace_access"],
                entry.principal,
                entry.namespace,
                entry.permission.value,
                granted_by,
            )
        else:
            await connection.execute(
                self.queries["grant_access"],
                entry.principal,
                entry.namespace,
                entry.table,
                entry.permission.value,
                granted_by,
            )

    async def _revoke(self, connection: asyncpg.Connection, entry: AccessEntry) -> None:
        if entry.namespace_wide:
            await connection.execute(
                self.queries["revoke_namespace_access"],
                entry.principal,
                entry.namespace,
                entry.permission.value,
            )
        else:
            await connection.execute(
                self.queries["revoke_access"],
                entry.principal,
                entry.namespace,
                entry.table,
                entry.permission.value,
            )

    async def has_permission(self, entry: AccessEntry) -> bool:
        """Whether the catalog (the truth behind every worker's ACL cache) lets `entry`'s
        principal do it: it holds `entry`, or the same permission on its namespace."""
        found: bool
        if entry.namespace_wide:
            found = await self.pool.fetchval(
                self.queries["has_namespace_permission"],
                entry.principal,
                entry.namespace,
                entry.permission.value,
            )
        else:
            found = await self.pool.fetchval(
                self.queries["has_permission"],
                entry.principal,
                entry.namespace,
                entry.table,
                entry.permission.value,
            )
        return found
