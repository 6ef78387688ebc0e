"""Fixtures of the topic tests: a real HTTP receiver on 127.0.0.1, and topics on the test pool."""

from __future__ import annotations

from collections.abc import AsyncIterator

import asyncpg
import pytest

from procbus.topics import Topics
from tests.integration.webhook_receiver import WebhookReceiver

# The helpers' asserts explain their failures as the tests' own do.
pytest.register_assert_rewrite("tests.integration.principals_helpers")


@pytest.fixture
async def receiver() -> AsyncIterator[WebhookReceiver]:
    started = WebhookReceiver()
    await started.start()
    yield started
    await started.stop()


@pytest.fixture
def topics(pool: asyncpg.Pool) -> Topics:
    return Topics(pool)
