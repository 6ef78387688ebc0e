"""Transaction-grouped batches (Apache Geode's group-transaction-events, made exact): a batch
never holds part of a transaction, and never sends an event ahead of an earlier, unsent event of
its key.

A batch is cut at `max_size` events in queue order. Then, for each transaction with events in the
batch but not all of them, in the order of the transactions' first appearance in the batch, its
missing events are taken from the queue (selectively, not by reading further) and appended in
queue order. An appended event first brings the earlier events of its key that are still queued
(and those events' transactions come whole too): per-key order wins over appending one
transaction's events before another's (Geode's worked example sends (T1-D)* before the
(T2-D)* queued ahead of it; here (D), (T2-C) and (T2-D)* go first).

An event can be sent only if everything it needs can go with it. Held back, with everything
behind it:
- an event that is not ready (it waits behind a batch that is being retried);
- the events of a transaction whose last event is not in the queue (or fewer events than its
  count), unless the caller says it waited long enough for it (`overdue`): then it goes as it
  is, incomplete;
- every later event of a held event's key, and the whole transaction of any held event.
The batch is then cut from what is left, so a held transaction never stalls the others.

Pure and deterministic: the same queue gives the same batch, in the same order.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Event:
    """An event as the assembly sees it: its ID, key and place in a transaction."""

    id: str
    key: str | None = None
    txn_id: str | None = None
    last_in_txn: bool = False
    txn_size: int | None = None  # the transaction's event count, where known
    ready: bool = True  # False: it may not be sent now, nor anything that needs it


@dataclass
class _Txn:
    positions: list[int]
    last_seen: bool = False
    size: int | None = None

    @property
    def complete(self) -> bool:
        return self.last_seen and (self.size is None or len(self.positions) >= self.size)


class _Scan:
    """The queue's shortest prefix that decides the batch: it holds `max_size` events that can
    be sent (or the whole queue), and every transaction that starts in it ends in it. Beyond it
    nothing can hold back an event inside it: holding travels forward along keys, and backward
    only within a transaction."""

    def __init__(self, queue: Sequence[Event], overdue: Collection[str]) -> None:
        self.queue = queue
        self.overdue = overdue
        self.end = 0
        self.txns: dict[str, _Txn] = {}
        self.open_txns: set[str] = set()  # started in the prefix, not ended in it
        self.held: set[int] = set()
        self.has_unready = False

    def extend(self, wanted: int) -> None:
        """Read on until the prefix holds `wanted` events and no transaction is open in it."""
        queue = self.queue
        while self.end < len(queue) and (self.open_txns or self.end - len(self.held) < wanted):
            event = queue[self.end]
            if not event.ready:
                self.has_unready = True
            txn_id = event.txn_id
            if txn_id is not None:
                txn = self.txns.get(txn_id)
                if txn is None:
                    txn = self.txns[txn_id] = _Txn([])
                txn.positions.append(self.end)
                if event.last_in_txn:
                    txn.last_seen = True
                    txn.size = event.txn_size
                if txn.complete:
                    self.open_txns.discard(txn_id)
                else:
                    self.open_txns.add(txn_id)
            self.end += 1

    def hold(self) -> None:
        """Which events of the prefix must wait: a fixed point, usually reached in one pass."""
        incomplete = {
            txn_id
            for txn_id, txn in self.txns.items()
            if not txn.complete and txn_id not in self.overdue
        }
        if not incomplete and not self.has_unready:
            return
        held_txns = set(incomplete)
        held = self.held
        changed = True
        while changed:
            changed = False
            held_keys: set[str] = set()
            for position in range(self.end):
                event = self.queue[position]
                if (
                    position in held
                    or not event.ready
                    or (event.txn_id is not None and event.txn_id in held_txns)
                    or (event.key is not None and event.key in held_keys)
                ):
                    if position not in held:
                        held.add(position)
                        changed = True
                    if event.key is not None:
                        held_keys.add(event.key)
                    if event.txn_id is not None and event.txn_id not in held_txns:
                        held_txns.add(event.txn_id)
                        changed = True  # its earlier events are held too: another pass


def assemble_batch(
    queue: Sequence[Event],
    max_size: int,
    *,
    group_transactions: bool = True,
    overdue: Collection[str] = frozenset(),
) -> list[Event]:
    """The next batch from `queue` (in queue order), as a list in send order.

    With `group_transactions=False`, the first `max_size` events. Otherwise the batch may pass
    `max_size` to keep transactions whole (a transaction larger than `max_size` goes whole in one
    batch). `overdue`: transactions whose missing events were waited for long enough; they go
    without them. Every other transaction missing its last event waits, and what needs it."""
    if max_size <= 0:
        raise ValueError(f"max_size must be more than 0, got {max_size}")
    if not group_transactions:
        return list(queue[:max_size])
    scan = _Scan(queue, overdue)
    while True:
        scan.extend(max_size)
        scan.hold()
        if scan.end == len(queue) or scan.end - len(scan.held) >= max_size:
            break
    return _emit(scan, max_size)


def _emit(scan: _Scan, max_size: int) -> list[Event]:
    queue, held = scan.queue, scan.held
    cut = [position for position in range(scan.end) if position not in held][:max_size]
    sent = set(cut)
    batch = list(cut)
    # Each key's queued positions, to find the earlier events an appended event needs.
    positions_of_key: dict[str, list[int]] = {}
    # The transactions to complete, in the order of their first appearance in the batch.
    to_complete: list[str] = []
    seen_txns: set[str] = set()

    def note_txn(position: int) -> None:
        txn_id = queue[position].txn_id
        if txn_id is not None and txn_id not in seen_txns:
            seen_txns.add(txn_id)
            if any(other not in sent for other in scan.txns[txn_id].positions):
                to_complete.append(txn_id)

    for position in cut:
        note_txn(position)
    if not to_complete:
        return [queue[position] for position in batch]
    for position in range(scan.end):
        key = queue[position].key
        if key is not None and position not in held:
            positions_of_key.setdefault(key, []).append(position)

    def needs(position: int) -> list[int]:
        """Unsent events that must go before this one: earlier ones of its key and its
        transaction."""
        event = queue[position]
        before = []
        if event.key is not None:
            before += [p for p in positions_of_key[event.key] if p < position and p not in sent]
        if event.txn_id is not None:
            before += [
                p for p in scan.txns[event.txn_id].positions if p < position and p not in sent
            ]
        return sorted(set(before))

    def append(position: int) -> None:
        # Depth-first over what must go first, without recursion: a transaction may be large.
        stack = [position]
        while stack:
            top = stack[-1]
            if top in sent:
                stack.pop()
                continue
            first = needs(top)
            if first:
                stack.extend(reversed(first))
                continue
            stack.pop()
            sent.add(top)
            batch.append(top)
            note_txn(top)

    index = 0
    while index < len(to_complete):
        for position in scan.txns[to_complete[index]].positions:
            append(position)
        index += 1
    return [queue[position] for position in batch]
