"""What the topic functions refuse with (their SQLSTATEs), as procbus errors."""

from __future__ import annotations

import asyncpg

from procbus.errors import AttemptFencedOut, InvalidRequest, QueueFull


class TopicNotFound(InvalidRequest):
    """No topic has this name."""


class TopicInUse(InvalidRequest):
    """A transaction that may have published to the topic under a lease is still open."""


class SynchronousTopic(InvalidRequest):
    """The topic delivers in the publishing call: it cannot queue (nor reserve) an event."""


_SQLSTATE_ERRORS: dict[str, type[Exception]] = {
    "PBT01": InvalidRequest,  # no such topic
    "PBT02": SynchronousTopic,  # it queues nothing
    "PBT03": TopicInUse,  # a delete waited too long for a publishing transaction
    "PBT04": AttemptFencedOut,  # a delivery attempt of an older owner epoch tried to claim
    "PBP01": InvalidRequest,  # payload too large
    "PBP02": InvalidRequest,  # larger than its reservation
    "PBQ01": QueueFull,
}


def topic_error(error: asyncpg.PostgresError) -> Exception:
    """A refusal raised by the topic functions as the procbus error it stands for."""
    sqlstate: str = getattr(error, "sqlstate", "") or ""
    kind = TopicNotFound if sqlstate == "PBT01" else _SQLSTATE_ERRORS.get(sqlstate)
    return error if kind is None else kind(str(error))
