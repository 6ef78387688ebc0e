"""A procedure of your own: give a user read access to a table, all or nothing."""

from __future__ import annotations

from pydantic import BaseModel
from temporalio import activity, workflow

from procbus import Procedure, ProcedureInput, invalid_input, step_key


class GrantAccessInput(ProcedureInput):
    user: str
    table: str


class Grant(BaseModel):
    user: str
    table: str


class AccessActivities:
    """Your systems go here; this one keeps accounts and grants in memory."""

    def __init__(self) -> None:
        self.accounts: dict[str, str] = {}  # user -> the step that created it
        self.grants: set[tuple[str, str]] = set()

    @activity.defn(name="create_account")
    async def create_account(self, grant: Grant) -> None:
        self.accounts.setdefault(grant.user, step_key())  # idempotent: a retry changes nothing

    @activity.defn(name="delete_account")
    async def delete_account(self, grant: Grant) -> None:
        if self.accounts.get(grant.user) == step_key():
            del self.accounts[grant.user]  # only the account this procedure created

    @activity.defn(name="grant_read")
    async def grant_read(self, grant: Grant) -> None:
        self.grants.add((grant.user, grant.table))

    @activity.defn(name="revoke_read")
    async def revoke_read(self, grant: Grant) -> None:
        self.grants.discard((grant.user, grant.table))


@workflow.defn(name="GrantAccess")
class GrantAccess(Procedure[GrantAccessInput, Grant]):
    @workflow.run
    async def run(self, request: GrantAccessInput) -> Grant:
        return await self.execute(request)

    def target(self, request: GrantAccessInput) -> str:
        return request.table

    def validate(self, request: GrantAccessInput) -> None:
        if not request.user:
            raise invalid_input("user is empty")

    async def steps(self, request: GrantAccessInput) -> Grant:
        grant = Grant(user=request.user, table=request.table)
        await self.step(
            "create_account",
            AccessActivities.create_account,
            grant,
            undo=AccessActivities.delete_account,
        )
        await self.step(
            "grant_read", AccessActivities.grant_read, grant, undo=AccessActivities.revoke_read
        )
        return grant
