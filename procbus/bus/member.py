"""A bus member: how one worker applies, stages, commits and aborts the bus's operations.

Every phase is idempotent per operation ID, because the coordinator resends to a member that
did not answer in time: a second apply or commit changes nothing, an abort undoes a one-phase
apply, and an operation aborted once is never applied after (a late resend finds it decided).
State is in memory only; `rebuild` loads it from the catalog when the worker starts, and again
after its heartbeat lapsed (the others may have sent it nothing meanwhile). Until then nothing is
served from it: phases wait, the ACL cache refuses (MemberNotCurrent, retried).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict
from collections.abc import Callable
from datetime import datetime
from typing import TypeVar

from procbus.bus.membership import MemberLease
from procbus.bus.models import (
    BusMessage,
    ChangeAccessOperation,
    EvictDescriptor,
    MemberReply,
    Operation,
    PutDescriptor,
    ReportState,
    ResetNamespaceGrants,
)
from procbus.core import MemberReport
from procbus.errors import InvalidRequest, MemberNotCurrent
from procbus.lakehouse import Catalog, DescriptorCache
from procbus.lakehouse.cache import AccessCache

# Operations remembered per member (applied, decided): far more than can be in flight at once.
REMEMBERED_OPERATIONS = 1000

Undo = Callable[[], None]
V = TypeVar("V")


class _Remembered(OrderedDict[str, V]):
    """An insertion-ordered map that forgets its oldest keys past REMEMBERED_OPERATIONS."""

    def remember(self, key: str, value: V) -> None:
        self[key] = value
        self.move_to_end(key)
        while len(self) > REMEMBERED_OPERATIONS:
            self.popitem(last=False)


class BusMember:
    """One worker's side of the bus: applies, stages, commits and aborts operations."""

    def __init__(
        self,
        member_id: str,
        tables: DescriptorCache,
        access: AccessCache,
        lease: MemberLease | None = None,
    ) -> None:
        self.member_id = member_id
        self.tables = tables
        self.access = access
        self.started_at = datetime.now().astimezone()
        self.applied: _Remembered[int] = _Remembered()  # operation ID -> times it took effect
        self._undo: _Remembered[Undo] = _Remembered()  # one-phase applies an abort would undo
        self._staged: dict[str, Operation] = {}
        self._decided: _Remembered[str] = _Remembered()  # "committed" or "aborted"
        # With a lease (a joined member), nothing is served until the caches are read.
        self.lease = lease
        self.stale = lease is not None
        self._read_once = False
        self.taken_over = asyncio.Event()
        self._changed = asyncio.Condition()
        if lease is not None:
            access.guard = self.check_current

    async def rebuild(self, catalog: Catalog) -> None:
        """The member's state from the catalog: what it missed while it was not running."""
        tables = await catalog.list_tables()
        self.tables.replace(tables)
        self.access.replace(await catalog.list_access())
        self.stale = False
        self._read_once = True

    async def refresh(self, catalog: Catalog) -> None:
        """After each heartbeat: rebuild the caches if the lease lapsed (or they were never
        read), then wake the phases waiting to be served."""
        lease = self.lease
        try:
            if lease is not None and lease.lapsed:
                lease.lapsed = False
                self.stale = True  # before any await: nothing is served from them from now
            if self.stale and (lease is None or lease.taken_over_by is None):
                await self.rebuild(catalog)
        finally:
            if lease is not None and lease.taken_over_by is not None:
                self.taken_over.set()
            async with self._changed:
                self._changed.notify_all()

    def out_of_lease(self) -> bool:
        """Joined, but its lease ran out: it cannot renew its membership (its database is out
        of reach, or the process was paused), so the others count it gone or soon will."""
        lease = self.lease
        return lease is not None and lease.incarnation is not None and not lease.current

    async def back_in_lease(self) -> bool:
        """Wait, up to its membership timeout, for the lease to run again (a heartbeat getting
        through: PostgreSQL back after a restart, say); whether it does."""
        lease = self.lease
        if lease is None:
            return True
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(lease.timeout_seconds), self._changed:
                await self._changed.wait_for(lambda: not self.out_of_lease())
        return not self.out_of_lease()

    def check_current(self) -> None:
        """MemberNotCurrent unless this process may serve from its caches right now: it holds
        its member ID, its lease runs, and its caches were rebuilt since its last lapse."""
        lease = self.lease
        if lease is None:
            return
        if lease.taken_over_by is not None:
            raise MemberNotCurrent(
                f"worker {self.member_id!r} was taken over by {lease.taken_over_by} (started "
                "with the same worker ID): this process no longer serves"
            )
        if self.stale and not self._read_once:
            raise MemberNotCurrent(
                f"worker {self.member_id!r} has not read its caches from the catalog yet "
                "(it is joining the bus); try again"
            )
        if self.stale or not lease.current:
            raise MemberNotCurrent(
                f"worker {self.member_id!r} cannot vouch for its caches now: its bus heartbeat "
                "lapsed or is overdue (the bus may have sent it changes it missed), and they are "
                "read again from the catalog after its next heartbeat; try again"
            )

    async def serving(self) -> None:
        """Wait until this process may serve a bus phase (its caches rebuilt after a lapse);
        MemberNotCurrent if it was taken over, or is still not current after a timeout."""
        lease = self.lease
        if lease is None:
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(lease.timeout_seconds), self._changed:
                await self._changed.wait_for(
                    lambda: lease.taken_over_by is not None or (lease.current and not self.stale)
                )
        self.check_current()

    # ---- the phases ----

    def apply(self, message: BusMessage) -> MemberReply:
        if isinstance(message.operation, ReportState):
            return self._reply("apply", changed=False, report=True)
        key = message.operation_id
        if key in self.applied or key in self._decided:
            return self._reply("apply", changed=False)
        self._undo.remember(key, self._perform(message.operation))
        self._count(key)
        return self._reply("apply", changed=True)

    def prepare(self, message: BusMessage) -> MemberReply:
        key = message.operation_id
        if key in self._decided or key in self._staged:
            return self._reply("prepare", changed=False)
        self._staged[key] = message.operation
        return self._reply("prepare", changed=True)

    def commit(self, message: BusMessage) -> MemberReply:
        """Applies the operation, staged or not: a member that restarted after it prepared
        has lost the stage, and learns the outcome from this commit."""
        key = message.operation_id
        decided = self._decided.get(key)
        if decided == "committed":
            return self._reply("commit", changed=False)
        if decided == "aborted":
            # The coordinator commits only after every member prepared, never after an abort.
            raise InvalidRequest(f"operation {key!r} was aborted on {self.member_id}")
        self._staged.pop(key, None)
        self._perform(message.operation)
        self._decided.remember(key, "committed")
        self._count(key)
        return self._reply("commit", changed=True)

    def abort(self, message: BusMessage) -> MemberReply:
        key = message.operation_id
        if key in self._decided:
            return self._reply("abort", changed=False)
        staged = self._staged.pop(key, None) is not None
        undo = self._undo.pop(key, None)
        if undo is not None:
            undo()
        self._decided.remember(key, "aborted")
        return self._reply("abort", changed=staged or undo is not None)

    # ---- the operations ----

    def _perform(self, operation: Operation) -> Undo:
        """Change this member's caches; returns how to put them back."""
        if isinstance(operation, PutDescriptor):
            name = operation.table.qualified_name
            before = self.tables.get(name)
            stale = [e for e in self.access.entries() if e.qualified_table == name]
            self.tables.put(operation.table)
            if operation.new_table:
                self.access.drop_table(name)
            added = [entry for entry in operation.grants if self.access.grant(entry)]

            def put_back() -> None:
                if before is None:
                    self.tables.evict(name)
                else:
                    self.tables.put(before)
                for entry in added:
                    self.access.revoke(entry)
                for entry in stale:
                    self.access.grant(entry)

            return put_back
        if isinstance(operation, EvictDescriptor):
            name = operation.qualified_name
            evicted = self.tables.get(name)
            self.tables.evict(name)
            # Its grants stay until a table of that name is created again: unused till then.
            return lambda: None if evicted is None else self.tables.put(evicted)
        if isinstance(operation, ChangeAccessOperation):
            entry = operation.entry
            granting = operation.action == "grant"
            changed = self.access.grant(entry) if granting else self.access.revoke(entry)

            def change_back() -> None:
                if changed and granting:
                    self.access.revoke(entry)
                elif changed:
                    self.access.grant(entry)

            return change_back
        if isinstance(operation, ResetNamespaceGrants):
            namespace = operation.namespace
            held = self.access.namespace_grants(namespace)
            self.access.reset_namespace(namespace, operation.grants)
            return lambda: self.access.reset_namespace(namespace, held)
        return _nothing

    def _count(self, key: str) -> None:
        self.applied.remember(key, self.applied.get(key, 0) + 1)

    def report(self) -> MemberReport:
        return MemberReport(
            member_id=self.member_id,
            started_at=self.started_at,
            tables=self.tables.names(),
            access=[entry.model_dump(mode="json") for entry in self.access.entries()],
            applied=dict(self.applied),
            staged=sorted(self._staged),
        )

    def _reply(self, phase: str, *, changed: bool, report: bool = False) -> MemberReply:
        return MemberReply(
            member_id=self.member_id,
            phase=phase,
            changed=changed,
            report=self.report() if report else None,
        )


def _nothing() -> None:
    """The undo of an operation that changed nothing."""
