"""A small lakehouse control plane: namespaces hold tables, tables are Apache Iceberg tables.

schemas: columns and types, checked (pure; the names are procbus.core.names); models: catalog
objects and the table procedures' inputs (pure); catalog: the catalog in PostgreSQL (import it
from procbus.lakehouse.catalog), its grants (access) and what a table's files say (table_files);
commits: procbus's compare-and-set on the Iceberg catalog's rows; the Iceberg tables themselves
(pyiceberg; `iceberg` imports them all): table_metadata, file_commits (appends, compactions),
row_deltas (position deletes), snapshot_reads, snapshot_expiry, and pyiceberg_private (every use
of pyiceberg's private API); warehouse: table folders on disk; cache: a worker's
table-descriptor and ACL caches; data: snapshots and data files; reader: one snapshot read whole.
"""

from procbus.lakehouse.cache import DescriptorCache
from procbus.lakehouse.models import (
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

__all__ = [
    "Column",
    "CreateNamespaceInput",
    "CreateTableInput",
    "DeleteNamespaceInput",
    "DeleteTableInput",
    "DescriptorCache",
    "NamespaceDescriptor",
    "NamespaceResult",
    "TableDescriptor",
    "TableResult",
    "parse_columns",
    "validate_partitioning",
]
