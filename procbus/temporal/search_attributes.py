"""procbus's search attributes on a Temporal namespace, through Temporal's operator service:
registered by `procbus temporal setup`, checked by every worker at start. The embedded server
registers them itself (`--search-attribute`, procbus/stack/temporal_server.py), from the same
SEARCH_ATTRIBUTES."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from enum import StrEnum

from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import (
    AddSearchAttributesRequest,
    ListSearchAttributesRequest,
)
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from procbus.core import SEARCH_ATTRIBUTES
from procbus.errors import SearchAttributesNotSet

log = logging.getLogger(__name__)

_TYPE_PREFIX = "INDEXED_VALUE_TYPE_"
# A worker whose identity may not read the namespace's search attributes starts unchecked.
_UNCHECKABLE = (RPCStatusCode.PERMISSION_DENIED, RPCStatusCode.UNIMPLEMENTED)


class Registration(StrEnum):
    ADDED = "added"  # registered by this call
    PRESENT = "present"  # registered before, with procbus's type: nothing to do


@dataclass(frozen=True)
class AttributeSetup:
    """What `ensure_search_attributes` did about one search attribute."""

    name: str
    type: str  # Temporal's name of the type: Keyword
    outcome: Registration


def setup_command(namespace: str) -> str:
    """Return the command that registers procbus's search attributes on `namespace`."""
    return f"procbus temporal setup --namespace {namespace}"


def _type_name(value: int) -> str:
    """Temporal's name of an IndexedValueType (the CLI's): Keyword, KeywordList, Datetime."""
    words = IndexedValueType.Name(value).removeprefix(_TYPE_PREFIX).split("_")  # type: ignore[arg-type]
    return "".join(word.title() for word in words)


def _type_value(name: str) -> IndexedValueType.ValueType:
    return IndexedValueType.Value(_TYPE_PREFIX + name.upper())


async def _registered(client: Client, namespace: str) -> dict[str, str]:
    """The namespace's custom search attributes and their types: one list call."""
    try:
        response = await client.operator_service.list_search_attributes(
            ListSearchAttributesRequest(namespace=namespace)
        )
    except RPCError as error:
        if error.status == RPCStatusCode.NOT_FOUND:
            raise SearchAttributesNotSet(
                f"the Temporal namespace {namespace!r} does not exist: create it "
                f"(`temporal operator namespace create --namespace {namespace}`), then run "
                f"`{setup_command(namespace)}`"
            ) from None
        raise
    return {name: _type_name(kind) for name, kind in response.custom_attributes.items()}


def _other_types(namespace: str, registered: dict[str, str]) -> SearchAttributesNotSet | None:
    """The error for attributes registered with another type than procbus's, if any."""
    wrong = [
        (name, registered[name], kind)
        for name, kind in SEARCH_ATTRIBUTES.items()
        if name in registered and registered[name] != kind
    ]
    if not wrong:
        return None
    found = ", ".join(f"{name} is {has}, procbus needs {needs}" for name, has, needs in wrong)
    names = " ".join(f"--name {name}" for name, _, _ in wrong)
    return SearchAttributesNotSet(
        f"the Temporal namespace {namespace!r} has procbus's search attributes with another "
        f"type ({found}); a type cannot change: if nothing else uses them, remove them "
        f"(`temporal operator search-attribute remove --namespace {namespace} {names}`), then "
        f"run `{setup_command(namespace)}`"
    )


async def require_search_attributes(client: Client, namespace: str) -> None:
    """Check that `namespace` has procbus's search attributes, with procbus's types.

    A worker whose identity may not list them (PERMISSION_DENIED, UNIMPLEMENTED) is let start
    with a warning: the check could not run, so it refuses nothing.

    Raises:
        SearchAttributesNotSet: one is missing or of another type; says what to run.
    """
    try:
        registered = await _registered(client, namespace)
    except RPCError as error:
        if error.status not in _UNCHECKABLE:
            raise
        log.warning(
            "cannot check procbus's search attributes on the Temporal namespace %r (%s); "
            "if they are missing, procedures fail to record their state: run `%s`",
            namespace,
            error.message,
            setup_command(namespace),
        )
        return
    other_types = _other_types(namespace, registered)
    if other_types is not None:
        raise other_types
    missing = [name for name in SEARCH_ATTRIBUTES if name not in registered]
    if missing:
        raise SearchAttributesNotSet(
            f"the Temporal namespace {namespace!r} lacks procbus's search attributes "
            f"{', '.join(missing)}: register them with `{setup_command(namespace)}`, then "
            "start the worker again"
        )


async def ensure_search_attributes(client: Client, namespace: str) -> list[AttributeSetup]:
    """Register on `namespace` procbus's search attributes it lacks (idempotent).

    Lists them first; adds the missing ones in one call, or nothing when one has another type.

    Raises:
        SearchAttributesNotSet: one has another type, the namespace does not exist, or this
            client may not register them (Temporal Cloud: its UI or `tcld`).
    """
    registered = await _registered(client, namespace)
    other_types = _other_types(namespace, registered)
    if other_types is not None:
        raise other_types
    missing = {name: kind for name, kind in SEARCH_ATTRIBUTES.items() if name not in registered}
    if missing:
        try:
            await client.operator_service.add_search_attributes(
                AddSearchAttributesRequest(
                    namespace=namespace,
                    search_attributes={name: _type_value(kind) for name, kind in missing.items()},
                )
            )
        except RPCError as error:
            if error.status not in _UNCHECKABLE:
                raise
            raise SearchAttributesNotSet(
                f"this client may not register search attributes on {namespace!r} "
                f"({error.message}): ask the cluster's admin to add "
                f"{', '.join(f'{name} ({kind})' for name, kind in missing.items())}; on "
                "Temporal Cloud, add them in its UI or with `tcld namespace search-attributes add`"
            ) from None
    return [
        AttributeSetup(name, kind, Registration.ADDED if name in missing else Registration.PRESENT)
        for name, kind in SEARCH_ATTRIBUTES.items()
    ]
