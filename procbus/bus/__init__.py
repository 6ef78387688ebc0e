"""The notification bus: operations that must reach every worker (HBase notification bus).

Each worker process is a member with its own task queue, registered in PostgreSQL with a
heartbeat (`membership`). A coordinator, the state of a Temporal workflow, sends an operation
to every live member and waits for all: one phase (apply) or two (prepare, then commit or
abort). Members keep no durable state: they rebuild their caches from the catalog at start.

The names below load on first use, so each command pays only for what it uses.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from procbus.bus.member import BusMember as BusMember
    from procbus.bus.membership import MemberLease as MemberLease
    from procbus.bus.membership import Membership as Membership
    from procbus.bus.membership import default_member_id as default_member_id
    from procbus.bus.membership import member_task_queue as member_task_queue
    from procbus.bus.models import BroadcastInput as BroadcastInput
    from procbus.bus.models import BusMessage as BusMessage
    from procbus.bus.models import ChangeAccessOperation as ChangeAccessOperation
    from procbus.bus.models import EvictDescriptor as EvictDescriptor
    from procbus.bus.models import ListMembers as ListMembers
    from procbus.bus.models import Member as Member
    from procbus.bus.models import MemberList as MemberList
    from procbus.bus.models import MemberReply as MemberReply
    from procbus.bus.models import Operation as Operation
    from procbus.bus.models import PutDescriptor as PutDescriptor
    from procbus.bus.models import ReportState as ReportState
    from procbus.bus.models import ResetNamespaceGrants as ResetNamespaceGrants

# Public name -> the module that defines it.
_MODULE_OF = {
    "BusMember": "procbus.bus.member",
    "MemberLease": "procbus.bus.membership",
    "Membership": "procbus.bus.membership",
    "default_member_id": "procbus.bus.membership",
    "member_task_queue": "procbus.bus.membership",
    "BroadcastInput": "procbus.bus.models",
    "BusMessage": "procbus.bus.models",
    "ChangeAccessOperation": "procbus.bus.models",
    "EvictDescriptor": "procbus.bus.models",
    "ListMembers": "procbus.bus.models",
    "Member": "procbus.bus.models",
    "MemberList": "procbus.bus.models",
    "MemberReply": "procbus.bus.models",
    "Operation": "procbus.bus.models",
    "PutDescriptor": "procbus.bus.models",
    "ReportState": "procbus.bus.models",
    "ResetNamespaceGrants": "procbus.bus.models",
}

__all__ = [
    "BroadcastInput",
    "BusMember",
    "BusMessage",
    "ChangeAccessOperation",
    "EvictDescriptor",
    "ListMembers",
    "Member",
    "MemberLease",
    "MemberList",
    "MemberReply",
    "Membership",
    "Operation",
    "PutDescriptor",
    "ReportState",
    "ResetNamespaceGrants",
    "default_member_id",
    "member_task_queue",
]


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
