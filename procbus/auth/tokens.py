"""Principal tokens: HMAC-SHA256 (the standard library's hmac: nothing to parse but JSON, no
algorithm choice an attacker could steer) over the principal, the workflow ID and type it is for,
and its expiry. A token names one workflow, so it cannot start another.

A schedule's token is kept by the Temporal server in the schedule's action, readable by whoever
may describe the schedule, and used for every run, so it names the runs' workflow ID base (each
run's ID is the base and its scheduled time) and the digest of the input: a copy can only start
what the schedule starts, as a trigger of the schedule would. It does not expire; the grants are
checked at every run, and deleting the schedule (or a new PROCBUS_AUTH_KEY) ends it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from procbus.core import check_principal
from procbus.errors import AccessDenied

# The Temporal header that carries the token from the client to the workflow.
TOKEN_HEADER = "procbus-principal"
TOKEN_VERSION = 1
# What Temporal appends to a schedule's workflow ID for each run: its scheduled time (RFC 3339).
_SCHEDULED_TIME = re.compile(r"-\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d+)?Z")


@dataclass(frozen=True)
class VerifiedToken:
    principal: str
    # A start's token: when it expires, and so how long its one use is remembered. None: a
    # schedule's, used by each of its runs (each its own workflow ID and the same input).
    expires_at: datetime | None
    # Its signature: the same for every copy of it, however its JSON is spaced or ordered.
    mac: str


def input_digest(fields: dict[str, Any]) -> str:
    """Return the SHA-256 of a procedure's input as canonical JSON.

    The same on the signing client and in the workflow (which dumps only the fields the start
    set, so fields added later keep it).
    """
    text = json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


def signature_of(token: str) -> str | None:
    """Return the MAC a token's JSON carries (None for text that is no token).

    What tells two copies of one token from two tokens, however their JSON is spaced.
    """
    try:
        claims = json.loads(token)
    except ValueError:
        return None
    mac = claims.get("mac") if isinstance(claims, dict) else None
    return mac if isinstance(mac, str) else None


def _mac(key: bytes, principal: str, workflow_id: str, workflow_type: str, expires_at: int) -> str:
    # JSON of a list: no separator a workflow ID could contain makes two claims sign alike.
    message = json.dumps(
        [TOKEN_VERSION, principal, workflow_id, workflow_type, expires_at], separators=(",", ":")
    )
    return hmac.new(key, message.encode(), hashlib.sha256).hexdigest()


def sign(
    key: bytes, principal: str, workflow_id: str, workflow_type: str, expires_at: datetime
) -> str:
    """Return the token (JSON text) that says `principal` starts `workflow_id` of `workflow_type`.

    Raises:
        InvalidRequest: when `principal` is no valid principal's name.
    """
    check_principal(principal)
    expires = int(expires_at.timestamp())
    return json.dumps(
        {
            "v": TOKEN_VERSION,
            "principal": principal,
            "workflow_id": workflow_id,
            "workflow_type": workflow_type,
            "expires_at": expires,
            "mac": _mac(key, principal, workflow_id, workflow_type, expires),
        }
    )


def _schedule_mac(
    key: bytes, principal: str, workflow_id_base: str, workflow_type: str, digest: str
) -> str:
    # "scheduled" and the list's length keep a schedule's message apart from a start's.
    message = json.dumps(
        [TOKEN_VERSION, "scheduled", principal, workflow_id_base, workflow_type, digest],
        separators=(",", ":"),
    )
    return hmac.new(key, message.encode(), hashlib.sha256).hexdigest()


def sign_schedule(
    key: bytes, principal: str, workflow_id_base: str, workflow_type: str, digest: str
) -> str:
    """Return the token a schedule's action carries.

    It says `principal` starts `workflow_type` runs named `workflow_id_base`-TIME with the
    input whose `input_digest` is `digest`.

    Raises:
        InvalidRequest: when `principal` is no valid principal's name.
    """
    check_principal(principal)
    return json.dumps(
        {
            "v": TOKEN_VERSION,
            "principal": principal,
            "scheduled": workflow_id_base,
            "workflow_type": workflow_type,
            "input_sha256": digest,
            "mac": _schedule_mac(key, principal, workflow_id_base, workflow_type, digest),
        }
    )


def _verify_scheduled(
    key: bytes, claims: dict[str, Any], workflow_id: str, workflow_type: str, digest: str | None
) -> VerifiedToken:
    principal, base, kind = claims["principal"], claims["scheduled"], claims["workflow_type"]
    signed_digest, mac = claims["input_sha256"], claims["mac"]
    if not (
        isinstance(principal, str)
        and isinstance(base, str)
        and isinstance(kind, str)
        and isinstance(signed_digest, str)
        and isinstance(mac, str)
    ):
        raise AccessDenied("the principal token is not a procbus token")
    expected = _schedule_mac(key, principal, base, kind, signed_digest)
    if not hmac.compare_digest(expected, mac):
        raise AccessDenied(
            "the schedule's principal token's signature does not match (forged, or signed with "
            "another PROCBUS_AUTH_KEY)"
        )
    run_time = workflow_id[len(base) :] if workflow_id.startswith(base) else ""
    if kind != workflow_type or _SCHEDULED_TIME.fullmatch(run_time) is None:
        raise AccessDenied(
            f"the principal token is for the runs of a schedule ({kind} {base!r}-TIME), not "
            f"for {workflow_type} {workflow_id!r}"
        )
    if digest is None or not hmac.compare_digest(signed_digest, digest):
        raise AccessDenied(
            "the schedule's principal token was signed for another input than this run's"
        )
    return VerifiedToken(principal, expires_at=None, mac=mac)


def verify(
    key: bytes,
    token: str,
    workflow_id: str,
    workflow_type: str,
    now: datetime,
    digest: str | None = None,
) -> VerifiedToken:
    """The principal a token names, or AccessDenied saying why it is not accepted. `digest`:
    the run's `input_digest`, which a schedule's token must match. That a start's token is used
    once is the worker's to check (procbus.auth.uses)."""
    try:
        claims = json.loads(token)
        if isinstance(claims, dict) and claims.get("v") == TOKEN_VERSION and "scheduled" in claims:
            return _verify_scheduled(key, claims, workflow_id, workflow_type, digest)
        principal = claims["principal"]
        expires = claims["expires_at"]
        mac = claims["mac"]
        if not (
            claims.get("v") == TOKEN_VERSION
            and isinstance(principal, str)
            and isinstance(claims["workflow_id"], str)
            and isinstance(claims["workflow_type"], str)
            and isinstance(expires, int)
            and isinstance(mac, str)
        ):
            raise ValueError("bad claims")
    except (ValueError, TypeError, KeyError):
        raise AccessDenied("the principal token is not a procbus token") from None
    expected = _mac(key, principal, claims["workflow_id"], claims["workflow_type"], expires)
    if not hmac.compare_digest(expected, mac):
        raise AccessDenied(
            "the principal token's signature does not match (forged, or signed with another "
            "PROCBUS_AUTH_KEY)"
        )
    if claims["workflow_id"] != workflow_id or claims["workflow_type"] != workflow_type:
        raise AccessDenied(
            f"the principal token is for {claims['workflow_type']} {claims['workflow_id']!r}, "
            f"not for {workflow_type} {workflow_id!r}"
        )
    if now.timestamp() > expires:
        when = datetime.fromtimestamp(expires, UTC).isoformat()
        raise AccessDenied(f"the principal token expired at {when}, before the start")
    return VerifiedToken(principal, expires_at=datetime.fromtimestamp(expires, UTC), mac=mac)
