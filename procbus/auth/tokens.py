"""Principal tokens: HMAC-SHA256 (the standard library's hmac: nothing to parse but JSON, no
algorithm choice an attacker could steer) over the principal, the workflow ID and type it is for,
and its expiry. A token names one workflow, so it cannot start another."""

from __future__ import annotations

import hashlib
import hmac
import json
from datetime import UTC, datetime

from procbus.auth.names import check_principal
from procbus.errors import AccessDenied

# The Temporal header that carries the token from the client to the workflow.
TOKEN_HEADER = "procbus-principal"
TOKEN_VERSION = 1


def _mac(key: bytes, principal: str, workflow_id: str, workflow_type: str, expires_at: int) -> str:
    # JSON of a list: no separator a workflow ID could contain makes two claims sign alike.
    message = json.dumps(
        [TOKEN_VERSION, principal, workflow_id, workflow_type, expires_at], separators=(",", ":")
    )
    return hmac.new(key, message.encode(), hashlib.sha256).hexdigest()


def sign(
    key: bytes, principal: str, workflow_id: str, workflow_type: str, expires_at: datetime
) -> str:
    """The token (JSON text) that says `principal` starts `workflow_id` of `workflow_type`."""
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


def verify(key: bytes, token: str, workflow_id: str, workflow_type: str, now: datetime) -> str:
    """The principal a token names, or AccessDenied saying why it is not accepted."""
    try:
        claims = json.loads(token)
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
    return principal
