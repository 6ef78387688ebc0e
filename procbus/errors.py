"""Errors a user can hit: each says what was wrong and what to do.

`ErrorType` is the one registry of the names procbus errors carry through Temporal (the `type`
of an `ApplicationError`): activities raise the classes below, the worker's error interceptor
(procbus.temporal.errors) turns them into ApplicationErrors of their type, and retry policies
take their non-retryable lists from here. Pure: safe to import in the workflow sandbox.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from enum import StrEnum
from typing import TYPE_CHECKING, ClassVar

if TYPE_CHECKING:
    from pydantic import ValidationError


class ErrorType(StrEnum):
    INVALID_REQUEST = "InvalidRequest"  # bad input, or a request that contradicts the catalog
    INVALID_PROCEDURE_INPUT = "InvalidProcedureInput"  # refused before any step ran
    STALE_FENCING_TOKEN = "StaleFencingToken"  # a write whose lock was lost meanwhile
    LOCK_LOST = "LockLost"  # a held lock's lease ran out and another holder may have it
    LOCK_TIMEOUT = "LockTimeout"  # the locks were not granted within the lock timeout
    QUEUE_FULL = "QueueFull"  # a topic's bound refused an event: the caller refuses its operation
    RESERVATION_EXPIRED = "ReservationExpired"  # a two-phase publish committed too late
    PROCEDURE_ROLLED_BACK = "ProcedureRolledBack"  # a procedure failed and was undone
    PROCEDURE_FAILED = "ProcedureFailed"  # a procedure failed past its pivot
    INJECTED_FAULT = "InjectedFault"  # PROCBUS_FAULTS made a step fail (drills and tests)
    BROADCAST_FAILED = "BroadcastFailed"  # a bus member refused or never answered: all aborted
    ACCESS_DENIED = "AccessDenied"  # the principal lacks the permission on this worker's ACL
    SPARK_JOB_FAILED = "SparkJobFailed"  # Spark's own message; Spark retried its tasks already
    SPARK_JOB_CANCELLED = "SparkJobCancelled"  # the job was cancelled before it finished
    ATTEMPT_FENCED_OUT = "AttemptFencedOut"  # a newer attempt of the same job took over
    SNAPSHOT_CONFLICT = "SnapshotConflict"  # a file a commit replaces is no longer live
    MEMBER_NOT_CURRENT = "MemberNotCurrent"  # this worker's bus caches may be stale: ask again
    LOCKS_RELEASED = "LocksReleased"  # a late lock request of an execution that released its own

    @property
    def retryable(self) -> bool:
        """Whether trying the same call again can succeed: an injected fault, or a worker that
        is rebuilding its caches (or was replaced: the retry goes to another)."""
        return self in (ErrorType.INJECTED_FAULT, ErrorType.MEMBER_NOT_CURRENT)


# What a step's retry policy never retries: trying the same request again cannot help.
NON_RETRYABLE_ERROR_TYPES: list[str] = [str(kind) for kind in ErrorType if not kind.retryable]


class ProcbusError(Exception):
    """An error with a message meant for the person running procbus (no traceback needed)."""

    # The name it carries through Temporal; None: it is retried like any unexpected error.
    error_type: ClassVar[ErrorType | None] = None


class ConfigError(ProcbusError):
    """A setting has a bad value."""


class StackError(ProcbusError):
    """The embedded stack cannot start, or no stack is reachable."""


class SearchAttributesNotSet(ProcbusError):
    """A Temporal namespace lacks procbus's search attributes, or has one of another type."""


class MigrationError(ProcbusError):
    """The database schema cannot be brought up to date."""


class MigrationHistoryError(MigrationError):
    """The database's migrations began otherwise (before a squash): only a reset helps."""


class MissingExtra(ProcbusError, ImportError):
    """An optional dependency is not installed; the message names the extra that brings it."""


# The optional parts of procbus: `pip install 'procbus[EXTRA]'` brings what each needs.
EXTRAS = {
    "spark": "Spark jobs (`spark_job` steps, loads and compactions)",
    "lake": "the lake's Apache Iceberg tables and the change pipeline",
    "kafka": "kafka:// topic endpoints",
    "amqp": "amqp:// topic endpoints",
    "dev": "the embedded stack (`procbus dev`): PostgreSQL and the Temporal CLI",
}


@contextlib.contextmanager
def needs_extra(extra: str) -> Iterator[None]:
    """Turn a missing optional dependency, imported inside, into MissingExtra naming `extra`.

        with needs_extra("spark"):
            from pyspark.sql import SparkSession

    Args:
        extra: the extra of procbus's distribution that installs what is imported (EXTRAS).
    """
    try:
        yield
    except ModuleNotFoundError as error:
        missing = (error.name or "").partition(".")[0]
        if not missing or missing == "procbus":
            raise  # not an optional dependency: procbus itself is broken
        raise MissingExtra(
            f"{EXTRAS[extra]} need {missing}, which is not installed: "
            f"pip install 'procbus[{extra}]'",
            name=error.name,
        ) from error


