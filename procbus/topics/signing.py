"""Standard Webhooks signing secrets of a topic: made, checked."""

from __future__ import annotations

import base64
import secrets

from procbus.errors import InvalidRequest

SECRET_PREFIX = "whsec_"
SECRET_BYTES = 32


def new_secret() -> str:
    """A Standard Webhooks signing secret: whsec_ and 32 random bytes in base64."""
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(SECRET_BYTES)).decode()


def check_secret(secret: str) -> str:
    if not secret.startswith(SECRET_PREFIX):
        raise InvalidRequest(f"a signing secret starts with {SECRET_PREFIX!r}")
    try:
        key = base64.b64decode(secret.removeprefix(SECRET_PREFIX), validate=True)
    except ValueError:
        raise InvalidRequest("the signing secret after whsec_ is not base64") from None
    if not 24 <= len(key) <= 64:
        raise InvalidRequest(f"a signing secret holds 24 to 64 bytes, this one {len(key)}")
    return secret
