"""The worker's table-descriptor cache: what a worker believes a table looks like.

CreateTable refreshes it and DeleteTable evicts from it as steps, so a rolled-back procedure
also rolls back what the cache says.
"""

from __future__ import annotations

from procbus.lakehouse.models import TableDescriptor


class DescriptorCache:
    def __init__(self) -> None:
        self._tables: dict[str, TableDescriptor] = {}

    def put(self, table: TableDescriptor) -> None:
        self._tables[table.qualified_name] = table

    def evict(self, qualified_name: str) -> bool:
        return self._tables.pop(qualified_name, None) is not None

    def get(self, qualified_name: str) -> TableDescriptor | None:
        return self._tables.get(qualified_name)

    def names(self) -> list[str]:
        return sorted(self._tables)
