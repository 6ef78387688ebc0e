"""Who starts a procedure: principals signed into a Temporal header by the client (HMAC over the
principal, the workflow ID and type, and an expiry: `tokens`) and verified on the worker,
replay-safe, in a local activity whose answer is recorded (`policy`; the request and the answer
are procbus.core.authentication, which the procedure engine's own models hold). `keys`: where
the signing key lives; `uses`: a token's one use. See docs/security.md.

The names below load on first use, so each command pays only for what it uses.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from procbus.auth.keys import DEV_PRINCIPAL as DEV_PRINCIPAL
    from procbus.auth.keys import client_key as client_key
    from procbus.auth.keys import ensure_dev_key as ensure_dev_key
    from procbus.auth.policy import WorkerAuth as WorkerAuth
    from procbus.auth.tokens import TOKEN_HEADER as TOKEN_HEADER
    from procbus.auth.tokens import input_digest as input_digest
    from procbus.auth.tokens import sign as sign
    from procbus.auth.tokens import sign_schedule as sign_schedule
    from procbus.auth.tokens import signature_of as signature_of
    from procbus.auth.uses import TokenUses as TokenUses

# Public name -> the module that defines it.
_MODULE_OF = {
    "DEV_PRINCIPAL": "procbus.auth.keys",
    "client_key": "procbus.auth.keys",
    "ensure_dev_key": "procbus.auth.keys",
    "WorkerAuth": "procbus.auth.policy",
    "TOKEN_HEADER": "procbus.auth.tokens",
    "input_digest": "procbus.auth.tokens",
    "sign": "procbus.auth.tokens",
    "sign_schedule": "procbus.auth.tokens",
    "signature_of": "procbus.auth.tokens",
    "TokenUses": "procbus.auth.uses",
}

__all__ = [
    "DEV_PRINCIPAL",
    "TOKEN_HEADER",
    "TokenUses",
    "WorkerAuth",
    "client_key",
    "ensure_dev_key",
    "input_digest",
    "sign",
    "sign_schedule",
    "signature_of",
]


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
