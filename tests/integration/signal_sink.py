"""A workflow that collects the signals it gets, for the outbox tests."""

from __future__ import annotations

from pydantic import BaseModel
from temporalio import workflow


class Note(BaseModel):
    text: str


@workflow.defn(name="SignalSink")
class SignalSink:
    def __init__(self) -> None:
        self.notes: list[str] = []
        self.done = False

    @workflow.run
    async def run(self, note: Note) -> list[str]:
        await workflow.wait_condition(lambda: self.done)
        return self.notes

    @workflow.signal(name="note")
    def note(self, note: Note) -> None:
        self.notes.append(note.text)

    @workflow.signal(name="finish")
    def finish(self) -> None:
        self.done = True

    @workflow.query(name="notes")
    def get_notes(self) -> list[str]:
        return self.notes
