"""Post-commit hooks and the durable outbox, on an asyncpg connection.

    async with procbus.hooks.transaction(conn) as tx:
        await conn.execute(...)
        done = tx.post_commit(send_email, user)           # in-process, after commit
        tx.start_workflow("Ingest", request, id="ingest-42")  # durable: a row in this transaction

Hooks fire only after the transaction committed, in registration order, one after the other.
A rollback (of the transaction or of the savepoint they were registered in) cancels them with a
reason; a failing hook cancels the ones after it (unless it was registered `robust=True`).
Durable calls are rows written in the same transaction, performed after commit by the relay
(right away when one is given, else by the worker's relay): a crash after commit loses nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
import secrets
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, Literal, TypeVar, overload

import asyncpg
from pydantic_core import to_jsonable_python

from procbus.core import workflow_definition
from procbus.db import load_queries
from procbus.errors import InvalidRequest, ProcbusError
from procbus.hooks.outbox import QUERIES, OutboxRelay, outbox_refusal
from procbus.topics import Published, publish_in_transaction
from procbus.topics.models import DEFAULT_EVENT_TYPE
from procbus.topics.publishing import mark_transaction_end

log = logging.getLogger(__name__)

T = TypeVar("T")
Isolation = Literal["read_committed", "repeatable_read", "serializable"]


class TransactionAborted(Exception):
    """The hook was cancelled: its transaction rolled back (the error says why)."""


class SavepointRolledBack(TransactionAborted):
    """The hook was cancelled: the savepoint it was registered in rolled back."""


class PreviousHookFailed(Exception):
    """The hook was cancelled because an earlier hook of the same transaction failed."""

    def __init__(self, failure: BaseException) -> None:
        super().__init__(f"an earlier post-commit hook failed: {failure!r}")
        self.failure = failure


class HookFailedAfterCommit(ProcbusError):
    """A post-commit hook failed; the transaction's data IS committed."""

    def __init__(self, hook: str, failure: BaseException) -> None:
        super().__init__(
            f"the transaction committed (its data is saved), but post-commit hook {hook} "
            f"failed: {failure!r}"
        )
        self.failure = failure


@dataclass
class _Hook:
    name: str
    call: Callable[[], Awaitable[Any] | Any]
    future: asyncio.Future[Any]
    robust: bool


@dataclass
class _Savepoint:
    hooks: list[_Hook] = field(default_factory=list)


# The procbus transaction open on each connection (by identity; removed when it ends).
_open: dict[int, Transaction] = {}


def _settle(future: asyncio.Future[Any], error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)
        future.exception()  # retrieved: an unawaited future must not warn at exit


def _workflow_name(workflow: Any) -> str:
    if isinstance(workflow, str):
        return workflow
    definition = workflow_definition(workflow)
    if definition is None or definition.name is None:
        raise ValueError(f"{workflow!r} is not a workflow class, run method or workflow name")
    return definition.name


