"""A small lakehouse control plane: namespaces hold tables, tables are Apache Iceberg tables.

schemas: columns and types, checked (pure; the names are procbus.core.names); models: catalog
objects and the table procedures' inputs (pure); catalog: the catalog in PostgreSQL (import it
from procbus.lakehouse.catalog), its grants (access) and what a table's files say (table_files);
commits: procbus's compare-and-set on the Iceberg catalog's rows; the Iceberg tables themselves
(pyiceberg; `iceberg` imports them all): table_metadata, file_commits (appends, compactions),
row_deltas (position deletes), snapshot_reads, snapshot_expiry, and pyiceberg_private (every use
of pyiceberg's private API); warehouse: table folders on disk; cache: a worker's
table-descriptor and ACL caches; data: snapshots and data files; reader: one snapshot read whole.
The catalog, data and reader names load on first use (the reader brings pyarrow and pyiceberg).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from procbus.lakehouse.cache import DescriptorCache
from procbus.lakehouse.models import (
    ChangeAccessInput,
    CreateNamespaceInput,
    CreateTableInput,
    DeleteNamespaceInput,
    DeleteTableInput,
    NamespaceDescriptor,
    NamespaceResult,
    TableDescriptor,
    TableResult,
)
from procbus.lakehouse.schemas import Column, parse_columns, validate_partitioning

if TYPE_CHECKING:
    from procbus.lakehouse.catalog import Catalog as Catalog
    from procbus.lakehouse.data import CompactTableInput as CompactTableInput
    from procbus.lakehouse.data import DataResult as DataResult
    from procbus.lakehouse.data import InputFormat as InputFormat
    from procbus.lakehouse.data import LoadTableInput as LoadTableInput
    from procbus.lakehouse.reader import read_snapshot as read_snapshot
    from procbus.lakehouse.reader import read_snapshot_rows as read_snapshot_rows

# Public name -> the module that defines it, for the names loaded on first use.
_MODULE_OF = {
    "Catalog": "procbus.lakehouse.catalog",
    "CompactTableInput": "procbus.lakehouse.data",
    "DataResult": "procbus.lakehouse.data",
    "InputFormat": "procbus.lakehouse.data",
    "LoadTableInput": "procbus.lakehouse.data",
    "read_snapshot": "procbus.lakehouse.reader",
    "read_snapshot_rows": "procbus.lakehouse.reader",
}

__all__ = [
    "Catalog",
    "ChangeAccessInput",
    "Column",
    "CompactTableInput",
    "CreateNamespaceInput",
    "CreateTableInput",
    "DataResult",
    "DeleteNamespaceInput",
    "DeleteTableInput",
    "DescriptorCache",
    "InputFormat",
    "LoadTableInput",
    "NamespaceDescriptor",
    "NamespaceResult",
    "TableDescriptor",
    "TableResult",
    "parse_columns",
    "read_snapshot",
    "read_snapshot_rows",
    "validate_partitioning",
]


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
