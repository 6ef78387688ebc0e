"""Reading procbus's lake tables with pyiceberg alone, as any Iceberg reader does: no procbus
code. Run by tests/integration/test_doc_examples.py."""

from __future__ import annotations

# --8<-- [start:read]
import pyarrow
from pyiceberg.catalog.sql import SqlCatalog


def read_eu_orders(database_url: str) -> pyarrow.Table:
    """sales.orders' rows of region eu, through the Iceberg SQL catalog in procbus's database."""
    # The catalog's name is always "procbus"; SqlCatalog needs a synchronous driver (psycopg2).
    uri = database_url.replace("postgresql://", "postgresql+psycopg2://", 1)
    catalog = SqlCatalog("procbus", uri=uri)
    table = catalog.load_table("sales.orders")
    for snapshot in table.snapshots():  # what procbus committed, with its job and procedure
        print(snapshot.snapshot_id, snapshot.summary)
    return table.scan(row_filter="region == 'eu'").to_arrow()


# --8<-- [end:read]
