"""What the topic delivery workflow and its activity exchange: JSON-friendly, and free of
secrets (they stay in PostgreSQL; the activity reads them)."""

from __future__ import annotations

from typing import Protocol

from pydantic import BaseModel, Field

from procbus.core import WorkflowInput

# An idle topic's delivery looks at its queue again after the first wait, twice as long each
# time, up to the worker's PROCBUS_DELIVERY_POLL_MAX_SECONDS (by default the second constant).
DELIVERY_POLL_FIRST_SECONDS = 0.05
DELIVERY_POLL_MAX_SECONDS = 0.5


class DeliveryInput(WorkflowInput):
    """Input of the TopicDelivery workflow: the one owner of a topic's queue."""

    topic: str
    rounds_per_run: int = Field(
        default=50, description="activity runs before the workflow continues as new"
    )


class DeliveryRequest(BaseModel):
    """One run of a topic's delivery activity."""

    topic: str
    max_seconds: float = Field(
        default=300.0, description="the activity returns after this long and is started again"
    )


class DeliveryCounts(Protocol):
    """What became of the entries a round (or a run of rounds) claimed."""

    delivered: int
    failed: int
    dead_lettered: int


class DeliveryProgress(BaseModel):
    """The delivery activity's heartbeat details: what a person sees in the Temporal UI."""

    topic: str
    rounds: int = 0
    delivered: int = 0
    failed: int = 0
    dead_lettered: int = 0
    state: str = "starting"

    def add(self, done: DeliveryCounts, rounds: int = 1) -> None:
        """Count what `rounds` rounds (one, or a whole run's) did into these totals."""
        self.rounds += rounds
        self.delivered += done.delivered
        self.failed += done.failed
        self.dead_lettered += done.dead_lettered


class DeliveryResult(DeliveryProgress):
    """What a delivery run did, and whether its topic was deleted meanwhile."""

    topic_deleted: bool = False
