"""procbus_stuck_procedures: the worker counts its namespace's STUCK procedures periodically."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, cast

from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from procbus.procedures import report_stuck


@dataclass
class Count:
    count: int


class FakeClient:
    def __init__(self, answers: list[int | None]) -> None:
        self.answers = answers
        self.queries: list[str] = []

    async def count_workflows(self, query: str) -> Count:
        self.queries.append(query)
        answer = self.answers.pop(0) if self.answers else 0
        if answer is None:
            raise RPCError("unavailable", RPCStatusCode.UNAVAILABLE, b"")
        return Count(answer)


class FakeGauge:
    def __init__(self) -> None:
        self.values: list[int] = []

    def set(self, value: int, *_: Any) -> None:
        self.values.append(value)


async def test_the_gauge_follows_the_count_and_keeps_its_value_while_temporal_is_away() -> None:
    client, gauge, stop = FakeClient([2, None, 3]), FakeGauge(), asyncio.Event()
    reporting = asyncio.create_task(
        report_stuck(cast(Client, client), cast(Any, gauge), stop, every_seconds=0.01)
    )
    while len(client.queries) < 3:
        await asyncio.sleep(0.01)
    stop.set()
    await asyncio.wait_for(reporting, 5)
    assert gauge.values[:2] == [2, 3]  # the failed count set nothing
    assert client.queries[0] == "ProcedureState = 'STUCK' AND ExecutionStatus = 'Running'"
