"""The member's phases, without Temporal: idempotent per operation, abort undoes, a decided
operation stays decided."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from procbus.bus.member import BusMember
from procbus.bus.membership import MemberLease
from procbus.bus.models import (
    BusMessage,
    ChangeAccessOperation,
    EvictDescriptor,
    PutDescriptor,
    ReportState,
    ResetNamespaceGrants,
)
from procbus.errors import AccessDenied, InvalidRequest, MemberNotCurrent
from procbus.lakehouse.cache import AccessCache, DescriptorCache
from procbus.lakehouse.models import AccessEntry, Permission, TableDescriptor
from procbus.lakehouse.schemas import Column

ORDERS = TableDescriptor(
    namespace="sales", name="orders", columns=[Column(name="id", type="bigint")]
)
ETL_WRITE = AccessEntry(
    principal="etl", namespace="sales", table="orders", permission=Permission.WRITE
)


def member() -> BusMember:
    return BusMember("w1", DescriptorCache(), AccessCache())


def put(operation_id: str = "p/refresh_cache", new_table: bool = False) -> BusMessage:
    return BusMessage(
        operation_id=operation_id, operation=PutDescriptor(table=ORDERS, new_table=new_table)
    )


def access(action: str, operation_id: str = "p/stage") -> BusMessage:
    return BusMessage(
        operation_id=operation_id,
        operation=ChangeAccessOperation(action=action, entry=ETL_WRITE),  # type: ignore[arg-type]
    )


def test_a_resent_apply_changes_nothing_the_second_time() -> None:
    bus = member()
    assert bus.apply(put()).changed
    assert not bus.apply(put()).changed
    assert bus.tables.names() == ["sales.orders"]
    assert bus.applied == {"p/refresh_cache": 1}


def test_abort_undoes_a_one_phase_apply_and_a_late_resend_stays_refused() -> None:
    bus = member()
    bus.apply(put())
    assert bus.abort(put()).changed
    assert bus.tables.names() == []
    assert not bus.apply(put()).changed  # decided: aborted
    assert bus.tables.names() == []


def test_abort_puts_back_what_an_evict_took_out() -> None:
    bus = member()
    bus.tables.put(ORDERS)
    evict = BusMessage(
        operation_id="d/evict", operation=EvictDescriptor(qualified_name="sales.orders")
    )
    bus.apply(evict)
    assert bus.tables.names() == []
    bus.abort(evict)
    assert bus.tables.get("sales.orders") == ORDERS


def test_prepare_stages_and_commit_applies_once() -> None:
    bus = member()
    assert bus.prepare(access("grant")).changed
    assert not bus.access.allows(ETL_WRITE)  # staged only
    assert bus.report().staged == ["p/stage"]
    assert bus.commit(access("grant")).changed
    assert not bus.commit(access("grant")).changed
    assert bus.access.allows(ETL_WRITE)
    assert bus.report().staged == []
    assert bus.applied == {"p/stage": 1}


def test_a_restarted_member_learns_the_outcome_from_the_commit_alone() -> None:
    bus = member()  # never saw the prepare
    assert bus.commit(access("grant")).changed
    assert bus.access.allows(ETL_WRITE)


def test_an_aborted_prepare_is_not_committed_by_a_late_prepare() -> None:
    bus = member()
    bus.prepare(access("grant"))
    bus.abort(access("grant"))
    assert not bus.prepare(access("grant")).changed
    assert bus.report().staged == []
    assert not bus.access.allows(ETL_WRITE)


def test_a_new_table_drops_grants_left_from_an_earlier_table_of_that_name() -> None:
    bus = member()
    bus.access.grant(ETL_WRITE)
    bus.apply(put(new_table=True))
    assert not bus.access.allows(ETL_WRITE)
    bus.abort(put(new_table=True))
    assert bus.access.allows(ETL_WRITE)


def test_a_grant_on_the_namespace_allows_it_on_every_table_in_it() -> None:
    cache = AccessCache()
    cache.grant(ETL_WRITE.on_namespace())
    assert cache.allows(ETL_WRITE)
    assert cache.allows(ETL_WRITE.model_copy(update={"table": "later"}))
    assert not cache.allows(ETL_WRITE.model_copy(update={"namespace": "hr"}))
    assert not cache.allows(ETL_WRITE.model_copy(update={"permission": Permission.ADMIN}))
    cache.revoke(ETL_WRITE.on_namespace())
    assert not cache.allows(ETL_WRITE)


def test_a_new_namespace_drops_grants_left_from_an_earlier_one_and_abort_puts_them_back() -> None:
    bus = member()
    old, table_grant = ETL_WRITE.on_namespace(), ETL_WRITE
    creator = AccessEntry(
        principal="lead", namespace="sales", table="*", permission=Permission.ADMIN
    )
    bus.access.grant(old)
    bus.access.grant(table_grant)  # a table's own grants are not the namespace's
    reset = BusMessage(
        operation_id="n/refresh_cache",
        operation=ResetNamespaceGrants(namespace="sales", grants=[creator]),
    )
    bus.apply(reset)
    assert bus.access.entries() == [table_grant, creator]
    bus.abort(reset)
    assert bus.access.entries() == [old, table_grant]


def test_a_namespace_reset_holds_only_grants_on_that_namespace() -> None:
    with pytest.raises(ValueError, match="is not a grant on namespace 'sales'"):
        ResetNamespaceGrants(namespace="sales", grants=[ETL_WRITE])


def test_report_is_read_only() -> None:
    bus = member()
    bus.apply(put())
    reply = bus.apply(BusMessage(operation_id="r", operation=ReportState()))
    assert not reply.changed
    assert reply.report is not None
    assert reply.report.tables == ["sales.orders"]
    assert reply.report.applied == {"p/refresh_cache": 1}


PHASES = st.lists(
    st.tuples(st.sampled_from(["prepare", "commit", "abort"]), st.sampled_from(["a", "b"])),
    max_size=12,
)


@given(PHASES)
def test_any_order_of_resends_ends_as_the_first_decision_says(
    phases: list[tuple[str, str]],
) -> None:
    """Whatever arrives twice or late, an operation's first commit or abort decides it."""
    bus = member()
    decided: dict[str, str] = {}
    for phase, operation in phases:
        message = access("grant", operation_id=operation)
        if phase == "commit" and decided.get(operation) == "abort":
            with pytest.raises(InvalidRequest, match="was aborted"):
                bus.commit(message)
            continue
        getattr(bus, phase)(message)
        if phase in ("commit", "abort"):
            decided.setdefault(operation, phase)
    committed = [op for op, decision in decided.items() if decision == "commit"]
    assert bus.access.allows(ETL_WRITE) == bool(committed)
    assert all(bus.applied.get(op) == 1 for op in committed)
    assert all(op not in bus.applied for op, d in decided.items() if d == "abort")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def joined_member(clock: Clock) -> tuple[BusMember, MemberLease]:
    lease = MemberLease(4.0, clock)  # acts on a heartbeat for 3 s
    bus = BusMember("w1", DescriptorCache(), AccessCache(), lease)
    bus.access.grant(ETL_WRITE)
    lease.held(7, sent_at=clock.now)
    return bus, lease


