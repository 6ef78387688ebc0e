"""The namespace procedures: CreateNamespace, DeleteNamespace.

Both run as the start's verified principal (Procedure.authenticates): CreateNamespace's creator
gets admin on the namespace; DeleteNamespace is for its admin (or the operator) only.

Each is a `Procedure`: steps with their undo, so a failure anywhere leaves the catalog and the
descriptor caches as they were (or, past DeleteNamespace's pivot, as after).

Locks (docs/concepts/locks.md), held from before the first step until after the last compensation:
X on the namespace. Every catalog write carries its fencing token.
"""

from __future__ import annotations

from collections.abc import Sequence

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from procbus.activities import TableActivities
    from procbus.bus import ResetNamespaceGrants
    from procbus.core import namespace_resource
    from procbus.lakehouse import (
        CreateNamespaceInput,
        DeleteNamespaceInput,
        NamespaceDescriptor,
        NamespaceResult,
    )
    from procbus.lakehouse.models import (
        EventStep,
        NamespaceRef,
        NamespaceStep,
        namespace_creator_grants,
    )

from procbus.engine import Procedure, checked

# workflow.patched ID of CreateNamespace's reset_grants_after_undo (docs/how-to/upgrading.md).
CREATE_NAMESPACE_RESETS_GRANTS_AFTER_UNDO = "procbus-create-namespace-resets-grants-after-undo"


@workflow.defn(name="CreateNamespace")
class CreateNamespace(Procedure[CreateNamespaceInput, NamespaceResult]):
    """Create a namespace in the catalog; its creator becomes its admin."""

    authenticates = True  # its creator gets admin on the namespace

    @workflow.run
    async def run(self, request: CreateNamespaceInput) -> NamespaceResult:
        return await self.execute(request)

    def target(self, request: CreateNamespaceInput) -> str:
        return request.namespace

    def validate(self, request: CreateNamespaceInput) -> None:
        checked(request.check)

    def locks(self, request: CreateNamespaceInput) -> Sequence[tuple[str, str]]:
        return [(namespace_resource(request.namespace), "X")]

    async def steps(self, request: CreateNamespaceInput) -> NamespaceResult:
        procedure_id = workflow.info().workflow_id
        fence = self.fence(namespace_resource(request.namespace))
        # The operator may do everything already: no grants of its own to keep.
        grants = (
            []
            if self.authentication.operator
            else namespace_creator_grants(request.namespace, self.principal)
        )
        step = NamespaceStep(
            procedure_id=procedure_id,
            namespace=NamespaceDescriptor(
                name=request.namespace,
                properties=request.properties,
                created_by=procedure_id,
                created_run=self.procedure_run,
            ),
            fence=fence,
            grants=grants,
        )
        await self.step("preflight", TableActivities.preflight_create_namespace, step)
        # A worker that rebuilds its caches meanwhile reads the creator's grants from the
        # catalog: take them back from every worker once create_namespace is undone.
        if workflow.patched(CREATE_NAMESPACE_RESETS_GRANTS_AFTER_UNDO):
            self.broadcast_on_rollback(
                "reset_grants_after_undo", ResetNamespaceGrants(namespace=request.namespace)
            )
        await self.step(
            "create_namespace",
            TableActivities.create_namespace,
            step,
            undo=TableActivities.remove_created_namespace,
            summary=f"add namespace {request.namespace} and its creator's grants to the catalog",
        )
        # Every worker's ACL cache, through the bus (one phase): the creator's grants, and none
        # left from an earlier namespace of that name. Its tables wait for the X lock.
        await self.broadcast(
            "refresh_cache",
            ResetNamespaceGrants(namespace=request.namespace, grants=grants),
            undo=ResetNamespaceGrants(namespace=request.namespace),
        )
        event = EventStep(
            procedure_id=procedure_id,
            procedure_run=self.procedure_run,
            event_type="NamespaceCreated",
            namespace=request.namespace,
            fence=fence,
        )
        await self.step(
            "record_event",
            TableActivities.record_event,
            event,
            undo=TableActivities.remove_event,
            summary="record NamespaceCreated",
        )
        return NamespaceResult(namespace=step.namespace)


# workflow.patched ID of DeleteNamespace's refresh_cache step (docs/how-to/upgrading.md).
DELETE_NAMESPACE_RESETS_GRANTS = "procbus-delete-namespace-resets-grants"


@workflow.defn(name="DeleteNamespace")
class DeleteNamespace(Procedure[DeleteNamespaceInput, NamespaceResult]):
    """Delete an empty namespace and its grants, from the catalog and every worker's cache."""

    # Only its admin (or the operator): else anyone could delete an empty namespace and create
    # it again, becoming the admin of every table made in it later.
    authenticates = True

    @workflow.run
    async def run(self, request: DeleteNamespaceInput) -> NamespaceResult:
        return await self.execute(request)

    def target(self, request: DeleteNamespaceInput) -> str:
        return request.namespace

    def validate(self, request: DeleteNamespaceInput) -> None:
        checked(request.check)

    def locks(self, request: DeleteNamespaceInput) -> Sequence[tuple[str, str]]:
        return [(namespace_resource(request.namespace), "X")]

    async def steps(self, request: DeleteNamespaceInput) -> NamespaceResult:
        procedure_id = workflow.info().workflow_id
        fence = self.fence(namespace_resource(request.namespace))
        ref = NamespaceRef(
            procedure_id=procedure_id,
            namespace=request.namespace,
            fence=fence,
            requested_by=self.principal,
        )
        namespace = await self.step("preflight", TableActivities.preflight_delete_namespace, ref)
        await self.step(
            "delete_namespace",
            TableActivities.delete_namespace,
            ref,
            undo=TableActivities.restore_namespace,
            undo_arg=NamespaceStep(procedure_id=procedure_id, namespace=namespace, fence=fence),
            pivot=True,
            summary=f"remove namespace {request.namespace} from the catalog (point of no return)",
        )
        # --8<-- [start:delete-namespace-patch]
        # Every worker's ACL cache drops the namespace's grants, as the catalog just did. Runs
        # begun before this step existed go on without it (their histories have no such step).
        if workflow.patched(DELETE_NAMESPACE_RESETS_GRANTS):
            await self.broadcast("refresh_cache", ResetNamespaceGrants(namespace=request.namespace))
        # --8<-- [end:delete-namespace-patch]
        await self.step(
            "record_event",
            TableActivities.record_event,
            EventStep(
                procedure_id=procedure_id,
                procedure_run=self.procedure_run,
                event_type="NamespaceDeleted",
                namespace=request.namespace,
                fence=fence,
            ),
            summary="record NamespaceDeleted",
        )
        return NamespaceResult(namespace=namespace)
