"""The worker's side of principals: the `authenticate` local activity verifies a start's token
with this worker's key (which never enters the workflow's history or input), and claims the
token's one use."""

from __future__ import annotations

from collections.abc import Callable

import asyncpg
from temporalio import activity

from procbus.auth.policy import WorkerAuth
from procbus.auth.uses import TokenUses
from procbus.core.authentication import Authentication, AuthRequest


class AuthActivities:
    def __init__(self, auth: WorkerAuth, pool: asyncpg.Pool) -> None:
        self.auth = auth
        self.uses = TokenUses(pool)

    @activity.defn(name="authenticate")
    async def authenticate(self, request: AuthRequest) -> Authentication:
        found, verified = self.auth.authenticate(request)
        if verified is None or verified.expires_at is None:
            return found  # no token, refused, or a schedule's (used by each of its runs)
        run_id = request.run_id or ""
        first = await self.uses.first_run(
            verified.mac, request.workflow_id, run_id, verified.expires_at
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
