"""The worker's side of principals: the `authenticate` local activity verifies a start's token
with this worker's key (which never enters the workflow's history or input), and claims the
token's one use."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import asyncpg
from temporalio import activity
from temporalio.client import ScheduleActionStartWorkflow
from temporalio.service import RPCError, RPCStatusCode

from procbus.auth import TOKEN_HEADER, TokenUses, WorkerAuth, signature_of
from procbus.core import Authentication, AuthRequest


async def schedule_refusal(schedule_id: str | None, mac: str) -> str | None:
    """Why a schedule's token may not start this run, or None: it starts runs only while the
    schedule it names exists and carries it, so deleting the schedule ends it (anyone who could
    describe the schedule may have copied it; the run's schedule ID it names may be set by any
    start, which then runs only as a trigger of that existing schedule would)."""
    if not schedule_id:
        return (
            "the principal token is a schedule's, and this run names no schedule "
            "(TemporalScheduledById): a schedule's token starts only its schedule's runs"
        )
    try:
        description = await activity.client().get_schedule_handle(schedule_id).describe()
    except RPCError as error:
        if error.status is RPCStatusCode.NOT_FOUND:
            return (
                f"the principal token is schedule {schedule_id!r}'s, which does not exist (it "
                "was deleted): its token starts nothing more"
            )
        raise
    action = description.schedule.action
    header = (
        action.headers.get(TOKEN_HEADER)
        if isinstance(action, ScheduleActionStartWorkflow) and action.headers
        else None
    )
    if header is None or signature_of(header.data.decode("utf-8", "replace")) != mac:
        return (
            f"the principal token is not the one schedule {schedule_id!r} carries: a schedule's "
            "token starts only its own schedule's runs"
        )
    return None


class AuthActivities:
    def __init__(self, auth: WorkerAuth, pool: asyncpg.Pool) -> None:
        self.auth = auth
        self.uses = TokenUses(pool)

    @activity.defn(name="authenticate")
    async def authenticate(self, request: AuthRequest) -> Authentication:
        found, verified = self.auth.authenticate(request)
        if verified is None:
            return found  # no token, or refused
        if verified.expires_at is None:  # a schedule's: used by each of its runs
            refusal = await schedule_refusal(request.scheduled_by, verified.mac)
            if refusal is not None:
                return Authentication(principal=None, method="none", refusal=refusal)
            return found
        late = datetime.now(UTC) - verified.expires_at
        if late.total_seconds() > self.auth.late_seconds:
            return Authentication(
                principal=None,
                method="none",
                refusal=f"the start was accepted before its principal token expired, but is "
                f"verified {late} after that, later than this worker remembers a token's one "
                f"use ({timedelta(seconds=self.auth.late_seconds)}, "
                "PROCBUS_AUTH_TOKEN_LATE_SECONDS): sign a new start",
            )
        run_id = request.run_id or ""
        first = await self.uses.first_run(
            verified.mac, request.workflow_id, run_id, verified.expires_at, self.auth.late_seconds
        )
        if first != run_id:
            return Authentication(
                principal=None,
                method="none",
                refusal=f"the principal token was used already, by run {first} of "
                f"{request.workflow_id!r}: a token starts one run (sign a new start)",
            )
        return found

    def all(self) -> list[Callable[..., object]]:
        return [self.authenticate]
