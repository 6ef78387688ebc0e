"""Activities of the notification bus: the four phases, run by a member on its own task
queue, and the membership list the coordinator reads. Thin adapters to procbus.bus."""

from __future__ import annotations

from collections.abc import Callable

from temporalio import activity

from procbus.bus import BusMember, BusMessage, ListMembers, MemberList, MemberReply, Membership


class MemberActivities:
    """Registered only on the member's own task queue: a message sent there reaches this
    worker process and no other. Each phase waits until the member may serve (its caches
    rebuilt after a lapsed heartbeat); a process whose ID was taken over refuses it
    (MemberNotCurrent: the coordinator sends it again, to the process that holds the ID)."""

    def __init__(self, member: BusMember) -> None:
        self.member = member

    @activity.defn(name="bus_apply")
    async def apply(self, message: BusMessage) -> MemberReply:
        await self.member.serving()
        return self.member.apply(message)

    @activity.defn(name="bus_prepare")
    async def prepare(self, message: BusMessage) -> MemberReply:
        await self.member.serving()
        return self.member.prepare(message)

    @activity.defn(name="bus_commit")
    async def commit(self, message: BusMessage) -> MemberReply:
        await self.member.serving()
        return self.member.commit(message)

    @activity.defn(name="bus_abort")
    async def abort(self, message: BusMessage) -> MemberReply:
        await self.member.serving()
        return self.member.abort(message)

    def all(self) -> list[Callable[..., object]]:
        return [self.apply, self.prepare, self.commit, self.abort]


class BusActivities:
    def __init__(self, membership: Membership) -> None:
        self.membership = membership

    @activity.defn(name="list_bus_members")
    async def list_members(self, request: ListMembers) -> MemberList:
        return MemberList(members=await self.membership.members())

    def all(self) -> list[Callable[..., object]]:
        return [self.list_members]