class Transaction:
    """What `transaction()` yields: register hooks and durable calls; savepoints."""

    __slots__ = (
        "_grouped_topics",
        "_hooks",
        "_savepoints",
        "_txn_id",
        "connection",
        "relay",
    )

    def __init__(self, connection: asyncpg.Connection, relay: OutboxRelay | None) -> None:
        self.connection = connection
        self.relay = relay
        self._hooks: list[_Hook] = []
        self._savepoints: list[_Savepoint] = []
        # Grouped topics this transaction published to: its last event there is marked at commit.
        self._grouped_topics: set[str] = set()
        self._txn_id: str | None = None

    # ---- in-process hooks ----

    @overload
    def post_commit(
        self, hook: Callable[..., Awaitable[T]], *args: Any, robust: bool = False
    ) -> asyncio.Future[T]: ...

    @overload
    def post_commit(
        self, hook: Callable[..., T], *args: Any, robust: bool = False
    ) -> asyncio.Future[T]: ...

    def post_commit(
        self, hook: Callable[..., Any], *args: Any, robust: bool = False
    ) -> asyncio.Future[Any]:
        """Run `hook(*args)` after commit; the Future gets its result or why it did not run."""
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        name = getattr(hook, "__qualname__", repr(hook))
        entry = _Hook(name, lambda: hook(*args), future, robust)
        self._hooks.append(entry)
        if self._savepoints:
            self._savepoints[-1].hooks.append(entry)
        return future

    @contextlib.asynccontextmanager
    async def savepoint(self) -> AsyncIterator[Transaction]:
        """A savepoint: if it rolls back, the hooks registered inside it are cancelled."""
        savepoint = _Savepoint()
        self._savepoints.append(savepoint)
        try:
            async with self.connection.transaction():
                yield self
        except BaseException as error:
            self._drop(savepoint, SavepointRolledBack(f"the savepoint rolled back: {error!r}"))
            raise
        finally:
            self._savepoints.remove(savepoint)
        if self._savepoints:  # released: its hooks now belong to the enclosing savepoint
            self._savepoints[-1].hooks.extend(savepoint.hooks)

    def _drop(self, savepoint: _Savepoint, reason: BaseException) -> None:
        dropped = {id(hook) for hook in savepoint.hooks}
        for hook in savepoint.hooks:
            _settle(hook.future, reason)
        self._hooks = [hook for hook in self._hooks if id(hook) not in dropped]

    async def rollback(self) -> None:
        """Roll the transaction back now; every hook is cancelled (TransactionAborted)."""
        raise _ExplicitRollback()

    # ---- persistent topics ----

    async def publish(
        self,
        topic: str,
        payload: Any,
        *,
        key: str | None = None,
        type: str = DEFAULT_EVENT_TYPE,
    ) -> Published:
        """Queue an event on a persistent topic in this transaction: it exists if and only if
        the transaction (and the savepoint it is in) commits. QueueFull when the topic is full:
        the transaction should then fail as a whole. On a topic that groups transactions, the
        events this transaction publishes carry its ID, and its last one is marked at commit."""
        if self._txn_id is None:
            self._txn_id = "tx_" + secrets.token_hex(16)  # 128 random bits, a third of uuid4's time
        published = await publish_in_transaction(
            self.connection, topic, payload, key=key, type=type, txn_id=self._txn_id
        )
        if published.txn_id is not None:
            self._grouped_topics.add(topic)
        return published

    async def _before_commit(self) -> None:
        if self._txn_id is not None:
            await mark_transaction_end(self.connection, sorted(self._grouped_topics), self._txn_id)

    # ---- durable calls (outbox) ----

    async def start_workflow(
        self,
        workflow: Any,
        arg: Any = None,
        *,
        id: str,
        task_queue: str | None = None,
    ) -> asyncio.Future[str | None]:
        """Start `workflow` after commit, exactly once (the workflow ID is fixed here)."""
        return await self._outbox(
            "start_workflow", id, _workflow_name(workflow), None, task_queue, arg
        )

    async def signal_workflow(
        self, workflow_id: str, signal: str, arg: Any = None
    ) -> asyncio.Future[str | None]:
        """Signal a running workflow after commit, exactly once."""
        return await self._outbox("signal_workflow", workflow_id, None, signal, None, arg)

    async def _outbox(
        self,
        kind: str,
        workflow_id: str,
        workflow_type: str | None,
        signal: str | None,
        task_queue: str | None,
        arg: Any,
    ) -> asyncio.Future[str | None]:
        args = [] if arg is None else [to_jsonable_python(arg)]
        refusal = outbox_refusal(kind, workflow_type, signal, args)
        if refusal is not None:
            raise InvalidRequest(f"durable {kind} refused: {refusal}")
        # Text, not a Python value: this is the application's connection, maybe without
        # procbus's jsonb codec.
        payload = json.dumps(args)
        row_id = await self.connection.fetchval(
            load_queries(QUERIES)["insert_outbox_row"],
            kind,
            workflow_id,
            workflow_type,
            signal,
            task_queue,
            payload,
            uuid.uuid4(),
        )
        # In line with the in-process hooks: performed after commit, in registration order.
        return self.post_commit(self._perform_now, row_id)

    async def _perform_now(self, row_id: int) -> str | None:
        if self.relay is None:
            return None  # the worker's relay performs it
        performed = await self.relay.perform_ids([row_id])
        return performed.get(row_id)

    # ---- after the transaction ----

    def _abort(self, error: BaseException | None) -> None:
        reason = TransactionAborted(
            "the transaction rolled back" + (f": {error!r}" if error is not None else "")
        )
        for hook in self._hooks:
            _settle(hook.future, reason)
        self._hooks = []

    async def _fire(self) -> None:
        failed: tuple[_Hook, BaseException] | None = None
        hooks, self._hooks = self._hooks, []
        for index, hook in enumerate(hooks):
            if failed is not None:
                _settle(hook.future, PreviousHookFailed(failed[1]))
                continue
            try:
                result = hook.call()
                if inspect.isawaitable(result):
                    result = await result
            except Exception as error:
                _settle(hook.future, error)
                if hook.robust:
                    log.warning("robust post-commit hook %s failed: %r", hook.name, error)
                else:
                    failed = (hook, error)
                continue
            except BaseException as error:  # cancellation: the rest are cancelled, not dropped
                _settle(hook.future, error)
                for rest in hooks[index + 1 :]:
                    _settle(rest.future, PreviousHookFailed(error))
                raise
            if not hook.future.done():
                hook.future.set_result(result)
        if failed is not None:
            raise HookFailedAfterCommit(failed[0].name, failed[1]) from failed[1]


