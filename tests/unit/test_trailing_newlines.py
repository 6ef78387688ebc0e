"""A name is checked whole: Python's `$` also matches before a final newline, so `orders\n` got
through every check written with `re.match` (issue 64); each now refuses it with its reason."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from procbus.core.ids import check_step_name
from procbus.core.names import check_member_id, check_principal, parse_table_name, validate_name
from procbus.errors import InvalidRequest, LockError
from procbus.lakehouse.data import split_partition
from procbus.locks.modes import parse_path
from procbus.topics.models import check_topic_name

CHECKS: dict[str, tuple[Callable[[str], object], str]] = {
    "namespace": (lambda name: validate_name("namespace", name), "orders"),
    "table": (parse_table_name, "sales.orders"),
    "principal": (check_principal, "etl"),
    "member": (check_member_id, "w1"),
    "topic": (check_topic_name, "orders"),
    "step": (check_step_name, "add_to_catalog"),
    "lock path": (parse_path, "sales/orders"),
    "partition": (split_partition, "region=eu"),
}


@pytest.mark.parametrize("kind", CHECKS)
@pytest.mark.parametrize("end", ["\n", "\r\n", "\n\n"])
def test_a_name_with_a_trailing_newline_is_refused(kind: str, end: str) -> None:
    check, good = CHECKS[kind]
    check(good)  # the same name without it passes
    with pytest.raises((InvalidRequest, LockError, ValueError)):
        check(good + end)
