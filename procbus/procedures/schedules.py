"""Procedures on Temporal Schedules: what `procbus schedule create` (and the demo) create.

A scheduled run is an ordinary procedure: its search attributes are set from the start, so
`procbus proc list` finds it; a run is skipped while the previous one runs; a failed run pauses
the schedule until a person unpauses it.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from pydantic import BaseModel
from temporalio.api.common.v1 import Payload
from temporalio.client import (
    Schedule,
    ScheduleActionStartWorkflow,
    ScheduleIntervalSpec,
    ScheduleOverlapPolicy,
    SchedulePolicy,
    ScheduleSpec,
    ScheduleState,
)
from temporalio.common import SearchAttributePair, TypedSearchAttributes

from procbus.core import PROCEDURE_TARGET, PROCEDURE_TYPE

DEFAULT_CATCHUP_WINDOW = timedelta(minutes=10)


def procedure_schedule(
    procedure_type: str,
    request: BaseModel | dict[str, Any],
    *,
    target: str,
    workflow_id: str,
    task_queue: str,
    every: timedelta | None = None,
    cron: str | None = None,
    catchup_window: timedelta = DEFAULT_CATCHUP_WINDOW,
    paused: bool = False,
    note: str | None = None,
    headers: Mapping[str, Payload] | None = None,
) -> Schedule:
    """Return a schedule that starts `procedure_type` every `every` or at `cron`.

    Args:
        procedure_type: the procedure's workflow type.
        request: its input model, or the JSON object of a procedure the caller has no model for.
        target: what the procedure acts on, as its search attribute names it.
        workflow_id: the base of each run's workflow ID (Temporal appends the scheduled time).
        task_queue: where the workers poll.
        every: the interval; give it or `cron`.
        cron: a cron expression; give it or `every`.
        catchup_window: how late a missed run may still start.
        paused: create the schedule paused.
        note: the schedule's note, shown beside its state.
        headers: the schedule's principal token (Signer.schedule_headers), if it is signed.

    Raises:
        ValueError: when neither or both of `every` and `cron` are given.
    """
    if (every is None) == (cron is None):
        raise ValueError("give either every or cron")
    spec = (
        ScheduleSpec(intervals=[ScheduleIntervalSpec(every=every)])
        if every is not None
        else ScheduleSpec(cron_expressions=[str(cron)])
    )
    action = ScheduleActionStartWorkflow(
        procedure_type,
        request,
        id=workflow_id,  # Temporal appends each run's scheduled time
        task_queue=task_queue,
        typed_search_attributes=TypedSearchAttributes(
            [
                SearchAttributePair(PROCEDURE_TYPE, procedure_type),
                SearchAttributePair(PROCEDURE_TARGET, target),
            ]
        ),
        static_summary=f"{procedure_type} {target}",
    )
    action.headers = headers  # not in the constructor's typed overloads
    return Schedule(
        action=action,
        spec=spec,
        policy=SchedulePolicy(
            overlap=ScheduleOverlapPolicy.SKIP,
            catchup_window=catchup_window,
            pause_on_failure=True,
        ),
        state=ScheduleState(paused=paused, note=note),
    )
