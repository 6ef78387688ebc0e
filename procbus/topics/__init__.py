"""Persistent notification topics: bounded two-phase queues in PostgreSQL, retry state with each
entry, dead letters and redrive, behind the `Topics` facade (procbus.topics.queue): its
administration (admin), publishing (publishing, leases, reservations) and consuming (consuming);
what goes in and out (models, pure)."""

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
from procbus.topics.publishing import publish_in_transaction
from procbus.topics.queue import Topics
from procbus.topics.refusals import SynchronousTopic, TopicInUse, TopicNotFound

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
    "SynchronousTopic",
    "Topic",
    "TopicGauges",
    "TopicInUse",
    "TopicNotFound",
    "TopicSettings",
    "TopicStats",
    "Topics",
    "publish_in_transaction",
]
