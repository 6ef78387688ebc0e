"""What the engine asks the worker's `authenticate` local activity, and its recorded answer.
Pure data: safe in the workflow sandbox."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field


class AuthRequest(BaseModel):
    """What a worker checks to authenticate a procedure's start."""

    token: str | None = Field(description="the start's procbus-principal header, if any")
    workflow_id: str
    run_id: str | None = Field(default=None, description="the run: a token starts only one")
    workflow_type: str
    started_at: datetime = Field(description="when the server started the run: expiry is by it")
    input_sha256: str | None = Field(
        default=None, description="the run's input_digest: a schedule's token must match it"
    )
    scheduled_by: str | None = Field(
        default=None,
        description="the schedule the run names as its starter (TemporalScheduledById): a "
        "schedule's token starts runs only while that schedule exists and carries it",
    )


class Authentication(BaseModel):
    """Who a procedure runs as, and how that was decided."""

    principal: str | None = Field(description="who the procedure runs as; None: nobody")
    method: Literal["token", "unauthenticated", "none"]
    operator: bool = Field(default=False, description="the operator: admin and write everywhere")
    refusal: str | None = Field(default=None, description="why the start is refused, if it is")
