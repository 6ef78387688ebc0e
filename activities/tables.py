"""Activities of the table procedures: thin adapters from steps to procbus.lakehouse.

Every action is idempotent per procedure, every undo removes only its own procedure's work.
Bad requests raise InvalidRequest and writes of a holder that lost its lock StaleFencingToken;
the worker's error interceptor makes both non-retryable.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path

import asyncpg
from temporalio import activity

from procbus.auth import WorkerAuth
from procbus.core import ALL_TABLES
from procbus.errors import AccessDenied, InvalidRequest
from procbus.lakehouse import Catalog, NamespaceDescriptor, TableDescriptor, warehouse
from procbus.lakehouse.cache import AccessCache
from procbus.lakehouse.models import (
    AccessEntry,
    AccessStep,
    EventStep,
    NamespaceRef,
    NamespaceStep,
    Permission,
    TableStep,
)


def made_before(existing: TableDescriptor | NamespaceDescriptor, procedure_id: str) -> str:
    """What a refusal adds when the row is an earlier procedure's under this workflow ID."""
    if existing.created_by != procedure_id:
        return ""
    return (
        f", made by an earlier procedure under the workflow ID {procedure_id!r} (its run "
        f"{existing.created_run or 'from before runs were recorded'}): a workflow ID that was "
        "used once names that procedure; start this one under a new ID"
    )


# The events of a deletion: recorded only while nothing of that name exists again.
DELETION_EVENTS = frozenset({"TableDeleted", "NamespaceDeleted"})


