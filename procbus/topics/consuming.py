"""Consuming a topic: claim what is due (entries, encoded bodies, or a grouped topic's batches),
settle what the endpoint did with it, expire, dead letters, redrive, and an operator's skip of
the batch a stopped pipeline holds. A claim carries its delivery owner's epoch (take_over)."""

from __future__ import annotations

import contextlib
import logging
import operator
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import fields, replace
from datetime import datetime

import asyncpg

from procbus.batching import assemble_batches, whole_transaction_batches
from procbus.core import collector_paused
from procbus.errors import InvalidRequest
from procbus.topics.decisions import (
    AfterFailures,
    Tried,
    after_failures,
    batches_to_keep,
    first_look,
    grouped_batch_id,
    next_look,
    read_look,
    retry_delays,
    stops_instead_of_dead_lettering,
    waits_for_more,
)
from procbus.topics.models import (
    DEAD_LETTER,
    Claim,
    ClaimedBatch,
    DeadLetter,
    EncodedBatch,
    Entry,
    Failure,
    Published,
    Settled,
    SkippedBatch,
    Topic,
    batch_id_of,
)
from procbus.topics.publishing import publish_in_transaction
from procbus.topics.refusals import TopicNotFound, topic_error
from procbus.topics.store import TopicStore, topic_of

log = logging.getLogger(__name__)


_ENTRY_COLUMNS = tuple(field.name for field in fields(Entry))


def _entries(rows: Iterable[asyncpg.Record]) -> list[Entry]:
    """The rows' entries (other columns of the rows, batch_id, ..., left out). Made as they
    are: each value comes from a typed column of the queue."""
    rows = list(rows)
    if not rows:
        return []
    # The rows of one statement share their columns.
    present = [name for name in _ENTRY_COLUMNS if name in rows[0].keys()]  # noqa: SIM118
    if len(present) == len(_ENTRY_COLUMNS):
        values = operator.itemgetter(*_ENTRY_COLUMNS)
        return [Entry(*values(row)) for row in rows]
    return [Entry(**{name: row[name] for name in present}) for row in rows]


