"""Names and their rules, checked before any side effect (pure): principals, bus members, and the
lake's namespaces and tables with the lock resources they take.

Namespace, table and column names are lower-case identifiers that fit PostgreSQL and Spark SQL
alike. A worker ID is one rule for the setting (PROCBUS_WORKER_ID) and the membership table.
"""

from __future__ import annotations

import re

from procbus.errors import InvalidRequest

# Who a procedure runs as, and a worker on the bus.
_PRINCIPAL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.@:\-]{0,199}$")
_MEMBER_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,99}$")

# The lake's namespaces, tables and columns.
MAX_NAME_LENGTH = 63  # PostgreSQL's identifier limit, so names fit anywhere they are used
_NAME = re.compile(r"^[a-z_][a-z0-9_]*$")
# SQL and Spark SQL keywords that make confusing or unusable table and column names.
RESERVED_WORDS = frozenset(
    """all alter and any as asc between by case cast check column constraint create cross
    current_date current_time current_timestamp current_user default delete desc distinct drop
    else end except exists false fetch for foreign from full grant group having in inner insert
    intersect into is join lateral left like limit natural not null of offset on only or order
    outer partition primary references right select session_user some table then to true union
    unique update user using values when where window with""".split()  # noqa: SIM905
)
# The warehouse's folder a worker loads inputs from by default (WAREHOUSE/incoming): a
# namespace of that name would put its tables among them.
LOAD_FOLDER = "incoming"
# A grant's table that stands for every table of its namespace, now and later ('sales.*'): no
# table can be named so.
ALL_TABLES = "*"


def check_principal(principal: str) -> str:
    """Return `principal` once checked as a principal's name.

    Args:
        principal: who starts a procedure, as a client names it.

    Raises:
        InvalidRequest: when the name has characters or a length a principal may not have.
    """
    if not _PRINCIPAL.fullmatch(principal):
        raise InvalidRequest(
            f"bad principal {principal!r}: use letters, digits, '_', '.', '@', ':', '-'"
            " (at most 200), starting with a letter or digit"
        )
    return principal


def check_member_id(member_id: str) -> str:
    """Return the worker (bus member) ID as given, once checked.

    Raises:
        ValueError: saying what a worker ID may hold (no '@': it separates the member in a bus
            activity's ID).
    """
    if not _MEMBER_ID.fullmatch(member_id):
        raise ValueError(
            f"bad worker ID {member_id!r}: use letters, digits, '_', '.', '-' (at most 100), "
            "starting with a letter or digit"
        )
    return member_id


def validate_name(kind: str, name: str) -> str:
    """Return a namespace, table or column name once checked.

    Args:
        kind: what the name is of ("namespace", "table", "column"), for the error.
        name: lower-case letters, digits and '_', not starting with a digit; not a keyword.

    Raises:
        InvalidRequest: saying what is wrong with the name.
    """
    if not name:
        raise InvalidRequest(f"the {kind} name is empty")
    if len(name) > MAX_NAME_LENGTH:
        raise InvalidRequest(
            f"the {kind} name {name[:20]!r}... is {len(name)} characters; at most "
            f"{MAX_NAME_LENGTH} are allowed"
        )
    if not _NAME.fullmatch(name):
        raise InvalidRequest(
            f"the {kind} name {name!r} may hold only lower-case letters, digits and '_', "
            "and must not start with a digit"
        )
    if name in RESERVED_WORDS:
        raise InvalidRequest(f"the {kind} name {name!r} is a reserved SQL word")
    if kind == "namespace" and name == LOAD_FOLDER:
        raise InvalidRequest(
            f"the namespace name {name!r} is the warehouse's folder for load inputs; choose another"
        )
    return name


def parse_table_name(qualified: str) -> tuple[str, str]:
    """Split a table's name: 'sales.orders' -> ('sales', 'orders'), both names checked.

    Args:
        qualified: a table's full name, NAMESPACE.TABLE.

    Raises:
        InvalidRequest: when either name is not a valid name.
    """
    parts = qualified.split(".")
    if len(parts) != 2:
        raise InvalidRequest(f"expected NAMESPACE.TABLE, got {qualified!r}")
    return validate_name("namespace", parts[0]), validate_name("table", parts[1])


def parse_grant_target(target: str) -> tuple[str, str]:
    """Return what a grant is on, as (namespace, table).

    'sales.orders' -> ('sales', 'orders'), one table; 'sales.*' -> ('sales', ALL_TABLES), the
    namespace: every table in it, now and later.

    Raises:
        InvalidRequest: for a bare name (so a forgotten dot never grants on a whole namespace)
            or a bad namespace or table name.
    """
    parts = target.split(".")
    if len(parts) != 2 or ALL_TABLES in parts[0]:
        raise InvalidRequest(
            f"expected NAMESPACE.TABLE, or NAMESPACE.{ALL_TABLES} for every table in the "
            f"namespace, got {target!r}"
        )
    namespace = validate_name("namespace", parts[0])
    if parts[1] == ALL_TABLES:
        return namespace, ALL_TABLES
    return namespace, validate_name("table", parts[1])


def namespace_resource(namespace: str) -> str:
    """Return the lock resource of a namespace."""
    return namespace


def table_resource(namespace: str, table: str) -> str:
    """Return the lock resource of a table: below its namespace's."""
    return f"{namespace}/{table}"


def grant_resource(namespace: str, table: str) -> str:
    """Return the lock resource a grant's change takes X on.

    Its table, or its namespace for a grant on the namespace as a whole (table ALL_TABLES).
    """
    if table == ALL_TABLES:
        return namespace_resource(namespace)
    return table_resource(namespace, table)
