"""What procbus names in its Iceberg tables: the catalog, the metadata folder, the properties of
the snapshots it commits. Importable without pyiceberg, which loads only where a table's files
are read or written (procbus.lakehouse.table_metadata): a worker or a command starts without it."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

# Every catalog row carries it, and an engine's catalog must be configured with the same name.
CATALOG_NAME = "procbus"
METADATA_FOLDER = "metadata"
# Written into every snapshot procbus commits: which job or batch it was (its idempotency key)
# and which procedure; readable by any engine from the snapshot's summary.
JOB_KEY_PROPERTY = "procbus.job-key"
PROCEDURE_PROPERTY = "procbus.procedure"
# Which procbus operation made a snapshot (load, compact, apply); engines' snapshots lack it.
OPERATION_PROPERTY = "procbus.operation"


def snapshot_properties(job_key: str, procedure_id: str) -> dict[str, str]:
    return {JOB_KEY_PROPERTY: job_key, PROCEDURE_PROPERTY: procedure_id}


@dataclass(frozen=True)
class SnapshotSummary:
    """A snapshot as `procbus table snapshots` lists it."""

    snapshot_id: int
    parent_id: int | None
    operation: str
    properties: dict[str, str]
    committed_at: datetime
