"""What a principal's name may be. Pure: imports nothing of procbus but its errors."""

from __future__ import annotations

import re

from procbus.errors import InvalidRequest

_PRINCIPAL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@:\-]{0,199}$")


def check_principal(principal: str) -> str:
    if not _PRINCIPAL.match(principal):
        raise InvalidRequest(
            f"bad principal {principal!r}: use letters, digits, '_', '.', '@', ':', '-'"
            " (at most 200), starting with a letter or digit"
        )
    return principal
