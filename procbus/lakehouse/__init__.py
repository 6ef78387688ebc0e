"""A small lakehouse control plane: namespaces hold tables, tables hold Parquet files.

names: names and schemas, checked (pure); models: catalog objects and the table procedures'
inputs (pure); catalog: the catalog in PostgreSQL; warehouse: table folders on disk; cache: a
worker's table-descriptor cache.
"""

from procbus.lakehouse.cache import DescriptorCache
from procbus.lakehouse.catalog import Catalog
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
from procbus.lakehouse.names import (
    Column,
    namespace_resource,
    parse_columns,
    parse_table_name,
    table_resource,
    validate_name,
    validate_partitioning,
)

__all__ = [
    "Catalog",
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
    "namespace_resource",
    "parse_columns",
    "parse_table_name",
    "table_resource",
    "validate_name",
    "validate_partitioning",
]
