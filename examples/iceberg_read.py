"""Reading procbus's lake tables with pyiceberg alone, as any Iceberg reader does: no procbus
code. Run by tests/integration/test_doc_examples.py and by the demo's table data scene."""

from __future__ import annotations

# --8<-- [start:read]
import logging

import pyarrow
from pyiceberg.catalog.sql import SqlCatalog

log = logging.getLogger(__name__)


def read_rows(
    database_url: str, table: str = "sales.orders", where: str = "region == 'eu'"
) -> pyarrow.Table:
    """A table's rows that match `where` (sales.orders' of region eu unless told), through the
    Iceberg SQL catalog in procbus's database."""
    # The catalog's name is always "procbus"; SqlCatalog needs a synchronous driver (psycopg2).
    uri = database_url.replace("postgresql://", "postgresql+psycopg2://", 1)
    catalog = SqlCatalog("procbus", uri=uri)
    loaded = catalog.load_table(table)
    for snapshot in loaded.snapshots():  # what procbus committed, with its job and procedure
        log.info("snapshot %s: %s", snapshot.snapshot_id, snapshot.summary)
    return loaded.scan(row_filter=where).to_arrow()  # only the files that can hold such rows


# --8<-- [end:read]
