from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from procbus.core.fences import LockMode
from procbus.locks.modes import (
    LockError,
    LockRequest,
    canonical_key,
    compatible,
    expand,
    lock_sets_conflict,
    parse_mode,
    parse_path,
    stronger,
)

MODES = list(LockMode)
PATHS = st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=3).map("/".join)


def test_the_compatibility_matrix_is_grays() -> None:
    allowed = {(held, wanted) for held in MODES for wanted in MODES if compatible(held, wanted)}
    assert allowed == {
        ("IS", "IS"),
        ("IS", "IX"),
        ("IS", "S"),
        ("IS", "SIX"),
        ("IX", "IS"),
        ("IX", "IX"),
        ("S", "IS"),
        ("S", "S"),
        ("SIX", "IS"),
    }


@given(st.sampled_from(MODES), st.sampled_from(MODES))
def test_compatibility_is_symmetric(first: LockMode, second: LockMode) -> None:
    assert compatible(first, second) == compatible(second, first)


@given(st.sampled_from(MODES), st.sampled_from(MODES))
def test_stronger_conflicts_with_everything_either_conflicts_with(
    first: LockMode, second: LockMode
) -> None:
    merged = stronger(first, second)
    for other in MODES:
        if not compatible(first, other) or not compatible(second, other):
            assert not compatible(merged, other)
    assert stronger(LockMode.IX, LockMode.S) is LockMode.SIX


def test_a_table_read_and_a_partition_write_conflict() -> None:
    read_table = expand([("sales/orders", "S")])
    write_partition = expand([("sales/orders/dt=2026-11-22", "X")])
    write_other_table = expand([("sales/returns", "X")])
    assert read_table == [
        LockRequest("sales", LockMode.IS),
        LockRequest("sales/orders", LockMode.S),
    ]
    assert [r.mode for r in write_partition] == [LockMode.IX, LockMode.IX, LockMode.X]
    assert lock_sets_conflict(read_table, write_partition)
    assert not lock_sets_conflict(read_table, write_other_table)
    assert not lock_sets_conflict(write_partition, write_other_table)


def overlap(first: str, second: str) -> bool:
    a, b = first.split("/"), second.split("/")
    return a[: len(b)] == b or b[: len(a)] == a


@given(
    st.lists(st.tuples(PATHS, st.sampled_from(["S", "X"])), min_size=1, max_size=4),
    st.lists(st.tuples(PATHS, st.sampled_from(["S", "X"])), min_size=1, max_size=4),
)
def test_expanded_sets_conflict_exactly_when_a_write_overlaps(
    first: list[tuple[str, str]], second: list[tuple[str, str]]
) -> None:
    expected = any(overlap(p1, p2) and "X" in (m1, m2) for p1, m1 in first for p2, m2 in second)
    assert lock_sets_conflict(expand(first), expand(second)) == expected


@given(st.lists(st.tuples(PATHS, st.sampled_from(MODES)), min_size=1, max_size=6))
def test_expansion_is_canonical_merged_and_stable(requests: list[tuple[str, LockMode]]) -> None:
    expanded = expand(requests)
    assert expanded == sorted(expanded, key=canonical_key)
    assert len({r.path for r in expanded}) == len(expanded)
    assert expand((r.path, r.mode) for r in expanded) == expanded
    assert expand(reversed(requests)) == expanded  # the order of declaration does not matter
    for path, mode in requests:
        granted = next(r.mode for r in expanded if r.path == path)
        assert stronger(granted, mode) is granted


@pytest.mark.parametrize(
    ("path", "says"),
    [
        ("", "empty"),
        ("sales//orders", "empty segment"),
        ("sales/../etc", "bad segment"),
        ("sales/or ders", "bad segment"),
        ("/".join(["a"] * 9), "levels deep"),
        ("a" * 513, "at most 512"),
    ],
)
def test_bad_paths_are_refused(path: str, says: str) -> None:
    with pytest.raises(LockError, match=says):
        parse_path(path)


def test_unknown_modes_are_refused() -> None:
    with pytest.raises(LockError, match="unknown lock mode 'W'"):
        parse_mode("W")
    assert parse_mode("six") is LockMode.SIX
