"""The README's own-procedure example, run for real."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from temporalio.client import Client, WorkflowFailureError
from temporalio.worker import Worker

from examples.grant_access import AccessActivities, GrantAccess, GrantAccessInput
from procbus.temporal.faults import FaultInterceptor, parse_faults

PROJECT = Path(__file__).resolve().parents[2]


def test_the_readme_shows_the_example_as_it_is() -> None:
    example = (PROJECT / "examples" / "grant_access.py").read_text()
    readme = (PROJECT / "README.md").read_text()
    body = example.split("from workflows.procedure import Procedure, invalid_input\n", 1)[1]
    assert body.strip() in readme


@pytest.mark.parametrize("faults", ["", "GrantAccess.grant_read:fail_after"])
async def test_grant_access_is_all_or_nothing(client: Client, task_queue: str, faults: str) -> None:
    access = AccessActivities()
    rules = parse_faults(faults)
    async with Worker(
        client,
        task_queue=task_queue,
        workflows=[GrantAccess],
        activities=[
            access.create_account,
            access.delete_account,
            access.grant_read,
            access.revoke_read,
        ],
        interceptors=[FaultInterceptor(rules)] if rules else [],
    ):
        request = GrantAccessInput(user="ana", table="sales.orders")
        procedure_id = f"grant-{uuid.uuid4().hex[:8]}"
        if not faults:
            await client.execute_workflow(
                GrantAccess.run, request, id=procedure_id, task_queue=task_queue
            )
            assert access.grants == {("ana", "sales.orders")}
            assert access.accounts == {"ana": f"{procedure_id}/create_account"}
        else:
            with pytest.raises(WorkflowFailureError):
                await client.execute_workflow(
                    GrantAccess.run, request, id=procedure_id, task_queue=task_queue
                )
            assert access.grants == set()
            assert access.accounts == {}
