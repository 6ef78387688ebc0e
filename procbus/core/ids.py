"""The activity IDs of procedure steps and undos: formatted and parsed here, and only here.

    create_layout            a step's action
    create_layout#3          its third roll-forward attempt (past the pivot)
    undo:create_layout       its undo
    undo:create_layout#2     its undo, run again after an operator's `retry`
    undo:CHILD-ID/add_row    the undo of a finished child's step, run by the parent
    refresh_cache.apply#2@w1 the second send of a broadcast step's phase to bus member w1

A step name is one segment (no '/', '#' or ':'), so an ID parses back to what made it whatever
the child procedure ID holds. Pure: safe in the workflow sandbox.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

UNDO_PREFIX = "undo:"
_STEP_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$")
MAX_STEP_NAME_LENGTH = 200


def check_step_name(name: str) -> str:
    """Return `name` once checked as a step's name.

    Args:
        name: the step's name, as a procedure gives it.

    Raises:
        ValueError: when the name has characters or a length a step name may not have.
    """
    if not _STEP_NAME.fullmatch(name) or len(name) > MAX_STEP_NAME_LENGTH:
        raise ValueError(
            f"bad step name {name!r}: use letters, digits, '_', '.', '-' (at most "
            f"{MAX_STEP_NAME_LENGTH}), starting with a letter, digit or '_'"
        )
    return name


@dataclass(frozen=True)
class StepActivityId:
    step: str
    undo: bool = False
    attempt: int = 1
    child: str | None = None  # the finished child procedure whose step a parent undoes

    def __post_init__(self) -> None:
        check_step_name(self.step)
        if self.attempt < 1:
            raise ValueError(f"attempts count from 1, got {self.attempt}")
        if self.child is not None and not self.undo:
            raise ValueError("only an undo runs a child's step in its parent")
        if self.child == "":
            raise ValueError("the child procedure ID is empty")

    @property
    def label(self) -> str:
        """How the status names it: the step, or CHILD-ID/step."""
        return self.step if self.child is None else f"{self.child}/{self.step}"

    def __str__(self) -> str:
        text = (UNDO_PREFIX if self.undo else "") + self.label
        return text if self.attempt == 1 else f"{text}#{self.attempt}"

    @classmethod
    def parse(cls, activity_id: str) -> StepActivityId:
        """The step behind an activity ID; ValueError for an ID no step has."""
        text = activity_id
        undo = text.startswith(UNDO_PREFIX)
        text = text.removeprefix(UNDO_PREFIX)
        attempt = 1
        rest, hash_mark, number = text.rpartition("#")
        if hash_mark and number.isdigit() and number == str(int(number)):
            text, attempt = rest, int(number)
        child: str | None = None
        if undo and "/" in text:
            child, _, text = text.rpartition("/")
        return cls(step=text, undo=undo, attempt=attempt, child=child)


MEMBER_MARK = "@"


def member_activity_id(step: StepActivityId, member_id: str) -> str:
    """Return a broadcast phase's activity ID as sent to one bus member (member IDs hold no '@')."""
    return f"{step}{MEMBER_MARK}{member_id}"


def step_of(activity_id: str) -> StepActivityId:
    """Return the step behind any activity ID of a procedure, a bus member's included."""
    return StepActivityId.parse(activity_id.partition(MEMBER_MARK)[0])


def step_key_of(activity_id: str, workflow_id: str) -> str:
    """Return procedure ID + step name: the same for a step's action, its retries and its undo."""
    parsed = StepActivityId.parse(activity_id)
    return f"{parsed.child or workflow_id}/{parsed.step}"


def lease_keeper_id(run: int, part: int) -> str:
    """Return the lease keeper's activity ID: one per procedure run and bounded part of it."""
    return f"hold_locks:{run}.{part}"
