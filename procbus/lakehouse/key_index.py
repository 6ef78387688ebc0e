"""Sorted key columns of data files, kept in the worker between a pipeline's batches.

A batch deletes its changed keys' live rows by position, so it must find them: with keys spread
over the whole table, that is a read of every data file's key column, a cost that follows the
table and not the batch. Data files never change once written, so the first batch to read a
file's key column hands it to a background thread that sorts it with its row positions; the
batches after it find their keys in that file by binary search, without reading it. Each entry
is kept by the file's path and size, and the least recently used go first past the byte budget
(`PROCBUS_KEY_INDEX_BYTES`). A one-column integer key only: other keys are read each time."""

from __future__ import annotations

import contextlib
import os
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

from procbus.errors import needs_extra

if TYPE_CHECKING:  # imported where used: the settings read this module's default
    import numpy
    import pyarrow

DEFAULT_KEY_INDEX_BYTES = 256 * 1024 * 1024
# The niceness of the thread that sorts: it takes the cores the worker's batches leave idle.
BUILDER_NICENESS = 19


@dataclass(frozen=True)
class FileKeys:
    """One data file's key column, sorted, with each key's row position in the file."""

    key_type: pyarrow.DataType
    keys: numpy.ndarray  # sorted
    positions: numpy.ndarray  # int64, in the order of `keys`

    @property
    def size(self) -> int:
        return int(self.keys.nbytes + self.positions.nbytes)

    def positions_of(self, wanted: pyarrow.Array) -> pyarrow.Array:
        """The positions (int64, ascending) of the rows whose key is in `wanted` (each once)."""
        with needs_extra("lake"):
            import numpy
            import pyarrow

        # Sorted, each search starts where the last ended: far fewer cache misses.
        values = numpy.sort(wanted.drop_null().cast(self.key_type).to_numpy())
        first = numpy.searchsorted(self.keys, values, side="left")
        last = numpy.searchsorted(self.keys, values, side="right")
        found = last > first
        first, last = first[found], last[found]
        if bool(numpy.all(last - first == 1)):
            hits = self.positions[first]
        else:  # a key held by several rows of the file: each of them
            hits = numpy.concatenate(
                [self.positions[start:end] for start, end in zip(first, last, strict=True)]
            )
        return pyarrow.array(numpy.sort(hits), pyarrow.int64())

    @classmethod
    def of(cls, column: pyarrow.ChunkedArray | pyarrow.Array) -> FileKeys:
        """Sort a file's key column (no nulls), keeping each key's position."""
        with needs_extra("lake"):
            import numpy

        values = column.to_numpy()
        order = numpy.argsort(values, kind="stable").astype(numpy.int64, copy=False)
        return cls(column.type, values[order], order)


def indexable(column_type: pyarrow.DataType) -> bool:
    with needs_extra("lake"):
        import pyarrow

    return bool(pyarrow.types.is_integer(column_type))


class KeyIndex:
    """The process's sorted key columns, by (data file path, size in bytes, key column): the
    path alone could name another file's contents only if a file were rewritten in place, which
    no writer does; the size makes even that miss instead of answer wrong."""

    def __init__(self, max_bytes: int = DEFAULT_KEY_INDEX_BYTES) -> None:
        self.max_bytes = max_bytes
        self._entries: OrderedDict[tuple[str, int, str], FileKeys] = OrderedDict()
        self._bytes = 0
        self._pending: dict[tuple[str, int, str], Future[None]] = {}
        # What the columns waiting to be sorted will take: counted against the budget too, so
        # that a batch reading a table far larger than it holds no more than it may keep.
        self._pending_bytes = 0
        self._lock = threading.Lock()
        self._builder: ThreadPoolExecutor | None = None

    def get(self, path: str, size: int, column: str) -> FileKeys | None:
        with self._lock:
            found = self._entries.get((path, size, column))
            if found is not None:
                self._entries.move_to_end((path, size, column))
            return found

    def index_later(
        self, path: str, size: int, column: str, values: pyarrow.ChunkedArray | pyarrow.Array
    ) -> None:
        """Sort `values`, the key column just read from a data file, in the background and keep
        it; nothing when it cannot be indexed or would not fit."""
        place = (path, size, column)
        kept_size = 16 * len(values)  # keys and positions, 8 bytes each per row at most
        if not indexable(values.type) or values.null_count:
            return
        with self._lock:
            if place in self._entries or place in self._pending:
                return
            if self._pending_bytes + kept_size > self.max_bytes:
                return
            if self._builder is None:
                self._builder = ThreadPoolExecutor(
                    1, thread_name_prefix="procbus-key-index", initializer=_lower_priority
                )
            self._pending_bytes += kept_size
            self._pending[place] = self._builder.submit(self._build, place, values, kept_size)

    def _build(
        self,
        place: tuple[str, int, str],
        values: pyarrow.ChunkedArray | pyarrow.Array,
        kept_size: int,
    ) -> None:
        try:
            built = FileKeys.of(values)
            with self._lock:
                if built.size > self.max_bytes:
                    return
                self._entries[place] = built
                self._bytes += built.size
                while self._bytes > self.max_bytes:
                    _, evicted = self._entries.popitem(last=False)
                    self._bytes -= evicted.size
        finally:
            with self._lock:
                self._pending.pop(place, None)
                self._pending_bytes -= kept_size

    def settled(self, timeout: float | None = None) -> None:
        """Wait until every sort handed over so far is kept (for a benchmark's steady state)."""
        with self._lock:
            pending = list(self._pending.values())
        for future in pending:
            future.result(timeout)

    @property
    def bytes_kept(self) -> int:
        with self._lock:
            return self._bytes


def _lower_priority() -> None:
    """Run the sorting thread at the lowest priority (Linux sets niceness per thread)."""
    with contextlib.suppress(OSError):  # elsewhere the sort runs at the worker's priority
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), BUILDER_NICENESS)


# The worker process's own (configured from PROCBUS_KEY_INDEX_BYTES at its start).
KEY_INDEX = KeyIndex()
