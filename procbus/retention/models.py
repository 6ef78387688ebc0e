"""What goes in and out of the Retention workflow and its activities (safe in the sandbox)."""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, Field

from procbus.core import WorkflowInput

DAY_SECONDS = 24 * 3600.0
# Rows and snapshots are kept a week unless configured; fences and members a day (see config).
DEFAULT_ROWS_SECONDS = 7 * DAY_SECONDS
DEFAULT_BATCH_SIZE = 1000
DEFAULT_ORPHAN_SECONDS = 3 * DAY_SECONDS


class RetentionKind(StrEnum):
    OUTBOX = "outbox"  # done procbus_outbox rows
    SPARK_JOBS = "spark_jobs"  # finished Spark job ledger rows and their attempts
    SNAPSHOTS = "snapshots"  # replaced table snapshots and the files only they listed
    BATCH_FENCES = "batch_fences"  # procbus_pipeline_batches rows of batches long applied
    BUS_MEMBERS = "bus_members"  # procbus_bus_members rows of members long gone


class RetentionRequest(WorkflowInput):
    """Input of the Retention workflow and of each of its activities: how long each kind is
    kept (seconds), and how many rows one statement deletes."""

    outbox_seconds: float = Field(default=DEFAULT_ROWS_SECONDS, gt=0)
    spark_job_seconds: float = Field(default=DEFAULT_ROWS_SECONDS, gt=0)
    snapshot_seconds: float = Field(default=DEFAULT_ROWS_SECONDS, gt=0)
    # A table's file that nothing lists goes this long after it was written (Iceberg's default:
    # a write still in flight must not lose its files before its commit).
    orphan_seconds: float = Field(default=DEFAULT_ORPHAN_SECONDS, gt=0)
    batch_fence_seconds: float = Field(default=DAY_SECONDS, gt=0)
    bus_member_seconds: float = Field(default=DAY_SECONDS, gt=0)
    batch_size: int = Field(default=DEFAULT_BATCH_SIZE, gt=0, le=10_000)

    def at_least(self, floors: RetentionRequest) -> RetentionRequest:
        """These ages, none shorter than `floors`' (the worker's settings): whoever may start
        Retention can ask to keep things longer, never to delete them sooner."""
        return self.model_copy(
            update={name: max(getattr(self, name), getattr(floors, name)) for name in AGES}
        )


# The fields of RetentionRequest that are ages (seconds), each a floor on the worker.
AGES = tuple(name for name in RetentionRequest.model_fields if name.endswith("_seconds"))


class KindResult(BaseModel):
    """What one activity deleted."""

    kind: RetentionKind
    deleted: int = 0
    files_deleted: int = 0
    skipped: list[str] = Field(
        default_factory=list, description="what was left for the next run, and why"
    )


class RetentionResult(BaseModel):
    """What a Retention run deleted, per kind."""

    kinds: list[KindResult] = Field(default_factory=list)
