"""What `procbus pipeline status` shows: JSON-friendly."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field


class PipelineStatus(BaseModel):
    """A pipeline's state and lag: one table:// topic applied to lake tables."""

    topic: str
    endpoint: str
    state: str = Field(description="running, or stopped (why: last_error / disabled reason)")
    position: int = Field(description="queue position (entry ID) of the newest change applied")
    lag_transactions: int = Field(description="source transactions queued, not yet applied")
    lag_changes: int
    lag_seconds: float = Field(description="age of the oldest change not yet applied")
    batches_applied: int
    changes_applied: int
    transactions_applied: int
    source_committed_at: datetime | None = None
    applied_at: datetime | None = None
    last_error: str | None = None
    last_error_at: datetime | None = None
    dead_letters: int = 0
    stopped_at_batch: str | None = Field(
        default=None,
        description="stopped: the batch kept first in the queue (`procbus pipeline skip` gives "
        "it up)",
    )
