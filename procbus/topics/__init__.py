"""Persistent notification topics: bounded two-phase queues in PostgreSQL, retry state with each
entry, dead letters and redrive (procbus.topics.queue); what goes in and out (models, pure)."""

from procbus.errors import QueueFull, ReservationExpired
from procbus.topics.models import (
    Claim,
    DeadLetter,
    Entry,
    Event,
    Failure,
    Published,
    Reservation,
    Settled,
    SkippedBatch,
    Topic,
    TopicGauges,
    TopicSettings,
    TopicStats,
)
from procbus.topics.queue import TopicInUse, TopicNotFound, Topics, publish_in_transaction

__all__ = [
    "Claim",
    "DeadLetter",
    "Entry",
    "Event",
    "Failure",
    "Published",
    "QueueFull",
    "Reservation",
    "ReservationExpired",
    "Settled",
    "SkippedBatch",
    "Topic",
    "TopicGauges",
    "TopicInUse",
    "TopicNotFound",
    "TopicSettings",
    "TopicStats",
    "Topics",
    "publish_in_transaction",
]
