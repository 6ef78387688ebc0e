"""The checkers of how the procedures ended: every one ended, none ran past its deadline
unnoticed, and the user's procedure left its note exactly when it succeeded."""

from __future__ import annotations

import collections
import json
from datetime import datetime
from typing import Any

from procbus.testing.nemesis.checkers._history import commands_of, ends_of

# What a procedure may end as after the final heal; STUCK only with its reason.
ENDED = {"SUCCEEDED", "ROLLED_BACK", "STUCK"}
# A deadline is a timer in the workflow: under a fault (Temporal restarting, the workflow's
# worker cut off) it is handled late. A procedure that ended later than this past its deadline,
# and never said a word of it, ran past its deadline unnoticed.
DEADLINE_GRACE_SECONDS = 30.0


def check_procedures(outcomes: dict[str, dict[str, Any]]) -> list[str]:
    """Every procedure ended SUCCEEDED, ROLLED_BACK, or STUCK with its reason."""
    violations = []
    for procedure_id, status in sorted(outcomes.items()):
        state = status.get("state")
        if state not in ENDED:
            violations.append(f"{procedure_id} did not end: {state}")
        elif state == "STUCK" and not status.get("stuck_error"):
            violations.append(f"{procedure_id} is STUCK without a reason")
    return violations


def check_deadlines(
    history: list[dict[str, Any]], outcomes: dict[str, dict[str, Any]]
) -> list[str]:
    """No procedure ran past its deadline unnoticed: one that ended SUCCEEDED more than the
    grace after its deadline must have passed its pivot first (its status then records the
    deadline's rollback as refused). A rollback for another reason may have begun before the
    deadline, so it is not counted; one that never ended is the procedures checker's."""
    deadlines = {
        recorded["procedure_id"]: recorded["deadline_seconds"]
        for recorded in history
        if recorded["event"] in ("started", "not_started") and recorded.get("deadline_seconds")
    }
    violations = []
    for procedure_id, deadline in sorted(deadlines.items()):
        status = outcomes.get(procedure_id, {})
        if status.get("state") != "SUCCEEDED" or not status.get("closed_at"):
            continue
        ran = (
            datetime.fromisoformat(status["closed_at"])
            - datetime.fromisoformat(status["started_at"])
        ).total_seconds()
        noticed = any("its deadline passed" in refusal for refusal in status.get("refused", []))
        if ran > deadline + DEADLINE_GRACE_SECONDS and not noticed:
            violations.append(
                f"{procedure_id} SUCCEEDED {ran:.1f} s after its start, past its deadline of "
                f"{deadline:g} s, and its status says nothing of the deadline"
            )
    return violations


def check_notes(history: list[dict[str, Any]], end: dict[str, Any]) -> list[str]:
    """The user's procedure left its note exactly when it succeeded: one line keyed by its step
    in its table's notes for each that SUCCEEDED, none for one ROLLED_BACK (its undo took it
    away), and no line of a procedure the workload never started."""
    refreshes = commands_of(history, "temporal")
    ends = ends_of(history)
    written = collections.Counter(
        (table, line.split(" ")[0])
        for table, lines in end.get("notes", {}).items()
        for line in lines
    )
    violations = []
    for procedure_id, argv in sorted(refreshes.items()):
        table = json.loads(argv[argv.index("--input") + 1])["table"]
        state, lines = (
            ends.get(procedure_id, {}).get("state"),
            written[(table, f"{procedure_id}/note")],
        )
        if state == "SUCCEEDED" and lines != 1:
            violations.append(
                f"{procedure_id} SUCCEEDED, and its note is in {table}'s notes {lines} times"
            )
        elif state == "ROLLED_BACK" and lines:
            violations.append(
                f"{procedure_id} was ROLLED_BACK, and its note is still in {table}'s notes"
            )
    known = {
        (json.loads(argv[argv.index("--input") + 1])["table"], f"{pid}/note")
        for pid, argv in refreshes.items()
    }
    for table, key in sorted(set(written) - known):
        violations.append(f"{table}'s notes hold {key}, of no procedure the workload started")
    return violations
