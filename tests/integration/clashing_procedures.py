"""A user's module whose workflow takes a built-in procedure's name (test_plugin.py)."""

from temporalio import workflow


@workflow.defn(name="CreateTable")
class MyCreateTable:
    @workflow.run
    async def run(self) -> None:
        return None