class Consuming(TopicStore):
    # ---- delivery: claim a batch, settle what happened to it ----

    async def claim(self, topic: str, limit: int) -> Claim:
        """The next entries due, in queue order, none behind an earlier entry of its key that
        waits for its retry. The new claim becomes the topic's one claim: only it settles them,
        and an older one settles nothing from now on."""
        claim_id = uuid.uuid4()
        rows = await self._fetch(
            self.queries["claim_entries"], topic, limit, claim_id, self.epochs.get(topic)
        )
        return Claim(topic=topic, id=claim_id, entries=_entries(rows))

    async def claim_encoded(self, topic: str, batch_size: int, count: int = 1) -> Claim:
        """What `claim` would claim, up to `count` batches of `batch_size`, each with its body
        built by PostgreSQL from the stored payloads, for an endpoint that takes only bodies:
        the round then costs the worker no decoding and no encoding of an event."""
        claim_id = uuid.uuid4()
        rows = await self._fetch(
            self.queries["claim_bodies"],
            topic,
            batch_size * count,
            batch_size,
            claim_id,
            self.epochs.get(topic),
        )
        encoded = [
            EncodedBatch(
                id=batch_id_of(row["webhook_ids"]),
                body=row["body"],
                entry_ids=row["entry_ids"],
                attempts=row["attempts"],
            )
            for row in rows
        ]
        return Claim(topic=topic, id=claim_id, entries=[], encoded=encoded)

    async def claim_batches(self, topic: Topic, count: int = 1, *, encoded: bool = False) -> Claim:
        """A grouped topic's next batches, claimed as by `claim`: a batch sent
        before and due again, whole and in its order; else up to `count` new ones assembled
        from the queue (procbus.batching), one after the other, each kept so that every retry
        sends exactly it. Sent in the order given: a batch may hold later events of a key that
        an earlier one holds. With `encoded`, batches come as their bodies, not as entries: a new
        one joined from each event's JSON that PostgreSQL built in the look, a kept one built
        again by PostgreSQL (the same bytes)."""
        claim_id = uuid.uuid4()
        empty = Claim(topic=topic.name, id=claim_id, entries=[])
        limit = first_look(topic, count)
        kept_tried = False
        look = self.queries["grouped_view_for_bodies" if encoded else "grouped_view"]
        overdue: set[str] = set()
        while True:
            # Tens of thousands of rows, each with its payload's objects, all kept: the
            # collector's passes while they arrive would find nothing (procbus.core.collector).
            with collector_paused():
                view = await self._fetch(
                    look, topic.name, limit, claim_id, self.epochs.get(topic.name)
                )
            if not kept_tried and (not view or view[0]["any_kept"]):
                kept_tried = True
                kept = await self._claim_kept_batch(topic, claim_id, encoded=encoded)
                if kept is not None:
                    return kept
            if not view:
                return empty
            now: datetime = view[0]["now"]
            if waits_for_more(topic, len(view), (now - view[0]["created_at"]).total_seconds()):
                return empty
            with collector_paused():
                # Nearly always every transaction in the look is whole and side by side: its
                # batches are then cut in one pass, and the rows go in the order they came.
                cut = whole_transaction_batches(
                    (
                        (row["txn_id"], row["txn_last"], row["txn_size"], not row["blocked"])
                        for row in view
                    ),
                    topic.batch_size,
                    count,
                )
                if cut is not None:
                    rows = view[: cut[-1].stop]
                    batches = [[row["id"] for row in view[part.start : part.stop]] for part in cut]
                    break
                window, overdue, in_window = read_look(view, now, topic.incomplete_wait_seconds)
                batches = [
                    [int(event.id) for event in batch]
                    for batch in assemble_batches(window, topic.batch_size, count, overdue=overdue)
                    if batch
                ]
            further = next_look(limit, in_window, found=bool(batches))
            if further is None:
                by_id = {row["id"]: row for row in view}
                rows = [by_id[entry_id] for batch in batches for entry_id in batch]
                break
            limit = further
        if not batches:
            return empty
        txn_of = {row["id"]: row["txn_id"] for row in view} if overdue else {}
        claimed: list[ClaimedBatch] = []
        incomplete: dict[str, list[str]] = {}
        for ids in batches:
            claimed.append(ClaimedBatch(id=grouped_batch_id(topic.name, ids), entry_ids=ids))
            short = {txn_of[i] for i in ids if txn_of.get(i) in overdue}
            if short:
                incomplete[claimed[-1].id] = sorted(str(txn) for txn in short)
        all_ids = [entry_id for batch in claimed for entry_id in batch.entry_ids]
        kept = await self.pool.fetchval(
            self.queries["assign_batches"],
            topic.name,
            [batch.id for batch in claimed],
            [len(batch.entry_ids) for batch in claimed],
            claim_id,
            all_ids,
            len(incomplete),
        )
        if not kept:
            return empty  # an overlapping attempt claimed the topic: the next round sees it
        for batch_id, txns in incomplete.items():
            log.warning(
                "topic %s: batch %s goes without the missing events of transaction(s) %s, "
                "waited for %g s",
                topic.name,
                batch_id,
                ", ".join(txns),
                topic.incomplete_wait_seconds,
            )
        entries: list[Entry] = []
        bodies: list[EncodedBatch] = []
        if encoded:
            # Each event's JSON came with the look: joined in send order, the body that
            # kept_batch_body builds again, byte for byte, if the batch is resent.
            start = 0
            for batch in claimed:
                of_batch = rows[start : start + len(batch.entry_ids)]
                start += len(batch.entry_ids)
                bodies.append(
                    EncodedBatch(
                        id=batch.id,
                        body="[" + ",".join([row["body"] for row in of_batch]) + "]",
                        entry_ids=batch.entry_ids,
                        attempts=[row["attempts"] for row in of_batch],
                    )
                )
        else:
            with collector_paused():
                entries = _entries(rows)
        return Claim(
            topic=topic.name,
            id=claim_id,
            entries=entries,
            batches=claimed,
            incomplete_txns=sorted({txn for txns in incomplete.values() for txn in txns}),
            encoded=bodies,
        )

    async def _claim_kept_batch(
        self, topic: Topic, claim_id: uuid.UUID, *, encoded: bool = False
    ) -> Claim | None:
        """The oldest batch that was sent, failed and is due again, claimed whole in its order;
        with `encoded`, as its body (the same bytes as when it was first sent)."""
        kept = await self._fetch(
            self.queries["claim_kept_batch"], topic.name, claim_id, self.epochs.get(topic.name)
        )
        if not kept:
            return None
        rows = sorted(kept, key=lambda row: row["batch_seq"])
        batch = ClaimedBatch(
            id=rows[0]["batch_id"], entry_ids=[row["id"] for row in rows], fresh=False
        )
        if not encoded:
            return Claim(topic=topic.name, id=claim_id, entries=_entries(rows), batches=[batch])
        body = await self.pool.fetchval(self.queries["kept_batch_body"], topic.name, batch.id)
        return Claim(
            topic=topic.name,
            id=claim_id,
            entries=[],
            batches=[batch],
            encoded=[
                EncodedBatch(
                    id=batch.id,
                    body=body,
                    entry_ids=batch.entry_ids,
                    attempts=[row["attempts"] for row in rows],
                )
            ],
        )

    async def take_over(self, topic: str) -> bool:
        """Become the topic's delivery owner at a new epoch, and end the topic's claim, for this
        owner to send what it held again at once (with the same webhook IDs; a grouped topic's
        next look keeps the batches it assembled, to be resent exactly); whether there was one.
        Every earlier owner's attempt claims, settles and commits nothing from now on."""
        async with self.pool.acquire() as connection, connection.transaction():
            held = await connection.fetchval(self.queries["lock_claim_for_take_over"], topic)
            epoch = await connection.fetchval(self.queries["bump_owner_epoch"], topic)
            if epoch is None:
                return False  # no such topic: its delivery finds it deleted
            await connection.execute(self.queries["take_over_claims"], topic, epoch)
        self.epochs[topic] = epoch
        return held is not None

    async def settle(
        self,
        claim: Claim,
        delivered: Sequence[int],
        failed: Sequence[Failure] = (),
    ) -> Settled:
        """Record a delivery attempt: remove what the endpoint acknowledged, count the failures
        with the entries (backoff with jitter, or the endpoint's Retry-After), move entries past
        max_retries or their TTL to the dead letters (on a table:// topic: they stay, and the
        topic stops), as procbus.topics.decisions decides; what was not sent stays as it was. An
        older, overlapping claim, or one of an older owner epoch, settles nothing."""
        assembled, kept = batches_to_keep(claim.batches, failed)
        async with (
            self.pool.acquire() as connection,
            # Without failures the settlement is one statement, atomic by itself.
            connection.transaction() if failed else contextlib.nullcontext(),
        ):
            settled = await connection.fetchrow(
                self.queries["settle_round"],
                claim.topic,
                claim.id,
                list(delivered),
                assembled,
                kept,
            )
            if not settled["held"]:
                return Settled(delivered=0, failed=0, dead_lettered=[])
            after = AfterFailures()
            dead: list[int] = []
            if failed:
                after = await self._record_failures(connection, claim, failed)
                dead = await self._apply_failures(connection, claim.topic, after)
        return Settled(
            delivered=settled["removed"],
            failed=len(failed),
            dead_lettered=sorted(dead),
            stopped=after.stopped,
        )

    async def _record_failures(
        self, connection: asyncpg.Connection, claim: Claim, failed: Sequence[Failure]
    ) -> AfterFailures:
        """Count the failed attempts with their entries, each due again after its retry delay;
        what is to become of those given up (after_failures)."""
        # The claim's row was there: so is its topic (deleting it deletes the claim).
        topic = topic_of(await connection.fetchrow(self.queries["get_topic"], claim.topic))
        rows = await connection.fetch(
            self.queries["record_failures"],
            claim.topic,
            [failure.id for failure in failed],
            [failure.error for failure in failed],
            retry_delays(topic, failed, whole_batch=bool(claim.batches)),
        )
        await connection.execute(self.queries["count_retried"], claim.topic, len(rows))
        now = await connection.fetchval(self.queries["database_time"])
        tried = [
            Tried(row["id"], row["attempts"], (now - row["created_at"]).total_seconds())
            for row in rows
        ]
        return after_failures(topic, failed, tried, claim.batches)

    async def _apply_failures(
        self, connection: asyncpg.Connection, topic: str, after: AfterFailures
    ) -> list[int]:
        """Stop the topic, or move entries to the dead letters, as decided; the dead letters."""
        if after.stopped is not None:
            # Kept in the queue, due again as soon as an operator enables the topic.
            await connection.execute(self.queries["set_disabled"], topic, after.stopped)
            await connection.execute(self.queries["retry_now"], topic, after.retry_now)
        dead: list[int] = []
        for ids, reason in after.dead_letters:
            dead += (
                await connection.fetchval(self.queries["dead_letter_ids"], topic, ids, reason) or []
            )
        return dead

    async def expire(self, topic: str, limit: int = 1000) -> list[int]:
        """Move entries past the topic's TTL to the dead letters, sent or not; their IDs. Ends
        the topic's expired leases first (their owners died or forgot them). A table:// topic's
        entries never expire: a change pipeline applies every change, in order."""
        settings = await self.get(topic)
        if stops_instead_of_dead_lettering(settings):
            return []
        await self.pool.fetchval(self.queries["end_expired_leases"], topic)
        async with self.pool.acquire() as connection, connection.transaction():
            ids = [
                row["id"]
                for row in await connection.fetch(
                    self.queries["expired_entries"], topic, settings.ttl_seconds, limit
                )
            ]
            if not ids:
                return []
            # Batches being assembled from these entries must not be kept (assign_batches).
            try:
                await connection.execute(
                    self.queries["hold_claim"], topic, uuid.uuid4(), self.epochs.get(topic)
                )
            except asyncpg.PostgresError as error:
                raise topic_error(error) from None
            reason = f"older than the topic's TTL of {settings.ttl_seconds:g} s"
            dead: list[int] = await connection.fetchval(
                self.queries["dead_letter_ids"], topic, ids, reason
            )
        return dead or []

    async def skip_stopped_batch(self, name: str, batch_id: str, reason: str) -> SkippedBatch:
        """An operator gives up the batch a stopped table:// topic holds first in its queue
        (`procbus pipeline skip`): its entries go to the dead letters with `reason`, and the
        topic is enabled, so the batches behind it go on, in order. In one transaction; refused
        (InvalidRequest, nothing changed) unless the topic is stopped and `batch_id` is that
        batch: the ID `pipeline status` shows, so that nothing else is given up."""
        reason = reason.strip()
        if not reason:
            raise InvalidRequest("say why the batch is given up: --reason TEXT")
        if not stops_instead_of_dead_lettering(await self.get(name)):
            raise InvalidRequest(
                f"topic {name!r} is no pipeline (its endpoint is not table://): its failed "
                "entries go to the dead letters by themselves"
            )
        queries = self.queries
        async with self.pool.acquire() as connection, connection.transaction():
            # A new claim (the claim's row locked before the topic's, as a settlement does):
            # a delivery attempt still in flight settles and commits nothing from now on.
            try:
                await connection.execute(queries["hold_claim"], name, uuid.uuid4(), None)
            except asyncpg.PostgresError as error:
                raise topic_error(error) from None
            state = await connection.fetchrow(queries["lock_topic_state"], name)
            if state is None:
                raise TopicNotFound(f"no topic named {name!r}")
            if state["disabled_at"] is None:
                raise InvalidRequest(
                    f"pipeline {name!r} is running: only the batch a stopped pipeline holds "
                    f"first can be skipped (`procbus pipeline status {name}` shows it)"
                )
            first = await connection.fetchval(queries["first_entry_batch"], name)
            if first != batch_id:
                holds = f"holds batch {first} first" if first else "holds no batch it sent"
                raise InvalidRequest(
                    f"pipeline {name!r} {holds}, not {batch_id}: nothing skipped (`procbus "
                    f"pipeline status {name}` shows the batch it stopped at)"
                )
            ids = await connection.fetchval(queries["batch_entry_ids"], name, batch_id)
            dead: list[int] = await connection.fetchval(
                queries["dead_letter_ids"], name, ids, f"skipped by an operator: {reason}"
            )
            await connection.execute(queries["set_enabled"], name)
        log.warning(
            "topic %s: batch %s (entries %s) skipped by an operator: %s",
            name,
            batch_id,
            ", ".join(map(str, dead)),
            reason,
        )
        return SkippedBatch(topic=name, batch_id=batch_id, reason=reason, dead_lettered=dead)

    # ---- dead letters and stats ----

    async def dead_letters(self, topic: str, ids: Sequence[int] | None = None) -> list[DeadLetter]:
        """Return the topic's dead letters (all of them, or these IDs).

        Raises:
            TopicNotFound: when there is no such topic.
        """
        await self.get(topic)
        rows = await self.pool.fetch(
            self.queries["list_dead_letters"], topic, list(ids) if ids is not None else None
        )
        return [DEAD_LETTER.validate_python(dict(row)) for row in rows]

    async def redrive(self, topic: str, ids: Sequence[int] | None = None) -> list[Published]:
        """Put dead letters back in the queue (all of them, or these IDs), each with its webhook ID.

        All or nothing. On a topic that groups transactions they go back to their original places
        in the queue; on any other, behind what is queued.

        Raises:
            QueueFull: when they do not fit; they stay where they were.
            InvalidRequest: for an ID that is no dead letter of the topic, or a pipeline that
                applied later changes since.
        """
        settings = await self.get(topic)
        published = []
        async with self.pool.acquire() as connection, connection.transaction():
            rows = await connection.fetch(
                self.queries["take_dead_letters"], topic, list(ids) if ids is not None else None
            )
            if ids is not None:
                missing = sorted(set(ids) - {row["id"] for row in rows})
                if missing:
                    raise InvalidRequest(
                        f"topic {topic!r} has no dead letter {', '.join(map(str, missing))}"
                    )
            if stops_instead_of_dead_lettering(settings):
                # Applied again, a change older than what the lake holds would bring back rows.
                position = await connection.fetchval(self.queries["pipeline_position"], topic)
                passed = sorted(row["id"] for row in rows if row["id"] < (position or 0))
                if passed:
                    raise InvalidRequest(
                        f"pipeline {topic!r}: later changes were applied since dead letter(s) "
                        f"{', '.join(map(str, passed))}; put back, they would bring older rows "
                        "back over them: nothing redriven (read them with `procbus topic "
                        "dead-letters`)"
                    )
            for row in sorted(rows, key=lambda dead: dead["id"]):
                again = await publish_in_transaction(
                    connection,
                    topic,
                    row["payload"],
                    key=row["key"],
                    type=row["type"],
                    txn_id=row["txn_id"],
                    last_in_txn=row["txn_last"],
                    txn_size=row["txn_size"],
                    webhook_id=row["webhook_id"],
                    leases=self.leases,
                )
                if settings.group_transactions:
                    # Back at its place: a receiver that applies batches (a change pipeline)
                    # must get a key's events in commit order, before what came after them.
                    await connection.execute(self.queries["restore_position"], again.id, row["id"])
                    again = replace(again, id=row["id"])
                published.append(again)
        return published