class SparkUnavailable(ProcbusError):
    """Spark cannot start on this machine (usually: no Java)."""


class InvalidRequest(ProcbusError):
    """Bad input (a name, a schema) or a request that contradicts the catalog."""

    error_type = ErrorType.INVALID_REQUEST


class AccessDenied(ProcbusError):
    """The worker's ACL cache does not let the principal do this to the table."""

    error_type = ErrorType.ACCESS_DENIED


class MemberNotCurrent(ProcbusError):
    """This worker may not serve from its caches now: its bus heartbeat lapsed and they are
    being rebuilt from the catalog, or another process took its worker ID over."""

    error_type = ErrorType.MEMBER_NOT_CURRENT


class LockError(InvalidRequest):
    """A bad lock request: a malformed path, an unknown mode, a bad lease."""


class LockTimeout(ProcbusError):
    """The locks were not granted in time; the request left the queue."""

    error_type = ErrorType.LOCK_TIMEOUT


class LockLost(ProcbusError):
    """A granted lock's lease ran out and another holder may have it now."""

    error_type = ErrorType.LOCK_LOST


class LocksReleased(ProcbusError):
    """A lock request of an execution that had released its locks (a worker that resumed an old
    workflow task of a procedure that already ended): it takes none."""

    error_type = ErrorType.LOCKS_RELEASED


class StaleFencingToken(ProcbusError):
    """A write carried a fencing token older than the resource's newest: its lock was lost."""

    error_type = ErrorType.STALE_FENCING_TOKEN


class QueueFull(ProcbusError):
    """A topic holds as many entries or bytes (committed and reserved) as its bounds allow; the
    caller should refuse the operation it wanted to publish about."""

    error_type = ErrorType.QUEUE_FULL


class ReservationExpired(ProcbusError):
    """A reservation was committed after it ran out: its capacity is back, nothing was queued."""

    error_type = ErrorType.RESERVATION_EXPIRED


class SparkJobFailed(ProcbusError):
    """The Spark job failed; the message is Spark's own, without the JVM stack."""

    error_type = ErrorType.SPARK_JOB_FAILED


class SparkDriverLost(ProcbusError):
    """A job's driver ended without leaving its outcome: it was killed, or the host it ran on
    was lost. Not the job's failure: the step is tried again, as a new attempt (no error type:
    retried like any unexpected error)."""


class SparkJobCancelled(ProcbusError):
    """The Spark job was cancelled before it finished."""

    error_type = ErrorType.SPARK_JOB_CANCELLED


class AttemptFencedOut(ProcbusError):
    """A job attempt tried to commit (or stage) after a newer attempt of the same job began: a
    zombie, whose output is discarded."""

    error_type = ErrorType.ATTEMPT_FENCED_OUT


class SnapshotConflict(ProcbusError):
    """A commit would replace files that a concurrent commit already replaced or removed."""

    error_type = ErrorType.SNAPSHOT_CONFLICT


def validation_findings(error: ValidationError) -> str:
    """pydantic's findings in one line: each bad or missing field and what is wrong with it."""
    return "; ".join(
        f"{'.'.join(str(part) for part in found['loc']) or 'the input'}: "
        + str(found["msg"]).removeprefix("Value error, ")
        for found in error.errors(include_url=False)
    )


# What Temporal's payload converter raises (a KeyError) for an encoding it cannot read.
UNKNOWN_PAYLOAD_ENCODING = "Unknown payload encoding "


def encoded_payload_error(error: BaseException) -> ConfigError | None:
    """Return the one-line error for payloads a codec procbus was not given encoded, when that
    is what `error` (or what caused it) is; None for any other error."""
    seen: set[int] = set()
    found: BaseException | None = error
    while found is not None and id(found) not in seen:
        seen.add(id(found))
        message = str(found.args[0]) if isinstance(found, KeyError) and found.args else ""
        if message.startswith(UNKNOWN_PAYLOAD_ENCODING):
            encoding = message.removeprefix(UNKNOWN_PAYLOAD_ENCODING)
            return ConfigError(
                f"Temporal payloads are encoded (encoding {encoding!r}) by a payload codec "
                "procbus was not given: set PROCBUS_PAYLOAD_CODEC=package.module:factory, the "
                "factory of your temporalio PayloadCodec"
            )
        found = found.__cause__ or found.__context__
    return None
