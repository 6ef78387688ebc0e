"""Fault rules for tests and drills: PROCBUS_FAULTS makes named steps fail or wait.

    PROCBUS_FAULTS="CreateTable.add_to_catalog:fail_after,CreateTable.create_layout:delay=5"

Each rule is `<ProcedureType>.<step>[.undo]:<fault>` with the fault one of
- `fail_before[=N]`: fail before the action runs (the first N times; always without N),
- `fail_after[=N]`: run the action, then fail as if the worker died before reporting,
- `delay=S`: wait S seconds before the action,
- `delay_first=S`: the same on the first attempt only (a resend or retry is not delayed).
`.undo` targets the step's compensation instead of its action. A broadcast step's phase on
the members of this process is `<step>.apply|prepare|commit|abort`, e.g.
`ChangeAccess.stage_on_workers.prepare:fail_before` or `CreateTable.refresh_cache.apply:delay=8`.
Off unless set. The rules are parsed here (pure, so the settings can check them); the worker
interceptor that applies them is procbus.temporal.faults.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

_RULE = re.compile(
    r"^(?P<procedure>[A-Za-z_][A-Za-z0-9_]*)\."
    r"(?P<step>[A-Za-z_][A-Za-z0-9_]*(\.(apply|prepare|commit|abort))?)(?P<undo>\.undo)?"
    r":(?P<kind>fail_before|fail_after|delay_first|delay)(=(?P<value>[0-9]+(\.[0-9]+)?))?$"
)


class FaultKind(StrEnum):
    """What an injected fault does to the action it matches."""

    FAIL_BEFORE = "fail_before"  # the action never runs
    FAIL_AFTER = "fail_after"  # the action ran, its result is lost
    DELAY = "delay"  # the action starts late
    DELAY_FIRST = "delay_first"  # its first attempt starts late, the next ones on time


@dataclass(frozen=True)
class Fault:
    procedure: str
    step: str
    undo: bool
    kind: FaultKind
    times: int | None = None  # fail only this many times; None: always
    seconds: float = 0.0


def parse_faults(text: str | None) -> list[Fault]:
    """Parse fault rules in the PROCBUS_FAULTS syntax.

    Args:
        text: comma-separated `<Procedure>.<step>[.undo]:<kind>[=<value>]` rules; None or
            empty: no faults.

    Raises:
        ValueError: naming the bad rule.
    """
    faults = []
    for rule in (text or "").split(","):
        rule = rule.strip()
        if not rule:
            continue
        match = _RULE.fullmatch(rule)
        if match is None:
            raise ValueError(
                f"bad fault rule {rule!r}: expected <Procedure>.<step>[.undo]:"
                "fail_before[=N]|fail_after[=N]|delay=SECONDS|delay_first=SECONDS"
            )
        kind = FaultKind(match["kind"])
        value = match["value"]
        if kind in (FaultKind.DELAY, FaultKind.DELAY_FIRST):
            if value is None:
                raise ValueError(f"bad fault rule {rule!r}: delay needs seconds, e.g. delay=5")
            faults.append(
                Fault(
                    match["procedure"],
                    match["step"],
                    bool(match["undo"]),
                    kind,
                    seconds=float(value),
                )
            )
        else:
            if value is not None and not value.isdigit():
                raise ValueError(f"bad fault rule {rule!r}: a count must be a whole number")
            faults.append(
                Fault(
                    match["procedure"],
                    match["step"],
                    bool(match["undo"]),
                    kind,
                    times=int(value) if value else None,
                )
            )
    return faults