class TableActivities:
    """The activities of the namespace, table and access procedures, over the catalog."""

    def __init__(
        self,
        pool: asyncpg.Pool,
        warehouse_root: Path,
        events_topic: str | None = None,
        access: AccessCache | None = None,
        auth: WorkerAuth | None = None,
    ) -> None:
        self.catalog = Catalog(pool, events_topic)
        self.warehouse_root = warehouse_root
        # This worker's ACL cache, kept current by the bus; empty (refusing) without a member.
        self.access = access or AccessCache()
        self.auth = auth or WorkerAuth()

    # ---- namespaces ----

    @activity.defn(name="preflight_create_namespace")
    async def preflight_create_namespace(self, step: NamespaceStep) -> NamespaceDescriptor:
        wanted = step.namespace
        existing = await self.catalog.get_namespace(wanted.name)
        if existing is not None and not existing.made_by(wanted.created_by, wanted.created_run):
            earlier = made_before(existing, step.procedure_id)
            raise InvalidRequest(f"namespace {wanted.name!r} exists already{earlier}")
        return wanted

    @activity.defn(name="create_namespace")
    async def create_namespace(self, step: NamespaceStep) -> None:
        await self.catalog.create_namespace(step.namespace, step.fence, step.grants)

    @activity.defn(name="remove_created_namespace")
    async def remove_created_namespace(self, step: NamespaceStep) -> None:
        made = step.namespace
        await self.catalog.remove_namespace_created_by(
            made.name, made.created_by, made.created_run, step.fence
        )

    @activity.defn(name="preflight_delete_namespace")
    async def preflight_delete_namespace(self, ref: NamespaceRef) -> NamespaceDescriptor:
        namespace = await self.catalog.get_namespace(ref.namespace)
        if namespace is None:
            raise InvalidRequest(f"namespace {ref.namespace!r} does not exist")
        # The catalog, not the cache: under the namespace's X lock it is the truth about admins.
        who = ref.requested_by
        if who is None:  # the engine refuses such a start before any step
            raise AccessDenied(f"no principal to check for admin on namespace {ref.namespace!r}")
        admin = AccessEntry(
            principal=who, namespace=ref.namespace, table=ALL_TABLES, permission=Permission.ADMIN
        )
        if not self.auth.is_operator(who) and not await self.catalog.has_permission(admin):
            raise AccessDenied(
                f"{who!r} may not delete namespace {ref.namespace!r}: that needs admin on the "
                "namespace (its creator has it) or the operator"
            )
        tables = await self.catalog.count_tables(ref.namespace)
        if tables:
            raise InvalidRequest(
                f"namespace {ref.namespace!r} holds {tables} tables: delete them first"
            )
        return namespace

    @activity.defn(name="delete_namespace")
    async def delete_namespace(self, ref: NamespaceRef) -> None:
        await self.catalog.delete_empty_namespace(ref.namespace, ref.fence)

    @activity.defn(name="restore_namespace")
    async def restore_namespace(self, step: NamespaceStep) -> None:
        await self.catalog.restore_namespace(step.namespace, step.fence)

    # ---- tables ----

    @activity.defn(name="preflight_create_table")
    async def preflight_create_table(self, step: TableStep) -> TableDescriptor:
        table = step.table
        if await self.catalog.get_namespace(table.namespace) is None:
            raise InvalidRequest(f"namespace {table.namespace!r} does not exist")
        existing = await self.catalog.get_table(table.namespace, table.name)
        if existing is not None and not existing.made_by(table.created_by, table.created_run):
            raise InvalidRequest(
                f"table {table.qualified_name!r} exists already"
                f"{made_before(existing, step.procedure_id)}"
            )
        folder = warehouse.table_folder(self.warehouse_root, table.namespace, table.name)
        return table.model_copy(update={"location": str(folder.resolve())})

    @activity.defn(name="create_layout")
    async def create_layout(self, step: TableStep) -> None:
        await asyncio.to_thread(warehouse.create_layout, self.warehouse_root, step.table)

    @activity.defn(name="remove_layout")
    async def remove_layout(self, step: TableStep) -> None:
        await asyncio.to_thread(
            warehouse.remove_layout,
            self.warehouse_root,
            step.table.namespace,
            step.table.name,
            step.table.created_by,
            step.table.created_run,
        )

    @activity.defn(name="add_to_catalog")
    async def add_to_catalog(self, step: TableStep) -> None:
        await self.catalog.add_table(step.table, step.fence, step.grants)

    @activity.defn(name="remove_added_table")
    async def remove_added_table(self, step: TableStep) -> None:
        made = step.table
        await self.catalog.remove_table_created_by(
            made.namespace, made.name, made.created_by, made.created_run, step.fence
        )

    @activity.defn(name="preflight_delete_table")
    async def preflight_delete_table(self, step: TableStep) -> TableDescriptor:
        # What the catalog records, as the undo (restore_table) puts it back.
        table = await self.catalog.get_recorded_table(step.table.namespace, step.table.name)
        if table is None:
            raise InvalidRequest(f"table {step.table.qualified_name!r} does not exist")
        # Deleting a table's data is writing it.
        self.auth.require_write(self.access, step.principal, table)
        return table

    @activity.defn(name="remove_from_catalog")
    async def remove_from_catalog(self, step: TableStep) -> None:
        table = step.table
        # At the metadata the preflight read, which the undo puts back.
        await self.catalog.remove_table(
            table.namespace, table.name, step.fence, table.metadata_location or None
        )

    @activity.defn(name="restore_to_catalog")
    async def restore_to_catalog(self, step: TableStep) -> None:
        await self.catalog.restore_table(step.table, step.fence)

    @activity.defn(name="delete_data")
    async def delete_data(self, step: TableStep) -> None:
        # Only the deleted table's own folder: a table made again since keeps its data.
        await asyncio.to_thread(
            warehouse.delete_data,
            self.warehouse_root,
            step.table.namespace,
            step.table.name,
            step.table.created_by,
            step.table.created_run,
        )

    # ---- access ----

    @activity.defn(name="preflight_change_access")
    async def preflight_change_access(self, step: AccessStep) -> AccessEntry:
        entry = step.entry
        if entry.namespace_wide:
            if await self.catalog.get_namespace(entry.namespace) is None:
                raise InvalidRequest(f"namespace {entry.namespace!r} does not exist")
            needs = "admin on the namespace (its creator has it) or the operator"
        else:
            if await self.catalog.get_table(entry.namespace, entry.table) is None:
                raise InvalidRequest(f"table {entry.qualified_table!r} does not exist")
            needs = "admin on the table (its creator has it) or on its namespace, or the operator"
        # The catalog, not the cache: under the X lock on the table (or the namespace) it is
        # the truth about admins; admin on the namespace counts for its tables.
        who = step.requested_by
        if who is None:  # the engine refuses such a start before any step
            raise AccessDenied(f"no principal to check for admin on {entry.qualified_table!r}")
        admin = entry.model_copy(update={"principal": who, "permission": Permission.ADMIN})
        if not self.auth.is_operator(who) and not await self.catalog.has_permission(admin):
            raise AccessDenied(
                f"{who!r} may not grant or revoke on {entry.qualified_table!r}: that needs {needs}"
            )
        return entry

    @activity.defn(name="record_access_change")
    async def record_access_change(self, step: AccessStep) -> None:
        await self.catalog.change_access(step.action, step.entry, step.procedure_id, step.fence)

    # ---- events ----

    @activity.defn(name="record_event")
    async def record_event(self, step: EventStep) -> None:
        recorded = await self.catalog.record_event(
            step.procedure_id,
            step.procedure_run,
            step.event_type,
            step.namespace,
            step.table,
            step.payload,
            step.fence,
            unless_made_again=step.event_type in DELETION_EVENTS,
        )
        if not recorded:
            # Its locks were lost past the pivot and a table (or namespace) of that name was
            # made meanwhile: its Created event, recorded after this deletion, is the one
            # receivers must see last; a Deleted event now would delete the new one for them.
            activity.logger.warning(
                "%s of %s not recorded: one of that name was made again since %s deleted it",
                step.event_type,
                step.namespace if step.table is None else f"{step.namespace}.{step.table}",
                step.procedure_id,
            )

    @activity.defn(name="remove_event")
    async def remove_event(self, step: EventStep) -> None:
        await self.catalog.remove_event(
            step.procedure_id, step.procedure_run, step.event_type, step.fence
        )

    def all(self) -> list[Callable[..., object]]:
        return [
            self.preflight_create_namespace,
            self.create_namespace,
            self.remove_created_namespace,
            self.preflight_delete_namespace,
            self.delete_namespace,
            self.restore_namespace,
            self.preflight_create_table,
            self.create_layout,
            self.remove_layout,
            self.add_to_catalog,
            self.remove_added_table,
            self.preflight_delete_table,
            self.remove_from_catalog,
            self.restore_to_catalog,
            self.delete_data,
            self.record_event,
            self.remove_event,
            self.preflight_change_access,
            self.record_access_change,
        ]
