from __future__ import annotations

import pytest

from procbus.stack.addresses import mask_password


@pytest.mark.parametrize(
    ("url", "masked"),
    [
        ("postgresql://app:s3cret@db:5432/procbus", "postgresql://app:***@db:5432/procbus"),
        ("postgresql://app@db/procbus", "postgresql://app@db/procbus"),
        (
            "postgresql://app:p%40ss@db/procbus?sslmode=require",
            "postgresql://app:***@db/procbus?sslmode=require",
        ),
    ],
)
def test_passwords_are_masked(url: str, masked: str) -> None:
    assert mask_password(url) == masked
