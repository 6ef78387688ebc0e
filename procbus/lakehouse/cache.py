"""The worker's caches: what a worker believes a table looks like, and who may do what.

Every worker holds both; the bus (procbus.bus) changes them on every worker at once, and a
worker that starts, or whose bus heartbeat lapsed, rebuilds them from the catalog.
"""

from __future__ import annotations

from collections.abc import Callable

from procbus.errors import AccessDenied
from procbus.lakehouse.models import AccessEntry, Permission, TableDescriptor


class DescriptorCache:
    """What a worker believes each table looks like, by qualified name."""

    def __init__(self) -> None:
        self._tables: dict[str, TableDescriptor] = {}

    def put(self, table: TableDescriptor) -> None:
        self._tables[table.qualified_name] = table

    def replace(self, tables: list[TableDescriptor]) -> None:
        self._tables = {table.qualified_name: table for table in tables}

    def evict(self, qualified_name: str) -> bool:
        return self._tables.pop(qualified_name, None) is not None

    def get(self, qualified_name: str) -> TableDescriptor | None:
        return self._tables.get(qualified_name)

    def names(self) -> list[str]:
        return sorted(self._tables)


class AccessCache:
    """The worker's copy of the ACL, grants on tables and on namespaces ('sales.*'): rebuilt
    from the catalog at start, changed by the bus's two-phase broadcasts, read by the table
    activities that write. A grant on a namespace allows the same on every table in it.
    `guard` (set by the bus member) raises before `require` answers from a cache that may have
    missed a change."""

    def __init__(self, guard: Callable[[], None] | None = None) -> None:
        self._entries: set[tuple[str, str, str, Permission]] = set()
        self.guard = guard

    @staticmethod
    def _key(entry: AccessEntry) -> tuple[str, str, str, Permission]:
        return (entry.principal, entry.namespace, entry.table, entry.permission)

    def replace(self, entries: list[AccessEntry]) -> None:
        self._entries = {self._key(entry) for entry in entries}

    def grant(self, entry: AccessEntry) -> bool:
        key = self._key(entry)
        added = key not in self._entries
        self._entries.add(key)
        return added

    def revoke(self, entry: AccessEntry) -> bool:
        key = self._key(entry)
        removed = key in self._entries
        self._entries.discard(key)
        return removed

    def allows(self, entry: AccessEntry) -> bool:
        """Whether `entry` is granted, or the same permission on its namespace."""
        return self._key(entry) in self._entries or self._key(entry.on_namespace()) in self._entries

    def require(self, entry: AccessEntry) -> None:
        if self.guard is not None:
            self.guard()
        if not self.allows(entry):
            raise AccessDenied(
                f"{entry.principal!r} may not {entry.permission.value} {entry.qualified_table!r}"
            )

    def drop_table(self, qualified_name: str) -> None:
        self._entries = {e for e in self._entries if f"{e[1]}.{e[2]}" != qualified_name}

    def namespace_grants(self, namespace: str) -> list[AccessEntry]:
        """The grants on `namespace` as a whole (not those on its tables)."""
        return [e for e in self.entries() if e.namespace == namespace and e.namespace_wide]

    def reset_namespace(self, namespace: str, grants: list[AccessEntry]) -> None:
        """The grants on `namespace` as a whole become `grants` (those on its tables stay)."""
        for entry in self.namespace_grants(namespace):
            self.revoke(entry)
        for entry in grants:
            self.grant(entry)

    def entries(self) -> list[AccessEntry]:
        return [
            AccessEntry(principal=p, namespace=n, table=t, permission=perm)
            for p, n, t, perm in sorted(self._entries)
        ]
