"""Names and their rules, checked before any side effect.

A bus member's ID: one rule for the setting (PROCBUS_WORKER_ID) and the membership table.
"""

from __future__ import annotations

import re

_MEMBER_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,99}$")


def check_member_id(member_id: str) -> str:
    """The ID as given, or ValueError saying what a worker ID may hold (no '@': it separates
    the member in a bus activity's ID)."""
    if not _MEMBER_ID.match(member_id):
        raise ValueError(
            f"bad worker ID {member_id!r}: use letters, digits, '_', '.', '-' (at most 100), "
            "starting with a letter or digit"
        )
    return member_id
