"""Activity IDs of steps and undos: every ID the engine makes parses back to what made it."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from procbus.core.faults import parse_faults
from procbus.core.ids import StepActivityId, lease_keeper_id, step_key_of
from procbus.temporal.faults import FaultInterceptor

step_names = st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_.\-]{0,30}", fullmatch=True)
# A child procedure ID is a workflow ID: any text, '/', '#' and ':' included.
child_ids = st.text(min_size=1, max_size=40)


@given(
    step=step_names,
    attempt=st.integers(min_value=1, max_value=10_000),
    child=st.none() | child_ids,
    undo=st.booleans(),
)
def test_every_id_round_trips(step: str, attempt: int, child: str | None, undo: bool) -> None:
    made = StepActivityId(step=step, undo=undo or child is not None, attempt=attempt, child=child)
    assert StepActivityId.parse(str(made)) == made


@pytest.mark.parametrize(
    ("activity_id", "parsed"),
    [
        ("create_layout", StepActivityId("create_layout")),
        ("create_layout#3", StepActivityId("create_layout", attempt=3)),
        ("undo:create_layout", StepActivityId("create_layout", undo=True)),
        ("undo:create_layout#2", StepActivityId("create_layout", undo=True, attempt=2)),
        (
            "undo:CreateTable-sales.t-1/add_row",
            StepActivityId("add_row", undo=True, child="CreateTable-sales.t-1"),
        ),
        ("undo:a/b#7/write#2", StepActivityId("write", undo=True, attempt=2, child="a/b#7")),
    ],
)
def test_the_documented_forms(activity_id: str, parsed: StepActivityId) -> None:
    assert StepActivityId.parse(activity_id) == parsed
    assert str(parsed) == activity_id


def test_the_step_key_is_the_same_for_an_action_its_retries_and_its_undo() -> None:
    keys = {
        step_key_of(activity_id, "Ledger-1")
        for activity_id in ("write_a", "write_a#4", "undo:write_a", "undo:write_a#2")
    }
    assert keys == {"Ledger-1/write_a"}
    # A finished child's step, undone by its parent, keeps the child's key.
    assert step_key_of("undo:Ledger-1-child/write_a", "Ledger-1") == "Ledger-1-child/write_a"


@pytest.mark.parametrize("bad", ["", "a/b", "a#b", "undo:x:y", "-x", "a b", "hold_locks:1.1"])
def test_ids_that_no_step_has_are_refused(bad: str) -> None:
    with pytest.raises(ValueError):
        StepActivityId.parse(bad)


def test_faults_find_a_childs_undo_and_ignore_other_activities() -> None:
    faults = FaultInterceptor(parse_faults("Ledger.write_a.undo:fail_before"))
    assert faults.matching("Ledger", "undo:Ledger-1-child/write_a#2")
    assert not faults.matching("Ledger", "write_a")
    assert not faults.matching("Ledger", lease_keeper_id(1, 1))