def test_a_joined_member_serves_no_acl_check_before_it_read_the_catalog() -> None:
    bus, _ = joined_member(Clock())
    with pytest.raises(MemberNotCurrent, match="has not read its caches"):
        bus.access.require(ETL_WRITE)
    bus.stale = False  # what a rebuild ends with
    bus.access.require(ETL_WRITE)


def test_a_heartbeat_later_than_the_lease_is_a_lapse() -> None:
    clock = Clock()
    bus, lease = joined_member(clock)
    bus.stale = False
    clock.now += 2.0
    lease.renewed(sent_at=clock.now)  # on time
    assert lease.current and not lease.lapsed
    clock.now += 3.5  # stopped: past the lease, maybe dropped by the bus meanwhile
    with pytest.raises(MemberNotCurrent, match="lapsed or is overdue"):
        bus.access.require(ETL_WRITE)
    sent = clock.now
    clock.now += 0.1
    lease.renewed(sent_at=sent)
    assert lease.current and lease.lapsed  # renewed, but its caches must be read again


def test_a_member_taken_over_refuses_whatever_its_lease_says() -> None:
    bus, lease = joined_member(Clock())
    bus.stale = False
    lease.taken_over("pid 42 on h2")
    assert not lease.current
    with pytest.raises(MemberNotCurrent, match="taken over by pid 42 on h2"):
        bus.check_current()


def test_an_access_cache_without_a_member_answers_from_what_it_holds() -> None:
    cache = AccessCache()
    with pytest.raises(AccessDenied):
        cache.require(ETL_WRITE)
    cache.grant(ETL_WRITE)
    cache.require(ETL_WRITE)
