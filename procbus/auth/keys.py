"""Where the signing key lives: PROCBUS_AUTH_KEY, or the dev stack's own in its state folder."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

DEV_KEY_FILE = "auth.key"
# Who the dev stack's CLI signs as, and runs unauthenticated starts as: the dev operator.
DEV_PRINCIPAL = "dev"


def ensure_dev_key(state_dir: Path) -> bytes:
    """Return the dev stack's key, made once (mode 0600: only its owner may sign)."""
    path = state_dir / DEV_KEY_FILE
    state_dir.mkdir(parents=True, exist_ok=True)
    try:
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return path.read_bytes().strip()
    with os.fdopen(descriptor, "w") as file:
        file.write(secrets.token_hex(32))
    return path.read_bytes().strip()


def client_key(auth_key: bytes | None, state_dir: Path) -> tuple[bytes, bool] | None:
    """Return the key a client signs with, and whether it is the dev stack's.

    PROCBUS_AUTH_KEY when set, else the dev stack's in `state_dir`; None: none to sign with.
    """
    if auth_key is not None:
        return auth_key, False
    path = state_dir / DEV_KEY_FILE
    if path.is_file():
        return path.read_bytes().strip(), True
    return None
