"""Leases: capacity a connection takes on a topic's shard for a block of events without key or
transaction, so that each publish writes its entry alone instead of counting on the shard's row
(bounds checked once per lease); and the cache of leases and preferred shards a process keeps."""

from __future__ import annotations

import hashlib
import random
import time
from dataclasses import dataclass

import asyncpg

from procbus.db import Queries
from procbus.topics.connections import pool_releases
from procbus.topics.models import (
    SHARDS,
)

# Server processes whose first shard moved (see move_shard); past this many, the moves of
# processes long gone are forgotten.
MOVED_SHARDS_KEPT = 4096

# Leases (see _Lease): entries each, and bytes each for this many events of the size of the one
# that takes it (at least LEASE_MIN_EVENT_BYTES each).
LEASE_ENTRIES = 512
LEASE_MIN_EVENT_BYTES = 512
LEASE_BYTES_FACTOR = 2
# A lease lives this long (a topic's delete waits for its leases to expire); its owner stops using
# it this much earlier, so that its publishes rarely meet the server's expiry.
LEASE_SECONDS = 2.0
LEASE_MARGIN_SECONDS = 0.5
# After a lease was refused (shard busy or nearly full): publishes count one by one for this
# long before the connection asks again; on a topic found to group transactions, this long.
NO_LEASE_SECONDS = 5.0
GROUPED_NO_LEASE_SECONDS = 60.0
# Connections (by server process) and topics with a lease; past this many, all are forgotten
# (each expires and gives back what it did not use).
LEASES_KEPT = 4096
# The session setting that arms a topic's lease: its name, by the topic's digest (a setting's
# name takes letters, digits and underscores only).
LEASE_SETTING_PREFIX = "procbus.lease_"


@dataclass
class Lease:
    """Capacity a connection took for a block of events without key or transaction: each of its
    publishes writes the entry alone, with an ID of the lease's, instead of counting on the
    shard's row. What it did not use goes back when it ends (procbus_topic_end_leases)."""

    id: int
    shard: int
    entry_ids: list[int]  # unused, the next last
    bytes_left: int
    max_payload_bytes: int
    # The server's clock, in seconds since the epoch: no publish under it from then on (a float
    # is passed to PostgreSQL in a tenth of a datetime's time).
    expires_at: float
    use_until: float  # time.monotonic()
    setting: str  # the session setting that arms it (procbus/topics/functions.sql)
    # The connection's pool releases when it was last armed: a release resets the session's
    # settings, so the next publish arms it again.
    armed_at_release: int | None


def lease_setting(topic: str) -> str:
    """The session setting that arms the session's lease on `topic`."""
    return LEASE_SETTING_PREFIX + hashlib.blake2b(topic.encode(), digest_size=16).hexdigest()


class LeaseCache:
    """What a process keeps between publishes, by server process (that is, by connection): its
    lease on each topic (or when to ask for one again), and the shard it takes capacity from
    first. One per process, PROCESS_LEASES, serves every Topics and every transaction's
    publishes; a test may give a Topics its own."""

    def __init__(self) -> None:
        self._leases: dict[tuple[int, str], Lease | float] = {}
        # A server process's first shard when it is no longer its PID's: see move_shard.
        self._moved_shards: dict[int, int] = {}

    def get(self, place: tuple[int, str]) -> Lease | float | None:
        return self._leases.get(place)

    def remember(self, place: tuple[int, str], lease: Lease | float) -> None:
        if len(self._leases) >= LEASES_KEPT:
            self._leases.clear()  # forgotten leases expire and give back what they did not use
        self._leases[place] = lease

    def forget(self, place: tuple[int, str]) -> None:
        self._leases.pop(place, None)

    def clear(self) -> None:
        """Forget every lease, as a process that died (each expires on the server)."""
        self._leases.clear()

    def preferred_shard(self, connection: asyncpg.Connection) -> int:
        """The shard a connection takes capacity from first: its own, by server process,
        unless it moved (move_shard)."""
        pid: int = connection.get_server_pid()
        return self._moved_shards.get(pid, pid % SHARDS)

    def move_shard(self, connection: asyncpg.Connection, shard: int | None = None) -> None:
        """After the connection's first shard was busy (or full): take `shard` first from now
        on, or another chosen at random. Two connections whose PIDs fall on one shard part this
        way, instead of one of them taking the slower checked path whenever the other holds
        it."""
        if shard is None:
            shard = (self.preferred_shard(connection) + random.randrange(1, SHARDS)) % SHARDS
        if len(self._moved_shards) >= MOVED_SHARDS_KEPT:
            self._moved_shards.clear()  # only preferences: a process that lost one moves again
        self._moved_shards[connection.get_server_pid()] = shard


# The process's own: a transaction's publishes (procbus.hooks) and every Topics share it.
PROCESS_LEASES = LeaseCache()


async def take_lease(
    connection: asyncpg.Connection, queries: Queries, topic: str, shard: int, size: int
) -> Lease | None:
    lease_bytes = LEASE_ENTRIES * LEASE_BYTES_FACTOR * max(size, LEASE_MIN_EVENT_BYTES)
    setting = lease_setting(topic)
    row = await connection.fetchrow(
        queries["take_lease"], topic, shard, LEASE_ENTRIES, lease_bytes, LEASE_SECONDS, setting
    )
    if row is None:
        return None
    return Lease(
        id=row["id"],
        shard=row["shard"],
        entry_ids=list(reversed(row["entry_ids"])),
        bytes_left=lease_bytes,
        max_payload_bytes=row["max_payload_bytes"],
        expires_at=row["expires_at"].timestamp(),
        use_until=time.monotonic() + LEASE_SECONDS - LEASE_MARGIN_SECONDS,
        setting=setting,
        armed_at_release=pool_releases(connection),
    )
