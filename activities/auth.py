"""The worker's side of principals: the `authenticate` local activity verifies a start's token
with this worker's key (which never enters the workflow's history or input)."""

from __future__ import annotations

from collections.abc import Callable

from temporalio import activity

from procbus.auth.models import Authentication, AuthRequest
from procbus.auth.policy import WorkerAuth


class AuthActivities:
    def __init__(self, auth: WorkerAuth) -> None:
        self.auth = auth

    @activity.defn(name="authenticate")
    async def authenticate(self, request: AuthRequest) -> Authentication:
        return self.auth.authenticate(request)

    def all(self) -> list[Callable[..., object]]:
        return [self.authenticate]
