"""What the table procedures touched: catalog, warehouse, events, cache; for before/after checks."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import asyncpg

from procbus.core.names import LOAD_FOLDER
from procbus.lakehouse.cache import DescriptorCache
from procbus.lakehouse.catalog import Catalog


@dataclass(frozen=True)
class Snapshot:
    namespaces: tuple[str, ...]
    tables: tuple[str, ...]
    files: tuple[str, ...]
    events: tuple[tuple[str, str | None], ...]
    cached: tuple[str, ...]


async def snapshot(pool: asyncpg.Pool, warehouse: Path, cache: DescriptorCache) -> Snapshot:
    catalog = Catalog(pool)
    return Snapshot(
        namespaces=tuple(n.name for n in await catalog.list_namespaces()),
        tables=tuple(t.qualified_name for t in await catalog.list_tables()),
        files=tuple(
            sorted(
                str(p.relative_to(warehouse))
                for p in warehouse.rglob("*")
                # The worker's own folder for load inputs is no table's.
                if p.relative_to(warehouse).parts[0] != LOAD_FOLDER
            )
        ),
        events=tuple((e["event_type"], e["table_name"]) for e in await catalog.list_events()),
        cached=tuple(cache.names()),
    )