class _ExplicitRollback(Exception):
    """Raised by `tx.rollback()` to leave the block; swallowed by `transaction()`."""


class transaction:  # used like a function: `async with transaction(conn)`
    """Open a transaction on `connection`, or join the procbus transaction already open on it.

    A class rather than a generator context manager: it sits on every write path, so it is kept
    cheap.
    """

    __slots__ = ("_asyncpg_tx", "_connection", "_isolation", "_joined", "_relay", "_tx")

    def __init__(
        self,
        connection: asyncpg.Connection,
        *,
        isolation: Isolation | None = None,
        relay: OutboxRelay | None = None,
    ) -> None:
        self._connection = connection
        self._isolation = isolation
        self._relay = relay
        self._joined = False
        self._tx: Transaction | None = None
        self._asyncpg_tx: Any = None

    async def __aenter__(self) -> Transaction:
        connection = self._connection
        if connection.is_in_transaction():
            joined = _open.get(id(connection))
            if joined is None:
                raise ProcbusError(
                    "the connection is in a transaction procbus did not open, so procbus cannot "
                    "know when it commits: open it with procbus.hooks.transaction()"
                )
            self._joined = True
            return joined  # hooks fire when the outer transaction commits
        tx = self._tx = Transaction(connection, self._relay)
        self._asyncpg_tx = connection.transaction(isolation=self._isolation)
        await self._asyncpg_tx.start()
        _open[id(connection)] = tx
        return tx

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> bool:
        if self._joined:
            return False
        tx = self._tx
        assert tx is not None
        try:
            if exc is None:
                if tx._grouped_topics:  # else nothing to do: no call on every write path
                    try:
                        await tx._before_commit()
                    except BaseException:
                        await self._asyncpg_tx.rollback()
                        raise
                await self._asyncpg_tx.commit()
            else:
                await self._asyncpg_tx.rollback()
        except BaseException as error:  # the commit itself failed: nothing was saved
            tx._abort(error)
            raise
        finally:
            _open.pop(id(self._connection), None)
        if exc is not None:
            # Cancellation too: no hook is ever silently dropped.
            tx._abort(None if isinstance(exc, _ExplicitRollback) else exc)
            return isinstance(exc, _ExplicitRollback)
        if tx._hooks:
            await tx._fire()
        return False


async def run_in_transaction(
    connection: asyncpg.Connection,
    body: Callable[[Transaction], Coroutine[Any, Any, T]],
    *,
    isolation: Isolation = "serializable",
    attempts: int = 5,
    relay: OutboxRelay | None = None,
) -> T:
    """Run `body` in a transaction, retrying serialization failures and deadlocks.

    Each attempt is a new transaction: the hooks and outbox rows of a failed attempt never fire.
    """
    for attempt in range(1, attempts + 1):
        try:
            async with transaction(connection, isolation=isolation, relay=relay) as tx:
                return await body(tx)
        except (asyncpg.SerializationError, asyncpg.DeadlockDetectedError):
            if attempt == attempts:
                raise
            await asyncio.sleep(0.01 * attempt)
    raise AssertionError("unreachable")
